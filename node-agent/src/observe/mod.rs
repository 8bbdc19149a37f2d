//! What the agent reads of its node, each source behind its own module: [`node`] (the node's
//! layout and readings, as the kubelet reads them, with [`fs_probe`] for filesystems off the
//! loop, [`allocatable`] for the Node's figure and [`pid_limit`] for the task limit), [`feed`]
//! (the Kubernetes connection) and [`pods`] (the pods ranked, with [`naming`] for pods the last
//! snapshot has not listed), and the lines armed in the kernel on the workload cgroups,
//! [`triggers`]. The loop that reads them is [`crate::run`].

pub mod allocatable;
pub mod feed;
pub mod fs_probe;
pub mod naming;
pub mod node;
pub mod pid_limit;
pub mod pods;
pub mod triggers;
