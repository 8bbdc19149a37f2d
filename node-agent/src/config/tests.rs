use super::*;

/// `body` as a whole config file: the version header, then `body`.
pub(crate) fn doc(body: &str) -> String {
    format!("apiVersion: {API_VERSION}\nkind: {KIND}\n{body}\n")
}

// The whole error chain, as the daemon logs it.
use crate::error_chain as chain;

fn signals(c: &AgentConfig) -> Vec<&'static str> {
    let mut v: Vec<_> = c
        .eviction
        .thresholds()
        .iter()
        .map(|t| t.signal.as_str())
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn parses_the_whole_file_into_typed_values() {
    let none = Overrides::default();
    let ok = AgentConfig::parse(
        &doc("eviction: {evictionHard: {memory.available: 500Mi}}\nlisten: '127.0.0.1:9999'\nresyncInterval: 30s\nringBufferSize: 2Mi\nmemoryCapacity: 8Gi\nallocatableMemory: 7Gi\nforkWindow: 1500ms"),
        &none,
    )
    .unwrap();
    assert!(ok.kubernetes.is_none(), "no kubernetes section: standalone");
    assert!(ok.dry_run(), "standalone never acts");
    assert_eq!(ok.settings.listen.port(), 9999);
    assert_eq!(ok.settings.resync_interval, Duration::from_secs(30));
    assert_eq!(ok.settings.ring_bytes, 2 << 20);
    assert_eq!(ok.settings.memory_capacity, Some(8 << 30));
    assert_eq!(ok.settings.allocatable_memory, Some(7 << 30));
    assert_eq!(ok.settings.fork_window, Duration::from_millis(1500));
    assert_eq!(
        ok.settings.inspect_listen, None,
        "not served unless asked for"
    );
    let loopback = AgentConfig::parse(&doc("inspectListen: 127.0.0.1:9465"), &none).unwrap();
    assert_eq!(
        loopback.settings.inspect_listen,
        Some("127.0.0.1:9465".parse().unwrap())
    );
    // The kubelet copies hard memory.available onto allocatableMemory.available.
    assert_eq!(
        signals(&ok),
        ["allocatableMemory.available", "memory.available"]
    );
    let defaults = AgentConfig::standalone(&none).unwrap();
    for s in [
        "imagefs.available",
        "memory.available",
        "nodefs.available",
        "nodefs.inodesFree",
    ] {
        assert!(
            signals(&defaults).contains(&s),
            "the kubelet's default hard thresholds: {s}"
        );
    }
    assert_eq!(
        AgentConfig::parse(&doc(""), &none).unwrap().settings,
        defaults.settings,
        "the header alone is every default"
    );
}

