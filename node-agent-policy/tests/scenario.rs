//! `simulate`'s exact output contract and its refusals.

use node_agent_policy::scenario::{run, ScenarioError};

const NODE: &str =
    "node:\n  capacity: {memory: 10Gi, ephemeral-storage: 100Gi, inodes: 1000000, pids: 32768}\n";

fn lines(text: &str) -> Vec<String> {
    run(text)
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|s| s.to_json_line())
        .collect()
}

#[test]
fn the_issue_example_prints_the_exact_line() {
    let scenario = format!(
        "{NODE}  hasImagefs: false
config:
  evictionHard: {{memory.available: 500Mi}}
  evictionSoft: {{memory.available: 1Gi}}
  evictionSoftGracePeriod: {{memory.available: 30s}}
  evictionMaxPodGracePeriod: 60
  evictionMinimumReclaim: {{memory.available: 200Mi}}
  evictionPressureTransitionPeriod: 5m
pods:
  - name: web
    namespace: default
    priority: 0
    static: false
    terminationGracePeriodSeconds: 30
    containers:
      - name: app
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
            r#"{"at":"0s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evicted":{"namespace":"default","name":"web","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 400Mi. Container app was using 1536Mi, request is 1Gi, has larger consumption of memory. "}}"#
        ]
    );
}

