//! A cache from cgroup id to cgroup path and pod, for one hierarchy.
//!
//! Kernel events name cgroups by id: a memory line's cgroup (the memcg's css, read by the
//! kernel programs) and the memory cgroup of an OOM victim are the kernfs id of the cgroup
//! directory in the hierarchy that holds the memory controller; `bpf_get_current_cgroup_id()`
//! is the v2 one. On 64-bit kernels that id is
//! the directory's inode number (`kernfs_id_ino()`, fs/kernfs/kernfs-internal.h), which
//! readdir also reports (`kernfs_fop_readdir()` passes `kernfs_ino(pos)` to `dir_emit()`), so a
//! walk costs one `getdents` per directory and no `stat` per entry.

use std::{
    collections::HashMap,
    io,
    os::unix::fs::DirEntryExt as _,
    path::{Path, PathBuf},
};

use super::{
    cgroup_id,
    kubepods::{self, PodCgroup},
};

/// How deep below the root the walk goes. The deepest kubelet shape, systemd under a
/// containerised node (`system.slice/docker-<id>.scope/kubelet.slice/kubelet-kubepods.slice/
/// <qos>.slice/<pod>.slice/<container>.scope`), is 7 deep.
pub const DEFAULT_MAX_DEPTH: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEntry {
    /// The path below the hierarchy's root; empty for the root itself.
    pub path: PathBuf,
    pub pod: Option<PodCgroup>,
}

/// What a [`CgroupIndex::refresh`] changed: ids to start and stop tracking. An id whose path
/// changed (inode reuse on a non-cgroup filesystem) is in both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<u64>,
    pub removed: Vec<u64>,
    /// Directories listed by their parent that were gone before they could be read.
    pub vanished: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("reading the cgroup root {path}")]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listing cgroup directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

#[derive(Debug)]
pub struct CgroupIndex {
    root: PathBuf,
    max_depth: usize,
    entries: HashMap<u64, CgroupEntry>,
    /// Directories that vanished during the last walk.
    vanished: usize,
}

impl CgroupIndex {
    /// Walks the hierarchy mounted (or rooted) at `root`, [`DEFAULT_MAX_DEPTH`] deep.
    pub fn scan(root: impl Into<PathBuf>) -> Result<Self, IndexError> {
        Self::scan_to_depth(root, DEFAULT_MAX_DEPTH)
    }

