//! Which pod (and container) a cgroup belongs to, read from the kubelet's cgroup naming.
//!
//! The kubelet names pod cgroups after its cgroup driver (kubelet `pkg/kubelet/cm/cgroup_manager_linux.go`,
//! `qos_container_manager_linux.go`, `pod_container_manager_linux.go`):
//!
//! | driver   | QoS        | pod cgroup                                                           |
//! |----------|------------|----------------------------------------------------------------------|
//! | cgroupfs | Guaranteed | `kubepods/pod<uid>`                                                  |
//! | cgroupfs | Burstable  | `kubepods/burstable/pod<uid>`                                        |
//! | systemd  | Guaranteed | `kubepods.slice/kubepods-pod<uid_>.slice`                            |
//! | systemd  | Burstable  | `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice` |
//!
//! BestEffort is Burstable's shape with `besteffort`. `<uid_>` is the pod UID with `-` written as
//! `_`, because systemd reads `-` in a slice name as a parent separator. A kubelet `cgroupRoot`
//! other than `/` adds a prefix: `kubelet/kubepods/...` (cgroupfs) or
//! `kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/...` (systemd), and a node
//! running inside a container (kind) adds the container's own cgroup before that.
//!
//! Below the pod cgroup the container runtime creates one cgroup per container: a bare id under
//! cgroupfs (containerd, docker), `crio-<id>` (CRI-O under cgroupfs), or a systemd scope
//! `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`. CRI-O also puts each
//! container's monitor process in `crio-conmon-<id>.scope`.

use std::path::{Component, Path, PathBuf};

/// The kubelet's pods cgroup as it names it directly below its cgroup root: `kubepods` with
/// the cgroupfs driver, `kubepods.slice` with systemd's.
pub const KUBEPODS: [&str; 2] = ["kubepods", "kubepods.slice"];

/// The kubelet's pods cgroup directly below `node_dir` (a directory in a cgroup hierarchy), if
/// there is one.
pub fn kubepods_dir(node_dir: &Path) -> Option<PathBuf> {
    KUBEPODS
        .iter()
        .map(|k| node_dir.join(k))
        .find(|d| d.is_dir())
}

/// The pod's quality-of-service class, as the kubelet placed its cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// What part of a pod a cgroup is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PodScope {
    /// The pod's own cgroup: its usage sums all of its containers.
    Pod,
    /// A container's cgroup, or a cgroup nested inside one (`crio-<id>.scope/container`).
    Container,
    /// CRI-O's `conmon` monitor for the container `container_id`. Its memory and tasks are
    /// charged to the pod but are not the container's (cAdvisor does not count them in the
    /// container's figures), so [`PodCgroup::container_id`] stays `None`: an OOM kill of conmon
    /// is reported against the pod, never blamed on the container.
    Conmon { container_id: String },
    /// A child of the pod cgroup whose name is no container shape this module knows.
    Other,
}

/// The pod a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodCgroup {
    /// The canonical pod UID: `8-4-4-4-12` hex for API pods, 32 hex digits for static pods
    /// (the kubelet derives those from an MD5 of the manifest).
    pub pod_uid: String,
    pub qos: QosClass,
    /// The container id, when the cgroup is a container's ([`PodScope::Container`]).
    pub container_id: Option<String>,
    /// The runtime named by the cgroup, spelled as in the pod status' `containerID` scheme
    /// (`containerd`, `cri-o`, `docker`), so `{runtime}://{container_id}` matches it. `None` when
    /// the name does not say (cgroupfs driver with containerd or docker: a bare id).
    pub runtime: Option<String>,
    pub scope: PodScope,
}

/// Reads the pod out of a cgroup path relative to its hierarchy's root (a leading `/` is
/// ignored). Returns `None` for anything that is not a pod's cgroup or below one: system
/// cgroups, `kubepods` itself, the QoS cgroups, and names that break the kubelet's shapes.
pub fn parse(path: &Path) -> Option<PodCgroup> {
    let names = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_str()),
            _ => None,
        })
        .collect::<Option<Vec<&str>>>()?;
    let at = names.iter().position(|name| is_kubepods(name))?;
    let below = &names[at + 1..];
    let (pod_uid, qos, rest) = match names[at].strip_suffix(".slice") {
        Some(slice) => systemd_pod(slice, below)?,
        None => cgroupfs_pod(below)?,
    };
    let (scope, container_id, runtime) = match rest.first() {
        None => (PodScope::Pod, None, None),
        Some(name) => container(name),
    };
    Some(PodCgroup {
        pod_uid,
        qos,
        container_id,
        runtime: runtime.map(str::to_owned),
        scope,
    })
}

