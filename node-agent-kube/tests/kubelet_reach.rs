//! Reaching the kubelet as real clusters are set up, against the strict fakes: a fake API
//! server holding the agent's Node (its `status.addresses` and kubelet port), and a fake
//! kubelet presenting the certificate a real one would (kubeadm's self-signed one naming its
//! hostname only, or one the cluster CA signed). Each way in, and each refusal, with the
//! exact requests made.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use node_agent_kube::{
    api::Context,
    config::KubeConfig,
    fake::{fixture, Fake, Pki, Reply, Seen, TEST_BOUND},
    kubelet::{KubeletError, KubeletSource, Timing},
    transport::Tls,
};
use serde_json::{json, Value};

const NODE: &str = "worker-1";

async fn bounded<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("test ran past its time bound")
}

/// The kubelet's answers, for node `node`.
fn kubelet_for(node: &'static str) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    move |seen, _| match seen.path.as_str() {
        "/pods" => Reply::json(200, fixture("pods.json")),
        "/stats/summary" => Reply::json(
            200,
            fixture("summary.json").replace("\"worker-1\"", &format!("{node:?}")),
        ),
        _ => Reply::status(404, "NotFound", "no such path"),
    }
}

/// The API server: the Node (as `node` holds it now), and its node proxy answering exactly
/// what the kubelet would.
fn api_server(node: Arc<Mutex<Value>>) -> impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static {
    let kubelet = kubelet_for(NODE);
    move |seen, i| {
        let path = seen.path.split('?').next().unwrap_or("");
        match path.strip_prefix(&format!("/api/v1/nodes/{NODE}/proxy")) {
            Some(rest) => kubelet(
                &Seen {
                    path: rest.to_string(),
                    ..seen.clone()
                },
                i,
            ),
            None if path == format!("/api/v1/nodes/{NODE}") => {
                Reply::json(200, node.lock().unwrap().to_string())
            }
            None => Reply::status(404, "NotFound", "not served"),
        }
    }
}