#[test]
fn timeline_behaviours() {
    let pods = "pods:
  - name: big
    containers: [{name: app}]
    usage: {memory: 3Gi, ephemeral-storage: 30Gi}
  - name: small
    containers: [{name: app}]
    usage: {memory: 1Gi, ephemeral-storage: 1Gi}
";
    let config = "config:
  evictionHard: {memory.available: 500Mi, nodefs.available: 10%}
  evictionSoft: {nodefs.inodesFree: 20%}
  evictionSoftGracePeriod: {nodefs.inodesFree: 1m}
";
    let rows: &[(&str, &str, &[&str])] = &[
        (
            "no threshold met: empty lists and a null eviction; at is echoed as written",
            "steps:\n  - at: 1m30s\n    signals: {memory.available: 5Gi}\n",
            &[r#"{"at":"1m30s","thresholdsMet":[],"conditions":[],"evicted":null}"#],
        ),
        (
            "thresholdsMet and conditions are sorted, each signal once; memory is reclaimed first",
            "steps:\n  - at: 0s\n    signals: {nodefs.inodesFree: 1000, nodefs.available: 1Gi, memory.available: 100Mi}\n",
            &[r#"{"at":"0s","thresholdsMet":["memory.available","nodefs.available","nodefs.inodesFree"],"conditions":["DiskPressure","MemoryPressure"],"evicted":{"namespace":"default","name":"big","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 3Gi, request is 0, has larger consumption of memory. "}}"#],
        ),
        (
            "a signal keeps its last value; an evicted pod is gone in later steps",
            "steps:\n  - at: 0s\n    signals: {memory.available: 100Mi}\n  - at: 10s\n  - at: 20s\n",
            &[
                r#"{"at":"0s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evicted":{"namespace":"default","name":"big","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 3Gi, request is 0, has larger consumption of memory. "}}"#,
                r#"{"at":"10s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evicted":{"namespace":"default","name":"small","signal":"memory.available","gracePeriodSeconds":1,"message":"The node was low on resource: memory. Threshold quantity: 500Mi, available: 100Mi. Container app was using 1Gi, request is 0, has larger consumption of memory. "}}"#,
                r#"{"at":"20s","thresholdsMet":["memory.available"],"conditions":["MemoryPressure"],"evicted":null}"#,
            ],
        ),
        (
            "usage changes apply from their step on and change the ranking",
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 1Gi}\n    usage: {small: {ephemeral-storage: 50Gi}}\n",
            &[r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"evicted":{"namespace":"default","name":"small","signal":"nodefs.available","gracePeriodSeconds":1,"message":"The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, available: 1Gi. Container app was using 50Gi, request is 0, has larger consumption of ephemeral-storage. "}}"#],
        ),
        (
            "a soft threshold within its grace period is listed and sets the condition, evicting nothing",
            "steps:\n  - at: 0s\n    signals: {nodefs.inodesFree: 1000}\n  - at: 59s\n",
            &[
                r#"{"at":"0s","thresholdsMet":["nodefs.inodesFree"],"conditions":["DiskPressure"],"evicted":null}"#,
                r#"{"at":"59s","thresholdsMet":["nodefs.inodesFree"],"conditions":["DiskPressure"],"evicted":null}"#,
            ],
        ),
    ];
    for (behaviour, steps, expected) in rows {
        let got = lines(&format!("{NODE}{config}{pods}{steps}"));
        assert_eq!(got, *expected, "{behaviour}");
    }
}

#[test]
fn local_storage_limits_evict_whatever_the_node() {
    let scenario = format!(
        "{NODE}pods:
  - name: cache
    containers: [{{name: app, limits: {{ephemeral-storage: 1Gi}}}}]
    volumes: [{{name: scratch, emptyDir: {{sizeLimit: 500Mi}}}}, {{name: tmp, emptyDir: {{}}}}]
    usage: {{ephemeral-storage: 100Mi, volumes: {{scratch: 100Mi}}}}
  - name: logs
    containers: [{{name: app, limits: {{ephemeral-storage: 200Mi}}}}]
    usage: {{ephemeral-storage: 100Mi}}
steps:
  - at: 0s
    signals: {{memory.available: 5Gi}}
  - at: 10s
    usage: {{cache: {{ephemeral-storage: 600Mi, volumes: {{scratch: 600Mi}}}}}}
  - at: 20s
    usage: {{logs: {{ephemeral-storage: 300Mi}}}}
"
    );
    assert_eq!(
        lines(&scenario),
        vec![
            r#"{"at":"0s","thresholdsMet":[],"conditions":[],"evicted":null}"#,
            r#"{"at":"10s","thresholdsMet":[],"conditions":[],"evicted":{"namespace":"default","name":"cache","signal":"emptydirfs.limit","gracePeriodSeconds":1,"message":"Usage of EmptyDir volume \"scratch\" exceeds the limit \"500Mi\". "}}"#,
            r#"{"at":"20s","thresholdsMet":[],"conditions":[],"evicted":{"namespace":"default","name":"logs","signal":"ephemeralpodfs.limit","gracePeriodSeconds":1,"message":"Pod ephemeral local storage usage exceeds the total limit of containers 200Mi. "}}"#,
        ]
    );
}

#[test]
fn node_level_reclaim_goes_before_a_disk_eviction() {
    let node = |imagefs: bool| {
        format!("node:\n  capacity: {{ephemeral-storage: 100Gi, inodes: 1000000}}\n  hasImagefs: {imagefs}\n")
    };
    let rest = "config:
  evictionHard: {nodefs.available: 10Gi, imagefs.available: 10Gi}
  evictionMinimumReclaim: {nodefs.available: 2Gi}
pods:
  - name: big
    usage: {ephemeral-storage: 30Gi}
";
    const EVICTED: &str = r#""evicted":{"namespace":"default","name":"big","signal":"nodefs.available","gracePeriodSeconds":1,"message":"The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. "}"#;
    let rows: &[(&str, bool, &str, &[&str])] = &[
        (
            "reclaim frees enough (past threshold plus minimum reclaim): nothing is evicted",
            false,
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n",
            &[r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{"signal":"nodefs.available","bytes":8589934592,"inodes":0,"enough":true},"evicted":null}"#],
        ),
        (
            "above the threshold but within its minimum reclaim: the pod goes",
            false,
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 5632Mi}\n",
            &[&format!(r#"{{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{{"signal":"nodefs.available","bytes":5905580032,"inodes":0,"enough":false}},{EVICTED}}}"#)],
        ),
        (
            "what was freed is gone: a later reclaim frees nothing and the pod goes",
            false,
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n  - at: 10s\n    signals: {nodefs.available: 5Gi}\n",
            &[
                r#"{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{"signal":"nodefs.available","bytes":8589934592,"inodes":0,"enough":true},"evicted":null}"#,
                &format!(r#"{{"at":"10s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],"reclaimed":{{"signal":"nodefs.available","bytes":0,"inodes":0,"enough":false}},{EVICTED}}}"#),
            ],
        ),
        (
            "nodefs beside a dedicated imagefs has nothing to reclaim: the pod goes at once",
            true,
            "steps:\n  - at: 0s\n    signals: {nodefs.available: 5Gi}\n    reclaimable: {bytes: 8Gi}\n",
            &[&format!(r#"{{"at":"0s","thresholdsMet":["nodefs.available"],"conditions":["DiskPressure"],{EVICTED}}}"#)],
        ),
    ];
    for (behaviour, imagefs, steps, expected) in rows {
        let got = lines(&format!("{}{rest}{steps}", node(*imagefs)));
        assert_eq!(got, *expected, "{behaviour}");
    }
}

#[test]
fn json_scenarios_are_accepted() {
    let json = r#"{"node": {"capacity": {"memory": "8Gi"}},
        "pods": [{"name": "a", "usage": {"memory": "1Gi"}}],
        "steps": [{"at": "0s", "signals": {"memory.available": "50Mi"}}]}"#;
    let out = lines(json);
    assert_eq!(out.len(), 1);
    assert!(out[0].contains(r#""name":"a""#), "{}", out[0]);
}

#[test]
fn invalid_scenarios_are_refused_naming_the_field() {
    let step = "steps:\n  - at: 0s\n";
    let rows: Vec<(&str, String, &str)> = vec![
        (
            "steps whose at goes backwards",
            format!("{NODE}steps:\n  - at: 1m\n  - at: 30s\n"),
            "steps[1].at: expected a time not before the previous step's 1m",
        ),
        (
            "a malformed step time",
            format!("{NODE}steps:\n  - at: 5 seconds\n"),
            "steps[0].at: expected a Go duration",
        ),
        (
            "a step without a time",
            format!("{NODE}steps:\n  - signals: {{}}\n"),
            "steps[0].at: expected the step's time",
        ),
        (
            "an unknown signal in a step",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.free: 1Gi}}\n"),
            "steps[0].signals[memory.free]: expected unknown eviction signal",
        ),
        (
            "a malformed signal value",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.available: lots}}\n"),
            "steps[0].signals[memory.available]: expected a Kubernetes quantity",
        ),
        (
            "a signal value beyond int64",
            format!("{NODE}steps:\n  - at: 0s\n    signals: {{memory.available: 20E}}\n"),
            "steps[0].signals[memory.available]: expected a quantity within the int64 range",
        ),
        (
            "a node capacity beyond int64",
            "node:\n  capacity: {memory: 9223372036854775808}\nsteps:\n  - at: 0s\n".to_string(),
            "node.capacity.memory: expected a quantity within the int64 range",
        ),
        (
            "a pod usage beyond int64",
            format!("{NODE}pods:\n  - name: a\n    usage: {{memory: 20E}}\n{step}"),
            "pods[0].usage.memory: expected a quantity within the int64 range",
        ),
        (
            "usage for a pod that is not listed",
            format!("{NODE}steps:\n  - at: 0s\n    usage: {{ghost: {{memory: 1Gi}}}}\n"),
            "steps[0].usage.ghost: expected the name of a pod listed in pods",
        ),
        (
            "a signal whose capacity the node does not give",
            "node:\n  capacity: {memory: 1Gi}\nsteps:\n  - at: 0s\n    signals: {pid.available: 10}\n"
                .to_string(),
            "steps[0].signals[pid.available]: expected node.capacity.pids to be set",
        ),
        (
            "an invalid config names the config field",
            format!("{NODE}config:\n  evictionSoft: {{memory.available: 1Gi}}\n{step}"),
            "config.evictionSoft[memory.available]: a soft threshold needs a grace period; set config.evictionSoftGracePeriod[memory.available]",
        ),
        (
            "an unknown pod field",
            format!("{NODE}pods:\n  - name: a\n    prio: 1\n{step}"),
            "pods[0].prio: expected only the fields",
        ),
        (
            "a pod without a name",
            format!("{NODE}pods:\n  - namespace: a\n{step}"),
            "pods[0].name: expected the pod's name",
        ),
        (
            "a negative termination grace period",
            format!("{NODE}pods:\n  - name: a\n    terminationGracePeriodSeconds: -1\n{step}"),
            "pods[0].terminationGracePeriodSeconds: expected a number of seconds that is not negative",
        ),
        (
            "a malformed request",
            format!("{NODE}pods:\n  - name: a\n    containers: [{{name: c, requests: {{memory: 1GB}}}}]\n{step}"),
            "pods[0].containers[0].requests.memory: expected a Kubernetes quantity",
        ),
        (
            "an unknown reclaimable field",
            format!("{NODE}steps:\n  - at: 0s\n    reclaimable: {{images: 3}}\n"),
            "steps[0].reclaimable.images: expected only the fields bytes, inodes",
        ),
        (
            "a volume that is not an emptyDir",
            format!("{NODE}pods:\n  - name: a\n    volumes: [{{name: v}}]\n{step}"),
            "pods[0].volumes[0].emptyDir: expected an emptyDir volume",
        ),
        (
            "a negative sizeLimit",
            format!("{NODE}pods:\n  - name: a\n    volumes: [{{name: v, emptyDir: {{sizeLimit: -1Mi}}}}]\n{step}"),
            "pods[0].volumes[0].emptyDir.sizeLimit: expected a quantity that is not negative",
        ),
        (
            "usage of a volume the pod does not have",
            format!("{NODE}pods:\n  - name: a\n{step}    usage: {{a: {{volumes: {{v: 1Mi}}}}}}\n"),
            "steps[0].usage.a.volumes.v: expected the name of a volume of pod a",
        ),
        (
            "a missing node",
            step.to_string(),
            "node: expected a node with its capacity",
        ),
        (
            "an unknown top-level field",
            format!("{NODE}{step}extra: 1\n"),
            "extra: expected only the fields node, config, pods and steps",
        ),
        ("not YAML at all", "node: [".to_string(), "scenario is not valid YAML or JSON"),
    ];
    for (behaviour, text, expected) in rows {
        let error = run(&text).expect_err(behaviour);
        let message = error.to_string();
        assert!(message.starts_with(expected), "{behaviour}: {message}");
        assert!(!message.contains('\n'), "{behaviour}: one line: {message}");
        let _: &ScenarioError = &error;
    }
}