/// The pods cgroup anywhere in a path: one of [`KUBEPODS`], or below a `cgroupRoot` other than
/// `/` under systemd (`kubelet-kubepods.slice`).
fn is_kubepods(name: &str) -> bool {
    KUBEPODS.contains(&name) || name.ends_with("-kubepods.slice")
}

/// `[burstable|besteffort/]pod<uid>/...` below `kubepods`.
fn cgroupfs_pod<'a>(below: &'a [&'a str]) -> Option<(String, QosClass, &'a [&'a str])> {
    let (qos, below) = match *below.first()? {
        "burstable" => (QosClass::Burstable, &below[1..]),
        "besteffort" => (QosClass::BestEffort, &below[1..]),
        _ => (QosClass::Guaranteed, below),
    };
    let uid = below.first()?.strip_prefix("pod")?;
    is_pod_uid(uid).then(|| (uid.to_owned(), qos, &below[1..]))
}

/// Below `<slice>.slice`: `<slice>-pod<uid_>.slice/...` or
/// `<slice>-<qos>.slice/<slice>-<qos>-pod<uid_>.slice/...`.
fn systemd_pod<'a>(slice: &str, below: &'a [&'a str]) -> Option<(String, QosClass, &'a [&'a str])> {
    let child = below.first()?.strip_suffix(".slice")?;
    let unit = child.strip_prefix(slice)?.strip_prefix('-')?;
    let (qos, pod_unit, below) = match unit {
        "burstable" | "besteffort" => {
            let qos = if unit == "burstable" {
                QosClass::Burstable
            } else {
                QosClass::BestEffort
            };
            let pod_unit = below.get(1)?.strip_suffix(".slice")?;
            let pod_unit = pod_unit.strip_prefix(child)?.strip_prefix('-')?;
            (qos, pod_unit, &below[2..])
        }
        _ => (QosClass::Guaranteed, unit, &below[1..]),
    };
    let escaped = pod_unit.strip_prefix("pod")?;
    if escaped.contains('-') {
        return None;
    }
    let uid = escaped.replace('_', "-");
    is_pod_uid(&uid).then_some((uid, qos, below))
}

/// A pod UID as the API server (`8-4-4-4-12` hex UUID) or the kubelet for a static pod
/// (32 hex digits) writes it.
fn is_pod_uid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    let hex = groups
        .iter()
        .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()));
    hex && (lengths == [8, 4, 4, 4, 12] || lengths == [32])
}

/// The container runtimes' cgroup name prefixes and the runtime each names. `crio-conmon-` is
/// matched before these, in [`container`].
const RUNTIME_PREFIXES: [(&str, &str); 3] = [
    ("cri-containerd-", "containerd"),
    ("crio-", "cri-o"),
    ("docker-", "docker"),
];

fn container(name: &str) -> (PodScope, Option<String>, Option<&'static str>) {
    let (base, is_scope) = match name.strip_suffix(".scope") {
        Some(base) => (base, true),
        None => (name, false),
    };
    if let Some(id) = base.strip_prefix("crio-conmon-") {
        if is_container_id(id) {
            let scope = PodScope::Conmon {
                container_id: id.to_owned(),
            };
            return (scope, None, Some("cri-o"));
        }
        return (PodScope::Other, None, None);
    }
    for (prefix, runtime) in RUNTIME_PREFIXES {
        if let Some(id) = base.strip_prefix(prefix) {
            if is_container_id(id) {
                return (PodScope::Container, Some(id.to_owned()), Some(runtime));
            }
            return (PodScope::Other, None, None);
        }
    }
    if !is_scope && is_container_id(base) {
        return (PodScope::Container, Some(base.to_owned()), None);
    }
    (PodScope::Other, None, None)
}

