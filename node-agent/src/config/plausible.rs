//! Agent settings that parse but cannot be meant, refused with the reason.
//!
//! Two kinds of check:
//! - on the values alone ([`memory_bytes`], [`ring_bytes`]), called while the file is
//!   validated, so `check-config` makes them anywhere: a memory figure implausibly small for a
//!   node; a ring buffer that is not a power of two or past [`MAX_RING_BYTES`];
//! - against the node ([`on_this_machine`], [`check_on_machine`]), at start and on every
//!   reload, and by `check-config --on-node`: the node cgroup exists, `nodefsPath` and
//!   `imagefsPath` are directories, `memoryCapacity` is not below what the node already uses
//!   (every memory threshold would be met at once), and the ring buffer fits the agent's own
//!   memory limit (the kernel charges it to the agent's cgroup). Only the node can answer
//!   these: a config checked elsewhere is checked without them (and says so).

use std::path::{Path, PathBuf};

use node_agent_policy::ByteSize;

use super::{AgentConfig, ConfigError, Settings};
use crate::cgroup::{
    paths::{self, Limit},
    CgroupVersion, Hierarchy, Layout,
};

/// No node runs Kubernetes in less; a smaller capacity is a typo (`64M` for `64Mi`).
pub const MIN_MEMORY_CAPACITY: i64 = 64 << 20;
/// 1 MiB (the default) holds about 15,000 events; past 256 MiB the ring only pins memory.
pub const MAX_RING_BYTES: u32 = 256 << 20;
/// The ring buffer may take at most this share of the agent's memory limit (1/2): the agent
/// itself needs the rest.
const RING_SHARE_OF_LIMIT: u64 = 2;

fn field(path: &'static str, problem: String) -> ConfigError {
    ConfigError::Invalid { path, problem }
}

/// A node's amount of memory in field `name` (`memoryCapacity`, `allocatableMemory`): from
/// [`MIN_MEMORY_CAPACITY`] up (the size type already holds it to whole bytes within int64).
pub fn memory_bytes(name: &'static str, size: ByteSize) -> Result<i64, ConfigError> {
    let bytes = i64::try_from(size.bytes())
        .map_err(|_| field(name, format!("{size} is beyond what 64 bits of bytes hold")))?;
    if bytes == 0 {
        return Err(field(name, format!("{size} must be positive")));
    }
    if bytes < MIN_MEMORY_CAPACITY {
        return Err(field(
            name,
            format!("{size} is {bytes} bytes, less than any node runs on (at least 64Mi); did you mean Mi or Gi?"),
        ));
    }
    Ok(bytes)
}

/// `ringBufferSize`: a power of two from 4Ki to [`MAX_RING_BYTES`].
pub fn ring_bytes(size: ByteSize) -> Result<u32, ConfigError> {
    let bytes = size.bytes();
    if !bytes.is_power_of_two() || bytes < 4096 {
        return Err(field(
            "ringBufferSize",
            format!("{size} ({bytes} bytes) must be a power of two of at least 4Ki"),
        ));
    }
    match u32::try_from(bytes) {
        Ok(ring) if ring <= MAX_RING_BYTES => Ok(ring),
        _ => Err(field(
            "ringBufferSize",
            format!("{size} is more than 256Mi: the kernel pins the whole ring in memory charged to the agent, and 1Mi already holds about 15,000 events"),
        )),
    }
}

/// The node cgroup's directory in the memory hierarchy.
pub fn node_dir(layout: &Layout, config: &AgentConfig) -> PathBuf {
    let cg = &config.settings.node_cgroup;
    layout
        .memory
        .mount()
        .join(cg.strip_prefix("/").unwrap_or(cg))
}

/// Every check that needs the node, as the agent makes them before it loads anything: the
/// node cgroup exists, then [`check_on_machine`]. Returns the node cgroup's directory.
pub fn on_this_machine(config: &AgentConfig, layout: &Layout) -> Result<PathBuf, ConfigError> {
    let node_dir = node_dir(layout, config);
    if !node_dir.is_dir() {
        return Err(ConfigError::NodeCgroup(node_dir));
    }
    check_on_machine(&config.settings, &layout.memory, &node_dir)?;
    Ok(node_dir)
}

/// Whether `dir` is a directory, asked of a helper process: it is the kubelet's filesystem,
/// which may hang. `Err` says why it could not be told (no answer within the helper's
/// deadline, or no helper to ask): never asked in the agent itself.
pub fn is_dir(dir: &Path) -> Result<bool, String> {
    use crate::fs_helper::{ask, Answer, Request};
    match ask(&Request::IsDir(dir.into())) {
        Ok(Answer::IsDir(is)) => is.map_err(|e| format!("{}: {e}", dir.display())),
        Ok(other) => Err(format!("the filesystem helper answered {other:?}")),
        Err(e) => Err(crate::error_chain(&e)),
    }
}

