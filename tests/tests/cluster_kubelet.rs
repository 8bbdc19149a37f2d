//! The kubelet as shipped, on the real cluster: the default config reaches the real kubelet at
//! its Node's InternalIP and verifies its self-signed `kubelet.crt`; `podSource: nodeProxy`
//! works with `deploy/rbac-kubelet-proxy.yaml` (and is refused without it); `podSource:
//! apiserver` works (a dry-run decision under pressure names the pod); and with
//! `serverTLSBootstrap: true` the kubelet's approved serving certificate, signed by the cluster
//! CA, is verified through `kubelet.clusterCA`.

use std::time::Duration;

use anyhow::Context as _;
use node_agent_cluster::node_components::KubeletOptions;
use node_agent_tests::{
    agent_access::agent_requests_since,
    real_cluster::{workspace, Qos, RealCluster, Variant, WorkloadPod, AGENT_NS},
    real_node::{grow_until_left, restart_kubelet, wait_log},
};

/// The line the agent logs when it has worked out where its kubelet is and how it checks it.
fn reading_line(ip: &str, node: &str) -> String {
    format!(
        "reading the kubelet at this address kubelet=https://{ip}:10250, the InternalIP of node {node}; its certificate must chain to /var/lib/kubelet/pki/kubelet.crt or /var/run/secrets/kubernetes.io/serviceaccount/ca.crt and name {ip} or {node}"
    )
}

/// Waits until the current agent's `series` reads `value`.
fn wait_metric(
    rc: &RealCluster,
    node: &str,
    series: &str,
    value: f64,
    limit: Duration,
) -> anyhow::Result<()> {
    rc.kubectl
        .wait_for(&format!("{series} = {value}"), limit, |_| {
            let pod = rc.agent_pod(node, "node-agent")?;
            Ok((rc.metric(&pod, series)? == Some(value)).then_some(()))
        })
}

const PODS_READY: &str = "node_agent_kube_source_ready{source=\"pods\"}";
const TLS_VERIFIED: &str = "node_agent_kube_kubelet_tls_verified";

/// Deletes the agent's pod on `node`; the DaemonSet starts a new one, which reads its
/// certificates and the kubelet's address afresh.
fn restart_agent(rc: &RealCluster, node: &str) -> anyhow::Result<()> {
    let old = rc.agent_pod(node, "node-agent")?;
    rc.kubectl
        .run(&["-n", AGENT_NS, "delete", "pod", &old, "--wait=true"])?;
    rc.kubectl
        .wait_for("a new agent pod", Duration::from_secs(120), |_| {
            Ok(rc.agent_pod(node, "node-agent").ok().filter(|p| *p != old))
        })?;
    Ok(())
}

#[test]
fn the_shipped_config_reads_the_kubelet_at_its_internal_ip_and_verifies_its_self_signed_certificate(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let spec = rc.node0();
    rc.install("base", &Variant::default())?;
    restart_agent(&rc, &spec.name)?;
    let line = wait_log(
        &rc,
        &spec.name,
        &[&reading_line(&spec.ip, &spec.name)],
        Duration::from_secs(60),
    )?;
    eprintln!("{line}");
    wait_metric(&rc, &spec.name, PODS_READY, 1.0, Duration::from_secs(60))?;
    let agent = rc.agent_pod(&spec.name, "node-agent")?;
    assert_eq!(
        rc.metric(&agent, TLS_VERIFIED)?,
        Some(1.0),
        "the kubelet's certificate is checked"
    );
    let kubelet_crt = std::fs::read_to_string(
        rc.cluster
            .node_path(&spec, "/var/lib/kubelet/pki/kubelet.crt")?,
    )?;
    assert!(
        kubelet_crt.contains("BEGIN CERTIFICATE"),
        "the kubelet wrote its own kubelet.crt"
    );

    // Without kubelet.crt (the cluster CA alone), the same kubelet is not trusted: the
    // certificate the agent verified is the kubelet's own self-signed one.
    let config = Variant::shipped_config_with(&[(
        "caFile: /var/lib/kubelet/pki/kubelet.crt",
        "caFile: null",
    )]);
    rc.apply_variant(
        "kubelet-cluster-ca-only",
        &Variant {
            config: Some(config),
            ..Variant::default()
        },
    )?;
    let line = wait_log(
        &rc,
        &spec.name,
        &["source not ready", "UnknownIssuer"],
        Duration::from_secs(180),
    )?;
    eprintln!("cluster CA alone: {line}");
    wait_metric(&rc, &spec.name, PODS_READY, 0.0, Duration::from_secs(30))?;
    Ok(())
}

