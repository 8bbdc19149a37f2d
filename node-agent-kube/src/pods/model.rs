//! A `v1.Pod` read as the policy's [`PodInfo`] (one pod model for the whole agent), and the
//! usage `/stats/summary` gives it.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity as KubeQuantity,
};
use node_agent_policy::{
    ContainerInfo, ContainerUsage, EmptyDirInfo, FsUsage, InitContainerInfo, PodInfo, PodUsage,
    Quantity, Resources,
};

use super::stats::PodStats;

/// The kubelet marks a mirror pod with this annotation (`kubetypes.ConfigMirrorAnnotationKey`).
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Where the kubelet got a pod from; anything but `api` is a static pod
/// (`kubetypes.ConfigSourceAnnotationKey`).
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// The API server's default for `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// A running container of a pod, by the id its runtime gave it (the part after `<runtime>://`
/// of `status.containerStatuses[].containerID`), which is how its cgroup names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub pod_uid: String,
    pub name: String,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PodError {
    #[error("a pod has no {field}")]
    Missing { field: &'static str },
    /// A name longer than Kubernetes allows: no real API server holds such a pod.
    #[error("{field} is {len} bytes long; Kubernetes allows at most {max} ({what})")]
    TooLong {
        field: String,
        len: usize,
        max: usize,
        what: &'static str,
    },
    #[error(
        "pod {namespace}/{name}: {part}: {field} {value:?} is not a quantity that is not negative"
    )]
    BadQuantity {
        namespace: String,
        name: String,
        /// `container NAME`, `init container NAME` or `spec`.
        part: String,
        field: String,
        value: String,
    },
}

/// What a pod in a snapshot is: a candidate for the policy, or no longer holding anything.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    Active {
        pod: Box<PodInfo>,
        /// Its running containers by runtime id.
        containers: Vec<(String, ContainerRef)>,
        /// Quantities that are not quantities (or are negative). The pod stays a candidate
        /// with each such request read as zero and each such limit as none: left out, it
        /// would pass its eviction on to an innocent neighbour.
        invalid: Vec<PodError>,
    },
    /// Succeeded or Failed: the kubelet leaves terminal pods out of its active pods.
    Terminal,
}

/// How a quantity that is not one is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    /// A request: zero, so the pod ranks as using more than it asked for.
    AsZero,
    /// A limit or an overhead: as if unset.
    AsUnset,
}

/// Kubernetes' own limits on what names a pod and its parts (`ValidatePodName`, a DNS
/// subdomain; namespaces, containers and volumes, DNS labels). The API server refuses longer
/// ones, so a source that sends one is broken or lying; refusing them caps what every log line,
/// metric label and event built from them can hold.
const DNS_SUBDOMAIN: (usize, &str) = (253, "a DNS subdomain");
const DNS_LABEL: (usize, &str) = (63, "a DNS label");
/// A UID is a UUID (36 bytes); the kubelet's static pods carry a 32-byte hash.
const UID: (usize, &str) = (128, "a UID");

