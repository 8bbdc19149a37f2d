use super::*;
use crate::pod::{ContainerInfo, ContainerUsage, EmptyDirInfo, InitContainerInfo, PodUsage};

fn q(text: &str) -> Quantity {
    text.parse().unwrap()
}

fn storage(text: &str) -> Resources {
    Resources {
        memory: None,
        ephemeral_storage: Some(q(text)),
    }
}

fn mib(n: u64) -> u64 {
    n << 20
}

/// A pod with one container `app` (limit `limit`, writable layer `rootfs` MiB, logs `logs`
/// MiB), an emptyDir `cache` (limit `size_limit`, using `cache` MiB) and `total` MiB of
/// ephemeral storage in all.
struct Case {
    limit: Option<&'static str>,
    size_limit: Option<&'static str>,
    rootfs: u64,
    logs: u64,
    cache: u64,
    total: u64,
}

impl Case {
    fn pod(&self) -> PodInfo {
        PodInfo {
            name: "web".into(),
            containers: vec![ContainerInfo {
                name: "app".into(),
                limits: self.limit.map(storage).unwrap_or_default(),
                usage: Some(ContainerUsage {
                    memory_working_set_bytes: None,
                    rootfs_bytes: Some(mib(self.rootfs)),
                    logs_bytes: Some(mib(self.logs)),
                }),
                ..Default::default()
            }],
            empty_dirs: vec![EmptyDirInfo {
                name: "cache".into(),
                size_limit: self.size_limit.map(q),
            }],
            usage: Some(PodUsage {
                ephemeral_storage_bytes: Some(mib(self.total)),
                volumes: [("cache".to_string(), mib(self.cache))].into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

const NONE: Case = Case {
    limit: None,
    size_limit: None,
    rootfs: 0,
    logs: 0,
    cache: 0,
    total: 0,
};

#[test]
fn each_limit_is_checked_as_the_kubelet_checks_it() {
    /// (behaviour, pod, dedicated imagefs, the limit and message expected).
    type Row = (
        &'static str,
        Case,
        bool,
        Option<(&'static str, &'static str)>,
    );
    let cases: Vec<Row> = vec![
        (
            "no limits",
            Case {
                total: 900,
                cache: 500,
                ..NONE
            },
            false,
            None,
        ),
        (
            "an emptyDir over its sizeLimit",
            Case {
                size_limit: Some("100Mi"),
                cache: 101,
                total: 101,
                ..NONE
            },
            false,
            Some((
                "emptydirfs.limit",
                "Usage of EmptyDir volume \"cache\" exceeds the limit \"100Mi\". ",
            )),
        ),
        (
            "an emptyDir exactly at its sizeLimit is not over it",
            Case {
                size_limit: Some("100Mi"),
                cache: 100,
                total: 100,
                ..NONE
            },
            false,
            None,
        ),
        (
            "a sizeLimit of 0 is no limit",
            Case {
                size_limit: Some("0"),
                cache: 100,
                total: 100,
                ..NONE
            },
            false,
            None,
        ),
        (
            "the pod's total over the containers' limits (volumes and logs count)",
            Case {
                limit: Some("1Gi"),
                cache: 600,
                logs: 200,
                rootfs: 300,
                total: 1100,
                ..NONE
            },
            false,
            Some((
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
            )),
        ),
        (
            "the emptyDir's own limit is named first when both hold",
            Case {
                limit: Some("1Gi"),
                size_limit: Some("500Mi"),
                cache: 600,
                rootfs: 500,
                total: 1100,
                ..NONE
            },
            false,
            Some((
                "emptydirfs.limit",
                "Usage of EmptyDir volume \"cache\" exceeds the limit \"500Mi\". ",
            )),
        ),
        (
            "a container's layer plus logs over its limit (the pod's total not given)",
            Case {
                limit: Some("500M"),
                rootfs: 400,
                logs: 100,
                total: 0,
                ..NONE
            },
            false,
            Some((
                "ephemeralcontainerfs.limit",
                "Container app exceeded its local ephemeral storage limit \"500M\". ",
            )),
        ),
        (
            "with an imagefs only the container's logs count against its limit",
            Case {
                limit: Some("500M"),
                rootfs: 400,
                logs: 100,
                total: 0,
                ..NONE
            },
            true,
            None,
        ),
        (
            "with an imagefs, logs alone over the limit",
            Case {
                limit: Some("100Mi"),
                rootfs: 0,
                logs: 101,
                total: 0,
                ..NONE
            },
            true,
            Some((
                "ephemeralcontainerfs.limit",
                "Container app exceeded its local ephemeral storage limit \"100Mi\". ",
            )),
        ),
    ];
    for (name, case, has_imagefs, want) in cases {
        let got = limit_exceeded(&case.pod(), has_imagefs);
        let got = got.as_ref().map(|e| (e.limit.as_str(), e.message.as_str()));
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn a_pod_without_stats_is_not_checked() {
    let mut pod = Case {
        size_limit: Some("1Mi"),
        cache: 10,
        total: 10,
        ..NONE
    }
    .pod();
    pod.usage = None;
    assert_eq!(limit_exceeded(&pod, false), None);
}

#[test]
fn the_reported_usage_and_limit_are_the_ones_compared() {
    let pod = Case {
        size_limit: Some("100Mi"),
        cache: 150,
        total: 150,
        ..NONE
    }
    .pod();
    let e = limit_exceeded(&pod, false).unwrap();
    assert_eq!(e.limit_quantity.value(), 100 << 20);
    assert_eq!(e.used.value(), 150 << 20);
}

#[test]
fn the_pod_limit_totals_as_pod_limits_aggregates_them() {
    let init = |limit: &str, restartable: bool| InitContainerInfo {
        limits: storage(limit),
        restartable,
        ..Default::default()
    };
    let container = |limit: Option<&str>| ContainerInfo {
        limits: limit.map(storage).unwrap_or_default(),
        ..Default::default()
    };
    let cases: Vec<(&str, PodInfo, Option<&str>)> = vec![
        (
            "no container names it",
            PodInfo {
                containers: vec![container(None)],
                ..Default::default()
            },
            None,
        ),
        (
            "containers summed, those without one adding nothing",
            PodInfo {
                containers: vec![
                    container(Some("1Gi")),
                    container(None),
                    container(Some("512Mi")),
                ],
                ..Default::default()
            },
            Some("1536Mi"),
        ),
        (
            "an init container larger than the sum",
            PodInfo {
                containers: vec![container(Some("1Gi"))],
                init_containers: vec![init("2Gi", false)],
                ..Default::default()
            },
            Some("2Gi"),
        ),
        (
            "a sidecar adds to the containers",
            PodInfo {
                containers: vec![container(Some("1Gi"))],
                init_containers: vec![init("1Gi", true)],
                ..Default::default()
            },
            Some("2Gi"),
        ),
        (
            "the overhead added to a non-zero total",
            PodInfo {
                containers: vec![container(Some("1Gi"))],
                overhead: storage("1Gi"),
                ..Default::default()
            },
            Some("2Gi"),
        ),
        (
            "the overhead left out of a zero total",
            PodInfo {
                containers: vec![container(Some("0"))],
                overhead: storage("1Gi"),
                ..Default::default()
            },
            Some("0"),
        ),
    ];
    for (name, pod, want) in cases {
        let got = pod_ephemeral_storage_limit(&pod).map(|q| q.to_string());
        assert_eq!(got.as_deref(), want, "{name}");
    }
}
