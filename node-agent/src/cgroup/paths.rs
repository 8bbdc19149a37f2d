//! The cgroup files the agent reads, per hierarchy version, and their parsers.
//!
//! | figure                 | cgroup v1                                 | cgroup v2                         |
//! |------------------------|-------------------------------------------|-----------------------------------|
//! | usage                  | `memory.usage_in_bytes`                   | `memory.current`                  |
//! | limit                  | `memory.limit_in_bytes` (huge = none)     | `memory.max` (`max` = none)       |
//! | inactive file pages    | `memory.stat` `total_inactive_file`       | `memory.stat` `inactive_file`     |
//! | tasks, task limit      | `pids.current`, `pids.max` (`max` = none) | same                              |
//!
//! The working set is the kubelet's: usage minus inactive file pages, floored at 0
//! (kubelet `pkg/kubelet/eviction/helpers.go`, cAdvisor `setMemoryStats`). v1's `memory.stat`
//! keeps `total_*` for the hierarchy and plain keys for the cgroup alone; v2's keys are already
//! hierarchical. The root cgroup of a v2 hierarchy has no `memory.current`/`memory.max` and
//! neither version has `pids.*` at the root: reading them there fails with the file named.

use std::{
    io,
    num::ParseIntError,
    path::{Path, PathBuf},
};

use super::hierarchy::CgroupVersion;

pub const MEMORY_STAT: &str = "memory.stat";
pub const PIDS_CURRENT: &str = "pids.current";
pub const PIDS_MAX: &str = "pids.max";

/// v1 writes "no limit" as `PAGE_COUNTER_MAX` pages in bytes: `LONG_MAX` rounded down to the
/// page size (9223372036854771712 with 4 KiB pages). Any value at or above `LONG_MAX` rounded
/// down to 2 MiB covers every 64-bit page size; no host has 8 EiB to limit.
pub const V1_UNLIMITED_FLOOR: u64 = (i64::MAX as u64) & !((2 << 20) - 1);

/// The memory files of one hierarchy version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFiles {
    pub usage: &'static str,
    pub limit: &'static str,
    pub stat: &'static str,
    /// The `memory.stat` key holding the hierarchy's inactive file pages, in bytes.
    pub inactive_file_key: &'static str,
}

impl MemoryFiles {
    pub const fn of(version: CgroupVersion) -> Self {
        match version {
            CgroupVersion::V1 => Self {
                usage: "memory.usage_in_bytes",
                limit: "memory.limit_in_bytes",
                stat: MEMORY_STAT,
                inactive_file_key: "total_inactive_file",
            },
            CgroupVersion::V2 => Self {
                usage: "memory.current",
                limit: "memory.max",
                stat: MEMORY_STAT,
                inactive_file_key: "inactive_file",
            },
        }
    }
}

/// A memory or task limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    At(u64),
}

#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("{file}: expected {expected}, found {found:?}")]
    Malformed {
        file: &'static str,
        expected: &'static str,
        found: String,
        #[source]
        source: Option<ParseIntError>,
    },
    #[error("{file}: no `{key}` line")]
    MissingKey {
        file: &'static str,
        key: &'static str,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
}

/// At most this much of a bad file is quoted in an error.
const QUOTE_MAX: usize = 80;

fn malformed(
    file: &'static str,
    expected: &'static str,
    found: &str,
    source: Option<ParseIntError>,
) -> ParseError {
    let found = match found.char_indices().nth(QUOTE_MAX) {
        Some((end, _)) => format!("{}...", &found[..end]),
        None => found.to_owned(),
    };
    ParseError::Malformed {
        file,
        expected,
        found,
        source,
    }
}

/// A file holding one decimal number and a newline (`memory.current`, `pids.current`, ...).
pub fn parse_count(file: &'static str, content: &str) -> Result<u64, ParseError> {
    let value = content.trim_end_matches('\n');
    value
        .parse()
        .map_err(|e| malformed(file, "a decimal count", content, Some(e)))
}

/// `memory.max` / `memory.limit_in_bytes`, with each version's spelling of "no limit".
pub fn parse_memory_limit(version: CgroupVersion, content: &str) -> Result<Limit, ParseError> {
    let file = MemoryFiles::of(version).limit;
    match version {
        CgroupVersion::V2 => parse_max_or_count(file, content),
        CgroupVersion::V1 => {
            let bytes = parse_count(file, content)?;
            Ok(if bytes >= V1_UNLIMITED_FLOOR {
                Limit::Unlimited
            } else {
                Limit::At(bytes)
            })
        }
    }
}

/// `pids.max`: a count or `max`, on both versions.
pub fn parse_pids_max(content: &str) -> Result<Limit, ParseError> {
    parse_max_or_count(PIDS_MAX, content)
}