/// containerd, CRI-O and docker all name containers with 64 hex digits; anything hex up to that
/// length is accepted so shortened ids from test runtimes still attribute.
fn is_container_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0c4a2c5e-7f0b-4f4e-9a55-3b1c1d2e3f40";
    const UID_: &str = "0c4a2c5e_7f0b_4f4e_9a55_3b1c1d2e3f40";
    const STATIC_UID: &str = "2f5f9f5a8c3c2e6d7a0a3d5c1e2b4a6f";
    const CID: &str = "8d3b6f1c0a9e4b7d2c5f8a1e3b6d9c0f2a4e7b1d5c8f0a3e6b9d2c4f7a1e3b5d";

    /// pod uid, QoS, container id, runtime, scope.
    type Want = (
        &'static str,
        QosClass,
        Option<&'static str>,
        Option<&'static str>,
        PodScope,
    );

    struct Row {
        name: &'static str,
        path: String,
        want: Option<Want>,
    }

    fn row(name: &'static str, path: String, want: Option<Want>) -> Row {
        Row { name, path, want }
    }

    #[test]
    fn reads_pod_and_container_from_every_kubelet_layout() {
        use PodScope::{Container, Other, Pod};
        use QosClass::{BestEffort, Burstable, Guaranteed};
        let conmon = || PodScope::Conmon {
            container_id: CID.to_owned(),
        };
        #[rustfmt::skip]
        let rows = [
            // cgroupfs driver
            row("cgroupfs guaranteed pod", format!("/kubepods/pod{UID}"), Some((UID, Guaranteed, None, None, Pod))),
            row("cgroupfs guaranteed container, bare id", format!("/kubepods/pod{UID}/{CID}"), Some((UID, Guaranteed, Some(CID), None, Container))),
            row("cgroupfs burstable pod", format!("/kubepods/burstable/pod{UID}"), Some((UID, Burstable, None, None, Pod))),
            row("cgroupfs burstable container", format!("/kubepods/burstable/pod{UID}/{CID}"), Some((UID, Burstable, Some(CID), None, Container))),
            row("cgroupfs besteffort container", format!("/kubepods/besteffort/pod{UID}/{CID}"), Some((UID, BestEffort, Some(CID), None, Container))),
            row("cgroupfs CRI-O container", format!("/kubepods/burstable/pod{UID}/crio-{CID}"), Some((UID, Burstable, Some(CID), Some("cri-o"), Container))),
            row("cgroupfs CRI-O conmon", format!("/kubepods/burstable/pod{UID}/crio-conmon-{CID}"), Some((UID, Burstable, None, Some("cri-o"), conmon()))),
            row("cgroupfs relative path without leading slash", format!("kubepods/pod{UID}"), Some((UID, Guaranteed, None, None, Pod))),
            row("cgroupfs under kubelet cgroupRoot", format!("/kubelet/kubepods/besteffort/pod{UID}/{CID}"), Some((UID, BestEffort, Some(CID), None, Container))),
            row("cgroupfs under a node container (kind)", format!("/docker/{CID}/kubepods/pod{UID}"), Some((UID, Guaranteed, None, None, Pod))),
            row("cgroupfs static pod uid", format!("/kubepods/burstable/pod{STATIC_UID}/{CID}"), Some((STATIC_UID, Burstable, Some(CID), None, Container))),
            row("cgroupfs nested below a container", format!("/kubepods/pod{UID}/{CID}/sub"), Some((UID, Guaranteed, Some(CID), None, Container))),
            row("cgroupfs unknown child of a pod", format!("/kubepods/pod{UID}/not-a-container"), Some((UID, Guaranteed, None, None, Other))),
            // systemd driver
            row("systemd guaranteed pod", format!("/kubepods.slice/kubepods-pod{UID_}.slice"), Some((UID, Guaranteed, None, None, Pod))),
            row("systemd guaranteed containerd", format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"), Some((UID, Guaranteed, Some(CID), Some("containerd"), Container))),
            row("systemd burstable pod", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"), Some((UID, Burstable, None, None, Pod))),
            row("systemd burstable containerd", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"), Some((UID, Burstable, Some(CID), Some("containerd"), Container))),
            row("systemd burstable CRI-O", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope"), Some((UID, Burstable, Some(CID), Some("cri-o"), Container))),
            row("systemd CRI-O v2 inner container cgroup", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope/container"), Some((UID, Burstable, Some(CID), Some("cri-o"), Container))),
            row("systemd CRI-O conmon", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope"), Some((UID, Burstable, None, Some("cri-o"), conmon()))),
            row("systemd besteffort docker", format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope"), Some((UID, BestEffort, Some(CID), Some("docker"), Container))),
            row("systemd under kubelet cgroupRoot", format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"), Some((UID, Burstable, Some(CID), Some("containerd"), Container))),
            row("systemd under a node container (kind)", format!("/system.slice/docker-{CID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice"), Some((UID, Guaranteed, None, None, Pod))),
            row("systemd static pod uid", format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{STATIC_UID}.slice"), Some((STATIC_UID, BestEffort, None, None, Pod))),
            row("systemd unknown scope under a pod", format!("/kubepods.slice/kubepods-pod{UID_}.slice/init.scope"), Some((UID, Guaranteed, None, None, Other))),
            // not pods
            row("root", "/".to_owned(), None),
            row("system cgroup", "/system.slice/containerd.service".to_owned(), None),
            row("cgroupfs kubepods itself", "/kubepods".to_owned(), None),
            row("cgroupfs QoS cgroup", "/kubepods/burstable".to_owned(), None),
            row("systemd kubepods itself", "/kubepods.slice".to_owned(), None),
            row("systemd QoS slice", "/kubepods.slice/kubepods-besteffort.slice".to_owned(), None),
            // garbage
            row("pod prefix without a uid", "/kubepods/burstable/pod".to_owned(), None),
            row("uid too short", "/kubepods/pod0c4a2c5e-7f0b-4f4e-9a55".to_owned(), None),
            row("uid with non-hex", "/kubepods/podzc4a2c5e-7f0b-4f4e-9a55-3b1c1d2e3f40".to_owned(), None),
            row("cgroupfs uid written with underscores", format!("/kubepods/pod{UID_}"), None),
            row("systemd uid written with dashes", format!("/kubepods.slice/kubepods-pod{UID}.slice"), None),
            row("systemd pod slice of another QoS", format!("/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{UID_}.slice"), None),
            row("systemd pod slice without .slice", format!("/kubepods.slice/kubepods-pod{UID_}"), None),
            row("systemd pod slice of another parent", format!("/kubepods.slice/other-pod{UID_}.slice"), None),
            row("cgroupfs unknown QoS directory", format!("/kubepods/gold/pod{UID}"), None),
            row("multibyte garbage", "/kubepods/podé€😀".to_owned(), None),
        ];
        for row in rows {
            let want = row.want.map(|(uid, qos, cid, runtime, scope)| PodCgroup {
                pod_uid: uid.to_owned(),
                qos,
                container_id: cid.map(str::to_owned),
                runtime: runtime.map(str::to_owned),
                scope,
            });
            assert_eq!(
                parse(Path::new(&row.path)),
                want,
                "{}: {}",
                row.name,
                row.path
            );
        }
    }

    #[test]
    fn non_utf8_names_are_no_pod() {
        use std::os::unix::ffi::OsStrExt as _;
        let mut bytes = format!("/kubepods/pod{UID}/").into_bytes();
        bytes.push(0xff);
        let path = Path::new(std::ffi::OsStr::from_bytes(&bytes));
        assert_eq!(parse(path), None);
    }

    #[test]
    fn garbage_runtime_ids_attribute_to_the_pod_only() {
        let rows = [
            (
                "empty containerd id",
                format!("/kubepods/pod{UID}/cri-containerd-.scope"),
            ),
            (
                "non-hex CRI-O id",
                format!("/kubepods/pod{UID}/crio-xyz.scope"),
            ),
            (
                "empty conmon id",
                format!("/kubepods/pod{UID}/crio-conmon-.scope"),
            ),
            ("id longer than 64", format!("/kubepods/pod{UID}/{CID}0")),
            (
                "bare id as a scope",
                format!("/kubepods/pod{UID}/{CID}.scope"),
            ),
        ];
        for (name, path) in rows {
            let got = parse(Path::new(&path)).unwrap_or_else(|| panic!("{name}: pod not found"));
            assert_eq!(got.pod_uid, UID, "{name}");
            assert_eq!(got.scope, PodScope::Other, "{name}");
            assert_eq!(got.container_id, None, "{name}");
        }
    }
}
