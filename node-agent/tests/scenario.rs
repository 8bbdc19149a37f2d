//! `simulate`'s exact output contract and its refusals. Pods are Kubernetes Pod manifests,
//! read by the daemon's own pod model.

use node_agent::simulate::render;

const NODE: &str =
    "node:\n  capacity: {memory: 10Gi, ephemeral-storage: 100Gi, inodes: 1000000, pids: 32768}\n";

fn lines(text: &str) -> Vec<String> {
    render(text)
        .unwrap_or_else(|e| panic!("{}", node_agent::error_chain(&e)))
        .lines()
        .map(str::to_string)
        .collect()
}

/// A pod with one container `app` and these resources (YAML flow text), usage as given.
fn pod(name: &str, resources: &str, usage: &str) -> String {
    format!(
        "  - pod:\n      metadata: {{name: {name}}}\n      spec: {{containers: [{{name: app, resources: {resources}}}]}}\n    usage: {usage}\n"
    )
}

#[test]
fn the_issue_example_prints_the_exact_line() {
    let scenario = format!(
        "{NODE}  fsLayout: shared
config:
  evictionHard: {{memory.available: 500Mi}}
  evictionSoft: {{memory.available: 1Gi}}
  evictionSoftGracePeriod: {{memory.available: 30s}}
  evictionMaxPodGracePeriod: 60
  evictionMinimumReclaim: {{memory.available: 200Mi}}
  evictionPressureTransitionPeriod: 5m
pods:
  - pod:
      metadata: {{name: web, namespace: default}}
      spec:
        priority: 0
        terminationGracePeriodSeconds: 30
        containers:
          - name: app
            resources:
              requests: {{memory: 1Gi, ephemeral-storage: 1Gi}}
              limits: {{memory: 2Gi}}
    usage: {{memory: 1536Mi, pids: 10, ephemeral-storage: 500Mi, inodes: 100}}
steps:
  - at: 0s
    signals: {{memory.available: 400Mi, nodefs.available: 50Gi}}
"
    );
    assert_eq!(
        lines(&scenario),
        vec![
            r#"{"at":"0s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evictions":[{"namespace":"default","name":"web","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. Container app was using 1536Mi, request is 1Gi, has larger consumption of memory. "}]}"#
        ]
    );
}