#[test]
fn every_refusal_names_the_path_and_what_was_expected() {
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("surprise: 1", "config: surprise: unknown field `surprise`, expected one of `apiVersion`, `kind`, `dryRun`"),
        ("dryrun: true", "config: dryrun: unknown field `dryrun`"),
        ("resyncinterval: 10s", "config: resyncinterval: unknown field `resyncinterval`"),
        ("eviction: {evictionHard: {memory.available: '<500Mi'}}", "config: eviction.evictionHard[memory.available]: \"<500Mi\" holds an operator"),
        ("eviction: {evictionhard: {memory.available: 1Gi}}", "config: eviction.evictionhard: unknown field `evictionhard`, expected one of `evictionHard`"),
        ("eviction: {evictionHard: [memory.available]}", "config: eviction.evictionHard: invalid type: sequence, expected a mapping of eviction signals"),
        ("eviction: {evictionMaxPodGracePeriod: -1}", "config: eviction.evictionMaxPodGracePeriod: \"-1\" must not be negative"),
        ("listen: nowhere", "config: listen: \"nowhere\" is not an address and port such as 0.0.0.0:9464"),
        ("resyncInterval: soon", "config: resyncInterval: \"soon\" is not a Go duration such as 30s, 1m30s or 100ms"),
        ("resyncInterval: 30", "config: resyncInterval: 30 has no unit; expected a Go duration such as 30s or 30ms"),
        ("pressurePollInterval: 0s", "config: pressurePollInterval: 0s: must be longer than 0"),
        ("forkLimit: -1", "config: forkLimit: invalid value: integer `-1`, expected u64"),
        ("memoryCapacity: lots", "config: memoryCapacity: \"lots\" is not a size"),
        ("allocatableMemory: 1m", "config: allocatableMemory: \"1m\" is not a size as a Kubernetes quantity such as 512Mi or 8Gi: is not a whole number of bytes"),
        ("memoryCapacity: 1Gi\nallocatableMemory: 2Gi", "config: allocatableMemory: 2147483648 bytes is more than memoryCapacity"),
        ("nodeCgroup: relative", "config: nodeCgroup: \"relative\" must be an absolute cgroup path"),
        ("nodeCgroup: /a/../b", "config: nodeCgroup"),
        ("ringBufferSize: 1000", "config: ringBufferSize: 1k (1000 bytes) must be a power of two"),
        ("nodefsPath: relative/dir", "config: nodefsPath: relative/dir is not an absolute path"),
        ("imagefsPath: images", "config: imagefsPath: images is not an absolute path"),
        ("kubeletConfig: config.yaml", "config: kubeletConfig: config.yaml is not an absolute path"),
        ("traceSocket: ''", "config: traceSocket: empty"),
        ("inspectListen: 0.0.0.0:9465", "config: inspectListen: 0.0.0.0:9465 is not a loopback address: the endpoint has no authentication of its own"),
        ("inspectListen: '[::]:9465'", "config: inspectListen: [::]:9465 is not a loopback address"),
        ("inspectListen: localhost", "config: inspectListen: \"localhost\" is not an address and port such as 127.0.0.1:9465"),
        ("kubernetes: {podSource: carrier-pigeon}", "config: kubernetes.podSource: unknown variant `carrier-pigeon`, expected one of `kubelet`, `apiserver`, `nodeProxy`"),
        ("kubernetes: {nodeName: n, retry: {attempts: 0}}", "config: kubernetes.retry.attempts: 0 is outside 1..=20"),
        ("kubernetes: {nodeName: n, passOver: 2h}", "config: kubernetes.passOver: 2h0m0s is outside 1s to 1h0m0s"),
        ("kubernetes: {nodeName: n, exclusions: {labelSelector: {matchLabel: {}}}}", "config: kubernetes.exclusions.labelSelector.matchLabel: unknown field `matchLabel`, expected `matchLabels` or `matchExpressions`"),
        ("cri: {endpoint: 'tcp://127.0.0.1:1'}", "config: cri.endpoint: \"tcp://127.0.0.1:1\" is not a unix socket endpoint"),
        ("cri: {timeout: 0s}", "config: cri.timeout: must be longer than 0"),
        ("cri: {imageMinimumGCAge: -1m}", "config: cri.imageMinimumGCAge: \"-1m\" is not a Go duration such as 30s, 1m30s or 100ms: must not be negative"),
        ("cri: {sandbox: x}", "config: cri.sandbox: unknown field `sandbox`"),
    ];
    for (body, needle) in cases {
        let err = AgentConfig::parse(&doc(body), &Overrides::default())
            .map(|_| ())
            .expect_err(body);
        let chain = chain(&err);
        assert!(
            chain.starts_with(needle),
            "{body}:\n  {chain}\n  wanted {needle}"
        );
    }
}

#[test]
fn a_document_that_is_not_this_format_is_refused_before_its_fields() {
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("", "config file is empty"),
        ("# only a comment\n", "config file is empty"),
        (": : :", "config is not YAML"),
        ("- a list", "config is not a mapping of fields"),
        ("dryRun: true", "config: apiVersion: missing; expected node-agent.io/v1alpha1"),
        ("apiVersion: node-agent.io/v1\nkind: NodeAgentConfiguration", "config: apiVersion: \"node-agent.io/v1\" is not a version this agent reads; expected node-agent.io/v1alpha1"),
        ("apiVersion: node-agent.io/v1alpha1", "config: kind: missing; expected NodeAgentConfiguration"),
        ("apiVersion: node-agent.io/v1alpha1\nkind: KubeletConfiguration", "config: kind: \"KubeletConfiguration\" is not this agent's; expected NodeAgentConfiguration"),
        ("apiVersion: 1\nkind: NodeAgentConfiguration", "config: apiVersion: 1 is not a version"),
    ];
    for (text, needle) in cases {
        let err = AgentConfig::parse(text, &Overrides::default())
            .map(|_| ())
            .expect_err(text);
        assert!(chain(&err).starts_with(needle), "{text:?}: {}", chain(&err));
    }
}