fn check_names(
    namespace: &str,
    name: &str,
    uid: &str,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Result<(), PodError> {
    let check = |field: String, text: &str, (max, what): (usize, &'static str)| {
        if text.len() > max {
            return Err(PodError::TooLong {
                field,
                len: text.len(),
                max,
                what,
            });
        }
        Ok(())
    };
    check("metadata.namespace".into(), namespace, DNS_LABEL)?;
    check("metadata.name".into(), name, DNS_SUBDOMAIN)?;
    check("metadata.uid".into(), uid, UID)?;
    for (i, c) in spec.containers.iter().enumerate() {
        check(format!("spec.containers[{i}].name"), &c.name, DNS_LABEL)?;
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        check(format!("spec.initContainers[{i}].name"), &c.name, DNS_LABEL)?;
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        check(format!("spec.volumes[{i}].name"), &v.name, DNS_LABEL)?;
    }
    Ok(())
}

/// Reads one `v1.Pod`; `Err` when it names no pod (no namespace, name, UID or spec).
pub fn read(pod: &Pod) -> Result<Read, PodError> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().ok_or(PodError::Missing {
        field: "metadata.namespace",
    })?;
    let name = meta.name.clone().ok_or(PodError::Missing {
        field: "metadata.name",
    })?;
    let uid = meta.uid.clone().ok_or(PodError::Missing {
        field: "metadata.uid",
    })?;
    let spec = pod
        .spec
        .as_ref()
        .ok_or(PodError::Missing { field: "spec" })?;
    check_names(&namespace, &name, &uid, spec)?;
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Ok(Read::Terminal);
    }
    let annotations = meta.annotations.clone().unwrap_or_default();
    let mut invalid = Vec::new();
    let mut containers = Vec::with_capacity(spec.containers.len());
    for c in &spec.containers {
        let part = format!("container {}", c.name);
        let (requests, limits) = container_resources(&namespace, &name, &part, c, &mut invalid);
        containers.push(ContainerInfo {
            name: c.name.clone(),
            requests,
            limits,
            usage: None,
        });
    }
    let mut init_containers = Vec::new();
    for c in spec.init_containers.as_deref().unwrap_or_default() {
        let part = format!("init container {}", c.name);
        let (requests, limits) = container_resources(&namespace, &name, &part, c, &mut invalid);
        init_containers.push(InitContainerInfo {
            name: c.name.clone(),
            requests,
            limits,
            restartable: c.restart_policy.as_deref() == Some("Always"),
        });
    }
    let overhead = resources(
        Where {
            ns: &namespace,
            pod: &name,
            part: "spec",
            field: "overhead",
        },
        spec.overhead.as_ref(),
        Bad::AsUnset,
        &mut invalid,
    );
    let pod_level_requests = match spec.resources.as_ref() {
        // Pod-level resources are cpu and memory: named in requests or limits, they are set.
        Some(r)
            if [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .any(|m| m.contains_key("cpu") || m.contains_key("memory")) =>
        {
            let requests = resources(
                Where {
                    ns: &namespace,
                    pod: &name,
                    part: "spec",
                    field: "resources.requests",
                },
                r.requests.as_ref(),
                Bad::AsZero,
                &mut invalid,
            );
            Some(Resources {
                memory: requests.memory,
                ephemeral_storage: None,
            })
        }
        _ => None,
    };
    let mut empty_dirs = Vec::new();
    for v in spec.volumes.as_deref().unwrap_or_default() {
        let Some(empty_dir) = &v.empty_dir else {
            continue;
        };
        // A size limit that is not one is read as none: the volume is not evicted for it.
        let size_limit = empty_dir.size_limit.as_ref().and_then(|q| {
            let parsed = q.0.parse::<Quantity>().ok().filter(|q| !q.is_negative());
            if parsed.is_none() {
                invalid.push(PodError::BadQuantity {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    part: format!("volume {}", v.name),
                    field: "emptyDir.sizeLimit".to_string(),
                    value: q.0.clone(),
                });
            }
            parsed
        });
        empty_dirs.push(EmptyDirInfo {
            name: v.name.clone(),
            size_limit,
        });
    }
    let running = status
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|s| {
            let id = s.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            (!id.is_empty()).then(|| {
                (
                    id.to_string(),
                    ContainerRef {
                        pod_uid: uid.clone(),
                        name: s.name.clone(),
                    },
                )
            })
        })
        .collect();
    Ok(Read::Active {
        pod: Box::new(PodInfo {
            labels: meta.labels.clone().unwrap_or_default(),
            terminating: meta.deletion_timestamp.is_some(),
            priority: spec.priority.unwrap_or(0),
            is_static: annotations
                .get(SOURCE_ANNOTATION)
                .is_some_and(|s| s != "api"),
            is_mirror: annotations.contains_key(MIRROR_ANNOTATION),
            termination_grace_period_seconds: Some(
                spec.termination_grace_period_seconds
                    .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS),
            ),
            containers,
            init_containers,
            pod_level_requests,
            overhead,
            empty_dirs,
            usage: None,
            namespace,
            name,
            uid: Some(uid),
        }),
        containers: running,
        invalid,
    })
}

/// Memory and ephemeral-storage requests and limits (the only resources eviction looks at).
fn container_resources(
    ns: &str,
    pod: &str,
    part: &str,
    c: &Container,
    invalid: &mut Vec<PodError>,
) -> (Resources, Resources) {
    let res = c.resources.as_ref();
    let at = |field| Where {
        ns,
        pod,
        part,
        field,
    };
    let limits = resources(
        at("resources.limits"),
        res.and_then(|r| r.limits.as_ref()),
        Bad::AsUnset,
        invalid,
    );
    let mut requests = resources(
        at("resources.requests"),
        res.and_then(|r| r.requests.as_ref()),
        Bad::AsZero,
        invalid,
    );
    // The API server defaults an unset request to the limit (a bad one is not unset).
    requests.memory = requests.memory.or(limits.memory);
    requests.ephemeral_storage = requests.ephemeral_storage.or(limits.ephemeral_storage);
    (requests, limits)
}

