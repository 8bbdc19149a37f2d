//! Each node's containerd, kubelet and kube-proxy, with their configuration files.
//!
//! The kubelet is configured as kubeadm configures it (`cmd/kubeadm/app/componentconfigs/
//! kubelet.go`): webhook authentication and authorization, anonymous access off, the cluster
//! CA for client certificates, its own self-signed serving certificate at
//! `/var/lib/kubelet/pki/kubelet.crt` (no `tlsCertFile`, no `serverTLSBootstrap`), the static
//! pod directory, and no eviction settings of its own, so the kubelet's defaults apply
//! (`memory.available<100Mi`, `nodefs.available<10%`, `nodefs.inodesFree<5%`,
//! `imagefs.available<15%`). What this host makes differ, each said where it is set.

use std::{fs, path::Path, process::Command};

use anyhow::Context as _;

use crate::layout::{Layout, NodeSpec, CLUSTER_CIDR};

/// The sandbox ("pause") image: built here from busybox (no registry), so it carries a name of
/// ours, not `registry.k8s.io/pause`.
pub const PAUSE_IMAGE: &str = "localhost/node-agent-cluster/pause:1";

/// Memory the pods of a node may use in all: the kubepods cgroup's hard limit (node
/// allocatable enforcement). The rest of this shared machine is `systemReserved`, so pressure
/// made by tests and benchmarks is pressure on a bounded part of the machine, and the host
/// never meets the OOM killer.
pub const POD_MEMORY_BYTES: u64 = 4 << 30;

/// Kubelet settings a test or benchmark changes (the rest are fixed).
#[derive(Debug, Clone, Default)]
pub struct KubeletOptions {
    /// Extra `KubeletConfiguration` fields, as YAML lines at the top level (eviction
    /// thresholds, `serverTLSBootstrap`, …).
    pub extra: Vec<String>,
}

/// containerd 1.6's configuration: kubeadm's defaults for a node (the CRI plugin, overlayfs,
/// runc), the sandbox image built here, CNI from Debian's plugins.
pub fn containerd_config(layout: &Layout, node: &NodeSpec) -> anyhow::Result<std::path::PathBuf> {
    let dir = layout.node_dir(node);
    let cni = dir.join("cni");
    fs::create_dir_all(&cni)?;
    fs::write(cni.join("10-node-agent.conflist"), cni_config(node))?;
    let text = format!(
        r#"version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
# Its "opt" directory (/opt/containerd by default, on the host's own /opt) on the node's disk.
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This process lacks CAP_SYS_RESOURCE in some sandboxes: containers may not lower their
  # oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # The kubelet's cgroupDriver: cgroupfs (PID 1 is not systemd here).
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        cni = cni.display()
    );
    let path = dir.join("containerd.toml");
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The pods' network: a bridge on the node with host-local addresses from the node's range,
/// no masquerading (nothing is routed off the lan) and no port mapping (no host ports).
fn cni_config(node: &NodeSpec) -> String {
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "node-agent-cluster",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{"subnet": "{cidr}", "gateway": "{gw}"}}]],
        "routes": [{{"dst": "0.0.0.0/0"}}]
      }}
    }},
    {{"type": "loopback"}}
  ]
}}
"#,
        cidr = node.pod_cidr,
        gw = node.pod_gateway
    )
}

pub fn containerd(config: &Path) -> Command {
    let mut cmd = Command::new("containerd");
    cmd.arg("--config").arg(config);
    cmd
}

/// The memory this machine has, from /proc/meminfo.
pub fn mem_total() -> anyhow::Result<u64> {
    let text = fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .context("/proc/meminfo has no MemTotal")
}

/// The kubelet's `KubeletConfiguration`, written to `/var/lib/kubelet/config.yaml` inside the
/// node (where kubeadm writes it, and where the agent's shipped `kubeletConfig` reads it).
pub fn kubelet_config(
    layout: &Layout,
    node: &NodeSpec,
    options: &KubeletOptions,
) -> anyhow::Result<String> {
    let reserved = mem_total()?
        .checked_sub(POD_MEMORY_BYTES)
        .filter(|r| *r >= 2 << 30)
        .context("this machine has too little memory for a node with 4 GiB for pods and 2 GiB for everything else")?;
    let manifests = layout.node_dir(node).join("manifests");
    fs::create_dir_all(&manifests)?;
    let mut text = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# kubeadm's settings.
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
healthzBindAddress: 127.0.0.1
healthzPort: 10248
staticPodPath: {manifests}
# Not kubeadm's: FlexVolume drivers (none) under the cluster directory, not the host's /usr/libexec.
volumePluginDir: {plugins}
# Not kubeadm's, because of this host:
# - PID 1 is not systemd: the cgroupfs driver (kubeadm's default is systemd).
cgroupDriver: cgroupfs
# - the memory controller is on cgroup v1 here, which the kubelet refuses by default since 1.35.
failCgroupV1: false
# - two kubelets on one host cannot share /kubepods: node 0 has the root, as kubeadm's, the others a
#   directory of their own.
cgroupRoot: {cgroup_root}
# - the client certificate was issued directly (no bootstrap token), so nothing to rotate.
rotateCertificates: false
# - the pods get {pods} GiB of this shared machine in all (node allocatable enforcement on the
#   kubepods cgroup): the rest is reserved for the system, so pressure stays inside that part.
enforceNodeAllocatable: [pods]
systemReserved:
  memory: \"{reserved}\"
",
        ca = layout.pki().join("ca.crt").display(),
        manifests = manifests.display(),
        plugins = layout.node_dir(node).join("volume-plugins").display(),
        cgroup_root = node.cgroup_root,
        pods = POD_MEMORY_BYTES >> 30,
    );
    for line in &options.extra {
        text.push_str(line);
        text.push('\n');
    }
    Ok(text)
}

/// The kubelet's command line; its config file is at `/var/lib/kubelet/config.yaml`.
pub fn kubelet(layout: &Layout, node: &NodeSpec) -> Command {
    let mut cmd = Command::new(layout.binary("kubelet"));
    cmd.args([
        "--config=/var/lib/kubelet/config.yaml".to_string(),
        format!(
            "--kubeconfig={}",
            layout
                .config()
                .join(format!("kubelet-{}.conf", node.name))
                .display()
        ),
        format!("--hostname-override={}", node.name),
        format!("--node-ip={}", node.ip),
        "--v=2".to_string(),
    ]);
    cmd
}

/// kube-proxy in iptables mode inside the node's network namespace: the `kubernetes` Service's
/// ClusterIP reaches the API server from pods, as the agent's in-cluster client expects.
pub fn kube_proxy(layout: &Layout, node: &NodeSpec) -> anyhow::Result<Command> {
    let config = layout.node_dir(node).join("kube-proxy.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
clusterCIDR: {CLUSTER_CIDR}
hostnameOverride: {name}
bindAddress: {ip}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# conntrack's table size is the host's, not this network namespace's to set.
conntrack:
  maxPerCore: 0
",
            kubeconfig = layout.config().join("kube-proxy.conf").display(),
            name = node.name,
            ip = node.ip,
        ),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let mut cmd = Command::new(layout.binary("kube-proxy"));
    cmd.arg(format!("--config={}", config.display()));
    Ok(cmd)
}