#[test]
fn keys_of_the_old_format_are_refused_naming_their_new_spelling() {
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        // The old shipped ConfigMap's shape, without a version: every old key, and the header.
        ("agent: {dry_run: false, ring_bytes: 1048576}\nkubernetes: {pod_source: kubelet, request_timeout_seconds: 10, retry: {initial_backoff_millis: 200}, dry_run: false}",
         "config is in the format before node-agent.io/v1alpha1: agent is now top-level fields (the agent's own settings have no section now); agent.dry_run is now dryRun (top level, the one dry-run switch); agent.ring_bytes is now ringBufferSize (top level, a quantity such as 1Mi); kubernetes.dry_run is now dryRun (top level, the one dry-run switch); kubernetes.pod_source is now kubernetes.podSource; kubernetes.request_timeout_seconds is now kubernetes.requestTimeout (a Go duration such as 10s); kubernetes.retry.initial_backoff_millis is now kubernetes.retry.initialBackoff (a Go duration such as 200ms); and begin the file with apiVersion: node-agent.io/v1alpha1 and kind: NodeAgentConfiguration"),
        // One stray old key in a new file: named alone.
        (&doc("kubernetes: {nodeName: n, eviction_wait_timeout_seconds: 30}"),
         "config is in the format before node-agent.io/v1alpha1: kubernetes.eviction_wait_timeout_seconds is now kubernetes.evictionWaitTimeout (a Go duration such as 30s)"),
        (&doc("agent: {pod_refresh_interval: 2s}"),
         "config is in the format before node-agent.io/v1alpha1: agent is now top-level fields (the agent's own settings have no section now); agent.pod_refresh_interval is now kubernetes.podRefreshInterval"),
        (&doc("cri: {image_minimum_gc_age: 2m, keep_images: []}"),
         "config is in the format before node-agent.io/v1alpha1: cri.image_minimum_gc_age is now cri.imageMinimumGCAge; cri.keep_images is now cri.keepImages"),
        (&doc("kubernetes: {exclusions: {label_selector: {match_labels: {app: db}}}, node_oom_events: off}"),
         "config is in the format before node-agent.io/v1alpha1: kubernetes.exclusions.label_selector is now kubernetes.exclusions.labelSelector; kubernetes.exclusions.label_selector.match_labels is now kubernetes.exclusions.labelSelector.matchLabels; kubernetes.node_oom_events is now kubernetes.nodeOOMEvents"),
    ];
    for (text, want) in cases {
        let err = AgentConfig::parse(text, &Overrides::default())
            .map(|_| ())
            .expect_err(text);
        assert_eq!(chain(&err), *want, "{text}");
    }
}

#[test]
fn one_dry_run_switch_and_flags_that_only_make_it_safer() {
    let o = |dry_run| Overrides {
        dry_run,
        node_name: Some("worker-1".into()),
        listen: Some("127.0.0.1:1".into()),
        ..Default::default()
    };
    let acting = doc("dryRun: false\nkubernetes: {}");
    let dry = doc("dryRun: true\nkubernetes: {}");
    #[rustfmt::skip]
    let rows = [
        (&acting, false, false),
        (&acting, true, true),
        (&dry, false, true),
        (&dry, true, true),
    ];
    for (text, flag, want) in rows {
        let c = AgentConfig::parse(text, &o(flag)).unwrap();
        assert_eq!(c.dry_run(), want, "{text} with --dry-run={flag}");
        assert_eq!(c.settings.listen.port(), 1, "--listen wins");
    }
    let err = AgentConfig::parse(
        &doc(""),
        &Overrides {
            listen: Some("x".into()),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        chain(&err).starts_with("config: --listen: \"x\" is not an address"),
        "{}",
        chain(&err)
    );
}

#[test]
fn node_level_reclaim_uses_the_runtime_in_kubernetes_mode_only() {
    let o = Overrides {
        node_name: Some("worker-1".into()),
        ..Default::default()
    };
    for present in ["kubernetes: {}", "kubernetes:", "kubernetes: null"] {
        let kube = AgentConfig::parse(&doc(present), &o).unwrap();
        assert!(
            kube.kubernetes.is_some(),
            "{present}: a section written empty is every default"
        );
        let runtime = kube.runtime.expect("Kubernetes mode reclaims by default");
        assert_eq!(
            runtime.settings.endpoint.to_string(),
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(runtime.gc.images.min_age, Duration::from_secs(120));
        assert!(!kube.cri_unused);
    }
    let set = AgentConfig::parse(
        &doc("kubernetes: {}\ncri: {endpoint: 'unix:///run/crio/crio.sock', imageMinimumGCAge: 0s, keepImages: []}"),
        &o,
    )
    .unwrap();
    let runtime = set.runtime.unwrap();
    assert_eq!(
        runtime.settings.endpoint.to_string(),
        "unix:///run/crio/crio.sock"
    );
    assert_eq!(runtime.gc.images.min_age, Duration::ZERO);
    assert!(runtime.gc.images.keep.is_empty());
    let standalone = AgentConfig::parse(&doc("cri: {}"), &o).unwrap();
    assert!(standalone.runtime.is_none(), "no pod list: no reclaim");
    assert!(standalone.cri_unused, "said at start");
    assert!(!AgentConfig::standalone(&o).unwrap().cri_unused);
    let no_name = AgentConfig::parse(&doc("kubernetes: {}"), &Overrides::default()).unwrap_err();
    assert!(chain(&no_name).contains("kubernetes.nodeName: empty, and NODE_NAME is not set"));
}

/// deploy/config.yaml, the base install's config.
pub(crate) fn shipped() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/config.yaml"
    ))
    .expect("deploy/config.yaml")
}