/// A filesystem path the agent will statvfs: it must be a directory that exists now. One that
/// cannot be told now (a filesystem that does not answer: the agent's probe will say so, and
/// its signals are unknown meanwhile) is taken as written, with a warning: a hung mount
/// neither stops the agent from starting nor holds up a reload (the emergency dry run).
fn existing_dir(path: &'static str, dir: &Path) -> Result<(), ConfigError> {
    let is = match is_dir(dir) {
        Ok(is) => is,
        Err(why) => {
            tracing::warn!(setting = path, path = %dir.display(), reason = %why,
                "could not be checked now; taken as written");
            return Ok(());
        }
    };
    if !is {
        return Err(field(
            path,
            format!(
                "{} is not an existing directory on this node",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// What the checks need to know about the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The node cgroup's working set (usage − inactive file), when `memoryCapacity` is set.
    pub node_working_set: Option<(PathBuf, u64)>,
    /// The tightest memory limit on the agent's own cgroup and its ancestors, if any.
    pub agent_memory_limit: Option<(PathBuf, u64)>,
}

/// Reads the machine, then checks `settings` against it (see the module's documentation).
/// `node_dir` is the node cgroup's directory in `memory`.
pub fn check_on_machine(
    settings: &Settings,
    memory: &Hierarchy,
    node_dir: &Path,
) -> Result<(), ConfigError> {
    existing_dir("nodefsPath", &settings.nodefs_path)?;
    if let Some(imagefs) = &settings.imagefs_path {
        existing_dir("imagefsPath", imagefs)?;
    }
    let node_working_set = match settings.memory_capacity {
        None => None,
        Some(_) => Some((
            node_dir.to_path_buf(),
            working_set(memory, node_dir).map_err(|problem| {
                field(
                    "memoryCapacity",
                    format!("cannot be checked against the node's memory in use: {problem}"),
                )
            })?,
        )),
    };
    let machine = Machine {
        node_working_set,
        agent_memory_limit: own_memory_limit(memory),
    };
    check(settings, &machine)
}

/// The checks against a [`Machine`] already read.
pub fn check(settings: &Settings, machine: &Machine) -> Result<(), ConfigError> {
    if let (Some(capacity), Some((dir, in_use))) =
        (settings.memory_capacity, &machine.node_working_set)
    {
        if u64::try_from(capacity).is_ok_and(|c| c < *in_use) {
            return Err(field(
                "memoryCapacity",
                format!(
                    "{capacity} bytes is below the {in_use} bytes the node already uses (working set of {}): memory.available would be negative and every memory threshold met at once",
                    dir.display()
                ),
            ));
        }
    }
    if let Some((dir, limit)) = &machine.agent_memory_limit {
        let ring = u64::from(settings.ring_bytes);
        if ring > limit / RING_SHARE_OF_LIMIT {
            return Err(field(
                "ringBufferSize",
                format!(
                    "{ring} is more than half of the agent's memory limit ({limit} bytes on {}); the kernel charges the ring buffer to the agent",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The working set of the node cgroup, as the daemon computes `memory.available` from it.
fn working_set(memory: &Hierarchy, node_dir: &Path) -> Result<u64, String> {
    // The v2 root has no memory.current: there the machine's figures stand in.
    if node_dir == memory.mount() && memory.version() == CgroupVersion::V2 {
        let text = std::fs::read_to_string("/proc/meminfo")
            .map_err(|e| format!("reading /proc/meminfo: {e}"))?;
        let mem = crate::sys::parse_meminfo(&text).map_err(|e| format!("/proc/meminfo: {e}"))?;
        return Ok(mem
            .total
            .saturating_sub(mem.free)
            .saturating_sub(mem.inactive_file));
    }
    paths::read_memory(node_dir, memory.version())
        .map(|reading| reading.working_set())
        .map_err(|e| crate::error_chain(&e))
}

/// The tightest memory limit on this process's cgroup in `memory` and its ancestors. `None`
/// when there is none, or when the cgroup is not visible in the mounted hierarchy (a private
/// cgroup namespace over the host's mount): then nothing is refused for it.
fn own_memory_limit(memory: &Hierarchy) -> Option<(PathBuf, u64)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let relative = own_cgroup(&text, memory.version())?;
    let mount = memory.mount();
    let mut dir = mount.join(relative.trim_start_matches('/'));
    if !dir.is_dir() {
        return None;
    }
    let file = match memory.version() {
        CgroupVersion::V1 => "memory.limit_in_bytes",
        CgroupVersion::V2 => "memory.max",
    };
    let mut tightest: Option<(PathBuf, u64)> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| paths::parse_memory_limit(memory.version(), &text).ok());
        if let Some(Limit::At(bytes)) = limit {
            if tightest.as_ref().is_none_or(|(_, t)| bytes < *t) {
                tightest = Some((dir.clone(), bytes));
            }
        }
        if dir == mount || !dir.pop() || !dir.starts_with(mount) {
            return tightest;
        }
    }
}

/// This process's cgroup path on a hierarchy of `version`, from `/proc/self/cgroup`: the v2
/// line `0::/path`, or the v1 line whose controllers include `memory`.
fn own_cgroup(proc_self_cgroup: &str, version: CgroupVersion) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match version {
            CgroupVersion::V2 => id == "0" && controllers.is_empty(),
            CgroupVersion::V1 => controllers.split(',').any(|c| c == "memory"),
        };
        wanted.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{tests::doc, AgentConfig, Overrides};

    fn settings(memory_capacity: Option<i64>, ring_bytes: u32) -> Settings {
        let mut settings = AgentConfig::standalone(&Overrides::default())
            .expect("defaults")
            .settings;
        settings.memory_capacity = memory_capacity;
        settings.ring_bytes = ring_bytes;
        settings
    }

    use crate::error_chain as chain;

    #[test]
    fn suspicious_settings_in_the_file_are_refused_with_the_reason() {
        #[rustfmt::skip]
        let rows: &[(&str, Option<&str>)] = &[
            ("memoryCapacity: 1Gi", None),
            ("memoryCapacity: 64Mi", None),
            ("memoryCapacity: 1m", Some("config: memoryCapacity: \"1m\" is not a size as a Kubernetes quantity such as 512Mi or 8Gi: is not a whole number of bytes")),
            ("memoryCapacity: '1'", Some("config: memoryCapacity: 1 is 1 bytes, less than any node runs on")),
            ("memoryCapacity: 64M", Some("less than any node runs on")),
            ("memoryCapacity: 20E", Some("config: memoryCapacity: \"20E\" is not a size as a Kubernetes quantity such as 512Mi or 8Gi: is beyond what 64 bits of bytes hold")),
            ("memoryCapacity: -1Gi", Some("config: memoryCapacity: \"-1Gi\" is not a size as a Kubernetes quantity such as 512Mi or 8Gi: must not be negative")),
            ("memoryCapacity: 0", Some("config: memoryCapacity: 0 must be positive")),
            ("memoryCapacity: lots", Some("config: memoryCapacity: \"lots\"")),
            ("ringBufferSize: 4Ki", None),
            ("ringBufferSize: 4096", None),
            ("ringBufferSize: 256Mi", None),
            ("ringBufferSize: 2Gi", Some("config: ringBufferSize: 2Gi is more than 256Mi")),
            ("ringBufferSize: 536870912", Some("config: ringBufferSize: 536870912 is more than 256Mi")),
            ("ringBufferSize: 1000", Some("config: ringBufferSize: 1k (1000 bytes) must be a power of two")),
            ("ringBufferSize: 2Ki", Some("config: ringBufferSize: 2Ki (2048 bytes) must be a power of two of at least 4Ki")),
        ];
        for (text, expected) in rows {
            let parsed = AgentConfig::parse(&doc(text), &Overrides::default());
            match (parsed, expected) {
                (Ok(_), None) => {}
                (Ok(_), Some(needle)) => panic!("{text}: accepted, expected {needle:?}"),
                (Err(e), None) => panic!("{text}: refused: {}", chain(&e)),
                (Err(e), Some(needle)) => {
                    let chain = chain(&e);
                    assert!(chain.contains(needle), "{text}: {chain}");
                }
            }
        }
    }

    #[test]
    fn settings_are_checked_against_the_machine() {
        let node = PathBuf::from("/sys/fs/cgroup/memory/node");
        let agent = PathBuf::from("/sys/fs/cgroup/memory/agent");
        let machine = |working_set: Option<u64>, limit: Option<u64>| Machine {
            node_working_set: working_set.map(|w| (node.clone(), w)),
            agent_memory_limit: limit.map(|l| (agent.clone(), l)),
        };
        #[rustfmt::skip]
        let rows: &[(&str, Settings, Machine, Option<&str>)] = &[
            ("capacity above the node's use", settings(Some(8 << 30), 1 << 20), machine(Some(3 << 30), None), None),
            ("capacity equal to the node's use", settings(Some(3 << 30), 1 << 20), machine(Some(3 << 30), None), None),
            ("capacity below the node's use", settings(Some(1 << 30), 1 << 20), machine(Some(3 << 30), None),
             Some("config: memoryCapacity: 1073741824 bytes is below the 3221225472 bytes the node already uses (working set of /sys/fs/cgroup/memory/node)")),
            ("no capacity set: nothing to compare", settings(None, 1 << 20), machine(None, None), None),
            ("ring within half the agent's limit", settings(None, 128 << 20), machine(None, Some(256 << 20)), None),
            ("ring past half the agent's limit", settings(None, 256 << 20), machine(None, Some(256 << 20)),
             Some("config: ringBufferSize: 268435456 is more than half of the agent's memory limit (268435456 bytes on /sys/fs/cgroup/memory/agent)")),
            ("no limit known: any valid ring", settings(None, 256 << 20), machine(None, None), None),
        ];
        for (behaviour, settings, machine, expected) in rows {
            match (check(settings, machine), expected) {
                (Ok(()), None) => {}
                (Ok(()), Some(needle)) => panic!("{behaviour}: accepted, expected {needle:?}"),
                (Err(e), None) => panic!("{behaviour}: refused: {e}"),
                (Err(e), Some(needle)) => {
                    assert!(e.to_string().contains(needle), "{behaviour}: {e}")
                }
            }
        }
    }

    #[test]
    fn the_own_cgroup_is_found_for_either_version() {
        let text = "12:pids:/user.slice\n4:cpu,cpuacct:/x\n9:memory:/kubepods/pod1/c1\n0::/system.slice/a.service\n";
        assert_eq!(
            own_cgroup(text, CgroupVersion::V1).as_deref(),
            Some("/kubepods/pod1/c1")
        );
        assert_eq!(
            own_cgroup(text, CgroupVersion::V2).as_deref(),
            Some("/system.slice/a.service")
        );
        assert_eq!(own_cgroup("1:name=systemd:/\n", CgroupVersion::V1), None);
    }

    #[test]
    fn this_machine_is_read_and_a_tiny_capacity_refused() {
        let layout = crate::cgroup::detect().expect("cgroups");
        let root = layout.memory.mount().to_path_buf();
        let in_use = working_set(&layout.memory, &root).expect("the root's working set");
        assert!(in_use > 0, "the machine uses some memory");

        // Parsing allows 64Mi; a machine that runs these tests uses more than that.
        assert!(in_use > 64 << 20, "{in_use} bytes in use at the root");
        let small = settings(Some(MIN_MEMORY_CAPACITY), 1 << 20);
        let error =
            check_on_machine(&small, &layout.memory, &root).expect_err("below the machine's use");
        assert!(error.to_string().contains("already uses"), "{error}");
        let ample = settings(Some(i64::MAX), 1 << 20);
        check_on_machine(&ample, &layout.memory, &root).expect("above the machine's use");
    }

    #[test]
    fn what_only_the_node_can_answer_is_checked_on_it() {
        let layout = crate::cgroup::detect().expect("cgroups");
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().display();
        #[rustfmt::skip]
        let rows: Vec<(String, Option<String>)> = vec![
            (format!("nodefsPath: {here}\nimagefsPath: {here}"), None),
            ("nodeCgroup: /node-agent-no-such-cgroup".into(),
             Some(format!("config: nodeCgroup: no cgroup at {}", layout.memory.mount().join("node-agent-no-such-cgroup").display()))),
            ("nodefsPath: /nonexistent/kubelet".into(),
             Some("config: nodefsPath: /nonexistent/kubelet is not an existing directory on this node".into())),
            (format!("nodefsPath: {here}\nimagefsPath: /nonexistent/images"),
             Some("config: imagefsPath: /nonexistent/images is not an existing directory on this node".into())),
            ("memoryCapacity: 64Mi".into(), Some("config: memoryCapacity: 67108864 bytes is below the".into())),
        ];
        for (text, expected) in rows {
            // The file itself is valid anywhere: only the node refuses it.
            let config = AgentConfig::parse(&doc(&text), &Overrides::default())
                .unwrap_or_else(|e| panic!("{text}: {}", chain(&e)));
            match (on_this_machine(&config, &layout), expected) {
                (Ok(node_dir), None) => assert_eq!(node_dir, layout.memory.mount()),
                (Err(e), Some(needle)) => {
                    assert!(chain(&e).contains(&needle), "{text}: {}", chain(&e))
                }
                (got, want) => panic!("{text}: {got:?}, expected {want:?}"),
            }
        }
    }
}