    pub fn scan_to_depth(root: impl Into<PathBuf>, max_depth: usize) -> Result<Self, IndexError> {
        let root = root.into();
        let (entries, vanished) = walk(&root, max_depth, |_| {})?;
        Ok(Self {
            root,
            max_depth,
            entries,
            vanished,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn lookup(&self, id: u64) -> Option<&CgroupEntry> {
        self.entries.get(&id)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Directories that vanished while the last scan or refresh walked the tree.
    pub fn vanished(&self) -> usize {
        self.vanished
    }

    /// Every cgroup in the index: `(id, entry)`.
    pub fn entries(&self) -> impl Iterator<Item = (u64, &CgroupEntry)> {
        self.entries.iter().map(|(id, entry)| (*id, entry))
    }

    /// Every cgroup that belongs to a pod: `(id, path, pod)`.
    pub fn pods(&self) -> impl Iterator<Item = (u64, &Path, &PodCgroup)> {
        self.entries.iter().filter_map(|(id, entry)| {
            let pod = entry.pod.as_ref()?;
            Some((*id, entry.path.as_path(), pod))
        })
    }

    /// Walks the tree again and reports which ids appeared and disappeared. On error the index
    /// keeps its previous contents.
    pub fn refresh(&mut self) -> Result<Changes, IndexError> {
        self.refresh_with(|_| {})
    }

    fn refresh_with(&mut self, before_read: impl FnMut(&Path)) -> Result<Changes, IndexError> {
        let (entries, vanished) = walk(&self.root, self.max_depth, before_read)?;
        let mut changes = Changes {
            vanished,
            ..Changes::default()
        };
        for (id, entry) in &entries {
            match self.entries.get(id) {
                Some(old) if old.path == entry.path => {}
                Some(_) => {
                    changes.removed.push(*id);
                    changes.added.push(*id);
                }
                None => changes.added.push(*id),
            }
        }
        changes.removed.extend(
            self.entries
                .keys()
                .filter(|id| !entries.contains_key(id))
                .copied(),
        );
        changes.added.sort_unstable();
        changes.removed.sort_unstable();
        self.entries = entries;
        self.vanished = vanished;
        Ok(changes)
    }
}

/// Depth-first walk from `root`. A directory is recorded once it has been listed (or, at
/// `max_depth`, once its parent listed it), so one removed between its parent's listing and its
/// own is counted as vanished, not indexed. `before_read` runs before each directory below the
/// root is listed; tests use it to remove directories mid-walk.
fn walk(
    root: &Path,
    max_depth: usize,
    mut before_read: impl FnMut(&Path),
) -> Result<(HashMap<u64, CgroupEntry>, usize), IndexError> {
    let root_id = cgroup_id(root).map_err(|source| IndexError::Root {
        path: root.to_owned(),
        source,
    })?;
    let mut entries = HashMap::new();
    let mut vanished = 0;
    // (id, path below root, depth)
    let mut stack = vec![(root_id, PathBuf::new(), 0usize)];
    while let Some((id, relative, depth)) = stack.pop() {
        if entries.contains_key(&id) {
            continue;
        }
        let dir = root.join(&relative);
        if depth > 0 {
            before_read(&dir);
        }
        if depth < max_depth {
            match list_subdirs(&dir) {
                Ok(children) => {
                    stack.extend(
                        children
                            .into_iter()
                            .map(|(child_id, name)| (child_id, relative.join(name), depth + 1)),
                    );
                }
                Err(source) if depth > 0 && is_gone(&source) => {
                    vanished += 1;
                    continue;
                }
                Err(source) if depth == 0 => return Err(IndexError::Root { path: dir, source }),
                Err(source) => return Err(IndexError::ReadDir { path: dir, source }),
            }
        }
        let pod = kubepods::parse(&relative);
        entries.insert(
            id,
            CgroupEntry {
                path: relative,
                pod,
            },
        );
    }
    Ok((entries, vanished))
}

/// A cgroup removed under us: the directory is gone, or kernfs reports it deactivated.
fn is_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(libc::ENODEV)
}

/// The subdirectories of `dir` with their inode numbers. Symlinks are not followed: cgroupfs has
/// none inside a hierarchy, and following them could loop.
fn list_subdirs(dir: &Path) -> io::Result<Vec<(u64, std::ffi::OsString)>> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_type = match entry.file_type() {
            Ok(file_type) => file_type,
            // DT_UNKNOWN falls back to lstat, which fails if the entry went away meanwhile.
            Err(e) if is_gone(&e) => continue,
            Err(e) => return Err(e),
        };
        if file_type.is_dir() {
            children.push((entry.ino(), entry.file_name()));
        }
    }
    Ok(children)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::cgroup::kubepods::{PodScope, QosClass};

    const UID: &str = "0c4a2c5e-7f0b-4f4e-9a55-3b1c1d2e3f40";
    const UID_: &str = "0c4a2c5e_7f0b_4f4e_9a55_3b1c1d2e3f40";
    const UID2: &str = "11111111-2222-3333-4444-555555555555";
    const CID: &str = "8d3b6f1c0a9e4b7d2c5f8a1e3b6d9c0f2a4e7b1d5c8f0a3e6b9d2c4f7a1e3b5d";
    const CID2: &str = "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999";

    fn mkdirs(root: &Path, relative: &str) -> PathBuf {
        let path = root.join(relative);
        fs::create_dir_all(&path).expect("creating fixture cgroup");
        path
    }

    fn id(path: &Path) -> u64 {
        cgroup_id(path).expect("fixture cgroup id")
    }

    /// A cgroupfs-driver tree with the files a real one holds beside its directories.
    fn cgroupfs_tree(root: &Path) -> Vec<PathBuf> {
        let dirs = [
            "system.slice/containerd.service".to_owned(),
            format!("kubepods/pod{UID}/{CID}"),
            format!("kubepods/burstable/pod{UID2}/crio-{CID2}"),
            format!("kubepods/burstable/pod{UID2}/crio-conmon-{CID2}"),
        ];
        for file in ["cgroup.procs", "memory.current"] {
            fs::write(root.join(file), "0\n").expect("fixture file");
        }
        dirs.iter().map(|d| mkdirs(root, d)).collect()
    }

    #[test]
    fn indexes_a_cgroupfs_tree_by_inode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let dirs = cgroupfs_tree(root);
        let index = CgroupIndex::scan(root).expect("scan");

        let root_entry = index.lookup(id(root)).expect("root indexed");
        assert_eq!(root_entry.path, PathBuf::new());
        assert_eq!(root_entry.pod, None);

        let container = index.lookup(id(&dirs[1])).expect("container indexed");
        assert_eq!(
            container.path,
            PathBuf::from(format!("kubepods/pod{UID}/{CID}"))
        );
        let pod = container.pod.as_ref().expect("container attributed");
        assert_eq!((pod.pod_uid.as_str(), pod.qos), (UID, QosClass::Guaranteed));
        assert_eq!(pod.container_id.as_deref(), Some(CID));

        let conmon = index.lookup(id(&dirs[3])).and_then(|e| e.pod.as_ref());
        let conmon = conmon.expect("conmon attributed");
        assert_eq!(
            (conmon.pod_uid.as_str(), conmon.qos),
            (UID2, QosClass::Burstable)
        );
        assert_eq!(conmon.container_id, None);
        assert!(matches!(conmon.scope, PodScope::Conmon { .. }));

        assert_eq!(index.lookup(id(&dirs[0])).map(|e| &e.pod), Some(&None));
        // root, system.slice, containerd.service, kubepods, pod, container, burstable, pod2,
        // crio, conmon; the files are not cgroups.
        assert_eq!(index.len(), 10);
        let mut pod_uids: Vec<&str> = index.pods().map(|(_, _, p)| p.pod_uid.as_str()).collect();
        pod_uids.sort_unstable();
        assert_eq!(pod_uids, [UID, UID, UID2, UID2, UID2]);
    }

