//! The records of kills on the node not yet taken by the API server, kept where a restarted
//! agent finds them: one file per pod in a directory that outlives the agent's process (the
//! DaemonSet's `emptyDir` at `/run/node-agent`, which a container restarted in place after a
//! crash, an OOM kill or SIGKILL finds as it was left). A kill's record is written there the
//! moment the pod is killed, before it is tried through the API, and removed once the API
//! server has taken it or it no longer applies; the next start writes what it finds. Without
//! it, an agent killed between its kill and its record left the pod ended with no word of why
//! (the kubelet ends it `Failed`, reason `Error`, exit code 137).
//!
//! The directory is the agent's own `emptyDir` of medium `Memory` (tmpfs), so its few small
//! file calls, some made from the loop's tasks, never wait on a disk or a network.
//!
//! What is read back is checked like any input: at most [`MAX_KEPT`] files of at most
//! [`MAX_FILE`] bytes, named by a UID, each a whole record; anything else is said and removed.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use node_agent_policy::{Eviction, OffendingContainer, Quantity, Resource};
use serde::{Deserialize, Serialize};

use crate::kill::KillTarget;

/// A record file's size, at most (a record with its message and containers is one or two
/// KiB).
pub const MAX_FILE: u64 = 16 * 1024;
/// Records kept at once, at most: with [`MAX_FILE`] well within the `emptyDir`'s 1 MiB
/// `sizeLimit` in practice (the kubelet would evict the agent's pod past it). A kill beyond is
/// carried out all the same, its record tried as before, only not kept.
pub const MAX_KEPT: usize = 128;

/// One pending record: the eviction as decided, the pod's cgroup as verified, and when it was
/// killed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    namespace: String,
    name: String,
    uid: String,
    signal: String,
    resource: String,
    hard: bool,
    grace_period_seconds: i64,
    message: String,
    offending_containers: Vec<(String, String)>,
    threshold_quantity: String,
    available: String,
    early: bool,
    cgroup: PathBuf,
    cgroup_id: u64,
    /// Milliseconds since the epoch.
    killed_at_ms: u64,
}

/// A record read back: the eviction, the pod's cgroup, and how long ago it was killed.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub eviction: Eviction,
    pub target: KillTarget,
    pub killed_ago: Duration,
}

/// The directory of pending records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    dir: PathBuf,
}

/// A UID as Kubernetes makes them (and nothing that could leave the directory).
fn is_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn resource(name: &str) -> Option<Resource> {
    [
        Resource::Memory,
        Resource::EphemeralStorage,
        Resource::Inodes,
        Resource::Pids,
    ]
    .into_iter()
    .find(|r| r.as_str() == name)
}

