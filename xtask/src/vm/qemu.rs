//! Booting one kernel under QEMU's software emulation and reading what the init script prints.
//!
//! The first serial port carries the init script's `@vmtest` lines and the tests' output; the
//! second is the kernel's console, written to a file and searched for oopses afterwards.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// One VM to boot.
pub struct Vm<'a> {
    pub bzimage: &'a Path,
    pub initramfs: &'a Path,
    pub cpus: u32,
    pub memory_mib: u32,
    /// Appended to the kernel command line.
    pub cmdline_extra: &'a str,
    /// Where the first port's lines are copied, and the kernel console and QEMU's own
    /// messages written: `<logs>.console.log`, `<logs>.kernel.log`, `<logs>.qemu.log`.
    pub logs: PathBuf,
    /// The init script must say `@vmtest boot` within this.
    pub boot_timeout: Duration,
    /// Longest silence on the first port once booted (the per-test limit inside the VM is
    /// shorter, so this catches a hung guest, not a slow test).
    pub silence_timeout: Duration,
}

/// How a VM's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// QEMU exited (the guest powered off, or rebooted after a panic: `-no-reboot`).
    Exited(Option<i32>),
    /// Killed by xtask: the guest said nothing for too long.
    TimedOut(String),
}

#[derive(Debug)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub kernel_log: String,
    pub ended: Ended,
    pub wall: Duration,
}

impl Vm<'_> {
    fn log(&self, kind: &str) -> PathBuf {
        let mut name = self.logs.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".{kind}.log"));
        self.logs.with_file_name(name)
    }

    /// The QEMU command: q35, multi-threaded TCG (the host's /dev/kvm cannot run stock
    /// kernels), no network or display, under `nice` so the host stays usable.
    fn command(&self) -> Command {
        let mut cmd = Command::new("nice");
        cmd.args(["-n", "10", "qemu-system-x86_64"])
            .args(["-M", "q35", "-accel", "tcg,thread=multi", "-cpu", "max"])
            .args(["-smp", &self.cpus.to_string()])
            .args(["-m", &self.memory_mib.to_string()])
            .args(["-nic", "none", "-display", "none", "-monitor", "none"])
            .arg("-no-reboot")
            .args(["-serial", "stdio"])
            .arg("-serial")
            .arg(format!("file:{}", self.log("kernel").display()))
            .arg("-kernel")
            .arg(self.bzimage)
            .arg("-initrd")
            .arg(self.initramfs)
            .arg("-append")
            // no_timer_check: an emulated CPU starved by a busy host can fail the IO-APIC
            // timer check ("IO-APIC + timer doesn't work!", a panic 0.06 s into boot, seen once
            // on 6.1 at load average 10); the check is for broken hardware, not for this.
            .arg(format!(
                "console=ttyS1 panic=-1 no_timer_check cgroup_no_v1=all node_agent_vmtest {}",
                self.cmdline_extra
            ));
        cmd
    }

    /// Boots, streams every first-port line to `on_line` as it arrives, and returns once QEMU
    /// exits or a time limit passes (then QEMU is killed).
    pub fn run(&self, mut on_line: impl FnMut(&str)) -> anyhow::Result<Outcome> {
        if let Some(dir) = self.logs.parent() {
            fs::create_dir_all(dir)?;
        }
        let qemu_log = fs::File::create(self.log("qemu"))?;
        let mut console = fs::File::create(self.log("console"))?;
        let started = Instant::now();
        let mut child = self
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(qemu_log)
            .spawn()
            .context("starting qemu-system-x86_64 (`cargo xtask setup` installs it)")?;
        let stdout = child.stdout.take().context("qemu's stdout")?;
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            // Serial output is bytes, not always UTF-8 (firmware escape codes): lossy.
            while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_string();
                buf.clear();
                if tx.send(line).is_err() {
                    return;
                }
            }
        });

        let mut lines = Vec::new();
        let mut booted = false;
        let mut last_line = Instant::now();
        let ended = loop {
            let limit = if booted {
                self.silence_timeout
            } else {
                self.boot_timeout
            };
            let deadline = if booted { last_line } else { started } + limit;
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    writeln!(console, "{line}")?;
                    booted |= line.contains("@vmtest boot");
                    last_line = Instant::now();
                    on_line(&line);
                    lines.push(line);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait()?;
                    break Ended::Exited(status.code());
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Ended::TimedOut(if booted {
                        format!("the guest printed nothing for {limit:?}")
                    } else {
                        format!("the guest did not come up within {limit:?}")
                    });
                }
            }
        };
        let kernel_log = fs::read(self.log("kernel"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Ok(Outcome {
            lines,
            kernel_log,
            ended,
            wall: started.elapsed(),
        })
    }
}

/// Lines of a kernel log that say the kernel itself went wrong, each with the lines after it
/// (the oops, its registers and call trace) up to `context` lines.
pub fn kernel_trouble(log: &str, context: usize) -> Vec<String> {
    const SIGNS: &[&str] = &[
        "Oops",
        "BUG:",
        "Kernel panic",
        "WARNING:",
        "general protection fault",
    ];
    let lines: Vec<&str> = log.lines().collect();
    let mut found = Vec::new();
    let mut skip_until = 0;
    for (i, line) in lines.iter().enumerate() {
        if i < skip_until || !SIGNS.iter().any(|s| line.contains(s)) {
            continue;
        }
        let end = (i + context).min(lines.len());
        found.push(lines[i..end].join("\n"));
        skip_until = end;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oops_is_found_with_the_lines_after_it_and_an_oom_report_is_not() {
        let log = "[ 1.0] mem-helper invoked oom-killer: gfp_mask=0xcc0\n\
                   [ 1.1] Call Trace:\n\
                   [ 2.0] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
                   [ 2.1] RIP: 0010:count_memcg_events+0x70/0x130\n\
                   [ 2.2] Call Trace:\n";
        let found = kernel_trouble(log, 2);
        assert_eq!(
            found,
            ["[ 2.0] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n[ 2.1] RIP: 0010:count_memcg_events+0x70/0x130"]
        );
    }

    #[test]
    fn the_kernel_gets_its_own_console_and_no_v1_hierarchies() {
        let vm = Vm {
            bzimage: Path::new("/k"),
            initramfs: Path::new("/i"),
            cpus: 2,
            memory_mib: 2048,
            cmdline_extra: "",
            logs: PathBuf::from("/tmp/x/6.1"),
            boot_timeout: Duration::from_secs(1),
            silence_timeout: Duration::from_secs(1),
        };
        let args: Vec<String> = vm
            .command()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let cmdline = args.last().unwrap();
        assert!(cmdline.contains("console=ttyS1") && cmdline.contains("cgroup_no_v1=all"));
        assert!(args.contains(&"file:/tmp/x/6.1.kernel.log".to_string()));
        assert!(args.contains(&"tcg,thread=multi".to_string()));
    }
}
