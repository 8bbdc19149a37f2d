//! A node's own namespaces, disk and network, and the lan between nodes.
//!
//! Each node is a holder process (`sleep infinity`) started by `unshare` in a new network and
//! mount namespace; every process of the node (containerd, the kubelet, kube-proxy, and on node
//! 0 the control plane) joins both. Inside them:
//!
//! - `/var/lib` is the node's disk, an ext4 image under the cluster directory mounted through a
//!   loop device (autoclear: it detaches when the namespace's last process ends), holding
//!   `/var/lib/kubelet` (nodefs) and `/var/lib/containerd` (images and writable layers on the
//!   same disk: the kubeadm layout the agent calls `shared`). Disk pressure on it is real and
//!   bounded, and never touches the host's disk beyond the image's size.
//! - `/var/log` is a directory of that disk (pod logs count against nodefs, as on a node).
//! - `/run` is a tmpfs of the node's: the runtime's socket, runc's state, pods' network
//!   namespace files.
//! - All three are shared mounts, so the kubelet's `HostToContainer` propagation works.
//!
//! Networking: a bridge `lan0` in a network namespace of its own ([`Lan`]); each node's `eth0`
//! is a veth whose peer is on that bridge, with the node's InternalIP. Pods are on the node's
//! CNI bridge, `10.244.<node>.0/24`; each node routes the others' pod ranges to them. The
//! lan's gateway forwards nothing, so no packet can leave: the host's own interfaces and
//! firewall are never touched.

use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{
    layout::{Layout, NodeSpec, LAN_GATEWAY, LAN_PREFIX, NODE_DISK_BYTES},
    process::{output_of, spawn_daemon, Daemon, Namespaces},
};

/// Starts a holder of new network and mount namespaces (`node-agent-cluster hold`, the
/// `helper` binary), forwarding `forward` (`LISTEN=TARGET`) from this host's loopback into
/// them when given.
pub fn holder(
    helper: &Path,
    layout: &Layout,
    name: &str,
    forward: Option<String>,
) -> anyhow::Result<Daemon> {
    let log = layout.log(name);
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(helper);
    cmd.arg("hold").arg(&layout.dir).arg(name);
    if let Some(spec) = forward {
        cmd.arg(spec);
    }
    let daemon = spawn_daemon(name, &mut cmd, None, &log)?;
    daemon.wait_until(
        "its namespaces exist",
        std::time::Duration::from_secs(10),
        || std::fs::read_to_string(&log).is_ok_and(|t| t.contains("holding")),
    )?;
    Ok(daemon)
}

/// Runs a command inside `ns` to its end.
pub fn in_ns(ns: Namespaces, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let _entered = ns.enter(&mut cmd)?;
    output_of(&mut cmd)
}

/// The lan: its holder and bridge.
pub struct Lan {
    pub ns: Namespaces,
}

impl Lan {
    pub fn create(holder: &Daemon) -> anyhow::Result<Self> {
        let ns = Namespaces { holder: holder.pid };
        in_ns(ns, "ip", &["link", "set", "lo", "up"])?;
        in_ns(ns, "ip", &["link", "add", "lan0", "type", "bridge"])?;
        in_ns(
            ns,
            "ip",
            &[
                "addr",
                "add",
                &format!("{LAN_GATEWAY}/{LAN_PREFIX}"),
                "dev",
                "lan0",
            ],
        )?;
        in_ns(ns, "ip", &["link", "set", "lan0", "up"])?;
        Ok(Self { ns })
    }

    /// Plugs a node in: `eth0` in the node, its peer on `lan0`.
    pub fn connect(&self, node: &NodeSpec, node_ns: Namespaces) -> anyhow::Result<()> {
        let peer = format!("n{}", node.index);
        in_ns(
            self.ns,
            "ip",
            &[
                "link",
                "add",
                &peer,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &node_ns.holder.to_string(),
            ],
        )?;
        in_ns(
            self.ns,
            "ip",
            &["link", "set", &peer, "master", "lan0", "up"],
        )?;
        Ok(())
    }
}

/// Sets a node's network up: loopback, `eth0` with its address, the default route to the
/// lan's gateway, forwarding (for its pods), and routes to the other nodes' pod ranges.
pub fn network(node: &NodeSpec, ns: Namespaces, others: &[NodeSpec]) -> anyhow::Result<()> {
    in_ns(ns, "ip", &["link", "set", "lo", "up"])?;
    in_ns(
        ns,
        "ip",
        &[
            "addr",
            "add",
            &format!("{}/{LAN_PREFIX}", node.ip),
            "dev",
            "eth0",
        ],
    )?;
    in_ns(ns, "ip", &["link", "set", "eth0", "up"])?;
    in_ns(ns, "ip", &["route", "add", "default", "via", LAN_GATEWAY])?;
    in_ns(ns, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    for other in others.iter().filter(|o| o.index != node.index) {
        in_ns(
            ns,
            "ip",
            &["route", "add", &other.pod_cidr, "via", &other.ip],
        )?;
    }
    Ok(())
}

/// Makes the node's disk (once per `up`) and mounts its filesystems inside its namespace.
pub fn filesystems(layout: &Layout, node: &NodeSpec, ns: Namespaces) -> anyhow::Result<()> {
    let dir = layout.node_dir(node);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let disk = layout.node_disk(node);
    let _ = std::fs::remove_file(&disk);
    let file =
        std::fs::File::create(&disk).with_context(|| format!("creating {}", disk.display()))?;
    file.set_len(NODE_DISK_BYTES)
        .with_context(|| format!("sizing {}", disk.display()))?;
    drop(file);
    output_of(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", &node.name])
            .arg(&disk),
    )
    .context("making the node's filesystem (mkfs.ext4)")?;
    let disk = disk.to_string_lossy().into_owned();
    in_ns(ns, "mount", &["-o", "loop", &disk, "/var/lib"])?;
    for sub in ["kubelet", "containerd", "cni", "log"] {
        in_ns(ns, "mkdir", &["-p", &format!("/var/lib/{sub}")])?;
    }
    in_ns(ns, "mount", &["--bind", "/var/lib/log", "/var/log"])?;
    in_ns(
        ns,
        "mount",
        &["-t", "tmpfs", "-o", "mode=755,size=256m", "tmpfs", "/run"],
    )?;
    for path in ["/var/lib", "/var/log", "/run"] {
        in_ns(ns, "mount", &["--make-rshared", path])?;
    }
    Ok(())
}

/// An HTTP/1.1 GET from inside a node's network namespace (where pods' addresses are
/// reachable), as a scraper on the node would make it: `bearer` as its Authorization. Returns
/// the status code and the body (at most 16 MiB); bounded by 10 s.
pub fn http_get(
    ns: Namespaces,
    addr: std::net::SocketAddr,
    path: &str,
    bearer: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use std::io::{Read as _, Write as _};
    let net = std::fs::File::open(format!("/proc/{}/ns/net", ns.holder))
        .context("opening the node's network namespace")?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{}\r\n",
        bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"))
    );
    // A thread of its own enters the namespace; the socket it makes stays there.
    let stream = std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns(2) on this thread only, with a namespace descriptor.
        if unsafe { libc::setns(net.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(5))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the connecting thread panicked"))?
    .with_context(|| format!("connecting to {addr} inside the node"))?;
    let mut stream = stream;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream
        .take(16 << 20)
        .read_to_end(&mut raw)
        .with_context(|| format!("reading {path} from {addr}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("no HTTP status from {addr}{path}: {head:?}"))?;
    // Chunked bodies (the agent's answers are not chunked, but a proxy's may be): joined.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