    #[test]
    fn indexes_a_systemd_tree_by_inode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let pod_dir =
            format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice");
        let pod = mkdirs(root, &pod_dir);
        let container = mkdirs(root, &format!("{pod_dir}/cri-containerd-{CID}.scope"));
        mkdirs(root, "system.slice/kubelet.service");
        let index = CgroupIndex::scan(root).expect("scan");

        let got = index
            .lookup(id(&pod))
            .and_then(|e| e.pod.as_ref())
            .expect("pod");
        assert_eq!((got.pod_uid.as_str(), got.qos), (UID, QosClass::BestEffort));
        assert_eq!(got.scope, PodScope::Pod);
        let got = index
            .lookup(id(&container))
            .and_then(|e| e.pod.as_ref())
            .expect("container");
        assert_eq!(got.container_id.as_deref(), Some(CID));
        assert_eq!(got.runtime.as_deref(), Some("containerd"));
        assert_eq!(index.pods().count(), 2);
    }

    #[test]
    fn refresh_reports_added_and_removed_ids() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let dirs = cgroupfs_tree(root);
        let mut index = CgroupIndex::scan(root).expect("scan");
        assert_eq!(index.refresh().expect("idle refresh"), Changes::default());

        let removed = [id(&dirs[2]), id(&dirs[3])];
        // Create before removing: the filesystem under the temp dir may hand a freed inode
        // number straight to the next directory, which would be a changed path, not a new id.
        let new_pod = mkdirs(root, &format!("kubepods/besteffort/pod{UID}"));
        fs::remove_dir(&dirs[2]).expect("rm crio");
        fs::remove_dir(&dirs[3]).expect("rm conmon");
        let mut added = vec![id(&root.join("kubepods/besteffort")), id(&new_pod)];
        added.sort_unstable();
        let changes = index.refresh().expect("refresh");
        let mut want_removed = removed.to_vec();
        want_removed.sort_unstable();
        assert_eq!(
            changes,
            Changes {
                added,
                removed: want_removed,
                vanished: 0
            }
        );
        assert!(index.lookup(removed[0]).is_none());
        let got = index
            .lookup(id(&new_pod))
            .and_then(|e| e.pod.as_ref())
            .expect("new pod");
        assert_eq!(got.qos, QosClass::BestEffort);
    }

    #[test]
    fn a_directory_removed_mid_walk_is_skipped_and_counted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let dirs = cgroupfs_tree(root);
        let mut index = CgroupIndex::scan(root).expect("scan");
        // The burstable pod goes away after kubepods/burstable listed it but before it is read.
        let doomed = dirs[2].parent().expect("pod dir").to_owned();
        let doomed_ids = [id(&doomed), id(&dirs[2]), id(&dirs[3])];
        let changes = index
            .refresh_with(|dir| {
                if dir == doomed {
                    fs::remove_dir_all(&doomed).expect("removing the pod mid-walk");
                }
            })
            .expect("refresh survives the race");
        assert_eq!(changes.vanished, 1);
        assert_eq!(index.vanished(), 1);
        assert!(changes.added.is_empty());
        let mut want = doomed_ids.to_vec();
        want.sort_unstable();
        assert_eq!(changes.removed, want);
        assert!(doomed_ids.iter().all(|id| index.lookup(*id).is_none()));
        assert!(
            index.lookup(id(&dirs[1])).is_some(),
            "the rest is still indexed"
        );
    }

    #[test]
    fn stops_at_the_depth_bound_and_skips_symlinks() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let deep = mkdirs(root, "a/b/c");
        std::os::unix::fs::symlink(root, root.join("a/loop")).expect("symlink");
        let index = CgroupIndex::scan_to_depth(root, 2).expect("scan");
        assert!(
            index.lookup(id(&root.join("a/b"))).is_some(),
            "depth 2 recorded"
        );
        assert!(index.lookup(id(&deep)).is_none(), "depth 3 not walked");
        assert_eq!(index.len(), 3, "root, a, a/b; the symlink is no cgroup");
    }

    #[test]
    fn a_missing_root_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("absent");
        match CgroupIndex::scan(&root) {
            Err(IndexError::Root { path, source }) => {
                assert_eq!(path, root);
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected a root error, got {other:?}"),
        }
    }

    /// Scan cost on a node-sized tree (1000 pods x 3 containers, systemd driver). A figure, not
    /// an assertion: `cargo test -p node-agent --lib index_scan_figures -- --ignored --nocapture`.
    #[test]
    #[ignore = "benchmark: prints figures"]
    fn index_scan_figures() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        for pod in 0..1000u32 {
            let uid = format!("{pod:08x}_0000_0000_0000_000000000000");
            let pod_dir = format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
            );
            for container in 0..3u32 {
                mkdirs(
                    root,
                    &format!("{pod_dir}/cri-containerd-{pod:032x}{container:032x}.scope"),
                );
            }
        }
        let started = std::time::Instant::now();
        let mut index = CgroupIndex::scan(root).expect("scan");
        let scan = started.elapsed();
        let started = std::time::Instant::now();
        let changes = index.refresh().expect("refresh");
        let refresh = started.elapsed();
        assert!(changes.added.is_empty());
        println!(
            "{} cgroups ({} in pods): scan {scan:?}, refresh {refresh:?}",
            index.len(),
            index.pods().count()
        );
    }
}

