//! What the idle rows read from `/proc`: the node's CPU time (`/proc/stat`), its timer
//! wake-ups (`/proc/interrupts`, `/proc/softirqs`), and one process's CPU time and RSS.

use anyhow::Context as _;

/// The node's CPU from the first line of `/proc/stat`, in jiffies summed over CPUs.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeJiffies {
    /// user, nice, system, irq, softirq: time the guest's CPUs spent working.
    pub busy: u64,
    /// Time a runnable vCPU waited for the hypervisor to run it (0 on bare metal).
    pub steal: u64,
    /// Everything, idle and iowait included.
    pub total: u64,
}

impl NodeJiffies {
    pub fn read() -> anyhow::Result<Self> {
        let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        Self::parse(&text)
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let fields: Vec<u64> = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("cpu "))
            .context("no cpu line in /proc/stat")?
            .split_whitespace()
            .map(|v| v.parse().context("a field of /proc/stat's cpu line"))
            .collect::<anyhow::Result<_>>()?;
        let &[user, nice, system, idle, iowait, irq, softirq, steal, ..] = fields.as_slice() else {
            anyhow::bail!("short cpu line in /proc/stat (fewer than 8 fields)");
        };
        Ok(Self {
            busy: user + nice + system + irq + softirq,
            steal,
            total: user + nice + system + idle + iowait + irq + softirq + steal,
        })
    }

    /// (busy, steal) between `self` and a later reading, in percent of one core.
    pub fn shares_since(&self, later: &Self, cpus: usize) -> (f64, f64) {
        let total = later.total.saturating_sub(self.total).max(1) as f64;
        let share = |a: u64, b: u64| b.saturating_sub(a) as f64 / total * cpus as f64 * 100.0;
        (share(self.busy, later.busy), share(self.steal, later.steal))
    }
}

/// Timer wake-ups of the whole node so far: local timer interrupts (`LOC` in
/// `/proc/interrupts`) plus the `TIMER` and `HRTIMER` softirqs (`/proc/softirqs`), each summed
/// over CPUs. A `bpf_timer` tick is one interrupt and one `HRTIMER` softirq; a task's own
/// sleep ending is one interrupt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wakeups {
    pub local_timer: u64,
    pub timer_softirq: u64,
    pub hrtimer_softirq: u64,
}

impl Wakeups {
    pub fn read() -> anyhow::Result<Self> {
        let interrupts =
            std::fs::read_to_string("/proc/interrupts").context("reading /proc/interrupts")?;
        let softirqs =
            std::fs::read_to_string("/proc/softirqs").context("reading /proc/softirqs")?;
        Self::parse(&interrupts, &softirqs)
    }

    fn parse(interrupts: &str, softirqs: &str) -> anyhow::Result<Self> {
        // `NAME: n n ... [description]`: the per-CPU counts are the numbers after the name.
        let row = |text: &str, file: &str, name: &str| -> anyhow::Result<u64> {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name}:")))
                .with_context(|| format!("no {name} row in {file}"))?;
            let (_, counts) = line.split_once(':').unwrap_or(("", ""));
            Ok(counts
                .split_whitespace()
                .map_while(|v| v.parse::<u64>().ok())
                .sum())
        };
        Ok(Self {
            local_timer: row(interrupts, "/proc/interrupts", "LOC")?,
            timer_softirq: row(softirqs, "/proc/softirqs", "TIMER")?,
            hrtimer_softirq: row(softirqs, "/proc/softirqs", "HRTIMER")?,
        })
    }

    pub fn total(&self) -> u64 {
        self.local_timer + self.timer_softirq + self.hrtimer_softirq
    }
}

/// CPU time of all a process's threads, ns (schedstat's first field).
pub fn process_cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let dir = format!("/proc/{pid}/task");
    let mut total = 0;
    for task in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let path = task?.path().join("schedstat");
        // A thread that ended between the listing and the read has nothing left to count.
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        total += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// A process's VmRSS, bytes.
pub fn rss(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path}: did the process exit?"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .with_context(|| format!("no VmRSS in {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_sum_the_timer_rows_over_cpus() {
        let interrupts = "           CPU0       CPU1\n  \
            24:          1          0  IO-APIC   5-edge      ACPI:Ged\n\
            LOC:     261700     274749   Local timer interrupts\n\
            RES:      56740      56842   Rescheduling interrupts\n";
        let softirqs = "                    CPU0       CPU1\n          \
            HI:          0          0\n       \
            TIMER:      35015      42903\n     \
            HRTIMER:       7638       7622\n";
        let w = Wakeups::parse(interrupts, softirqs).unwrap();
        assert_eq!(
            w,
            Wakeups {
                local_timer: 536_449,
                timer_softirq: 77_918,
                hrtimer_softirq: 15_260
            }
        );
        assert_eq!(w.total(), 536_449 + 77_918 + 15_260);
        assert!(
            Wakeups::parse("RES: 1 2\n", softirqs).is_err(),
            "no LOC row"
        );
    }

    #[test]
    fn node_jiffies_split_busy_steal_and_total() {
        let j = NodeJiffies::parse("cpu  10 1 5 100 2 3 4 7 0 0\ncpu0 1 2 3\n").unwrap();
        assert_eq!((j.busy, j.steal, j.total), (23, 7, 132));
        assert!(NodeJiffies::parse("cpu  1 2 3\n").is_err());
        let later = NodeJiffies {
            busy: 23 + 2,
            steal: 7 + 1,
            total: 132 + 200,
        };
        let (busy, steal) = j.shares_since(&later, 2);
        assert!((busy - 2.0).abs() < 1e-9 && (steal - 1.0).abs() < 1e-9);
    }
}
