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
/// namespace ([`crate::forward`]). Not 6443, which a real cluster on a developer's machine
/// may hold.
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
pub const NODE_DISK_BYTES: u64 = 8 << 30;

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
    pub fn new(index: u8) -> Self {
        Self {
            index,
            name: format!("node-agent-{index}"),
            ip: format!("10.99.0.{}", 10 + u32::from(index)),
            pod_cidr: format!("10.244.{index}.0/24"),
            pod_gateway: format!("10.244.{index}.1"),
            cgroup_root: if index == 0 {
                "/".to_string()
            } else {
                format!("/node-agent-node{index}")
            },
        }
    }
}

/// The cluster directory and the paths in it.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// `$NODE_AGENT_CLUSTER_DIR`, else `<workspace>/target/cluster`.
    pub fn default_for(workspace: &Path) -> Self {
        match std::env::var_os("NODE_AGENT_CLUSTER_DIR") {
            Some(dir) => Self::new(dir),
            None => Self::new(workspace.join("target/cluster")),
        }
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
        format!("https://127.0.0.1:{HOST_API_PORT}")
    }
}