/// A Node with these addresses, its kubelet on `port`.
fn node_object(addresses: Value, port: u16) -> Value {
    json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": "7"},
           "status": {"addresses": addresses, "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}})
}

/// kubeadm's Node: the InternalIP (loopback here, where the fake kubelet listens) and the
/// hostname.
fn kubeadm_addresses(hostname: &str) -> Value {
    json!([{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": hostname}])
}

struct Cluster {
    api: Fake,
    node: Arc<Mutex<Value>>,
}

impl Cluster {
    async fn start() -> Self {
        let node = Arc::new(Mutex::new(Value::Null));
        let api = Fake::start(api_server(node.clone())).await;
        Self { api, node }
    }

    fn set_node(&self, node: Value) {
        *self.node.lock().unwrap() = node;
    }

    fn api_context(&self) -> Context {
        self.api.context("api server", 1, NODE)
    }

    /// The `kubernetes:` section with these `kubelet:` settings, against this API server.
    fn config(&self, kubelet: &str) -> KubeConfig {
        KubeConfig::from_yaml(
            &format!(
                "nodeName: {NODE}\nkubelet: {kubelet}\napiServer: {{url: '{}', caFile: '{}'}}\ntokenPath: '{}'\nrequestTimeout: 2s",
                self.api.url(),
                self.api.pki.ca_file.display(),
                self.api.token_file.display()
            ),
            None,
        )
        .unwrap()
    }

    fn source(&self, kubelet: &str) -> KubeletSource {
        KubeletSource::kubelet(&self.config(kubelet), &self.api_context())
    }

    fn node_reads(&self) -> usize {
        self.api
            .calls()
            .iter()
            .filter(|(_, p)| p == &format!("/api/v1/nodes/{NODE}?resourceVersion=0"))
            .count()
    }
}

fn ca(path: &std::path::Path) -> String {
    path.display().to_string()
}

/// A path that does not exist.
fn absent() -> PathBuf {
    PathBuf::from("/nonexistent/var/lib/kubelet/pki/kubelet.crt")
}

#[tokio::test]
async fn each_way_to_the_kubelet_and_each_refusal() {
    bounded(async {
        let cluster = Cluster::start().await;
        let other = Pki::new();
        /// (behaviour, the kubelet's certificate, its node, the Node's addresses, kubelet:
        /// settings given the kubelet's CA file, Ok(words of the target) or Err(words))
        type Row = (
            &'static str,
            Pki,
            &'static str,
            Value,
            Box<dyn Fn(&str) -> String>,
            Result<&'static str, &'static str>,
        );
        let own = |kubelet_ca: &str| format!("{{caFile: '{kubelet_ca}', clusterCA: false}}");
        let absent_file = absent();
        let with_cluster_ca =
            move |_: &str| format!("{{caFile: '{}', clusterCA: true}}", absent_file.display());
        let wrong = ca(&other.ca_file);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("kubeadm: a self-signed certificate naming the hostname, reached at the InternalIP and checked for the Node's Hostname",
                Pki::kubelet_self_signed("worker-1"), NODE, kubeadm_addresses("worker-1"), Box::new(own),
                Ok("the InternalIP of node worker-1; its certificate must chain to")),
            ("serverTLSBootstrap: the cluster CA signed it for the InternalIP; kubelet.caFile absent is passed over",
                Pki::signed_by(&cluster.api.pki, "worker-1", &["127.0.0.1", "worker-1"]), NODE, kubeadm_addresses("worker-1"), Box::new(with_cluster_ca.clone()),
                Ok("kubelet.caFile /nonexistent/var/lib/kubelet/pki/kubelet.crt does not exist: not trusted")),
            ("explicitly unchecked",
                Pki::kubelet_self_signed("elsewhere"), NODE, kubeadm_addresses("worker-1"),
                Box::new(|_: &str| "{insecureSkipTLSVerify: true, caFile: null, clusterCA: false}".to_string()),
                Ok("its certificate NOT checked (kubelet.insecureSkipTLSVerify: true)")),
            ("a CA that did not sign it",
                Pki::kubelet_self_signed("worker-1"), NODE, kubeadm_addresses("worker-1"),
                Box::new(move |_: &str| format!("{{caFile: '{wrong}', clusterCA: false}}")),
                Err("TLS handshake failed")),
            ("the cluster CA alone, for a self-signed kubelet",
                Pki::kubelet_self_signed("worker-1"), NODE, kubeadm_addresses("worker-1"), Box::new(with_cluster_ca),
                Err("UnknownIssuer")),
            ("a certificate naming neither the address nor the Node's Hostname",
                Pki::kubelet_self_signed("worker-9"), NODE, kubeadm_addresses("worker-1"), Box::new(own),
                Err("the certificate is not valid for 127.0.0.1 nor worker-1 (it names worker-9)")),
            ("a Node without a Hostname: the address alone must be named",
                Pki::kubelet_self_signed("worker-1"), NODE, json!([{"type": "InternalIP", "address": "127.0.0.1"}]), Box::new(own),
                Err("not valid for name \"127.0.0.1\"")),
            ("the kubelet of another node, trusted and named",
                Pki::kubelet_self_signed("worker-1"), "worker-2", kubeadm_addresses("worker-1"), Box::new(own),
                Err("it is the summary of node \"worker-2\", not of worker-1: this kubelet is another node's")),
            ("a garbage InternalIP and no other usable address",
                Pki::kubelet_self_signed("worker-1"), NODE, json!([{"type": "InternalIP", "address": "127.0.0.256"}]), Box::new(own),
                Err("cannot find the kubelet: node worker-1: none of status.addresses is a usable InternalIP, Hostname, InternalDNS, ExternalDNS, ExternalIP (kubelet.preferredAddressTypes); it holds InternalIP=127.0.0.256 (not an IP address)")),
            ("no addresses at all",
                Pki::kubelet_self_signed("worker-1"), NODE, json!([]), Box::new(own),
                Err("cannot find the kubelet: node worker-1 has no status.addresses")),
        ];
        for (what, pki, kubelet_node, addresses, settings, want) in rows {
            let kubelet_ca = ca(&pki.ca_file);
            let kubelet = Fake::start_with(pki, kubelet_for(kubelet_node)).await;
            cluster.set_node(node_object(addresses, kubelet.addr.port()));
            let mut source = cluster.source(&settings(&kubelet_ca));
            match (source.snapshot().await, want) {
                (Ok(snapshot), Ok(words)) => {
                    assert_eq!(snapshot.pods.len(), 3, "{what}");
                    let target = source.target().unwrap().to_string();
                    assert!(target.starts_with(&format!("https://127.0.0.1:{}", kubelet.addr.port())), "{what}: {target}");
                    assert!(target.contains(words), "{what}: {target}");
                    assert_eq!(
                        kubelet.calls(),
                        [("GET".into(), "/pods".into()), ("GET".into(), "/stats/summary".into())],
                        "{what}"
                    );
                }
                (Err(e), Err(words)) => {
                    let e = e.to_string();
                    assert!(e.contains(words), "{what}: {e}");
                }
                (got, want) => panic!("{what}: got {:?}, want {want:?}", got.map(|s| s.pods.len())),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn the_kubelet_is_found_once_and_again_only_after_a_failure() {
    bounded(async {
        let cluster = Cluster::start().await;
        let first = Fake::start_with(Pki::kubelet_self_signed("worker-1"), kubelet_for(NODE)).await;
        cluster.set_node(node_object(
            kubeadm_addresses("worker-1"),
            first.addr.port(),
        ));
        let mut source = cluster
            .source(&format!(
                "{{caFile: '{}', clusterCA: true}}",
                ca(&first.pki.ca_file)
            ))
            .with_timing(Timing {
                after_failure: Duration::from_millis(200),
                every: Duration::from_secs(3600),
            });
        for _ in 0..5 {
            source.snapshot().await.unwrap();
        }
        assert_eq!(
            cluster.node_reads(),
            1,
            "the Node is read once, not per request"
        );
        assert_eq!(first.calls().len(), 10);

        // The kubelet moves (another port, now with a certificate the cluster signed) and the
        // old address stops answering.
        let old_port = first.addr.port();
        drop(first);
        let second = Fake::start_with(
            Pki::signed_by(&cluster.api.pki, "worker-1", &["127.0.0.1", "worker-1"]),
            kubelet_for(NODE),
        )
        .await;
        cluster.set_node(node_object(
            kubeadm_addresses("worker-1"),
            second.addr.port(),
        ));
        let err = source.snapshot().await.unwrap_err();
        assert!(
            matches!(&err, KubeletError::Read { .. })
                && err.to_string().contains(&format!("127.0.0.1:{old_port}")),
            "{err}"
        );
        assert!(source.snapshot().await.is_err());
        assert_eq!(cluster.node_reads(), 1, "not again before after_failure");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let snapshot = source.snapshot().await.unwrap();
        assert_eq!(snapshot.pods.len(), 3);
        assert_eq!(
            cluster.node_reads(),
            2,
            "worked out again after the failure"
        );
        assert_eq!(second.calls().len(), 2);
        assert!(source
            .target()
            .unwrap()
            .url
            .ends_with(&format!(":{}", second.addr.port())));
    })
    .await;
}

#[tokio::test]
async fn a_renewed_kubelet_certificate_is_trusted_once_its_file_is_read_again() {
    bounded(async {
        let cluster = Cluster::start().await;
        let dir = tempfile::tempdir().unwrap();
        let kubelet_crt = dir.path().join("kubelet.crt");
        let old = Fake::start_with(Pki::kubelet_self_signed("worker-1"), kubelet_for(NODE)).await;
        std::fs::copy(&old.pki.ca_file, &kubelet_crt).unwrap();
        cluster.set_node(node_object(kubeadm_addresses("worker-1"), old.addr.port()));
        let mut source = cluster
            .source(&format!(
                "{{caFile: '{}', clusterCA: false}}",
                kubelet_crt.display()
            ))
            .with_timing(Timing {
                after_failure: Duration::from_millis(100),
                every: Duration::from_secs(3600),
            });
        source.snapshot().await.unwrap();

        // kubeadm's kubelet.crt expires after a year; deleting it and restarting the kubelet
        // makes a new one, at the same address.
        drop(old);
        let renewed =
            Fake::start_with(Pki::kubelet_self_signed("worker-1"), kubelet_for(NODE)).await;
        std::fs::copy(&renewed.pki.ca_file, &kubelet_crt).unwrap();
        cluster.set_node(node_object(
            kubeadm_addresses("worker-1"),
            renewed.addr.port(),
        ));
        assert!(source.snapshot().await.is_err(), "the old address is gone");
        tokio::time::sleep(Duration::from_millis(150)).await;
        let snapshot = source.snapshot().await.unwrap();
        assert_eq!(snapshot.pods.len(), 3);
        assert_eq!(renewed.calls().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn the_node_proxy_reads_what_the_kubelet_would_and_needs_nodes_proxy() {
    bounded(async {
        let cluster = Cluster::start().await;
        let mut source = KubeletSource::node_proxy(cluster.api_context());
        let snapshot = source.snapshot().await.unwrap();
        assert_eq!(snapshot.pods.len(), 3);
        assert!(
            snapshot.pods.iter().any(|p| p.usage.is_some()),
            "usage from the proxied /stats/summary"
        );
        assert_eq!(
            cluster.api.calls(),
            [
                ("GET".into(), format!("/api/v1/nodes/{NODE}/proxy/pods")),
                ("GET".into(), format!("/api/v1/nodes/{NODE}/proxy/stats/summary")),
            ],
            "no Node read, no kubelet certificate: the API server's connection alone"
        );
        assert!(source.target().unwrap().to_string().contains("the API server's node proxy"));

        cluster.api.deny("nodes/proxy");
        let err = source.snapshot().await.unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                r#"403 Forbidden (RBAC does not grant this): nodes "{NODE}" is forbidden: User "system:serviceaccount:node-agent:node-agent" cannot get resource "nodes/proxy" in API group "" at the cluster scope"#
            )),
            "{err}"
        );
        cluster.api.grant("nodes/proxy");
        source.snapshot().await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_kubelet_url_is_dialled_as_given_and_checked_for_its_host() {
    bounded(async {
        let cluster = Cluster::start().await;
        let kubelet = Fake::start_with(
            Pki::signed_by(&cluster.api.pki, "worker-1", &["127.0.0.1"]),
            kubelet_for(NODE),
        )
        .await;
        let mut source = cluster.source(&format!("{{url: '{}', caFile: null}}", kubelet.url()));
        source.snapshot().await.unwrap();
        assert_eq!(cluster.node_reads(), 0, "no Node read for a fixed URL");
        let target = source.target().unwrap();
        assert_eq!(target.from, "kubelet.url");
        assert!(
            matches!(&target.tls, Some(Tls::Verify { also_named, .. }) if also_named.is_empty())
        );
    })
    .await;
}
