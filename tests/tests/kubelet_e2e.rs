//! `node-agent run` reaching the kubelet as real clusters are set up (issue 23, point 2): the
//! fake API server holds the agent's Node (`status.addresses`, the kubelet's port), and a
//! separate fake kubelet presents the certificate a kubeadm kubelet makes itself (its own CA,
//! naming a hostname that does not resolve, no IP address). Each way in, and each refusal:
//! `/readyz`, the log (once per transition), the metrics, and no eviction on data the agent
//! could not verify.

use std::time::{Duration, Instant};

use node_agent_kube::fake::{Fake, Pki};
use node_agent_tests::{
    fake_cluster::{responder, wait_until, Daemon, PodSpec, NODE},
    require_root,
    world::{wait, World},
};
use serde_json::{json, Value};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");

fn pods() -> [PodSpec; 2] {
    [
        PodSpec::new(
            "shop",
            "hog",
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "16Mi",
            'a',
        ),
        PodSpec::new(
            "shop",
            "calm",
            "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            "512Mi",
            'b',
        ),
    ]
}

/// A world whose Node publishes its allocatable memory and these addresses, its kubelet on
/// `port`.
fn world(label: &str, addresses: Value, port: u16) -> anyhow::Result<World> {
    let w = World::new(label, &pods(), MEM_HELPER)?;
    w.cluster().node.change(|n| {
        n["status"]["allocatable"] = json!({"cpu": "2", "memory": "1Gi", "pods": "110"});
        n["status"]["addresses"] = addresses.clone();
        n["status"]["daemonEndpoints"] = json!({"kubeletEndpoint": {"Port": port}});
    });
    Ok(w)
}