impl Entry {
    fn of(eviction: &Eviction, target: &KillTarget, killed_at: SystemTime) -> Self {
        Self {
            namespace: eviction.namespace.clone(),
            name: eviction.name.clone(),
            uid: target.pod_uid.clone(),
            signal: eviction.signal.to_string(),
            resource: eviction.resource.as_str().to_string(),
            hard: eviction.hard,
            grace_period_seconds: eviction.grace_period_seconds,
            message: eviction.message.clone(),
            offending_containers: eviction
                .offending_containers
                .iter()
                .map(|c| (c.name.clone(), c.usage.to_string()))
                .collect(),
            threshold_quantity: eviction.threshold_quantity.to_string(),
            available: eviction.available.to_string(),
            early: eviction.early,
            cgroup: target.cgroup.clone(),
            cgroup_id: target.cgroup_id,
            killed_at_ms: killed_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    fn pending(self, now: SystemTime) -> Result<Pending, String> {
        let quantity = |what: &str, text: &str| -> Result<Quantity, String> {
            text.parse()
                .map_err(|e| format!("{what} {text:?} is not a quantity: {e}"))
        };
        let offending = self
            .offending_containers
            .iter()
            .map(|(name, usage)| {
                Ok(OffendingContainer {
                    name: name.clone(),
                    usage: quantity("a container's usage", usage)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let killed_at = SystemTime::UNIX_EPOCH + Duration::from_millis(self.killed_at_ms);
        Ok(Pending {
            eviction: Eviction {
                namespace: self.namespace,
                name: self.name,
                uid: Some(self.uid.clone()),
                signal: self
                    .signal
                    .parse()
                    .map_err(|e| format!("signal {:?}: {e}", self.signal))?,
                resource: resource(&self.resource)
                    .ok_or_else(|| format!("resource {:?} is not one", self.resource))?,
                hard: self.hard,
                grace_period_seconds: self.grace_period_seconds,
                message: self.message,
                offending_containers: offending,
                threshold_quantity: quantity("the threshold", &self.threshold_quantity)?,
                available: quantity("the available figure", &self.available)?,
                early: self.early,
            },
            target: KillTarget {
                pod_uid: self.uid,
                cgroup: self.cgroup,
                cgroup_id: self.cgroup_id,
            },
            killed_ago: now.duration_since(killed_at).unwrap_or_default(),
        })
    }
}

impl Journal {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The journal in `records/` beside the trace socket: the DaemonSet's `emptyDir` at
    /// `/run/node-agent`, the one directory the agent writes.
    pub fn beside(trace_socket: &Path) -> Self {
        Self::new(
            trace_socket
                .parent()
                .unwrap_or_else(|| Path::new("/"))
                .join("records"),
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{uid}.json"))
    }

    /// Keeps the record of a kill until [`Journal::remove`]: written whole (a temporary file
    /// renamed), so a crash leaves the old file or the new one, never half of one.
    pub fn keep(
        &self,
        eviction: &Eviction,
        target: &KillTarget,
        killed_at: SystemTime,
    ) -> std::io::Result<()> {
        if !is_uid(&target.pod_uid) {
            return Err(std::io::Error::other(format!(
                "{:?} is not a pod UID",
                target.pod_uid
            )));
        }
        std::fs::create_dir_all(&self.dir)?;
        let kept = std::fs::read_dir(&self.dir)?.take(MAX_KEPT).count();
        if kept >= MAX_KEPT {
            return Err(std::io::Error::other(format!(
                "{MAX_KEPT} records are kept already"
            )));
        }
        let entry = Entry::of(eviction, target, killed_at);
        let text = serde_json::to_vec(&entry).map_err(std::io::Error::other)?;
        if text.len() as u64 > MAX_FILE {
            return Err(std::io::Error::other(format!(
                "the record is larger than {MAX_FILE} bytes"
            )));
        }
        let path = self.path(&target.pod_uid);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    }

    /// Forgets the record of pod `uid` (taken by the API server, or no longer applying).
    pub fn remove(&self, uid: &str) {
        if !is_uid(uid) {
            return;
        }
        match std::fs::remove_file(self.path(uid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %self.dir.display(), %uid, error = %e,
                "a written record could not be forgotten: the next start writes it again"),
        }
    }

    /// The records a previous run left, oldest first; what cannot be one is said and removed.
    pub fn pending(&self, now: SystemTime) -> Vec<Pending> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e,
                    "the records a previous run left cannot be read: they are not written");
                return Vec::new();
            }
        };
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let uid = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
                .filter(|uid| is_uid(uid))
                .map(str::to_string);
            let read = match &uid {
                Some(_) if found.len() >= MAX_KEPT => {
                    Err(format!("more than {MAX_KEPT} records are pending"))
                }
                Some(uid) => read_entry(&path)
                    .and_then(|e| {
                        if &e.uid == uid {
                            Ok(e)
                        } else {
                            Err(format!("it names pod UID {:?}", e.uid))
                        }
                    })
                    .and_then(|e| e.pending(now)),
                None => Err("not a record's name".into()),
            };
            match read {
                Ok(pending) => found.push(pending),
                Err(why) => {
                    tracing::warn!(file = %path.display(), %why,
                        "a pending record that cannot be read back: removed, not written");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.sort_by_key(|p| std::cmp::Reverse(p.killed_ago));
        found
    }
}

fn read_entry(path: &Path) -> Result<Entry, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!("larger than {MAX_FILE} bytes"));
    }
    serde_json::from_slice(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use node_agent_policy::{EvictionSignal, Signal};

    use super::*;

    fn eviction(uid: &str) -> (Eviction, KillTarget) {
        (
            Eviction {
                namespace: "shop".into(),
                name: "web".into(),
                uid: Some(uid.into()),
                signal: EvictionSignal::Threshold(Signal::MemoryAvailable),
                resource: Resource::Memory,
                hard: true,
                grace_period_seconds: 1,
                message: "The node was low on resource: memory. ".into(),
                offending_containers: vec![OffendingContainer {
                    name: "main".into(),
                    usage: "1200Mi".parse().unwrap(),
                }],
                threshold_quantity: "200Mi".parse().unwrap(),
                available: "150Mi".parse().unwrap(),
                early: false,
            },
            KillTarget {
                pod_uid: uid.into(),
                cgroup: "/sys/fs/cgroup/memory/kubepods/besteffort/pod1".into(),
                cgroup_id: 42,
            },
        )
    }

    #[test]
    fn a_kept_record_reads_back_as_it_was_until_it_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path().join("records"));
        let killed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let (e, t) = eviction("1b4e28ba-2fa1-11d2-883f-0016d3cca427");
        journal.keep(&e, &t, killed).unwrap();
        let later = killed + Duration::from_secs(7);
        let back = journal.pending(later);
        assert_eq!(
            back,
            [Pending {
                eviction: e.clone(),
                target: t.clone(),
                killed_ago: Duration::from_secs(7)
            }]
        );
        journal.remove(&t.pod_uid);
        assert!(journal.pending(later).is_empty());
    }

    #[test]
    fn what_is_not_a_record_is_removed_and_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        let now = SystemTime::now();
        let (e, t) = eviction("aaaa-1");
        journal.keep(&e, &t, now).unwrap();
        let uid = "bbbb-2";
        let cases: &[(&str, &[u8])] = &[
            ("bbbb-2.json", b"{\"namespace\": \"shop\""),
            ("cccc-3.json", b"[]"),
            ("../x.json", b"{}"),
            ("not a uid.json", b"{}"),
        ];
        for (name, text) in cases {
            let _ = std::fs::write(dir.path().join(name), text);
        }
        // A record whose file names another pod.
        let (e2, mut t2) = eviction(uid);
        t2.pod_uid = "dddd-4".into();
        journal.keep(&e2, &t2, now).unwrap();
        std::fs::rename(
            dir.path().join("dddd-4.json"),
            dir.path().join("eeee-5.json"),
        )
        .unwrap();
        // Too big.
        std::fs::write(
            dir.path().join("ffff-6.json"),
            vec![b' '; MAX_FILE as usize + 1],
        )
        .unwrap();

        let back = journal.pending(now);
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!(back[0].target.pod_uid, "aaaa-1");
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["aaaa-1.json"], "the rest removed");
        // Past MAX_KEPT, nothing more is kept.
        for i in 0..MAX_KEPT {
            let (e, t) = eviction(&format!("{i:04x}-f"));
            let _ = journal.keep(&e, &t, now);
        }
        assert_eq!(journal.pending(now).len(), MAX_KEPT);
        let (e, t) = eviction("ffff-f");
        assert!(journal.keep(&e, &t, now).is_err(), "the 129th is not kept");
        // A UID that is not one is never a file name.
        let (e3, mut t3) = eviction("x");
        t3.pod_uid = "../../etc/passwd".into();
        assert!(journal.keep(&e3, &t3, now).is_err());
    }
}
