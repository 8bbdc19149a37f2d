//! Protobuf answers → [`crate::model`], checking what the agent relies on. A missing required
//! field or an unknown enum value is an error naming the field, never a silent default.

use std::collections::HashMap;

use jiff::Timestamp;

use crate::{
    model::{
        Container, ContainerState, ContainerStats, FilesystemUsage, Image, ImageFsInfo, PodRef,
        PodSandbox, RuntimeVersion, SandboxState, POD_NAMESPACE_LABEL, POD_NAME_LABEL,
        POD_UID_LABEL,
    },
    proto,
};

/// Why an answer does not convert; the client wraps it with the call and endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem(pub String);

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn problem(text: impl Into<String>) -> Problem {
    Problem(text.into())
}

/// CRI times are nanoseconds since the Unix epoch.
fn timestamp(what: &str, nanos: i64) -> Result<Timestamp, Problem> {
    Timestamp::from_nanosecond(i128::from(nanos))
        .map_err(|_| problem(format!("{what} {nanos} ns is not a time")))
}

fn pod_from_labels(labels: &HashMap<String, String>) -> PodRef {
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    PodRef {
        uid: get(POD_UID_LABEL),
        namespace: get(POD_NAMESPACE_LABEL),
        name: get(POD_NAME_LABEL),
    }
}

pub(crate) fn version(v: proto::VersionResponse) -> RuntimeVersion {
    RuntimeVersion {
        runtime_name: v.runtime_name,
        runtime_version: v.runtime_version,
        runtime_api_version: v.runtime_api_version,
    }
}

pub(crate) fn sandbox(s: proto::PodSandbox) -> Result<PodSandbox, Problem> {
    let meta = s
        .metadata
        .ok_or_else(|| problem(format!("sandbox {} has no metadata", s.id)))?;
    let state = match proto::PodSandboxState::try_from(s.state) {
        Ok(proto::PodSandboxState::SandboxReady) => SandboxState::Ready,
        Ok(proto::PodSandboxState::SandboxNotready) => SandboxState::NotReady,
        Err(_) => {
            return Err(problem(format!(
                "sandbox {}: state {} is not a PodSandboxState",
                s.id, s.state
            )))
        }
    };
    Ok(PodSandbox {
        created_at: timestamp(&format!("sandbox {} created_at", s.id), s.created_at)?,
        id: s.id,
        pod: PodRef {
            uid: meta.uid,
            namespace: meta.namespace,
            name: meta.name,
        },
        attempt: meta.attempt,
        state,
    })
}

pub(crate) fn container_state(state: i32) -> Option<ContainerState> {
    Some(match proto::ContainerState::try_from(state).ok()? {
        proto::ContainerState::ContainerCreated => ContainerState::Created,
        proto::ContainerState::ContainerRunning => ContainerState::Running,
        proto::ContainerState::ContainerExited => ContainerState::Exited,
        proto::ContainerState::ContainerUnknown => ContainerState::Unknown,
    })
}

pub(crate) fn state_value(state: ContainerState) -> proto::ContainerStateValue {
    let state = match state {
        ContainerState::Created => proto::ContainerState::ContainerCreated,
        ContainerState::Running => proto::ContainerState::ContainerRunning,
        ContainerState::Exited => proto::ContainerState::ContainerExited,
        ContainerState::Unknown => proto::ContainerState::ContainerUnknown,
    };
    proto::ContainerStateValue {
        state: state.into(),
    }
}

pub(crate) fn container(c: proto::Container) -> Result<Container, Problem> {
    let meta = c
        .metadata
        .ok_or_else(|| problem(format!("container {} has no metadata", c.id)))?;
    let state = container_state(c.state).ok_or_else(|| {
        problem(format!(
            "container {}: state {} is not a ContainerState",
            c.id, c.state
        ))
    })?;
    // `image_id` is newer than `image_ref`; runtimes that have it may leave `image_ref` a
    // digest reference, older ones (containerd 1.6) put the image ID in `image_ref`.
    let image_id = if c.image_id.is_empty() {
        c.image_ref
    } else {
        c.image_id
    };
    if image_id.is_empty() {
        return Err(problem(format!("container {} names no image ID", c.id)));
    }
    Ok(Container {
        created_at: timestamp(&format!("container {} created_at", c.id), c.created_at)?,
        pod: pod_from_labels(&c.labels),
        pod_sandbox_id: c.pod_sandbox_id,
        name: meta.name,
        attempt: meta.attempt,
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_id,
        state,
        id: c.id,
    })
}

pub(crate) fn image(i: proto::Image) -> Result<Image, Problem> {
    if i.id.is_empty() {
        return Err(problem(format!(
            "an image without ID (tags {:?})",
            i.repo_tags
        )));
    }
    Ok(Image {
        id: i.id,
        repo_tags: i.repo_tags,
        repo_digests: i.repo_digests,
        size_bytes: i.size,
        pinned: i.pinned,
    })
}