/// Removes `deploy/rbac-kubelet-proxy.yaml`'s objects when dropped (an apply prunes nothing).
struct KubeletProxyGrant<'a>(&'a RealCluster);

impl Drop for KubeletProxyGrant<'_> {
    fn drop(&mut self) {
        let file = workspace().join("deploy/rbac-kubelet-proxy.yaml");
        let _ = self.0.kubectl.call(
            &[
                "delete",
                "-f",
                &file.to_string_lossy(),
                "--ignore-not-found",
            ],
            None,
            Duration::from_secs(60),
        );
    }
}

#[test]
fn node_proxy_reads_the_kubelet_with_its_grant_and_the_api_server_source_names_a_pod_in_dry_run(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let _grant = KubeletProxyGrant(&rc);
    let node = rc.node0().name;

    // podSource: nodeProxy without rbac-kubelet-proxy.yaml: the API server refuses the proxy.
    let proxy = Variant::shipped_config_with(&[("podSource: kubelet ", "podSource: nodeProxy")]);
    let since = jiff::Timestamp::now();
    rc.apply_variant(
        "kubelet-node-proxy",
        &Variant {
            config: Some(proxy.clone()),
            ..Variant::default()
        },
    )?;
    let line = wait_log(
        &rc,
        &node,
        &[
            "source not ready",
            "403",
            "cannot get resource \"nodes/proxy\"",
        ],
        Duration::from_secs(180),
    )?;
    eprintln!("nodeProxy without its grant: {line}");
    // With it (as deploy/kustomization.yaml's commented line adds it): ready.
    let grant = std::fs::read_to_string(workspace().join("deploy/rbac-kubelet-proxy.yaml"))?;
    rc.install(
        "kubelet-node-proxy",
        &Variant {
            config: Some(proxy),
            resources: vec![grant],
            ..Variant::default()
        },
    )?;
    wait_metric(&rc, &node, PODS_READY, 1.0, Duration::from_secs(60))?;
    let through_proxy = agent_requests_since(&rc, since)?
        .into_iter()
        .filter(|a| a.resource == "nodes" && a.subresource == "proxy" && a.name == node)
        .collect::<Vec<_>>();
    assert!(
        through_proxy
            .iter()
            .any(|a| a.code == 200 && a.uri.ends_with("/proxy/pods")),
        "the agent read /pods through the node proxy: {:?}",
        through_proxy.iter().map(|a| a.line()).collect::<Vec<_>>()
    );
    assert!(
        through_proxy
            .iter()
            .any(|a| a.code == 200 && a.uri.ends_with("/proxy/stats/summary")),
        "and /stats/summary"
    );

    // podSource: apiserver: the node's pods listed and watched; under pressure, in dry run, the
    // decision names the pod.
    let since = jiff::Timestamp::now();
    let apiserver =
        Variant::shipped_config_with(&[("podSource: kubelet ", "podSource: apiserver")]);
    rc.install(
        "kubelet-apiserver",
        &Variant {
            config: Some(apiserver),
            ..Variant::default()
        },
    )?;
    wait_metric(&rc, &node, PODS_READY, 1.0, Duration::from_secs(60))?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    let ns = rc.namespace("apiserver-source");
    let grower = grow_until_left(
        &rc,
        &ns.name,
        &agent,
        &node,
        WorkloadPod::new("grower", Qos::Burstable, "64Mi", &[]),
        150.0,
        400,
    )?;
    let line = wait_log(
        &rc,
        &node,
        &[
            "dry run: would evict",
            &format!("namespace={}", ns.name),
            &format!("name={}", grower.name),
        ],
        Duration::from_secs(90),
    )?;
    eprintln!("podSource: apiserver, dry run: {line}");
    let counted = rc.metric(
        &agent,
        "node_agent_evictions_total{eviction_signal=\"allocatableMemory.available\",result=\"dry_run\"}",
    )?;
    assert!(
        counted.is_some_and(|n| n >= 1.0),
        "the dry-run decision counted: {counted:?}"
    );
    // What the source asked the API server for: the node's pods, listed and watched, nothing else.
    let on_pods: Vec<String> = agent_requests_since(&rc, since)?
        .into_iter()
        .filter(|a| a.resource == "pods" && a.subresource.is_empty())
        .map(|a| {
            assert!(
                a.uri.contains("fieldSelector=spec.nodeName%3D") && a.code == 200,
                "{}",
                a.line()
            );
            a.verb
        })
        .collect();
    assert!(
        on_pods.iter().any(|v| v == "list") && on_pods.iter().any(|v| v == "watch"),
        "{on_pods:?}"
    );
    assert!(
        on_pods.iter().all(|v| v == "list" || v == "watch"),
        "only list and watch: {on_pods:?}"
    );
    rc.kubectl
        .run(&["-n", &ns.name, "delete", "pod", &grower.name, "--wait=true"])?;
    Ok(())
}

