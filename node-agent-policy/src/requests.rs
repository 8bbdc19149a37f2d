//! A pod's request for a resource as the kubelet's eviction ranking reads it
//! (`GetResourceRequestQuantity`, pkg/api/v1/resource, on `PodRequests` of
//! k8s.io/component-helpers/resource):
//! - pod-level resources (`spec.resources` naming cpu or memory), when set, replace the
//!   containers' requests for every resource: memory from the pod level, nothing else;
//! - otherwise the containers' requests summed, restartable init containers (sidecars) added
//!   to that sum, and the total raised to the largest init container's request (plus the
//!   sidecars started before it), since init containers run one at a time;
//! - the pod overhead (`spec.overhead`, from the RuntimeClass) added when the total is not 0.

use crate::pod::{PodInfo, Resources};
use crate::quantity::Quantity;
use crate::signal::Resource;

fn nanos(r: &Resources, resource: Resource) -> i128 {
    let q: Option<Quantity> = match resource {
        Resource::Memory => r.memory,
        Resource::EphemeralStorage => r.ephemeral_storage,
        Resource::Inodes | Resource::Pids => None,
    };
    q.map_or(0, |q| q.nanos())
}

impl PodInfo {
    /// The pod's request for `resource`, in nano-units (0 when none), as the kubelet ranks.
    pub fn request_nanos(&self, resource: Resource) -> i128 {
        let total = match &self.pod_level_requests {
            // Only cpu and memory are pod-level resources; with them set the kubelet skips
            // the containers for every other resource too.
            Some(pod) if resource == Resource::Memory => nanos(pod, resource),
            Some(_) => 0,
            None => self.container_request_nanos(resource),
        };
        if total == 0 {
            return 0;
        }
        total.saturating_add(nanos(&self.overhead, resource))
    }

    fn container_request_nanos(&self, resource: Resource) -> i128 {
        let mut sum = self
            .containers
            .iter()
            .fold(0i128, |s, c| s.saturating_add(nanos(&c.requests, resource)));
        let (mut sidecars, mut init_peak) = (0i128, 0i128);
        for c in &self.init_containers {
            let own = nanos(&c.requests, resource);
            let while_it_runs = if c.restartable {
                sum = sum.saturating_add(own);
                sidecars = sidecars.saturating_add(own);
                sidecars
            } else {
                own.saturating_add(sidecars)
            };
            init_peak = init_peak.max(while_it_runs);
        }
        sum.max(init_peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{ContainerInfo, InitContainerInfo};

    fn mi(n: i64) -> Option<Quantity> {
        Some(Quantity::from_int(
            n << 20,
            crate::quantity::Format::BinarySi,
        ))
    }

    fn mem(n: i64) -> Resources {
        Resources {
            memory: mi(n),
            ephemeral_storage: None,
        }
    }

    fn pod(containers: &[i64], init: &[(i64, bool)]) -> PodInfo {
        PodInfo {
            containers: containers
                .iter()
                .map(|&n| ContainerInfo {
                    requests: if n == 0 { Resources::default() } else { mem(n) },
                    ..Default::default()
                })
                .collect(),
            init_containers: init
                .iter()
                .map(|&(n, restartable)| InitContainerInfo {
                    requests: mem(n),
                    restartable,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn memory_request_totals_as_the_kubelet_computes_them() {
        let with = |mut p: PodInfo, f: &dyn Fn(&mut PodInfo)| {
            f(&mut p);
            p
        };
        let cases: Vec<(&str, PodInfo, i64)> = vec![
            ("containers summed", pod(&[100, 50], &[]), 150),
            ("no requests", pod(&[0, 0], &[]), 0),
            (
                "an init container below the sum",
                pod(&[100, 50], &[(120, false)]),
                150,
            ),
            (
                "an init container above the sum",
                pod(&[100, 50], &[(300, false)]),
                300,
            ),
            (
                "the largest init container",
                pod(&[10], &[(200, false), (150, false)]),
                200,
            ),
            ("a sidecar adds to the sum", pod(&[100], &[(30, true)]), 130),
            (
                "an init container after a sidecar runs beside it",
                pod(&[100], &[(30, true), (90, false)]),
                130,
            ),
            (
                "... and may exceed the sum with it",
                pod(&[100], &[(30, true), (120, false)]),
                150,
            ),
            (
                "an init container before the sidecar runs alone",
                pod(&[100], &[(120, false), (30, true)]),
                130,
            ),
            (
                "overhead added to a non-zero total",
                with(pod(&[100], &[]), &|p| p.overhead = mem(10)),
                110,
            ),
            (
                "overhead not added to a zero total",
                with(pod(&[0], &[]), &|p| p.overhead = mem(10)),
                0,
            ),
            (
                "pod-level memory replaces the containers'",
                with(pod(&[100, 50], &[(300, false)]), &|p| {
                    p.pod_level_requests = Some(mem(64))
                }),
                64,
            ),
            (
                "pod-level resources without memory: 0",
                with(pod(&[100], &[]), &|p| {
                    p.pod_level_requests = Some(Resources::default())
                }),
                0,
            ),
            (
                "pod-level memory plus overhead",
                with(pod(&[100], &[]), &|p| {
                    p.pod_level_requests = Some(mem(64));
                    p.overhead = mem(8);
                }),
                72,
            ),
        ];
        for (name, pod, want_mi) in cases {
            assert_eq!(
                pod.request_nanos(Resource::Memory),
                i128::from(want_mi << 20) * 1_000_000_000,
                "{name}"
            );
        }
    }

    #[test]
    fn ephemeral_storage_totals_and_pod_level_resources() {
        let storage = |n: i64| Resources {
            memory: None,
            ephemeral_storage: mi(n),
        };
        let mut p = PodInfo {
            containers: vec![ContainerInfo {
                requests: storage(100),
                ..Default::default()
            }],
            init_containers: vec![InitContainerInfo {
                requests: storage(500),
                ..Default::default()
            }],
            ..Default::default()
        };
        let gi = |n: i64| i128::from(n << 20) * 1_000_000_000;
        assert_eq!(p.request_nanos(Resource::EphemeralStorage), gi(500));
        assert_eq!(
            p.request_nanos(Resource::Inodes),
            0,
            "nobody requests inodes"
        );
        // Pod-level resources are cpu and memory; with them set the kubelet reads no
        // container request, ephemeral storage included.
        p.pod_level_requests = Some(mem(64));
        assert_eq!(p.request_nanos(Resource::EphemeralStorage), 0);
    }
}
