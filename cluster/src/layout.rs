//! Where everything of one cluster lives, and its fixed addresses.
//!
//! All files are under the cluster directory (`target/cluster` of the checkout by default):
//! nothing is written outside it. The nodes' well-known paths (`/var/lib/kubelet`,
//! `/var/lib/containerd`, `/run/containerd`, `/var/log/pods`) exist only inside each node's
//! own mount namespace, over a disk image of the node's (see [`crate::node`]).

use std::path::{Path, PathBuf};

/// The API server's port inside node 0's network namespace (kubeadm's).
pub const APISERVER_PORT: u16 = 6443;
/// Where the API server is reached from this host: loopback, forwarded into node 0's network
/// namespace by node 0's holder. Not 6443, which a real cluster on a developer's machine may
/// hold. Instance N (`NODE_AGENT_CLUSTER_INSTANCE`) uses this port + N.
pub const HOST_API_PORT: u16 = 16443;
/// The lan the nodes share: a bridge in a network namespace of its own.
pub const LAN_GATEWAY: &str = "10.99.0.1";
pub const LAN_PREFIX: u8 = 24;
/// Services' ClusterIPs (kubeadm's default), and the `kubernetes` service's.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// Pods' addresses: `10.244.<node>.0/24` on each node (kubeadm with flannel's usual CIDR).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The size of each node's disk (sparse; what it holds is what it costs).
pub const NODE_DISK_BYTES: u64 = 4 << 30;

/// One node's fixed facts.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub index: u8,
    pub name: String,
    /// Its InternalIP on the lan.
    pub ip: String,
    pub pod_cidr: String,
    pub pod_gateway: String,
    /// The kubelet's `cgroupRoot`: `/` for the first node (as kubeadm), a directory of its own
    /// for the others (two kubelets cannot share `/kubepods`).
    pub cgroup_root: String,
}

impl NodeSpec {
    /// Node `index` of cluster instance `instance` (0 unless two clusters share the host).
    pub fn new(instance: u8, index: u8) -> Self {
        Self {
            index,
            name: format!("node-agent-{index}"),
            ip: format!("10.99.0.{}", 10 + u32::from(index)),
            pod_cidr: format!("10.244.{index}.0/24"),
            pod_gateway: format!("10.244.{index}.1"),
            cgroup_root: match (instance, index) {
                (0, 0) => "/".to_string(),
                (0, i) => format!("/node-agent-node{i}"),
                (n, i) => format!("/node-agent-c{n}-node{i}"),
            },
        }
    }
}

/// The cluster directory and the paths in it.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    /// Which of the clusters on this host (0 by default): two clusters of two checkouts can
    /// run at once when their instances differ (the host's API port and the nodes' cgroup
    /// roots are the only things they would share; the rest is in namespaces of their own).
    pub instance: u8,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>, instance: u8) -> Self {
        Self {
            dir: dir.into(),
            instance,
        }
    }

    /// `$NODE_AGENT_CLUSTER_DIR`, else `<workspace>/target/cluster`; the instance from
    /// `$NODE_AGENT_CLUSTER_INSTANCE` (0 to 9), else 0.
    pub fn default_for(workspace: &Path) -> Self {
        let dir = std::env::var_os("NODE_AGENT_CLUSTER_DIR")
            .map_or_else(|| workspace.join("target/cluster"), PathBuf::from);
        let instance = std::env::var("NODE_AGENT_CLUSTER_INSTANCE")
            .ok()
            .and_then(|v| v.parse::<u8>().ok())
            .filter(|n| *n <= 9)
            .unwrap_or(0);
        Self::new(dir, instance)
    }

    /// Node `index` of this cluster.
    pub fn node(&self, index: u8) -> NodeSpec {
        NodeSpec::new(self.instance, index)
    }

    /// The API server's port on this host's loopback.
    pub fn host_port(&self) -> u16 {
        HOST_API_PORT + u16::from(self.instance)
    }

    pub fn bin(&self) -> PathBuf {
        self.dir.join("bin")
    }
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin().join(name)
    }
    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    pub fn log(&self, component: &str) -> PathBuf {
        self.logs().join(format!("{component}.log"))
    }
    pub fn etcd_data(&self) -> PathBuf {
        self.dir.join("etcd")
    }
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("audit/audit.log")
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config")
    }
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.conf")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    pub fn images(&self) -> PathBuf {
        self.dir.join("images")
    }
    pub fn node_dir(&self, node: &NodeSpec) -> PathBuf {
        self.dir.join("nodes").join(&node.name)
    }
    pub fn node_disk(&self, node: &NodeSpec) -> PathBuf {
        self.node_dir(node).join("disk.img")
    }
    /// The API server as this host's clients reach it.
    pub fn host_server(&self) -> String {
        format!("https://127.0.0.1:{}", self.host_port())
    }
}