/// Deletes the kubelet's serving CSRs when dropped.
struct Csrs<'a>(&'a RealCluster, Vec<String>);

impl Drop for Csrs<'_> {
    fn drop(&mut self) {
        for name in &self.1 {
            let _ = self.0.kubectl.call(
                &["delete", "csr", name, "--ignore-not-found"],
                None,
                Duration::from_secs(30),
            );
        }
    }
}

#[test]
fn with_server_tls_bootstrap_the_cluster_ca_verifies_the_kubelets_approved_certificate(
) -> anyhow::Result<()> {
    let rc = RealCluster::get();
    let _base = rc.base_on_drop();
    let spec = rc.node0();
    let node = spec.name.clone();
    rc.install("base", &Variant::default())?;
    let mut kubelet = restart_kubelet(
        &rc,
        &spec,
        &KubeletOptions {
            extra: vec!["serverTLSBootstrap: true".into()],
        },
    )?;
    // What the kubelet writes goes when its defaults come back.
    kubelet
        .before_restart
        .push("/var/lib/kubelet/pki/kubelet-server-*".into());
    let mut csrs = Csrs(&rc, Vec::new());

    // The kubelet asks for a serving certificate; an admin approves it, as kubeadm's docs say.
    let csr = rc
        .kubectl
        .wait_for("the kubelet's serving CSR", Duration::from_secs(60), |k| {
            let list = k.get_json(&["csr"])?;
            Ok(list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|c| {
                    (c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
                        && c["spec"]["username"] == format!("system:node:{node}")
                        && c["status"]["conditions"].is_null())
                    .then(|| c["metadata"]["name"].as_str().map(str::to_string))
                    .flatten()
                }))
        })?;
    csrs.1.push(csr.clone());
    rc.kubectl.run(&["certificate", "approve", &csr])?;
    rc.kubectl
        .wait_for("the CSR signed", Duration::from_secs(60), |k| {
            let c = k.get_json(&["csr", &csr])?;
            Ok(c["status"]["certificate"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
                .then_some(()))
        })?;
    let current = "/var/lib/kubelet/pki/kubelet-server-current.pem";
    // (A symbolic link to an absolute path inside the node: not followed from the host.)
    rc.kubectl.wait_for(
        "the kubelet holds its new certificate",
        Duration::from_secs(60),
        |_| {
            Ok(
                std::fs::symlink_metadata(rc.cluster.node_path(&spec, current)?)
                    .is_ok()
                    .then_some(()),
            )
        },
    )?;

    // The shipped config, in a new agent: verified (kubelet.crt no longer chains to it; the
    // cluster CA does).
    restart_agent(&rc, &node)?;
    let line = wait_log(
        &rc,
        &node,
        &[&reading_line(&spec.ip, &node)],
        Duration::from_secs(60),
    )?;
    eprintln!("{line}");
    wait_metric(&rc, &node, PODS_READY, 1.0, Duration::from_secs(60))
        .context("the shipped config verifies the bootstrapped certificate")?;
    let agent = rc.agent_pod(&node, "node-agent")?;
    assert_eq!(rc.metric(&agent, TLS_VERIFIED)?, Some(1.0));

    // Without the cluster CA (kubelet.crt alone) it is not trusted: the certificate is the
    // cluster-signed one, not the self-signed kubelet.crt.
    let config = Variant::shipped_config_with(&[("clusterCA: true", "clusterCA: false")]);
    rc.apply_variant(
        "kubelet-no-cluster-ca",
        &Variant {
            config: Some(config),
            ..Variant::default()
        },
    )?;
    let line = wait_log(
        &rc,
        &node,
        &["source not ready", "UnknownIssuer"],
        Duration::from_secs(180),
    )?;
    eprintln!("kubelet.crt alone: {line}");
    Ok(())
}
