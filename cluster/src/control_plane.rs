//! The control plane on node 0, with kubeadm's flags (`cmd/kubeadm/app/phases/controlplane`,
//! `phases/etcd`) and their certificates; the differences are named where they are.

use std::process::Command;

use anyhow::Context as _;

use crate::{
    layout::{Layout, NodeSpec, APISERVER_PORT, CLUSTER_CIDR, KUBERNETES_SERVICE_IP, SERVICE_CIDR},
    pki::{self, Authority, Leaf},
};

/// Certificates and kubeconfigs for everything, made once per cluster directory.
pub struct Credentials {
    pub ca: Authority,
}

/// The groups of the admin's certificate: `system:masters` (kubeadm's `admin.conf` uses
/// `kubeadm:cluster-admins` bound to cluster-admin by kubeadm itself; nothing binds that group
/// here, and `system:masters` is what `super-admin.conf` holds).
const ADMIN_GROUPS: &[&str] = &["system:masters"];

/// Makes (or keeps) the PKI and writes every kubeconfig.
pub fn credentials(layout: &Layout, nodes: &[NodeSpec]) -> anyhow::Result<Credentials> {
    let dir = layout.pki();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = Authority::create_or_load(&dir, "ca", "kubernetes")?;
    let etcd_ca = Authority::create_or_load(&dir, "etcd-ca", "etcd-ca")?;
    let node0 = &nodes[0];
    let apiserver_names: Vec<String> = [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "localhost",
        "127.0.0.1",
        KUBERNETES_SERVICE_IP,
        &node0.ip,
        &node0.name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ca.issue(
        &dir,
        &Leaf {
            stem: "apiserver",
            common_name: "kube-apiserver",
            organizations: &[],
            server_names: &apiserver_names,
            client: false,
        },
    )?;
    // The API server's client certificate at the kubelets (kubeadm:
    // apiserver-kubelet-client, in a group the kubelet's webhook authorizer allows).
    ca.issue(
        &dir,
        &Leaf {
            stem: "apiserver-kubelet-client",
            common_name: "kube-apiserver-kubelet-client",
            organizations: &["system:masters"],
            server_names: &[],
            client: true,
        },
    )?;
    let local = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    etcd_ca.issue(
        &dir,
        &Leaf {
            stem: "etcd-server",
            common_name: "etcd-server",
            organizations: &[],
            server_names: &local,
            client: true,
        },
    )?;
    etcd_ca.issue(
        &dir,
        &Leaf {
            stem: "apiserver-etcd-client",
            common_name: "kube-apiserver-etcd-client",
            organizations: &[],
            server_names: &[],
            client: true,
        },
    )?;
    pki::service_account_keys(&dir)?;

    let inside = format!("https://{}:{APISERVER_PORT}", node0.ip);
    let mut clients: Vec<(String, String, Vec<&str>, String)> = vec![
        (
            "admin".into(),
            "kubernetes-admin".into(),
            ADMIN_GROUPS.to_vec(),
            layout.host_server(),
        ),
        (
            "controller-manager".into(),
            "system:kube-controller-manager".into(),
            vec![],
            inside.clone(),
        ),
        (
            "scheduler".into(),
            "system:kube-scheduler".into(),
            vec![],
            inside.clone(),
        ),
        (
            "kube-proxy".into(),
            "system:kube-proxy".into(),
            vec![],
            inside.clone(),
        ),
    ];
    for node in nodes {
        clients.push((
            format!("kubelet-{}", node.name),
            format!("system:node:{}", node.name),
            vec!["system:nodes"],
            inside.clone(),
        ));
    }
    for (stem, user, groups, server) in &clients {
        let (cert, key) = ca.issue(
            &dir,
            &Leaf {
                stem,
                common_name: user,
                organizations: groups,
                server_names: &[],
                client: true,
            },
        )?;
        let text = pki::kubeconfig(server, &ca.cert, &cert, &key, user)?;
        let path = if stem == "admin" {
            layout.admin_kubeconfig()
        } else {
            layout.config().join(format!("{stem}.conf"))
        };
        std::fs::create_dir_all(path.parent().expect("a file in a directory"))?;
        pki::write_private(&path, text.as_bytes(), 0o600)?;
    }
    Ok(Credentials { ca })
}

/// The audit policy: every request, with its user, verb, object and answer (`Metadata`), and
/// the request bodies of the agent's service account (`Request`), whose writes the tests read.
const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    users: [\"system:serviceaccount:node-agent:node-agent\"]
  - level: Metadata
";

pub fn etcd(layout: &Layout, node0: &NodeSpec) -> Command {
    let pki = layout.pki();
    let p = |f: &str| pki.join(f).to_string_lossy().into_owned();
    let mut cmd = Command::new(layout.binary("etcd"));
    cmd.args([
        format!("--name={}", node0.name),
        format!("--data-dir={}", layout.etcd_data().display()),
        "--listen-client-urls=https://127.0.0.1:2379".into(),
        "--advertise-client-urls=https://127.0.0.1:2379".into(),
        // Peers: one member, on loopback (kubeadm listens on the node's address for peers
        // that join later; none do here).
        "--listen-peer-urls=https://127.0.0.1:2380".into(),
        "--initial-advertise-peer-urls=https://127.0.0.1:2380".into(),
        format!("--initial-cluster={}=https://127.0.0.1:2380", node0.name),
        format!("--cert-file={}", p("etcd-server.crt")),
        format!("--key-file={}", p("etcd-server.key")),
        format!("--trusted-ca-file={}", p("etcd-ca.crt")),
        "--client-cert-auth=true".into(),
        format!("--peer-cert-file={}", p("etcd-server.crt")),
        format!("--peer-key-file={}", p("etcd-server.key")),
        format!("--peer-trusted-ca-file={}", p("etcd-ca.crt")),
        "--peer-client-cert-auth=true".into(),
        "--snapshot-count=10000".into(),
        "--listen-metrics-urls=http://127.0.0.1:2381".into(),
    ]);
    cmd
}

pub fn apiserver(layout: &Layout, node0: &NodeSpec) -> anyhow::Result<Command> {
    let pki = layout.pki();
    let p = |f: &str| pki.join(f).to_string_lossy().into_owned();
    let policy = layout.config().join("audit-policy.yaml");
    std::fs::create_dir_all(layout.config())?;
    std::fs::write(&policy, AUDIT_POLICY)
        .with_context(|| format!("writing {}", policy.display()))?;
    let audit = layout.audit_log();
    std::fs::create_dir_all(audit.parent().expect("a file in a directory"))?;
    let mut cmd = Command::new(layout.binary("kube-apiserver"));
    cmd.args([
        format!("--advertise-address={}", node0.ip),
        "--bind-address=0.0.0.0".into(),
        format!("--secure-port={APISERVER_PORT}"),
        // kubeadm's: NodeRestriction on top of the defaults (ValidatingAdmissionPolicy is on
        // by default since 1.30).
        "--enable-admission-plugins=NodeRestriction".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ),
        format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        "--allow-privileged=true".into(),
        "--etcd-servers=https://127.0.0.1:2379".into(),
        format!("--etcd-cafile={}", p("etcd-ca.crt")),
        format!("--etcd-certfile={}", p("apiserver-etcd-client.crt")),
        format!("--etcd-keyfile={}", p("apiserver-etcd-client.key")),
        // Not kubeadm's: an audit log of every request (kubeadm leaves auditing off).
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit.display()),
        "--audit-log-maxsize=200".into(),
        "--audit-log-maxbackup=2".into(),
        // The audit log is read by tests soon after the request: write each batch at once.
        "--audit-log-mode=blocking".into(),
    ]);
    Ok(cmd)
}