fn parse_max_or_count(file: &'static str, content: &str) -> Result<Limit, ParseError> {
    let value = content.trim_end_matches('\n');
    if value == "max" {
        return Ok(Limit::Unlimited);
    }
    value
        .parse()
        .map(Limit::At)
        .map_err(|e| malformed(file, "`max` or a decimal count", content, Some(e)))
}

/// One `key value` line of a flat-keyed file such as `memory.stat`.
pub fn parse_stat_key(
    file: &'static str,
    content: &str,
    key: &'static str,
) -> Result<u64, ParseError> {
    for line in content.lines() {
        let mut fields = line.split(' ');
        if fields.next() != Some(key) {
            continue;
        }
        return match (fields.next(), fields.next()) {
            (Some(value), None) => value
                .parse()
                .map_err(|e| malformed(file, "`<key> <decimal>` lines", line, Some(e))),
            _ => Err(malformed(file, "`<key> <decimal>` lines", line, None)),
        };
    }
    Err(ParseError::MissingKey { file, key })
}

/// The kubelet's working set: usage minus inactive file pages, never below 0.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// One reading of a cgroup's memory files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    pub usage: u64,
    pub limit: Limit,
    pub inactive_file: u64,
}

impl MemoryReading {
    pub fn working_set(&self) -> u64 {
        working_set(self.usage, self.inactive_file)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidsReading {
    pub current: u64,
    pub max: Limit,
}

/// How a file is read: `std::fs::read_to_string`, or through a descriptor held open.
pub type ReadFile<'a> = &'a dyn Fn(&Path) -> io::Result<String>;

fn read_parsed<T>(
    read: ReadFile,
    dir: &Path,
    file: &str,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, ReadError> {
    let path = dir.join(file);
    match read(&path) {
        Ok(content) => parse(&content).map_err(|source| ReadError::Parse { path, source }),
        Err(source) => Err(ReadError::Io { path, source }),
    }
}

/// Reads usage, limit and inactive file pages of the cgroup directory `dir` on a hierarchy of
/// `version`.
pub fn read_memory(dir: &Path, version: CgroupVersion) -> Result<MemoryReading, ReadError> {
    read_memory_with(&|p| std::fs::read_to_string(p), dir, version)
}

/// [`read_memory`], each file read through `read`.
pub fn read_memory_with(
    read: ReadFile,
    dir: &Path,
    version: CgroupVersion,
) -> Result<MemoryReading, ReadError> {
    let files = MemoryFiles::of(version);
    Ok(MemoryReading {
        usage: read_parsed(read, dir, files.usage, |c| parse_count(files.usage, c))?,
        limit: read_parsed(read, dir, files.limit, |c| parse_memory_limit(version, c))?,
        inactive_file: read_parsed(read, dir, files.stat, |c| {
            parse_stat_key(files.stat, c, files.inactive_file_key)
        })?,
    })
}

/// Reads the task count and limit of the cgroup directory `dir` (same files on v1 and v2).
pub fn read_pids(dir: &Path) -> Result<PidsReading, ReadError> {
    Ok(PidsReading {
        current: read_parsed(&|p| std::fs::read_to_string(p), dir, PIDS_CURRENT, |c| {
            parse_count(PIDS_CURRENT, c)
        })?,
        max: read_parsed(
            &|p| std::fs::read_to_string(p),
            dir,
            PIDS_MAX,
            parse_pids_max,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CgroupVersion::{V1, V2};

    #[test]
    fn parses_memory_limits_in_each_spelling() {
        #[rustfmt::skip]
        let rows = [
            ("v2 max is unlimited", V2, "max\n", Limit::Unlimited),
            ("v2 number is a limit", V2, "536870912\n", Limit::At(536_870_912)),
            ("v1 4 KiB page counter max is unlimited", V1, "9223372036854771712\n", Limit::Unlimited),
            ("v1 64 KiB page counter max is unlimited", V1, "9223372036854710272\n", Limit::Unlimited),
            ("v1 number is a limit", V1, "536870912\n", Limit::At(536_870_912)),
            ("v1 zero is a limit", V1, "0\n", Limit::At(0)),
            ("missing newline is fine", V2, "4096", Limit::At(4096)),
        ];
        for (name, version, content, want) in rows {
            let got =
                parse_memory_limit(version, content).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn rejects_bad_content_naming_the_file() {
        let long = "9".repeat(200);
        let quoted = format!("\"{}...\"", "9".repeat(QUOTE_MAX));
        #[rustfmt::skip]
        let rows: [(&str, Result<u64, ParseError>, String); 9] = [
            ("v1 does not spell max", parse_memory_limit(V1, "max\n").map(|_| 0),
                "memory.limit_in_bytes: expected a decimal count, found \"max\\n\"".to_owned()),
            ("negative usage", parse_count("memory.current", "-1\n"),
                "memory.current: expected a decimal count, found \"-1\\n\"".to_owned()),
            ("empty usage", parse_count("memory.usage_in_bytes", ""),
                "memory.usage_in_bytes: expected a decimal count, found \"\"".to_owned()),
            ("two lines", parse_count("pids.current", "1\n2\n"),
                "pids.current: expected a decimal count, found \"1\\n2\\n\"".to_owned()),
            ("garbage pids.max", parse_pids_max("unlimited\n").map(|_| 0),
                "pids.max: expected `max` or a decimal count, found \"unlimited\\n\"".to_owned()),
            ("overflowing count quoted short", parse_count("memory.current", &long),
                format!("memory.current: expected a decimal count, found {quoted}")),
            ("stat key missing", parse_stat_key(MEMORY_STAT, "anon 1\nfile 2\n", "inactive_file"),
                "memory.stat: no `inactive_file` line".to_owned()),
            ("stat value not a number", parse_stat_key(MEMORY_STAT, "inactive_file x\n", "inactive_file"),
                "memory.stat: expected `<key> <decimal>` lines, found \"inactive_file x\"".to_owned()),
            ("stat line with extra field", parse_stat_key(MEMORY_STAT, "inactive_file 1 2\n", "inactive_file"),
                "memory.stat: expected `<key> <decimal>` lines, found \"inactive_file 1 2\"".to_owned()),
        ];
        for (name, got, want) in rows {
            match got {
                Ok(v) => panic!("{name}: expected an error, got {v}"),
                Err(e) => assert_eq!(e.to_string(), want, "{name}"),
            }
        }
    }

    #[test]
    fn finds_stat_keys_exactly_and_floors_the_working_set() {
        let v1_stat = "cache 100\ninactive_file 7\ntotal_cache 300\ntotal_inactive_file 70\n";
        let key = MemoryFiles::of(V1).inactive_file_key;
        assert_eq!(parse_stat_key(MEMORY_STAT, v1_stat, key).ok(), Some(70));
        let v2_stat = "anon 5\nfile 9\nactive_file 2\ninactive_file 7\n";
        let key = MemoryFiles::of(V2).inactive_file_key;
        assert_eq!(parse_stat_key(MEMORY_STAT, v2_stat, key).ok(), Some(7));
        assert_eq!(working_set(100, 30), 70);
        assert_eq!(
            working_set(30, 100),
            0,
            "inactive_file above usage floors at 0"
        );
    }

    fn write_files(dir: &Path, files: &[(&str, &str)]) {
        for (name, content) in files {
            std::fs::write(dir.join(name), content).expect("writing fixture file");
        }
    }

    #[test]
    fn reads_v1_and_v2_cgroup_directories() {
        let v1 = tempfile::tempdir().expect("tempdir");
        write_files(
            v1.path(),
            &[
                ("memory.usage_in_bytes", "1000\n"),
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.stat", "inactive_file 10\ntotal_inactive_file 300\n"),
                ("pids.current", "12\n"),
                ("pids.max", "max\n"),
            ],
        );
        let v2 = tempfile::tempdir().expect("tempdir");
        write_files(
            v2.path(),
            &[
                ("memory.current", "2000\n"),
                ("memory.max", "4096\n"),
                ("memory.stat", "anon 1\ninactive_file 500\n"),
                ("pids.current", "3\n"),
                ("pids.max", "100\n"),
            ],
        );
        let m1 = read_memory(v1.path(), V1).expect("v1 memory");
        assert_eq!(
            m1,
            MemoryReading {
                usage: 1000,
                limit: Limit::Unlimited,
                inactive_file: 300
            }
        );
        assert_eq!(m1.working_set(), 700);
        let m2 = read_memory(v2.path(), V2).expect("v2 memory");
        assert_eq!(
            m2,
            MemoryReading {
                usage: 2000,
                limit: Limit::At(4096),
                inactive_file: 500
            }
        );
        assert_eq!(m2.working_set(), 1500);
        assert_eq!(
            read_pids(v1.path()).expect("v1 pids"),
            PidsReading {
                current: 12,
                max: Limit::Unlimited
            }
        );
        assert_eq!(
            read_pids(v2.path()).expect("v2 pids"),
            PidsReading {
                current: 3,
                max: Limit::At(100)
            }
        );
    }

    #[test]
    fn read_errors_name_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        // v1 files in a directory read as v2: memory.current is missing.
        write_files(
            dir.path(),
            &[("memory.usage_in_bytes", "1\n"), ("pids.current", "x\n")],
        );
        match read_memory(dir.path(), V2) {
            Err(ReadError::Io { path, source }) => {
                assert_eq!(path, dir.path().join("memory.current"));
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected a missing memory.current, got {other:?}"),
        }
        match read_pids(dir.path()) {
            Err(ReadError::Parse { path, source }) => {
                assert_eq!(path, dir.path().join("pids.current"));
                assert!(matches!(
                    source,
                    ParseError::Malformed {
                        file: "pids.current",
                        ..
                    }
                ));
            }
            other => panic!("expected a malformed pids.current, got {other:?}"),
        }
    }
}