/// The arguments the base DaemonSet gives `node-agent`, after its command.
fn daemonset_args() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/daemonset/daemonset.yaml"
    ))
    .expect("deploy/daemonset/daemonset.yaml");
    let ds: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    container["command"]
        .as_sequence()
        .into_iter()
        .chain(container["args"].as_sequence())
        .flatten()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_shipped_config_is_valid_observes_and_acts_before_a_default_kubelet() {
    let args = daemonset_args();
    assert_eq!(
        &args[..4],
        [
            "/usr/local/bin/node-agent",
            "run",
            "--config",
            "/etc/node-agent/config.yaml"
        ]
    );
    let o = Overrides {
        node_name: Some("worker-1".into()),
        dry_run: args[4..] == ["--dry-run"],
        ..Default::default()
    };
    let c = AgentConfig::parse(&shipped(), &o).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let kube = c
        .kubernetes
        .as_ref()
        .expect("the DaemonSet talks to the cluster");
    assert_eq!(kube.node_name, "worker-1");
    assert!(
        c.dry_run(),
        "the base install only observes: --dry-run on the DaemonSet"
    );
    let file_alone = AgentConfig::parse(
        &shipped(),
        &Overrides {
            dry_run: false,
            ..o.clone()
        },
    )
    .unwrap();
    assert!(
        !file_alone.dry_run(),
        "the file lets an agent act once the DaemonSet drops --dry-run (components/enforce)"
    );
    assert!(kube.taint, "the pressure taint is on once it enforces");
    // kubectl node-agent's endpoint: on the pod's own loopback, in the pod's own network
    // namespace (not hostNetwork), so only pods/portforward reaches it.
    assert_eq!(
        c.settings.inspect_listen,
        Some("127.0.0.1:9465".parse().unwrap())
    );
    let daemonset = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/daemonset/daemonset.yaml"
    ))
    .unwrap();
    assert!(!daemonset.contains("hostNetwork: true") && !daemonset.contains("hostPort"));
    assert_eq!(
        c.runtime.as_ref().map(|r| r.settings.endpoint.to_string()),
        Some(node_agent_cri::config::DEFAULT_ENDPOINT.to_string()),
        "node-level reclaim through containerd's socket (the DaemonSet mounts its directory)"
    );
    assert_eq!(
        c.settings.kubelet_config.as_deref(),
        Some(Path::new(DEFAULT_KUBELET_CONFIG))
    );
    assert!(c
        .eviction
        .thresholds()
        .iter()
        .any(|t| t.signal == node_agent_policy::Signal::PidAvailable));
    // Beside a kubelet on its defaults (a KubeletConfiguration without eviction fields, as
    // kubeadm writes it), the agent acts first on every signal: the check is silent, with or
    // without the node's capacities.
    let kubelet = EvictionConfig::from_kubelet_yaml(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
    )
    .unwrap();
    assert_eq!(kubelet, EvictionConfig::default(), "the kubelet's defaults");
    for capacity in [None, Some(1 << 40)] {
        let findings =
            node_agent_policy::beside::kubelet_acts_first(&kubelet, &c.eviction, &|_| capacity);
        assert!(findings.is_empty(), "{findings:?}");
    }
    // The kubelet's documented defaults as they stand would act first on the old shipped
    // thresholds (memory.available<100Mi both): the comparison does tell.
    let same = AgentConfig::parse(
        &doc("eviction: {evictionHard: {memory.available: 100Mi}}"),
        &o,
    )
    .unwrap();
    assert!(
        !node_agent_policy::beside::kubelet_acts_first(&kubelet, &same.eviction, &|_| None)
            .is_empty()
    );
}