fn filesystem(f: proto::FilesystemUsage, what: &str) -> Result<FilesystemUsage, Problem> {
    Ok(FilesystemUsage {
        mountpoint: f.fs_id.map(|id| id.mountpoint).unwrap_or_default(),
        used_bytes: f.used_bytes.map(|v| v.value),
        inodes_used: f.inodes_used.map(|v| v.value),
        timestamp: timestamp(&format!("{what} timestamp"), f.timestamp)?,
    })
}

pub(crate) fn image_fs_info(r: proto::ImageFsInfoResponse) -> Result<ImageFsInfo, Problem> {
    Ok(ImageFsInfo {
        image_filesystems: r
            .image_filesystems
            .into_iter()
            .map(|f| filesystem(f, "image filesystem"))
            .collect::<Result<_, _>>()?,
        container_filesystems: r
            .container_filesystems
            .into_iter()
            .map(|f| filesystem(f, "container filesystem"))
            .collect::<Result<_, _>>()?,
    })
}

pub(crate) fn container_stats(s: proto::ContainerStats) -> Result<ContainerStats, Problem> {
    let id = s
        .attributes
        .map(|a| a.id)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| problem("container stats without a container ID"))?;
    Ok(ContainerStats {
        writable_layer: s
            .writable_layer
            .map(|w| filesystem(w, &format!("container {id} writable layer")))
            .transpose()?,
        memory_working_set_bytes: s.memory.and_then(|m| m.working_set_bytes).map(|v| v.value),
        id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str) -> Option<proto::ContainerMetadata> {
        Some(proto::ContainerMetadata {
            name: name.into(),
            attempt: 2,
        })
    }

    #[test]
    fn a_container_takes_its_pod_from_the_kubelet_labels_and_its_image_id_from_image_ref() {
        let c = container(proto::Container {
            id: "c1".into(),
            metadata: meta("app"),
            image_ref: "sha256:aa".into(),
            state: proto::ContainerState::ContainerExited.into(),
            created_at: 1_700_000_000_000_000_000,
            labels: [
                (POD_UID_LABEL, "u1"),
                (POD_NAMESPACE_LABEL, "shop"),
                (POD_NAME_LABEL, "web"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            c.pod,
            PodRef {
                uid: "u1".into(),
                namespace: "shop".into(),
                name: "web".into()
            }
        );
        assert_eq!(c.image_id, "sha256:aa");
        assert_eq!(
            (c.name.as_str(), c.attempt, c.state),
            ("app", 2, ContainerState::Exited)
        );
        assert_eq!(c.created_at.to_string(), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn image_id_wins_over_image_ref_when_the_runtime_sends_both() {
        let c = container(proto::Container {
            id: "c1".into(),
            metadata: meta("app"),
            image_ref: "docker.io/library/app@sha256:bb".into(),
            image_id: "sha256:aa".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.image_id, "sha256:aa");
    }

    #[test]
    fn malformed_answers_are_refused_naming_what_is_wrong() {
        let cases: Vec<(&str, Result<Container, Problem>, &str)> = vec![
            (
                "no metadata",
                container(proto::Container {
                    id: "c1".into(),
                    image_ref: "x".into(),
                    ..Default::default()
                }),
                "container c1 has no metadata",
            ),
            (
                "unknown state",
                container(proto::Container {
                    id: "c2".into(),
                    metadata: meta("a"),
                    image_ref: "x".into(),
                    state: 9,
                    ..Default::default()
                }),
                "container c2: state 9 is not a ContainerState",
            ),
            (
                "no image",
                container(proto::Container {
                    id: "c3".into(),
                    metadata: meta("a"),
                    ..Default::default()
                }),
                "container c3 names no image ID",
            ),
        ];
        for (behaviour, got, expected) in cases {
            assert_eq!(got.unwrap_err().0, expected, "{behaviour}");
        }
        assert_eq!(
            image(proto::Image {
                repo_tags: vec!["a:1".into()],
                ..Default::default()
            })
            .unwrap_err()
            .0,
            "an image without ID (tags [\"a:1\"])"
        );
        assert_eq!(
            container_stats(proto::ContainerStats::default())
                .unwrap_err()
                .0,
            "container stats without a container ID"
        );
        assert_eq!(
            sandbox(proto::PodSandbox {
                id: "s1".into(),
                ..Default::default()
            })
            .unwrap_err()
            .0,
            "sandbox s1 has no metadata"
        );
    }

    #[test]
    fn filesystem_usage_keeps_absent_figures_absent() {
        let info = image_fs_info(proto::ImageFsInfoResponse {
            image_filesystems: vec![proto::FilesystemUsage {
                timestamp: 1,
                fs_id: Some(proto::FilesystemIdentifier {
                    mountpoint: "/var/lib/containerd".into(),
                }),
                used_bytes: Some(proto::UInt64Value { value: 4096 }),
                inodes_used: None,
            }],
            container_filesystems: vec![],
        })
        .unwrap();
        assert_eq!(info.image_bytes_used(), Some(4096));
        assert_eq!(info.image_filesystems[0].inodes_used, None);
        assert_eq!(info.image_filesystems[0].mountpoint, "/var/lib/containerd");
    }
}