/// Where a resource list is, for its errors.
#[derive(Debug, Clone, Copy)]
struct Where<'a> {
    ns: &'a str,
    pod: &'a str,
    part: &'a str,
    field: &'a str,
}

/// The memory and ephemeral-storage entries of a resource list; an entry that is not a
/// quantity (or is negative) is named in `invalid` and read as `bad` says.
fn resources(
    at: Where<'_>,
    map: Option<&BTreeMap<String, KubeQuantity>>,
    bad: Bad,
    invalid: &mut Vec<PodError>,
) -> Resources {
    let mut r = Resources::default();
    for (key, slot) in [
        ("memory", &mut r.memory),
        ("ephemeral-storage", &mut r.ephemeral_storage),
    ] {
        let Some(q) = map.and_then(|m| m.get(key)) else {
            continue;
        };
        match q.0.parse::<Quantity>().ok().filter(|q| !q.is_negative()) {
            Some(parsed) => *slot = Some(parsed),
            None => {
                invalid.push(PodError::BadQuantity {
                    namespace: at.ns.to_string(),
                    name: at.pod.to_string(),
                    part: at.part.to_string(),
                    field: format!("{}.{key}", at.field),
                    value: q.0.clone(),
                });
                *slot = match bad {
                    Bad::AsZero => Some(Quantity::from_int(0, node_agent_policy::Format::BinarySi)),
                    Bad::AsUnset => None,
                };
            }
        }
    }
    r
}

/// Fills the pod's usage from its `/stats/summary` entry: the pod's working set, processes,
/// ephemeral storage and volumes, and each container's working set, writable layer and logs
/// (the figures the kubelet's eviction message and its local storage limits use).
pub fn apply_stats(pod: &mut PodInfo, stats: &PodStats) {
    let storage = stats.ephemeral_storage.as_ref();
    let volumes = stats
        .volumes
        .iter()
        .filter_map(|v| Some((v.name.clone(), v.used_bytes?)))
        .collect();
    pod.usage = Some(PodUsage {
        memory_working_set_bytes: stats
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0),
        processes: stats
            .process_stats
            .as_ref()
            .and_then(|p| p.process_count)
            .unwrap_or(0),
        nodefs: FsUsage {
            bytes: storage.and_then(|f| f.used_bytes).unwrap_or(0),
            inodes: storage.and_then(|f| f.inodes_used).unwrap_or(0),
        },
        imagefs: FsUsage::default(),
        ephemeral_storage_bytes: storage.and_then(|f| f.used_bytes),
        volumes,
    });
    for container in &mut pod.containers {
        let Some(c) = stats.containers.iter().find(|c| c.name == container.name) else {
            continue;
        };
        let used = |f: &Option<super::stats::FsStats>| f.as_ref().and_then(|f| f.used_bytes);
        container.usage = Some(ContainerUsage {
            memory_working_set_bytes: c.memory.as_ref().and_then(|m| m.working_set_bytes),
            rootfs_bytes: used(&c.rootfs),
            logs_bytes: used(&c.logs),
        });
    }
}

#[cfg(test)]
mod tests {
    use node_agent_policy::Resource;

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn memory_request_mi(spec: serde_json::Value) -> i128 {
        let Read::Active { pod, invalid, .. } = read(&pod(spec)).unwrap() else {
            panic!("an active pod");
        };
        assert!(invalid.is_empty(), "{invalid:?}");
        pod.request_nanos(Resource::Memory) / 1_000_000_000 / (1 << 20)
    }

    fn memory_request_mi_as_read(spec: serde_json::Value) -> i128 {
        let Read::Active { pod, .. } = read(&pod(spec)).unwrap() else {
            panic!("an active pod");
        };
        pod.request_nanos(Resource::Memory) / 1_000_000_000 / (1 << 20)
    }