#[test]
fn timeline_behaviours() {
    let pods = format!(
        "pods:\n{}{}",
        pod("big", "{}", "{memory: 3Gi, ephemeral-storage: 30Gi}"),
        pod("small", "{}", "{memory: 1Gi, ephemeral-storage: 1Gi}")
    );
    let config = "config:
  evictionHard: {memory.available: 500Mi, nodefs.available: 10%}
  evictionSoft: {nodefs.inodesFree: 20%}
  evictionSoftGracePeriod: {nodefs.inodesFree: 1m}
";
    let rows: &[(&str, &str, &[&str])] = &[
        (
            "no threshold met: empty lists and no eviction; at is echoed as written",
            "steps:\n  - at: 1m30s\n    signals: {memory.available: 5Gi}\n",
            &[r#"{"at":"1m30s","thresholdsMet":[],"conditions":[],"evictions":[]}"#],
        ),
        (
            "thresholdsMet and conditions are sorted, each signal once; memory is reclaimed first",
            "steps:\n  - at: 0s\n    signals: {nodefs.inodesFree: 1000, nodefs.available: 1Gi, memory.available: 100Mi}\n",
            &[r#"{"at":"0s","thresholdsMet":["memory.available","nodefs.available","nodefs.inodesFree"],"conditions":["DiskPressure","MemoryPressure"],"evictions":[{"namespace":"default","name":"big","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 3Gi, request is 0, has larger consumption of memory. "}]}"#],
        ),
        (
            "a signal keeps its last value; an evicted pod is gone in later steps",
            "steps:\n  - at: 0s\n    signals: {memory.available: 100Mi}\n  - at: 10s\n  - at: 20s\n",
            &[
                r#"{"at":"0s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evictions":[{"namespace":"default","name":"big","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 3Gi, request is 0, has larger consumption of memory. "}]}"#,
                r#"{"at":"10s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evictions":[{"namespace":"default","name":"small","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 1Gi, request is 0, has larger consumption of memory. "}]}"#,
                r#"{"at":"20s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evictions":[]}"#,
            ],
        ),
        (
            "usage changes apply from their step on and change the ranking",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 1Gi}\n    usage: {small: {ephemeral-storage: 50Gi}}\n",
            &[r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"evictions":[{"namespace":"default","name":"small","signal":"nodefs.available","gracePeriodSeconds":1,"message":"The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, available: 1Gi. Container app was using 50Gi, request is 0, has larger consumption of ephemeral-storage. "}]}"#],
        ),
        (
            "a soft threshold within its grace period is listed and sets the condition, evicting nothing",
            "steps:\n  - at: 0s\n    signals: {nodefs.inodesFree: 1000}\n  - at: 59s\n",
            &[
                r#"{"at":"0s","thresholdsMet":["nodefs.inodesFree"],"conditions":["DiskPressure"],"evictions":[]}"#,
                r#"{"at":"59s","thresholdsMet":["nodefs.inodesFree"],"conditions":["DiskPressure"],"evictions":[]}"#,
            ],
        ),
    ];
    for (behaviour, steps, expected) in rows {
        let got = lines(&format!("{NODE}{config}{pods}{steps}"));
        assert_eq!(got, *expected, "{behaviour}");
    }
}

/// The kubelet evicts every pod over a local storage limit in one synchronize: so does a step.
#[test]
fn local_storage_limits_evict_every_violating_pod_at_once_whatever_the_node() {
    let scenario = format!(
        "{NODE}pods:
  - pod:
      metadata: {{name: cache}}
      spec:
        containers: [{{name: app, resources: {{limits: {{ephemeral-storage: 1Gi}}}}}}]
        volumes: [{{name: scratch, emptyDir: {{sizeLimit: 500Mi}}}}, {{name: tmp, emptyDir: {{}}}}]
    usage: {{ephemeral-storage: 100Mi, volumes: {{scratch: 100Mi}}}}
{logs}{other}steps:
  - at: 0s
    signals: {{memory.available: 5Gi}}
  - at: 10s
    usage: {{cache: {{ephemeral-storage: 600Mi, volumes: {{scratch: 600Mi}}}}, logs: {{ephemeral-storage: 300Mi}}}}
  - at: 20s
    usage: {{other: {{ephemeral-storage: 300Mi}}}}
",
        logs = pod("logs", "{limits: {ephemeral-storage: 200Mi}}", "{ephemeral-storage: 100Mi}"),
        other = pod("other", "{limits: {ephemeral-storage: 200Mi}}", "{ephemeral-storage: 100Mi}"),
    );
    assert_eq!(
        lines(&scenario),
        vec![
            r#"{"at":"0s","thresholdsMet":[],"conditions":[],"evictions":[]}"#,
            r#"{"at":"10s","thresholdsMet":[],"conditions":[],"evictions":[{"namespace":"default","name":"cache","signal":"emptydirfs.limit","gracePeriodSeconds":1,"message":"Usage of EmptyDir volume \"scratch\" exceeds the limit \"500Mi\". "},{"namespace":"default","name":"logs","signal":"ephemeralpodfs.limit","gracePeriodSeconds":1,"message":"Pod ephemeral local storage usage exceeds the total limit of containers 200Mi. "}]}"#,
            r#"{"at":"20s","thresholdsMet":[],"conditions":[],"evictions":[{"namespace":"default","name":"other","signal":"ephemeralpodfs.limit","gracePeriodSeconds":1,"message":"Pod ephemeral local storage usage exceeds the total limit of containers 200Mi. "}]}"#,
        ]
    );
}

/// Everything the daemon reads of a pod counts in a scenario: init and sidecar containers,
/// overhead and pod-level resources move the request the ranking compares usage with, the
/// static-pod annotation makes a pod critical, and per-container usage names the offender.
#[test]
fn the_daemons_pod_model_decides_the_ranking() {
    // Both pods use 3Gi. One asks 1Gi in its app container; the other only 512Mi there, but
    // its restartable init container (a sidecar) adds 2Gi to its request, so it is within.
    let scenario = format!(
        "{NODE}config:\n  evictionHard: {{memory.available: 500Mi}}\npods:
  - pod:
      metadata: {{name: plain, namespace: shop}}
      spec:
        containers: [{{name: app, resources: {{requests: {{memory: 1Gi}}}}}}]
    usage: {{memory: 3Gi}}
  - pod:
      metadata: {{name: sidecar, namespace: shop}}
      spec:
        initContainers: [{{name: proxy, restartPolicy: Always, resources: {{requests: {{memory: 2Gi}}}}}}]
        containers: [{{name: app, resources: {{requests: {{memory: 512Mi}}}}}}]
        overhead: {{memory: 512Mi}}
    usage: {{memory: 3Gi, containers: {{app: {{memory: 1Gi}}}}}}
  - pod:
      metadata:
        name: static
        namespace: kube-system
        annotations: {{kubernetes.io/config.source: file}}
      spec: {{containers: [{{name: app}}]}}
    usage: {{memory: 8Gi}}
steps:
  - at: 0s
    signals: {{memory.available: 100Mi}}
  - at: 10s
"
    );
    let out = lines(&scenario);
    assert!(
        out[0].contains(r#""name":"plain""#),
        "the pod over its request goes first, not the static one: {}",
        out[0]
    );
    assert!(
        out[1].contains(r#""name":"sidecar""#) && out[1].contains("Container app was using 1Gi"),
        "then the sidecar pod, its own container's figure in the message: {}",
        out[1]
    );
}

#[test]
fn node_level_reclaim_goes_before_a_disk_eviction() {
    let node = |layout: &str| {
        format!("node:\n  capacity: {{ephemeral-storage: 100Gi, inodes: 1000000}}\n  fsLayout: {layout}\n")
    };
    let rest = format!(
        "config:
  evictionHard: {{nodefs.available: 10Gi, imagefs.available: 10Gi}}
  evictionMinimumReclaim: {{nodefs.available: 2Gi}}
pods:
{}",
        pod("big", "{}", "{ephemeral-storage: 30Gi}")
    );
    const EVICTED: &str = r#""evictions":[{"namespace":"default","name":"big","signal":"nodefs.available","gracePeriodSeconds":1,"message":"The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. Container app was using 30Gi, request is 0, has larger consumption of ephemeral-storage. "}]"#;
    let rows: &[(&str, &str, &str, &[&str])] = &[
        (
            "reclaim frees enough (past threshold plus minimum reclaim): nothing is evicted",
            "shared",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n",
            &[r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{"signal":"nodefs.available","bytes":8589934592,"inodes":0,"enough":true},"evictions":[]}"#],
        ),
        (
            "above the threshold but within its minimum reclaim: the pod goes",
            "shared",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 5632Mi}\n",
            &[&format!(r#"{{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{{"signal":"nodefs.available","bytes":5905580032,"inodes":0,"enough":false}},{EVICTED}}}"#)],
        ),
        (
            "what was freed is gone: a later reclaim frees nothing and the pod goes",
            "shared",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n  - at: 10s\n    signals: {nodefs.available: 5Gi}\n",
            &[
                r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{"signal":"nodefs.available","bytes":8589934592,"inodes":0,"enough":true},"evictions":[]}"#,
                &format!(r#"{{"at":"10s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{{"signal":"nodefs.available","bytes":0,"inodes":0,"enough":false}},{EVICTED}}}"#),
            ],
        ),
        (
            "nodefs beside a dedicated imagefs has nothing to reclaim: the pod goes at once",
            "separate_image_fs",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n",
            &[&format!(r#"{{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],{EVICTED}}}"#)],
        ),
    ];
    for (behaviour, layout, steps, expected) in rows {
        let got = lines(&format!("{}{rest}{steps}", node(layout)));
        assert_eq!(got, *expected, "{behaviour}");
    }
}

#[test]
fn json_scenarios_are_accepted() {
    let json = r#"{"node": {"capacity": {"memory": "8Gi"}},
        "pods": [{"pod": {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "app"}]}}, "usage": {"memory": "1Gi"}}],
        "steps": [{"at": "0s", "signals": {"memory.available": "50Mi"}}]}"#;
    let out = lines(json);
    assert_eq!(out.len(), 1);
    assert!(out[0].contains(r#""name":"a""#), "{}", out[0]);
}

#[test]
fn invalid_scenarios_are_refused_naming_the_field() {
    let step = "steps:\n  - at: 0s\n";
    let a = |spec: &str, usage: &str| {
        format!("{NODE}pods:\n  - pod:\n      metadata: {{name: a}}\n      spec: {spec}\n    usage: {usage}\n{step}")
    };
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "steps whose at goes backwards",
            format!("{NODE}steps:\n  - at: 1m\n  - at: 30s\n"),
            "steps[1].at: a time not before the previous step's 1m",
        ),
        (
            "a malformed step time",
            format!("{NODE}steps:\n  - at: 5 seconds\n"),
            "steps[0].at: a Go duration",
        ),
        (
            "a step without a time",
            format!("{NODE}steps:\n  - signals: {{}}\n"),
            "steps[0]: missing field `at`",
        ),
        (
            "an unknown signal in a step",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.free: 1Gi}}\n"),
            "steps[0].signals[memory.free]: unknown eviction signal",
        ),
        (
            "a malformed signal value",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.available: lots}}\n"),
            "steps[0].signals[memory.available]: a Kubernetes quantity",
        ),
        (
            "a signal value beyond int64",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.available: 20E}}\n"),
            "steps[0].signals[memory.available]: a quantity within the int64 range",
        ),
        (
            "a node capacity beyond int64",
            "node:\n  capacity: {memory: 9223372036854775808}\nsteps:\n  - at: 0s\n".to_string(),
            "node.capacity.memory: a quantity within the int64 range",
        ),
        (
            "a pod usage beyond int64",
            a("{containers: [{name: app}]}", "{memory: 20E}"),
            "pods[0].usage.memory: a quantity within the int64 range",
        ),
        (
            "usage for a pod that is not listed",
            format!("{NODE}steps:\n  - at: 0s\n    usage: {{ghost: {{memory: 1Gi}}}}\n"),
            "steps[0].usage.ghost: the name of a pod listed in pods",
        ),
        (
            "a signal whose capacity the node does not give",
            "node:\n  capacity: {memory: 1Gi}\nsteps:\n  - at: 0s\n    signals: {pid.available: 10}\n"
                .to_string(),
            "steps[0].signals[pid.available]: node.capacity.pids to be set",
        ),
        (
            "an invalid config names the config field",
            format!("{NODE}config:\n  evictionSoft: {{memory.available: 1Gi}}\n{step}"),
            "config: config.evictionSoft[memory.available]: a soft threshold needs a grace period",
        ),
        (
            "a misspelt pod field, refused though Kubernetes' types would ignore it",
            a("{containers: [{name: app}], prio: 1}", "{}"),
            "pods[0].pod.spec.prio: not a field of a v1 Pod",
        ),
        (
            "an unknown field of a pod entry",
            format!("{NODE}pods:\n  - pod: {{metadata: {{name: a}}, spec: {{containers: []}}}}\n    stats: {{}}\n{step}"),
            "pods[0].stats: unknown field `stats`, expected `pod` or `usage`",
        ),
        (
            "a pod without a name: the daemon's own refusal",
            format!("{NODE}pods:\n  - pod: {{metadata: {{namespace: a}}, spec: {{containers: []}}}}\n{step}"),
            "pods[0].pod: a pod has no metadata.name",
        ),
        (
            "a malformed request: the daemon's own refusal",
            a("{containers: [{name: c, resources: {requests: {memory: 1GB}}}]}", "{}"),
            "pods[0].pod: pod default/a: container c: resources.requests.memory \"1GB\" is not a quantity",
        ),
        (
            "a negative sizeLimit: the daemon's own refusal",
            a("{containers: [{name: c}], volumes: [{name: v, emptyDir: {sizeLimit: -1Mi}}]}", "{}"),
            "pods[0].pod: pod default/a: volume v: emptyDir.sizeLimit \"-1Mi\"",
        ),
        (
            "a field of the wrong type in a pod",
            a("{containers: [{name: c, resources: {requests: {memory: [1]}}}]}", "{}"),
            "pods[0].pod: a Kubernetes Pod",
        ),
        (
            "an unknown reclaimable field",
            format!("{NODE}steps:\n  - at: 0s\n    reclaimable: {{images: 3}}\n"),
            "steps[0].reclaimable.images: unknown field `images`, expected `bytes` or `inodes`",
        ),
        (
            "usage of a volume the pod does not have",
            a("{containers: [{name: app}]}", "{volumes: {v: 1Mi}}"),
            "pods[0].usage.volumes.v: the name of an emptyDir volume of pod a",
        ),
        (
            "usage of a container the pod does not have",
            a("{containers: [{name: app}]}", "{containers: {web: {memory: 1Mi}}}"),
            "pods[0].usage.containers.web: the name of a container of pod a",
        ),
        (
            "an unknown filesystem layout",
            "node:\n  capacity: {memory: 1Gi}\n  fsLayout: two_disks\nsteps:\n  - at: 0s\n".to_string(),
            "node.fsLayout: unknown variant `two_disks`",
        ),
        (
            "two pods with one name",
            format!("{NODE}pods:\n  - pod: {{metadata: {{name: a}}, spec: {{containers: []}}}}\n  - pod: {{metadata: {{name: a}}, spec: {{containers: []}}}}\n{step}"),
            "pods[1].pod.metadata.name: a pod name not used by another pod of the namespace",
        ),
        (
            "a missing node",
            step.to_string(),
            "scenario: missing field `node`",
        ),
        (
            "an unknown top-level field",
            format!("{NODE}{step}extra: 1\n"),
            "extra: unknown field `extra`, expected one of `node`, `config`, `pods`, `steps`",
        ),
        (
            "not YAML at all",
            "node: {capacity: {memory: 1Gi}}\nsteps: [{at: 0s\n".to_string(),
            "steps[0]: did not find expected ',' or '}'",
        ),
    ];
    for (behaviour, text, expected) in rows {
        let error = render(&text).expect_err(behaviour);
        let message = node_agent::error_chain(&error);
        assert!(message.starts_with(expected), "{behaviour}: {message}");
        assert!(!message.contains('\n'), "{behaviour}: one line: {message}");
    }
}
