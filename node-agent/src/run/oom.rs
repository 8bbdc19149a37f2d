//! Kernel OOM kills: whether the victim is the node's, what ran out, what the agent saw before,
//! and what is told of each kill once its victim is named as far as it can be (an event on the
//! pod, else on the node), counted then. A container the pod source has not named yet is
//! named by the runtime first ([`Daemon::on_identified`]).

use std::{path::Path, time::Duration};

use node_agent_executor::{reclaim::RuntimeError, Identity, OomCounted, OomTold, Unnamed};
use node_agent_kube::events::{OomCause, OomKill, PodOomKill};

use crate::run::core::Daemon;
use crate::{
    error_chain,
    probes::oom_kill::{self, Constraint},
    saw_before::SawBefore,
};

impl Daemon {
    /// What the agent saw and did in the minute before an OOM kill; `None`: the kill is not
    /// this node's, its victim outside the node's cgroup (`nodeCgroup`, the whole hierarchy by
    /// default; a victim whose cgroup is not known is taken as the node's).
    pub(super) fn before_oom_kill(
        &self,
        ktime_ns: u64,
        kill: &oom_kill::OomKill,
    ) -> Option<SawBefore> {
        let node = &self.config.current.settings.node_cgroup;
        let on_this_node = kill
            .victim
            .path
            .as_deref()
            .is_none_or(|path| Path::new(path).starts_with(node));
        if !on_this_node {
            tracing::debug!(pid = kill.pid, cgroup = ?kill.victim.path,
                "OOM kill outside the node's cgroup: not this node's");
            return None;
        }
        let in_flight = self.acts.in_flight_pods();
        Some(
            self.report
                .recent
                .before(ktime_ns, kill.victim.path.as_deref(), in_flight),
        )
    }

    /// An OOM kill on this node: its event, on the pod when the process was a pod's, on the
    /// node otherwise. A container the pod source has not named (its pod not listed yet, or
    /// the container just started) is named by the runtime first, and the kill counted and
    /// told once it has.
    pub(super) fn on_oom_kill(&mut self, kill: &oom_kill::OomKill, saw: Option<&SawBefore>) {
        let cause = self.oom_cause(kill);
        let victim = kill.victim.pod.as_ref();
        let foreseen = saw.is_some_and(|s| s.pressure.is_some());
        let saw_before = saw.map(ToString::to_string).unwrap_or_default();
        if let Some((pod, id)) = victim.and_then(|p| {
            Some((p, p.container_id.as_ref()?)).filter(|(p, _)| p.container.is_none())
        }) {
            self.acts.identify(Unnamed {
                container_id: id.clone(),
                pod_uid: pod.uid.clone(),
                pod: pod.namespace.clone().zip(pod.name.clone()),
                pid: kill.pid,
                comm: kill.comm.clone(),
                cause,
                saw_before,
                foreseen,
            });
            return;
        }
        let counted = OomCounted {
            namespace: victim.and_then(|p| p.namespace.clone()).unwrap_or_default(),
            container: victim.and_then(|p| p.container.clone()).unwrap_or_default(),
            cause: cause.label(),
            foreseen,
        };
        let told = match victim {
            Some(pod) => match (&pod.namespace, &pod.name) {
                (Some(namespace), Some(name)) => OomTold::Pod(PodOomKill {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    uid: pod.uid.clone(),
                    container: pod.container.clone(),
                    pid: kill.pid,
                    comm: kill.comm.clone(),
                    cause,
                    saw_before,
                    named_late: false,
                }),
                // Not listed, and not in a container's cgroup (a container's went to the
                // runtime above): the pod's UID is all there is.
                _ => OomTold::Node(OomKill {
                    pid: kill.pid,
                    comm: kill.comm.clone(),
                    pod_uid: Some(pod.uid.clone()),
                }),
            },
            None => OomTold::Node(OomKill {
                pid: kill.pid,
                comm: kill.comm.clone(),
                pod_uid: None,
            }),
        };
        self.count(&counted);
        let now = self.now();
        self.acts
            .oom_kill(told, self.config.current.kubernetes.as_ref(), now);
    }

    /// The runtime named the container of an OOM kill (and of those that waited for it), or
    /// could not: the acting half tells each kill; each is counted here.
    pub(super) fn on_identified(
        &mut self,
        kill: Unnamed,
        who: Result<Identity, RuntimeError>,
        now: Duration,
    ) {
        if let Err(error) = &who {
            // Nobody can name the container: the pod's event when the pod is known, else
            // the node's, says what is known.
            tracing::warn!(error = %error_chain(error), "the runtime could not name an OOM-killed container");
        }
        let kube = self.config.current.kubernetes.as_ref();
        for counted in self.acts.identified(kill, &who, kube, now) {
            self.count(&counted);
        }
    }

    /// How a kill is counted, once its victim is named as far as it can be.
    fn count(&self, counted: &OomCounted) {
        self.report.metrics.oom_kill(
            &counted.namespace,
            &counted.container,
            counted.cause,
            counted.foreseen,
        );
    }

    /// What ran out: a cgroup's limit (the container's or the pod's, with the memory in use
    /// against it, read now from the cgroup the kernel named), the whole node, or not known.
    fn oom_cause(&self, kill: &oom_kill::OomKill) -> OomCause {
        match kill.constraint {
            Constraint::System => OomCause::Node,
            Constraint::Unknown => OomCause::Unknown,
            Constraint::CgroupLimit => {
                let limit = kill.limit.as_ref().unwrap_or(&kill.victim);
                let of = match &limit.pod {
                    Some(p) if p.container_id.is_some() => "container",
                    Some(_) => "pod",
                    None => "cgroup",
                };
                let reading = limit.path.as_ref().and_then(|path| {
                    let dir = self
                        .node
                        .layout
                        .memory
                        .mount()
                        .join(path.trim_start_matches('/'));
                    crate::cgroup::paths::read_memory(&dir, self.node.layout.version()).ok()
                });
                OomCause::Limit {
                    of,
                    usage_bytes: reading.map(|r| r.usage),
                    limit_bytes: reading.and_then(|r| match r.limit {
                        crate::cgroup::paths::Limit::At(b) => Some(b),
                        crate::cgroup::paths::Limit::Unlimited => None,
                    }),
                }
            }
        }
    }
}