#[test]
fn the_effective_configuration_reads_back_as_the_same() {
    let o = Overrides {
        node_name: Some("worker-1".into()),
        ..Default::default()
    };
    let files = [
        shipped(),
        doc(""),
        doc("dryRun: true\nmemoryCapacity: 1.5Gi\nringBufferSize: 4096\nresyncInterval: 90s\nkubeletConfig: null\neviction: {evictionHard: {pid.available: 1000}, evictionSoft: {memory.available: 1Gi}, evictionSoftGracePeriod: {memory.available: 1m30s}}"),
        doc("kubernetes: {podSource: apiserver, kubelet: {caFile: null, clusterCA: false, insecureSkipTLSVerify: true}, exclusions: {namespaces: [a], labelSelector: {matchExpressions: [{key: k, operator: Exists}]}}}\ncri: {keepImages: []}"),
    ];
    for text in files {
        let file = NodeAgentConfiguration::parse(&text).unwrap();
        let effective = file.effective();
        let printed = effective.to_yaml();
        let again = NodeAgentConfiguration::parse(&printed)
            .unwrap_or_else(|e| panic!("{}\n{printed}", chain(&e)));
        assert_eq!(again, effective, "{printed}");
        assert_eq!(
            again.effective(),
            effective,
            "filling defaults again changes nothing"
        );
        // The same thresholds and settings as the file it came from.
        let (a, b) = (
            AgentConfig::from_file(&file, &o).unwrap(),
            AgentConfig::from_file(&again, &o).unwrap(),
        );
        assert_eq!(a.eviction, b.eviction, "{printed}");
        assert_eq!(a.settings, b.settings);
        assert_eq!(a.kubernetes, b.kubernetes);
        assert_eq!(a.runtime.map(|r| r.settings), b.runtime.map(|r| r.settings));
    }
}

#[test]
fn the_file_is_read_once_from_a_regular_file_within_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, doc("dryRun: true")).unwrap();
    assert!(
        AgentConfig::load(&path, &Overrides::default())
            .unwrap()
            .settings
            .dry_run
    );
    // A file past the cap is refused without being parsed, even when it would parse.
    let padding = "#".repeat(crate::fs_helper::read::MAX_CONFIG_BYTES as usize);
    std::fs::write(&path, format!("{}{padding}\n", doc(""))).unwrap();
    let err = AgentConfig::load(&path, &Overrides::default()).unwrap_err();
    assert!(
        chain(&err).contains("is larger than 1048576 bytes"),
        "{}",
        chain(&err)
    );
    std::fs::write(&path, [0xff, 0xfe, b'\n']).unwrap();
    let err = AgentConfig::load(&path, &Overrides::default()).unwrap_err();
    assert_eq!(chain(&err), "config is not UTF-8 text");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = AgentConfig::load(&fifo, &Overrides::default()).unwrap_err();
    assert_eq!(
        chain(&err),
        format!(
            "config file {} is not a regular file (a FIFO): refusing to read it",
            fifo.display()
        )
    );
}

/// The fuzz target's property (fuzz/fuzz_targets/agent_config.rs) over its committed corpus:
/// refused or accepted, and accepted files' effective configuration reads back the same.
#[test]
fn the_fuzz_corpus_is_refused_or_reads_back_the_same() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/agent_config");
    let o = Overrides {
        node_name: Some("worker-1".into()),
        ..Default::default()
    };
    let mut accepted = 0;
    for entry in std::fs::read_dir(dir).expect("the corpus") {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(file) = NodeAgentConfiguration::parse(&text) else {
            continue;
        };
        let effective = file.effective();
        let again = NodeAgentConfiguration::parse(&effective.to_yaml())
            .unwrap_or_else(|e| panic!("{}: {}", path.display(), chain(&e)));
        assert_eq!(again, effective, "{}", path.display());
        if let Ok(config) = AgentConfig::from_file(&file, &o) {
            accepted += 1;
            let reread = AgentConfig::from_file(&again, &o).unwrap();
            assert_eq!(reread.settings, config.settings, "{}", path.display());
        }
    }
    assert!(
        accepted >= 4,
        "the corpus holds valid files too: {accepted}"
    );
}
