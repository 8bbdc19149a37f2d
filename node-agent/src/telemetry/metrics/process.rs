//! The standard `process_*` metrics of the agent's own process, read from `/proc/self` at each
//! scrape (the names and meanings of Prometheus' client libraries). A file that cannot be read
//! or parsed leaves out the metrics it feeds, logged at debug level; the scrape goes on.

use std::path::{Path, PathBuf};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what} not found or not a number")]
    Parse { path: PathBuf, what: &'static str },
}

/// What `/proc/<pid>/stat` says about CPU, start time and memory, in the kernel's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    /// Ticks after boot at which the process started.
    pub start_ticks: u64,
    /// Resident set, in pages.
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat` (proc(5)): fields after the command name's closing parenthesis
/// (the name may hold spaces and parentheses itself), utime 14, stime 15, starttime 22, rss 24.
pub fn parse_stat(path: &Path, text: &str) -> Result<Stat, ProcessError> {
    let parse = |what| ProcessError::Parse {
        path: path.to_owned(),
        what,
    };
    let (_, after_comm) = text
        .rsplit_once(')')
        .ok_or_else(|| parse("the command name"))?;
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize, what| -> Result<u64, ProcessError> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| parse(what))
    };
    Ok(Stat {
        cpu_ticks: field(14, "utime")?.saturating_add(field(15, "stime")?),
        start_ticks: field(22, "starttime")?,
        rss_pages: field(24, "rss")?,
    })
}

/// Parses the boot time (`btime`, seconds since the epoch) out of `/proc/stat`.
pub fn parse_btime(path: &Path, text: &str) -> Result<u64, ProcessError> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ProcessError::Parse {
            path: path.to_owned(),
            what: "btime",
        })
}

/// Parses the soft limit of `Max open files` out of `/proc/<pid>/limits`; `None` when it is
/// `unlimited`.
pub fn parse_max_fds(path: &Path, text: &str) -> Result<Option<u64>, ProcessError> {
    let soft = text
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next());
    match soft {
        Some("unlimited") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| ProcessError::Parse {
            path: path.to_owned(),
            what: "Max open files",
        }),
        None => Err(ProcessError::Parse {
            path: path.to_owned(),
            what: "Max open files",
        }),
    }
}

/// The process metrics of the process whose `/proc` directory is `proc_dir` (`/proc/self`),
/// with `/proc/stat` at `proc_stat`.
#[derive(Debug)]
pub struct ProcessCollector {
    pub proc_dir: PathBuf,
    pub proc_stat: PathBuf,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self {
            proc_dir: PathBuf::from("/proc/self"),
            proc_stat: PathBuf::from("/proc/stat"),
        }
    }
}

fn read(path: &Path) -> Result<String, ProcessError> {
    std::fs::read_to_string(path).map_err(|source| ProcessError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Ticks per second (`sysconf(_SC_CLK_TCK)`; 100 on every Linux when it cannot be asked).
fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// One reading: each metric present only when its sources could be read.
#[derive(Debug, Default, PartialEq)]
pub struct Reading {
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcessCollector {
    pub fn read(&self) -> Reading {
        let ticks = clock_ticks();
        let stat_path = self.proc_dir.join("stat");
        let stat = read(&stat_path).and_then(|text| parse_stat(&stat_path, &text));
        let btime = read(&self.proc_stat).and_then(|text| parse_btime(&self.proc_stat, &text));
        let fd_dir = self.proc_dir.join("fd");
        let open_fds = std::fs::read_dir(&fd_dir)
            .map(|entries| entries.count() as u64)
            .map_err(|source| ProcessError::Read {
                path: fd_dir,
                source,
            });
        let limits_path = self.proc_dir.join("limits");
        let max_fds = read(&limits_path).and_then(|text| parse_max_fds(&limits_path, &text));
        for error in [stat.as_ref().err(), btime.as_ref().err()]
            .into_iter()
            .chain([open_fds.as_ref().err(), max_fds.as_ref().err()])
            .flatten()
        {
            tracing::debug!(error = %error, "a process metric is left out of this scrape");
        }
        let stat = stat.ok();
        Reading {
            cpu_seconds: stat.map(|s| s.cpu_ticks as f64 / ticks),
            start_time_seconds: stat
                .zip(btime.ok())
                .map(|(s, btime)| btime as f64 + s.start_ticks as f64 / ticks),
            resident_memory_bytes: stat
                .map(|s| s.rss_pages.saturating_mul(crate::sys::page_size())),
            open_fds: open_fds.ok(),
            max_fds: max_fds.ok().flatten(),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = self.read();
        if let Some(v) = r.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                r.resident_memory_bytes.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                r.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                r.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                r.max_fds.map(|v| v as f64),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (node agent) S 1 4242 4242 0 -1 4194560 1200 0 0 0 \
        250 50 0 0 20 0 8 0 123456 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        let p = Path::new("stat");
        #[rustfmt::skip]
        let rows: &[(&str, String, Result<Stat, &str>)] = &[
            ("a plain line", STAT.to_owned(),
             Ok(Stat { cpu_ticks: 300, start_ticks: 123456, rss_pages: 2560 })),
            ("a name with parentheses and spaces", STAT.replace("(node agent)", "(a) b (c))"),
             Ok(Stat { cpu_ticks: 300, start_ticks: 123456, rss_pages: 2560 })),
            ("no name", "4242 S 1".to_owned(), Err("the command name")),
            ("cut short", "1 (x) S 1 2 3".to_owned(), Err("utime")),
            ("not a number", STAT.replace(" 123456 ", " soon "), Err("starttime")),
        ];
        for (name, text, expected) in rows {
            match (parse_stat(p, text), expected) {
                (Ok(stat), Ok(want)) => assert_eq!(stat, *want, "{name}"),
                (Err(ProcessError::Parse { what, .. }), Err(want)) => {
                    assert_eq!(what, *want, "{name}")
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn limits_and_btime_are_parsed() {
        let p = Path::new("limits");
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max processes             63504                63504                processes\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(p, limits).ok(), Some(Some(1024)));
        let unlimited = limits.replace("1024 ", "unlimited ");
        assert_eq!(parse_max_fds(p, &unlimited).ok(), Some(None));
        assert!(parse_max_fds(p, "Max processes 1 1\n").is_err());
        assert_eq!(
            parse_btime(p, "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n").ok(),
            Some(1_700_000_000)
        );
        assert!(parse_btime(p, "cpu 1\n").is_err());
    }

    #[test]
    fn this_process_reads_whole() {
        let r = ProcessCollector::default().read();
        assert!(r.cpu_seconds.is_some_and(|v| v >= 0.0), "{r:?}");
        assert!(r.resident_memory_bytes.is_some_and(|v| v > 0), "{r:?}");
        assert!(r.open_fds.is_some_and(|v| v >= 3), "{r:?}");
        let start = r.start_time_seconds.expect("start time");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!(start > 1.5e9 && start <= now + 1.0, "{start} vs now {now}");
    }

    #[test]
    fn an_unreadable_source_leaves_out_only_its_metrics() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("stat"), STAT).expect("stat");
        std::fs::write(dir.path().join("limits"), "garbage\n").expect("limits");
        let collector = ProcessCollector {
            proc_dir: dir.path().to_owned(),
            proc_stat: dir.path().join("missing"),
        };
        let r = collector.read();
        assert_eq!(
            r.resident_memory_bytes,
            Some(2560 * crate::sys::page_size())
        );
        assert!(r.cpu_seconds.is_some());
        assert_eq!(r.start_time_seconds, None, "no /proc/stat: no btime");
        assert_eq!(r.open_fds, None, "no fd directory");
        assert_eq!(r.max_fds, None, "unparsable limits");
    }
}