/// kubeadm's Node: its InternalIP (loopback, where the fake kubelet listens) and its hostname.
fn kubeadm_addresses() -> Value {
    json!([{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": NODE}])
}

/// The world's config with these `kubelet:` settings in place of its fixed URL.
fn config_with(w: &World, kubelet: &str) -> String {
    let fixed = format!(
        "kubelet: {{url: '{}', caFile: '{}', clusterCA: false}}",
        w.fake.url(),
        w.fake.pki.ca_file.display()
    );
    let text = w.config("", "");
    assert!(text.contains(&fixed), "the world's kubelet line: {text}");
    text.replace(&fixed, &format!("kubelet: {kubelet}"))
}

fn readyz(daemon: &Daemon) -> String {
    daemon.get("/readyz").unwrap_or_default()
}

fn metric(daemon: &Daemon, series: &str) -> Option<f64> {
    daemon.metric(series).ok().flatten()
}

fn kube_ready(daemon: &Daemon) -> bool {
    let r = readyz(daemon);
    !r.is_empty()
        && !r.contains("\npods: ")
        && !r.contains("\ncluster: ")
        && metric(daemon, "node_agent_kube_source_ready{source=\"pods\"}") == Some(1.0)
        && metric(daemon, "node_agent_kube_source_ready{source=\"cluster\"}") == Some(1.0)
}

fn gets(fake: &Fake, path: &str) -> usize {
    fake.calls()
        .iter()
        .filter(|(m, p)| m == "GET" && p.split('?').next() == Some(path))
        .count()
}

/// What a row expects of the daemon.
enum Want {
    /// Ready, reading the fake kubelet; the TLS gauge's value; words of the log.
    Ready(f64, &'static str),
    /// The pod source not ready, `/readyz` naming it with these words, said once in the log.
    Refused(&'static str),
}

#[test]
fn the_kubelet_is_reached_at_its_nodes_address_verified_or_refused_by_name() -> anyhow::Result<()> {
    require_root();
    let rt = tokio::runtime::Runtime::new()?;
    let other = Pki::new();
    let other_ca = other.ca_file.display().to_string();
    // (probe, the name the kubelet's certificate carries, the Node's addresses, `kubelet:`
    // given the kubelet's own kubelet.crt, what the daemon does)
    type Row = (
        &'static str,
        &'static str,
        Value,
        Box<dyn Fn(&str) -> String>,
        Want,
    );
    let rows: Vec<Row> = vec![
        (
            "kubeadm: the default address type, the kubelet's self-signed kubelet.crt",
            NODE,
            kubeadm_addresses(),
            Box::new(|crt: &str| format!("{{caFile: '{crt}'}}")),
            Want::Ready(1.0, "the InternalIP of node test-node"),
        ),
        (
            "explicitly unchecked: a certificate naming another host is accepted, and said",
            "somewhere-else",
            kubeadm_addresses(),
            Box::new(|_: &str| {
                "{insecureSkipTLSVerify: true, caFile: null, clusterCA: false}".to_string()
            }),
            Want::Ready(0.0, "its serving certificate is NOT checked"),
        ),
        (
            "a CA that did not sign the kubelet's certificate",
            NODE,
            kubeadm_addresses(),
            Box::new(move |_: &str| format!("{{caFile: '{other_ca}', clusterCA: false}}")),
            Want::Refused("TLS handshake failed"),
        ),
        (
            "the cluster CA alone for a self-signed kubelet (kubelet.crt not there)",
            NODE,
            kubeadm_addresses(),
            Box::new(|_: &str| "{caFile: /nonexistent/kubelet.crt, clusterCA: true}".to_string()),
            Want::Refused("UnknownIssuer"),
        ),
        (
            "malformed status.addresses: a garbage InternalIP, a Hostname with a space",
            NODE,
            json!([{"type": "InternalIP", "address": "10.0.0.999"}, {"type": "Hostname", "address": "test node"}]),
            Box::new(|crt: &str| format!("{{caFile: '{crt}'}}")),
            Want::Refused("none of status.addresses is a usable InternalIP, Hostname"),
        ),
    ];
    for (probe, named, addresses, kubelet, want) in rows {
        let pki = Pki::kubelet_self_signed(named);
        let crt = pki.ca_file.display().to_string();
        // A world first, so that the kubelet shares its pods.
        let w = world("e2e-kubelet", addresses, 0)?;
        let fake_kubelet = rt.block_on(Fake::start_with(pki, responder(w.state.clone())));
        w.cluster().node.change(|n| {
            n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] =
                json!(fake_kubelet.addr.port());
        });
        let config = config_with(&w, &kubelet(&crt));
        match want {
            Want::Ready(verified, words) => {
                let mut daemon = w.start_text(&config)?;
                wait_until(wait(), "both sources ready", || kube_ready(&daemon))?;
                let said = daemon.wait_log(words, wait())?;
                eprintln!("{probe}: {said}");
                assert_eq!(
                    metric(&daemon, "node_agent_kube_kubelet_tls_verified"),
                    Some(verified),
                    "{probe}"
                );
                // Both are read again and again (pods every podRefreshInterval, usage each
                // second): wait for the second reading rather than race it on a busy machine.
                wait_until(wait(), &format!("{probe}: read at the kubelet"), || {
                    gets(&fake_kubelet, "/pods") >= 2
                })?;
                wait_until(wait(), &format!("{probe}: usage from the kubelet"), || {
                    gets(&fake_kubelet, "/stats/summary") >= 2
                })?;
                assert_eq!(gets(&w.fake, "/pods"), 0, "{probe}: nothing read elsewhere");
                assert!(
                    gets(&w.fake, &format!("/api/v1/nodes/{NODE}")) >= 1,
                    "{probe}: the address from the Node"
                );
                w.assert_nothing_refused();
                daemon.stop()?;
            }
            Want::Refused(words) => {
                std::fs::write(&w.config, &config)?;
                let mut daemon = Daemon::start(&w.config, w.port)?;
                let started = Instant::now();
                // Pressure the agent would act on, had it pods it could trust.
                let _hog = w.load("hog", 260)?;
                wait_until(wait(), "/readyz to name the pod source", || {
                    let r = readyz(&daemon);
                    r.starts_with("HTTP/1.1 503") && r.contains("pods: ") && r.contains(words)
                })?;
                let r = readyz(&daemon);
                eprintln!(
                    "{probe}: /readyz 503 after {:.1?}: {}",
                    started.elapsed(),
                    r.lines().find(|l| l.starts_with("pods: ")).unwrap_or("")
                );
                assert!(r.contains("kubelet"), "{probe}: names the kubelet: {r}");
                assert_eq!(
                    metric(&daemon, "node_agent_kube_source_ready{source=\"pods\"}"),
                    Some(0.0),
                    "{probe}"
                );
                assert_eq!(
                    metric(&daemon, "node_agent_kube_source_ready{source=\"cluster\"}"),
                    Some(1.0),
                    "{probe}: the API server connection is fine"
                );
                // Refreshes every 200 ms, the kubelet worked out again every 10 s: one line.
                std::thread::sleep(Duration::from_secs(12));
                assert_eq!(
                    daemon.log_count(words),
                    1,
                    "{probe}: one line for the transition, not one per refresh"
                );
                assert_eq!(gets(&fake_kubelet, "/pods"), 0, "{probe}: no pods read");
                assert!(
                    w.evictions().is_empty(),
                    "{probe}: nothing evicted on data the agent could not verify: {:?}",
                    w.evictions()
                );
                w.assert_nothing_refused();
                daemon.stop()?;
            }
        }
    }
    Ok(())
}

#[test]
fn the_node_proxy_reads_what_the_kubelet_would_and_is_named_when_rbac_refuses_it(
) -> anyhow::Result<()> {
    require_root();
    // The Node's addresses are not needed: the API server finds its kubelet.
    let w = world("e2e-node-proxy", json!([]), 10250)?;
    let config = config_with(&w, "{caFile: null, clusterCA: false}")
        .replace("podSource: kubelet", "podSource: nodeProxy");
    let daemon = w.start_text(&config)?;
    wait_until(wait(), "both sources ready", || kube_ready(&daemon))?;
    let proxy = format!("/api/v1/nodes/{NODE}/proxy");
    assert!(gets(&w.fake, &format!("{proxy}/pods")) >= 2);
    assert!(gets(&w.fake, &format!("{proxy}/stats/summary")) >= 2);
    assert_eq!(gets(&w.fake, "/pods"), 0, "no kubelet dialled");
    assert_eq!(
        metric(&daemon, "node_agent_kube_kubelet_tls_verified"),
        Some(1.0)
    );
    w.assert_nothing_refused();

    w.fake.deny("nodes/proxy");
    let denied = Instant::now();
    wait_until(wait(), "/readyz to name the refusal", || {
        let r = readyz(&daemon);
        r.starts_with("HTTP/1.1 503") && r.contains("pods: ") && r.contains("nodes/proxy")
    })?;
    let r = readyz(&daemon);
    eprintln!(
        "nodes/proxy refused: /readyz 503 after {:.1?}: {}",
        denied.elapsed(),
        r.lines().find(|l| l.starts_with("pods: ")).unwrap_or("")
    );
    assert!(r.contains("403"), "{r}");
    assert_eq!(
        metric(&daemon, "node_agent_kube_source_ready{source=\"cluster\"}"),
        Some(1.0),
        "the node proxy's refusal is the pod source's, not the API server connection's"
    );

    w.fake.grant("nodes/proxy");
    wait_until(wait(), "ready again", || kube_ready(&daemon))?;
    daemon.stop()
}
