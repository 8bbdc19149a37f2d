//! Who may read what the agent knows, with real ServiceAccount tokens, the real API server's
//! TokenReview and SubjectAccessReview and real RBAC: `/metrics` for callers granted `get` on
//! it, 401 without a token and 403 without the grant; `/readyz` says what is wrong to anyone
//! (the kubelet's probes) but names no path or URL to callers without a token.

use std::time::Duration;

use node_agent_tests::real_cluster::{RealCluster, Variant, AGENT_NS};

/// A service account of the test's with no grant at all, and its token.
fn ungranted_token(rc: &RealCluster, namespace: &str) -> anyhow::Result<String> {
    rc.kubectl
        .run(&["-n", namespace, "create", "serviceaccount", "nobody"])?;
    Ok(rc
        .kubectl
        .run(&[
            "-n",
            namespace,
            "create",
            "token",
            "nobody",
            "--duration=10m",
        ])?
        .trim()
        .to_string())
}

#[test]
fn metrics_go_to_callers_granted_get_and_readyz_names_no_path_to_strangers() -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let node = rc.node0().name;
    let ns = rc.namespace("access");
    let stranger = ungranted_token(&rc, &ns.name)?;
    let scraper = rc.metrics_token()?;

    // A ready agent: /metrics by who asks.
    rc.restore_base()?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let (anonymous, _) = rc.agent_get(&agent, "/metrics", None)?;
    assert_eq!(anonymous, 401, "no token: 401");
    let (denied, body) = rc.agent_get(&agent, "/metrics", Some(&stranger))?;
    assert_eq!(
        denied, 403,
        "a token the API server knows, without the grant: 403 ({body})"
    );
    let (allowed, body) = rc.agent_get(&agent, "/metrics", Some(&scraper))?;
    assert_eq!(allowed, 200);
    assert!(body.contains("node_agent_build_info"), "the metrics");
    let allowed_count = rc
        .metric(
            &agent,
            "node_agent_telemetry_authorizations_total{result=\"allowed\"}",
        )?
        .unwrap_or(0.0);
    assert!(allowed_count >= 1.0, "the allowed reviews are counted");
    let (probe, _) = rc.agent_get(&agent, "/healthz", None)?;
    assert_eq!(probe, 200, "the kubelet's liveness probe needs no token");

    // An agent that cannot verify its kubelet: /readyz 503, saying what, not where.
    let wrong_ca = Variant::shipped_config_with(&[
        (
            "caFile: /var/lib/kubelet/pki/kubelet.crt",
            "caFile: /var/lib/kubelet/pki/absent.crt",
        ),
        ("clusterCA: true", "clusterCA: false"),
    ]);
    // The rollout surges one node at a time, in the controller's order: the new agent is on
    // either node, beside the old ones, which stay Ready.
    let before: Vec<String> = rc.kubectl.get_json(&["-n", AGENT_NS, "pods"])?["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    rc.apply_variant(
        "wrong-kubelet-ca",
        &Variant {
            config: Some(wrong_ca),
            ..Variant::default()
        },
    )?;
    let blind = rc.kubectl.wait_for(
        "the new agent running, not ready",
        Duration::from_secs(120),
        |k| {
            let pods = k.get_json(&["-n", AGENT_NS, "pods"])?;
            Ok(pods["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|p| {
                    let running = p["status"]["phase"] == "Running"
                        && p["metadata"]["deletionTimestamp"].is_null();
                    let ready = p["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
                    (running && !ready && !before.contains(&name)).then_some(name)
                }))
        },
    )?;
    let (code, stranger_view) = rc.kubectl.wait_for(
        "the pod source's failure on /readyz",
        Duration::from_secs(60),
        |_| {
            let (code, body) = rc.agent_get(&blind, "/readyz", None)?;
            Ok((code == 503 && body.contains("pods")).then_some((code, body)))
        },
    )?;
    assert_eq!(code, 503);
    for secret in ["/var/lib/kubelet", "https://", "10.99.0."] {
        assert!(
            !stranger_view.contains(secret),
            "an unauthenticated /readyz names {secret:?}: {stranger_view}"
        );
    }
    let (_, granted_view) = rc.agent_get(&blind, "/readyz", Some(&scraper))?;
    assert!(
        granted_view.contains("/var/lib/kubelet/pki/absent.crt"),
        "a caller granted get /readyz gets the whole reason: {granted_view}"
    );
    eprintln!("/readyz to a stranger: {stranger_view:?}\n/readyz to the scraper: {granted_view:?}");
    Ok(())
}
