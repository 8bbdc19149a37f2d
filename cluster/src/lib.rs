//! A real Kubernetes on this machine, for the agent's real-cluster tests and benchmarks:
//! `cargo xtask cluster build | up | down | status | test`.
//!
//! Components built from their Go modules at the release `cluster/go/go.mod` pins
//! ([`compile`]); one node (or more) set up as kubeadm sets one up — etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy — each node in
//! network and mount namespaces of its own ([`node`]), so nothing is written to the host's
//! `/var/lib` or `/run` and no packet reaches the host's interfaces; the API server forwarded to
//! this host's loopback ([`layout::HOST_API_PORT`]; two clusters of two checkouts may run at
//! once with different `NODE_AGENT_CLUSTER_INSTANCE`s). Then the agent installed from `deploy/` as
//! the README tells users to, through `cluster/overlay`, which names each difference this box
//! needs. `down` ends all of it ([`down`]).

pub mod chart;
pub mod compile;
pub mod control_plane;
pub mod down;
pub mod faults;
pub mod gomod;
pub mod gotool;
pub mod images;
pub mod kubectl;
pub mod layout;
pub mod node;
pub mod node_components;
pub mod pki;
pub mod process;
pub mod state;
pub mod up;

pub use kubectl::Kubectl;
pub use layout::{Layout, NodeSpec};
pub use up::{Cluster, UpOptions};