    #[test]
    fn the_request_total_counts_init_containers_sidecars_overhead_and_pod_level_resources() {
        let c = |name: &str, mem: &str| serde_json::json!({"name": name, "resources": {"requests": {"memory": mem}}});
        let cases = [
            (
                "containers only",
                serde_json::json!({"containers": [c("a", "100Mi"), c("b", "50Mi")]}),
                150,
            ),
            (
                "an init container larger than the containers",
                serde_json::json!({"containers": [c("a", "100Mi")], "initContainers": [c("i", "300Mi")]}),
                300,
            ),
            (
                "a sidecar (restartPolicy Always) adds to them",
                serde_json::json!({"containers": [c("a", "100Mi")],
                    "initContainers": [{"name": "s", "restartPolicy": "Always",
                        "resources": {"requests": {"memory": "30Mi"}}}]}),
                130,
            ),
            (
                "the RuntimeClass overhead",
                serde_json::json!({"containers": [c("a", "100Mi")], "overhead": {"memory": "20Mi"}}),
                120,
            ),
            (
                "pod-level resources replace the containers'",
                serde_json::json!({"containers": [c("a", "100Mi")],
                    "resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}}}),
                64,
            ),
            (
                "pod-level resources naming only cpu: no memory request",
                serde_json::json!({"containers": [c("a", "100Mi")], "resources": {"limits": {"cpu": "1"}}}),
                0,
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(memory_request_mi(spec), want, "{name}");
        }
    }

    #[test]
    fn emptydir_volumes_and_every_limit_are_read_for_local_storage() {
        let Read::Active { pod, .. } = read(&pod(serde_json::json!({
            "containers": [{"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}}],
            "initContainers": [{"name": "i", "resources": {"limits": {"ephemeral-storage": "3Gi"}}}],
            "volumes": [
                {"name": "scratch", "emptyDir": {"sizeLimit": "500Mi"}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "config", "configMap": {"name": "c"}},
            ],
        })))
        .unwrap() else {
            panic!("an active pod");
        };
        let volumes: Vec<(&str, Option<String>)> = pod
            .empty_dirs
            .iter()
            .map(|v| (v.name.as_str(), v.size_limit.map(|q| q.to_string())))
            .collect();
        assert_eq!(
            volumes,
            [("scratch", Some("500Mi".to_string())), ("tmp", None)],
            "emptyDir volumes only"
        );
        assert_eq!(
            node_agent_policy::local_storage::pod_ephemeral_storage_limit(&pod)
                .map(|q| q.to_string()),
            Some("3Gi".to_string()),
            "the init container's limit counts"
        );
    }

    #[test]
    fn a_bad_quantity_names_where_it_is_and_the_pod_stays_a_candidate() {
        // (spec, the error's start, the pod's memory request in MiB as read, its
        // ephemeral-storage limit as read)
        let cases = [
            (
                serde_json::json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "100Mi"}}}],
                    "overhead": {"memory": "-1"}}),
                "pod shop/web: spec: overhead.memory \"-1\"",
                100,
                None,
            ),
            (
                serde_json::json!({"containers": [], "initContainers": [{"name": "i",
                    "resources": {"requests": {"ephemeral-storage": "lots"}}}]}),
                "pod shop/web: init container i: resources.requests.ephemeral-storage \"lots\"",
                0,
                None,
            ),
            (
                serde_json::json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "x"}}}], "resources": {"requests": {"memory": "x"}}}),
                "pod shop/web: container a: resources.requests.memory \"x\"",
                0,
                None,
            ),
            (
                serde_json::json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi", "ephemeral-storage": "much"}}}]}),
                "pod shop/web: container a: resources.limits.ephemeral-storage \"much\"",
                1024,
                None,
            ),
            (
                serde_json::json!({"containers": [{"name": "a", "resources": {"requests": {"memory": "-5Mi"}, "limits": {"memory": "64Mi", "ephemeral-storage": "1Gi"}}}]}),
                "pod shop/web: container a: resources.requests.memory \"-5Mi\": a bad request is not defaulted to the limit",
                0,
                Some("1Gi"),
            ),
            (
                serde_json::json!({"containers": [],
                    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "-1Gi"}}]}),
                "pod shop/web: volume scratch: emptyDir.sizeLimit \"-1Gi\"",
                0,
                None,
            ),
        ];
        for (spec, want, request_mi, limit) in cases {
            let Read::Active {
                pod: info, invalid, ..
            } = read(&pod(spec.clone())).unwrap()
            else {
                panic!("an active pod");
            };
            let err = invalid[0].to_string();
            let named = want.split(':').take(3).collect::<Vec<_>>().join(":");
            assert!(err.starts_with(&named), "{err} / {want}");
            assert_eq!(memory_request_mi_as_read(spec), request_mi, "{want}");
            assert_eq!(
                node_agent_policy::local_storage::pod_ephemeral_storage_limit(&info)
                    .map(|q| q.to_string())
                    .as_deref(),
                limit,
                "{want}"
            );
            assert!(
                info.empty_dirs.iter().all(|d| d.size_limit.is_none()),
                "{want}"
            );
        }
    }
}