/// When to walk cgroupfs again: as soon as the kernel said a cgroup came or went (marked
/// dirty), and otherwise only every `safety` interval, in case such an event was lost. Walking
/// a node's thousands of cgroups every second would cost more than everything else the agent
/// does while idle.
#[derive(Debug, Clone)]
pub struct RescanSchedule {
    dirty: bool,
    last: std::time::Instant,
    safety: std::time::Duration,
}

impl RescanSchedule {
    pub fn new(safety: std::time::Duration, now: std::time::Instant) -> Self {
        Self {
            dirty: false,
            last: now,
            safety,
        }
    }

    /// The kernel reported a cgroup created or removed.
    pub fn mark(&mut self) {
        self.dirty = true;
    }

    /// True when a rescan is due now; the caller then rescans.
    pub fn due(&mut self, now: std::time::Instant) -> bool {
        if self.dirty || now.duration_since(self.last) >= self.safety {
            self.dirty = false;
            self.last = now;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod schedule_tests {
    use std::time::{Duration, Instant};

    use super::RescanSchedule;

    #[test]
    fn rescans_when_marked_or_when_the_safety_interval_passed() {
        let t0 = Instant::now();
        let mut s = RescanSchedule::new(Duration::from_secs(60), t0);
        assert!(!s.due(t0 + Duration::from_secs(1)), "idle: no walk");
        s.mark();
        assert!(s.due(t0 + Duration::from_secs(2)), "a cgroup came or went");
        assert!(!s.due(t0 + Duration::from_secs(3)), "once per mark");
        assert!(
            s.due(t0 + Duration::from_secs(62)),
            "safety interval from the last walk"
        );
        assert!(!s.due(t0 + Duration::from_secs(63)));
    }
}