pub fn controller_manager(layout: &Layout) -> Command {
    let pki = layout.pki();
    let p = |f: &str| pki.join(f).to_string_lossy().into_owned();
    let kubeconfig = layout.config().join("controller-manager.conf");
    let mut cmd = Command::new(layout.binary("kube-controller-manager"));
    cmd.args([
        "--bind-address=127.0.0.1".into(),
        "--leader-elect=true".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        format!("--client-ca-file={}", p("ca.crt")),
        format!("--root-ca-file={}", p("ca.crt")),
        format!("--service-account-private-key-file={}", p("sa.key")),
        format!("--cluster-signing-cert-file={}", p("ca.crt")),
        format!("--cluster-signing-key-file={}", p("ca.key")),
        "--use-service-account-credentials=true".into(),
        // Every default controller: disruption, daemonset, node lifecycle, service account,
        // CSR signing and approving among them.
        "--controllers=*,bootstrapsigner,tokencleaner".into(),
        "--allocate-node-cidrs=true".into(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // The node range each node's CNI bridge uses (10.244.<node>.0/24).
        "--node-cidr-mask-size=24".into(),
        // Not kubeadm's: FlexVolume drivers (none) under the cluster directory, not the host's
        // /usr/libexec/kubernetes, which the controller manager would create.
        format!(
            "--flex-volume-plugin-dir={}",
            layout.dir.join("volume-plugins").display()
        ),
    ]);
    cmd
}

pub fn scheduler(layout: &Layout) -> Command {
    let kubeconfig = layout.config().join("scheduler.conf");
    let mut cmd = Command::new(layout.binary("kube-scheduler"));
    cmd.args([
        "--bind-address=127.0.0.1".into(),
        "--leader-elect=true".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
    ]);
    cmd
}
