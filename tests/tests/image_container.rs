//! The agent's image (`cargo xtask image`) in a real containerd, run with the security context
//! and mounts of the DaemonSet as `kubectl kustomize deploy` renders it (each runtime
//! component too), translated as the kubelet would: it must load its kernel programs, report a
//! real OOM kill on the host and answer `/healthz`. Then each added capability is taken away
//! in turn: without BPF or PERFMON the agent fails to start, without KILL (or the host's PID
//! namespace) it says it cannot kill a pod on the node: the set is minimal.
//!
//! Differences from a cluster, all outside the security context: the ConfigMap is a standalone
//! config (no API server here), and the hostPaths this machine lacks (it runs no kubelet) are
//! stood in for: `/var/lib/kubelet` by an empty directory, the runtime's root by the test
//! containerd's own root, the host's `/run` by a directory holding the test containerd's
//! socket where the runtime component says the runtime's socket is
//! (`containerd/containerd.sock`, `k3s/containerd/containerd.sock`, `crio/crio.sock`). In
//! Kubernetes mode (an API server that cannot be reached) the agent reaches that containerd
//! through the mount, at the DaemonSet's `CONTAINER_RUNTIME_ENDPOINT`.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_cri::{model::ContainerState, proto};
use node_agent_tests::{
    containerd::{Containerd, Options, Pod},
    podspec::{check_container_fields, render_daemonset, PodTemplate, Volume},
    require_root, runtime, AgentProcess, Helper, TestCgroup,
};

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");
const AGENT_UID: &str = "8c1f7a52-3d4e-4b6a-9f0e-1a2b3c4d5e6f";
/// Capability numbers (linux/capability.h).
const CAP_KILL: u32 = 5;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The DaemonSet as rendered with `components`, checked for fields the test cannot translate.
fn daemonset_with(components: &[&str]) -> anyhow::Result<PodTemplate> {
    let template = render_daemonset(components, "node-agent")?;
    check_container_fields(&template)?;
    Ok(template)
}

fn daemonset() -> anyhow::Result<PodTemplate> {
    daemonset_with(&[])
}

/// Where each runtime component says the runtime's socket is, below the host's /run, and
/// where its root is.
const RUNTIMES: [(&[&str], &str, &str); 4] = [
    (&[], "containerd/containerd.sock", "/var/lib/containerd"),
    (
        &["runtime-k3s"],
        "k3s/containerd/containerd.sock",
        "/var/lib/rancher/k3s/agent/containerd",
    ),
    (
        &["runtime-rke2"],
        "k3s/containerd/containerd.sock",
        "/var/lib/rancher/rke2/agent/containerd",
    ),
    (
        &["runtime-crio"],
        "crio/crio.sock",
        "/var/lib/containers/storage",
    ),
];

/// The image `cargo xtask test` built (`cargo xtask image`); the test fails without it.
fn image() -> (PathBuf, String) {
    let archive = std::env::var_os("NODE_AGENT_IMAGE_ARCHIVE").expect(
        "NODE_AGENT_IMAGE_ARCHIVE names the image archive: run this through `cargo xtask test`, which builds it",
    );
    let reference = std::env::var("NODE_AGENT_IMAGE").expect("NODE_AGENT_IMAGE names the image");
    (PathBuf::from(archive), reference)
}

/// The agent's pod as the kubelet would create it from the template (with `tweak` applied to
/// the container's security context), and its container ID.
struct AgentPod {
    pod: Pod,
    config: proto::ContainerConfig,
    id: String,
    run_dir: PathBuf,
    port: u16,
}

async fn run_agent(
    ctrd: &Containerd,
    template: &PodTemplate,
    reference: &str,
    attempt: u32,
    tweak: impl FnOnce(&mut proto::LinuxContainerSecurityContext),
) -> anyhow::Result<AgentPod> {
    run_agent_with(ctrd, template, reference, attempt, tweak, None).await
}

/// A config of the test's own instead of the standalone one (`{port}` replaced by the
/// listener's), files next to it in the ConfigMap's directory, extra environment.
struct Custom<'a> {
    config: &'a str,
    files: &'a [(&'a str, &'a [u8])],
    env: &'a [(&'a str, &'a str)],
}

/// What stands in for the runtime's paths on a node: the test containerd's socket at this
/// path below the stand-in /run, and the runtime root's hostPath (`root`) backed by `backing`
/// (the test containerd's root; a path that does not exist, for a node of another runtime).
struct Node<'a> {
    socket_below_run: &'a str,
    root: &'a str,
    backing: Option<PathBuf>,
}

const STANDARD: Node<'static> = Node {
    socket_below_run: "containerd/containerd.sock",
    root: "/var/lib/containerd",
    backing: None,
};

/// As [`run_agent`], with a config of the test's own.
async fn run_agent_with(
    ctrd: &Containerd,
    template: &PodTemplate,
    reference: &str,
    attempt: u32,
    tweak: impl FnOnce(&mut proto::LinuxContainerSecurityContext),
    custom: Option<Custom<'_>>,
) -> anyhow::Result<AgentPod> {
    run_agent_on(ctrd, template, reference, attempt, tweak, custom, &STANDARD).await
}

/// As [`run_agent_with`], on a node whose runtime's paths are `node`.
async fn run_agent_on(
    ctrd: &Containerd,
    template: &PodTemplate,
    reference: &str,
    attempt: u32,
    tweak: impl FnOnce(&mut proto::LinuxContainerSecurityContext),
    custom: Option<Custom<'_>>,
    node: &Node<'_>,
) -> anyhow::Result<AgentPod> {
    let port = template.port("http")?;
    let (resources, qos) = template.resources()?;
    let volumes = ctrd.dir().join(format!("volumes-{attempt}"));
    let config_dir = volumes.join("config");
    let run_dir = volumes.join("run");
    let kubelet_dir = volumes.join("kubelet");
    for d in [&config_dir, &run_dir, &kubelet_dir] {
        std::fs::create_dir_all(d)?;
    }
    // Standalone: no API server here. Everything else at its defaults, as in the ConfigMap.
    let Custom {
        config: config_text,
        files,
        env: extra_env,
    } = custom.unwrap_or(Custom {
        // Read from the host over the pod's address: open (who may read /metrics is not what
        // this test is about).
        config: "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\nlisten: '0.0.0.0:{port}'\nmetricsAccess: open\n",
        files: &[],
        env: &[],
    });
    std::fs::write(
        config_dir.join("config.yaml"),
        config_text.replace("{port}", &port.to_string()),
    )?;
    for (name, content) in files {
        std::fs::write(config_dir.join(name), content)?;
    }

    let mut sandbox = ctrd.pod_config(
        "node-agent",
        &format!("node-agent-{attempt}"),
        AGENT_UID,
        qos,
    );
    sandbox
        .metadata
        .as_mut()
        .expect("pod_config sets metadata")
        .attempt = attempt;
    let linux = sandbox.linux.as_mut().expect("pod_config sets linux");
    linux.security_context = Some(proto::LinuxSandboxSecurityContext {
        namespace_options: Some(template.namespaces()),
        ..Default::default()
    });
    let pod = ctrd.run_pod(sandbox).await?;

    let (command, args) = template.command();
    let fields: BTreeMap<&str, &str> = [
        ("spec.nodeName", "test-node"),
        ("metadata.name", "node-agent-test"),
        ("metadata.namespace", "node-agent"),
    ]
    .into();
    let root = node
        .backing
        .clone()
        .unwrap_or_else(|| ctrd.root().to_path_buf());
    // The host's /run as this node has it: the runtime's socket where its runtime keeps it (a
    // hard link: the same socket under the runtime's own name and directory).
    let host_run = volumes.join("host-run");
    let socket = host_run.join(node.socket_below_run);
    std::fs::create_dir_all(socket.parent().context("the socket's directory")?)?;
    if !socket.exists() {
        std::fs::hard_link(ctrd.socket(), &socket).with_context(|| {
            format!(
                "linking {} as {}",
                ctrd.socket().display(),
                socket.display()
            )
        })?;
    }
    let mounts = template.mounts(|name, volume| {
        Ok(match (name, volume) {
            (_, Volume::ConfigMap { .. }) => Some(config_dir.clone()),
            (_, Volume::EmptyDir) => Some(run_dir.clone()),
            (_, Volume::HostPath { path, .. }) if path == "/var/lib/kubelet" => {
                Some(kubelet_dir.clone())
            }
            (_, Volume::HostPath { path, .. }) if path == node.root => Some(root.clone()),
            (_, Volume::HostPath { path, .. }) if path == "/run" => Some(host_run.clone()),
            // The host's own cgroups.
            (_, Volume::HostPath { path, .. }) if path == "/sys/fs/cgroup" => None,
            (_, Volume::HostPath { path, .. }) => {
                bail!("hostPath {path} (volume {name}): not a path of this node's runtime ({}) nor the agent's", node.root)
            }
        })
    })?;
    let mut security = template.security_context()?;
    tweak(&mut security);
    let mut config = Containerd::container_config(&pod, "node-agent", attempt, reference, &[]);
    config.command = command;
    config.args = args;
    config.envs = template.env(&fields)?;
    config
        .envs
        .extend(extra_env.iter().map(|(key, value)| proto::KeyValue {
            key: key.to_string(),
            value: value.as_bytes().to_vec(),
        }));
    config.mounts = mounts;
    config.linux = Some(proto::LinuxContainerConfig {
        resources: Some(resources),
        security_context: Some(security),
    });
    let id = ctrd.run_container(&pod, config.clone(), true).await?;
    Ok(AgentPod {
        pod,
        config,
        id,
        run_dir,
        port,
    })
}

fn http_get(addr: &str, port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(
        &format!("{addr}:{port}").parse()?,
        Duration::from_secs(2),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// The capability mask of a process (`CapEff` in /proc/PID/status), and two flags.
fn process_security(pid: u32) -> anyhow::Result<(u64, String, String)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("{name} in /proc/{pid}/status"))
    };
    let cap_eff = u64::from_str_radix(&field("CapEff:")?, 16)?;
    Ok((cap_eff, field("NoNewPrivs:")?, field("Seccomp:")?))
}

#[test]
fn the_image_runs_with_the_daemonsets_privileges_and_reports_a_host_oom_kill() {
    require_root();
    let (archive, reference) = image();
    runtime()
        .block_on(async {
            let template = daemonset()?;
            let ctrd = Containerd::start(Options::default()).await?;
            ctrd.import_archive(&archive, &reference).await?;
            let agent = run_agent(&ctrd, &template, &reference, 0, |_| {}).await?;
            let ip = ctrd.pod_ip(&agent.pod).await?;

            // Ready: /healthz answers on the pod's IP.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match http_get(&ip, agent.port, "/healthz") {
                    Ok(reply) if reply.starts_with("HTTP/1.1 200") => break,
                    _ if Instant::now() > deadline => bail!(
                        "no 200 from /healthz at {ip}:{} within 30 s; the agent said:\n{}",
                        agent.port,
                        Containerd::container_log(&agent.pod, &agent.config)
                    ),
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }

            // It runs with exactly the named capabilities, no privilege escalation, seccomp.
            let pid = ctrd.container_pid(&agent.id).await?;
            let (cap_eff, no_new_privs, seccomp) = process_security(pid)?;
            assert_eq!(
                cap_eff,
                (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_KILL),
                "effective capabilities {cap_eff:#x}: BPF, PERFMON and KILL only"
            );
            assert_eq!(no_new_privs, "1", "allowPrivilegeEscalation: false");
            assert_eq!(seccomp, "2", "seccomp filter mode (RuntimeDefault)");
            let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
            let root = mountinfo
                .lines()
                .find(|l| l.split_whitespace().nth(4) == Some("/"))
                .context("the container's root in its mountinfo")?;
            assert!(
                root.split_whitespace()
                    .nth(5)
                    .is_some_and(|o| o.split(',').any(|f| f == "ro")),
                "read-only root filesystem: {root}"
            );

            // A real OOM kill on the host, outside any pod, seen through the trace socket.
            let socket = agent.run_dir.join("trace.sock");
            let trace = AgentProcess::spawn(&[
                "trace".as_ref(),
                "--output".as_ref(),
                "json".as_ref(),
                "--kind".as_ref(),
                "oom_kill".as_ref(),
                "--socket".as_ref(),
                socket.as_os_str(),
            ])?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let left = deadline
                    .checked_duration_since(Instant::now())
                    .context("trace did not attach to the agent in the container within 20 s")?;
                if trace
                    .log
                    .recv_timeout(left)
                    .is_ok_and(|l| l.contains("attached"))
                {
                    break;
                }
            }
            let cgroup = TestCgroup::new("image-oom")?;
            cgroup.set_memory_limit(32 << 20)?;
            let mut helper = Helper::spawn(MEM_HELPER, &["oom".to_string()])?;
            let victim = helper.pid();
            cgroup.add(victim)?;
            helper.go()?;
            helper.wait_killed(Duration::from_secs(20))?;

            let deadline = Instant::now() + Duration::from_secs(5);
            let mut seen = None;
            while let Some(left) = deadline.checked_duration_since(Instant::now()) {
                let Ok(v) = trace.json.recv_timeout(left) else {
                    break;
                };
                if v["pid"] == victim {
                    seen = Some(v);
                    break;
                }
            }
            let v = seen.with_context(|| {
                format!(
                    "the agent in the container reported no OOM kill of pid {victim}; it said:\n{}",
                    Containerd::container_log(&agent.pod, &agent.config)
                )
            })?;
            assert_eq!(v["kind"], "oom_kill");
            assert_eq!(v["comm"], "mem-helper");
            assert_eq!(
                v["cgroup"]["id"],
                cgroup.id(),
                "attributed to the host cgroup: {v}"
            );
            let name = cgroup
                .path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            assert!(
                v["cgroup"]["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&name)),
                "the agent names the host cgroup, read through its cgroupfs mount: {v}"
            );
            let metrics = http_get(&ip, agent.port, "/metrics")?;
            assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");

            // The image names the commit it was built from.
            let version = Containerd::container_config(
                &agent.pod,
                "version",
                0,
                &reference,
                &["/usr/local/bin/node-agent", "--version"],
            );
            let id = ctrd
                .run_container(&agent.pod, version.clone(), true)
                .await?;
            ctrd.wait_state(&id, ContainerState::Exited, Duration::from_secs(30))
                .await?;
            let said = Containerd::container_log(&agent.pod, &version);
            let head = std::process::Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .output()?;
            let head = String::from_utf8(head.stdout)?.trim().to_string();
            assert!(
                head.len() == 40
                    && said.contains(&format!("node-agent 0.1.0 (commit {head}, rustc ")),
                "the image's --version names HEAD {head}: {said}"
            );
            assert_eq!(
                ctrd.client()
                    .list_containers(Some(ContainerState::Running))
                    .await?
                    .len(),
                1,
                "the agent is still running"
            );
            anyhow::Ok(())
        })
        .unwrap();
}

/// Kubernetes mode against unreachable addresses (their failures are the agent's to log) with
/// a real CA, so node-level reclaim is on and the agent asks the runtime at once; no
/// `cri.endpoint`: the DaemonSet's CONTAINER_RUNTIME_ENDPOINT names it, as deploy/config.yaml
/// leaves it.
fn kubernetes_mode() -> (String, Vec<u8>) {
    let pki = node_agent_kube::fake::Pki::new();
    let ca = std::fs::read(&pki.ca_file).expect("the fake's CA");
    let config = "apiVersion: node-agent.io/v1alpha1\nkind: NodeAgentConfiguration\n\
         kubernetes:\n  apiServer: {url: 'https://127.0.0.1:1', caFile: /etc/node-agent/ca.crt}\n  \
         kubelet: {url: 'https://127.0.0.1:2', caFile: /etc/node-agent/ca.crt}\n  \
         tokenPath: /etc/node-agent/token\n  retry: {attempts: 1}\n\
         listen: '0.0.0.0:{port}'\nmetricsAccess: open\n"
        .to_string();
    (config, ca)
}

/// Waits until the agent's log says `needle`; an error with its log otherwise.
async fn wait_for_log(agent: &AgentPod, needle: &str, what: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = Containerd::container_log(&agent.pod, &agent.config);
        if log.contains(needle) {
            return Ok(log);
        }
        if Instant::now() > deadline {
            bail!("{what} within 30 s; it said:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[test]
fn each_runtime_component_reaches_its_runtime_through_the_daemonsets_mounts() {
    require_root();
    let (archive, reference) = image();
    runtime()
        .block_on(async {
            let ctrd = Containerd::start(Options::default()).await?;
            ctrd.import_archive(&archive, &reference).await?;
            let (config, ca) = kubernetes_mode();
            let files: &[(&str, &[u8])] = &[("ca.crt", &ca), ("token", b"token\n")];
            let env: &[(&str, &str)] = &[("RUST_LOG", "info,node_agent=debug")];
            for (attempt, (components, socket, root)) in (0..).zip(RUNTIMES) {
                let template = daemonset_with(components)?;
                let node = Node {
                    socket_below_run: socket,
                    root,
                    backing: None,
                };
                let custom = Custom { config: &config, files, env };
                let agent =
                    run_agent_on(&ctrd, &template, &reference, attempt, |_| {}, Some(custom), &node)
                        .await?;
                let log = wait_for_log(
                    &agent,
                    "container runtime images detected",
                    &format!("with {components:?} the agent did not list the runtime's images at /host/run/{socket}"),
                )
                .await?;
                assert!(
                    !log.contains("container runtime unavailable"),
                    "{components:?}: reached at once: {log}"
                );
                let said = log
                    .lines()
                    .find(|l| l.contains("node-level reclaim through the container runtime"))
                    .unwrap_or_default();
                assert!(
                    said.contains(&format!("endpoint=unix:///host/run/{socket} "))
                        && said.contains("CONTAINER_RUNTIME_ENDPOINT"),
                    "{components:?}: the DaemonSet's endpoint: {log}"
                );
                // The mounts as the DaemonSet asks: read-only, following the host's unmounts.
                let pid = ctrd.container_pid(&agent.id).await?;
                let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
                for path in ["/host/run", root] {
                    let mount = mountinfo
                        .lines()
                        .find(|l| l.split_whitespace().nth(4) == Some(path))
                        .with_context(|| format!("{path} in the container's mounts:\n{mountinfo}"))?;
                    assert!(
                        mount
                            .split_whitespace()
                            .nth(5)
                            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
                        "read-only: {mount}"
                    );
                    assert!(
                        mount.contains(" master:"),
                        "HostToContainer: the host's unmounts propagate (a slave mount): {mount}"
                    );
                }
                // Removed (stopped first, as CRI asks) before the next runtime's agent loads its programs.
                ctrd.client().remove_container(&agent.id).await?;
            }
            anyhow::Ok(())
        })
        .unwrap();
}

#[test]
fn on_a_node_of_another_runtime_the_agent_starts_and_reports_the_runtime_unavailable() {
    require_root();
    let (archive, reference) = image();
    runtime()
        .block_on(async {
            let ctrd = Containerd::start(Options::default()).await?;
            ctrd.import_archive(&archive, &reference).await?;
            // CRI-O's component on a containerd node: no socket at /run/crio, no
            // /var/lib/containers/storage (stood in for by a path that does not exist).
            let template = daemonset_with(&["runtime-crio"])?;
            let absent = ctrd.dir().join("absent/var/lib/containers/storage");
            let node = Node {
                socket_below_run: "containerd/containerd.sock",
                root: "/var/lib/containers/storage",
                backing: Some(absent.clone()),
            };
            let (config, ca) = kubernetes_mode();
            let files: &[(&str, &[u8])] = &[("ca.crt", &ca), ("token", b"token\n")];
            let custom = Custom {
                config: &config,
                files,
                env: &[],
            };
            let agent =
                run_agent_on(&ctrd, &template, &reference, 0, |_| {}, Some(custom), &node).await?;
            let ip = ctrd.pod_ip(&agent.pod).await?;
            wait_for_log(
                &agent,
                "container runtime unavailable",
                "the agent did not report the runtime unavailable",
            )
            .await?;
            let metrics = http_get(&ip, agent.port, "/metrics")?;
            assert!(
                metrics.contains("\nnode_agent_node_reclaim_runtime_unavailable 1"),
                "{metrics}"
            );
            assert!(http_get(&ip, agent.port, "/healthz")?.starts_with("HTTP/1.1 200"));
            // The kubelet made the missing root (DirectoryOrCreate), empty; the host's /run
            // got nothing (read-only, never created).
            assert!(absent.is_dir() && std::fs::read_dir(&absent)?.next().is_none());
            let run = std::fs::read_dir(ctrd.dir().join("volumes-0/host-run"))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<Vec<_>, _>>()?;
            assert_eq!(run, ["containerd"], "nothing created below /run");
            assert_eq!(
                ctrd.client()
                    .list_containers(Some(ContainerState::Running))
                    .await?
                    .len(),
                1,
                "the agent runs"
            );
            anyhow::Ok(())
        })
        .unwrap();
}

/// Each capability the DaemonSet adds is needed: without BPF or PERFMON the kernel refuses
/// the agent and it stops, saying which it needs; without KILL it runs, but says it cannot
/// kill a pod on the node (in Kubernetes mode, where it would), and sends hard evictions
/// through the API.
#[test]
fn each_added_capability_is_needed() {
    require_root();
    let (archive, reference) = image();
    runtime()
        .block_on(async {
            let template = daemonset()?;
            let added = template
                .security_context()?
                .capabilities
                .unwrap_or_default()
                .add_capabilities;
            assert_eq!(added, ["BPF", "PERFMON", "KILL"], "the DaemonSet adds these");
            let ctrd = Containerd::start(Options::default()).await?;
            ctrd.import_archive(&archive, &reference).await?;
            let (config, ca) = kubernetes_mode();
            let files: &[(&str, &[u8])] = &[("ca.crt", &ca), ("token", b"token\n")];
            for (attempt, missing) in (1..).zip(&added) {
                let without = |sc: &mut proto::LinuxContainerSecurityContext| {
                    if let Some(caps) = sc.capabilities.as_mut() {
                        caps.add_capabilities.retain(|c| c != missing);
                    }
                };
                if missing == "KILL" {
                    let custom = Custom { config: &config, files, env: &[] };
                    let agent = run_agent_with(&ctrd, &template, &reference, attempt, without, Some(custom)).await?;
                    let log = wait_for_log(
                        &agent,
                        "cannot be carried out on the node here",
                        "without KILL the agent did not say it cannot kill on the node",
                    )
                    .await?;
                    assert!(log.contains("lacks CAP_KILL"), "it names the capability: {log}");
                    ctrd.client().remove_container(&agent.id).await?;
                    continue;
                }
                let agent = run_agent(&ctrd, &template, &reference, attempt, without).await?;
                ctrd.wait_state(&agent.id, ContainerState::Exited, Duration::from_secs(30))
                    .await
                    .with_context(|| format!("without {missing} the agent kept running"))?;
                let status = ctrd.client().container_status(&agent.id).await?;
                let exit = status.status.map(|s| s.exit_code).unwrap_or(0);
                let log = Containerd::container_log(&agent.pod, &agent.config);
                eprintln!("without {missing}: exit code {exit}; the agent said:\n{log}");
                assert_ne!(exit, 0, "without {missing} the agent fails: {log}");
                assert!(
                    log.contains("Operation not permitted")
                        && log.contains("needs root, or CAP_BPF and CAP_PERFMON"),
                    "without {missing} the kernel refuses the agent, and it says which capabilities it needs: {log}"
                );
            }
            anyhow::Ok(())
        })
        .unwrap();
}

/// The kill of a pod on the node needs the host's PID namespace (`hostPID: true`): with the
/// DaemonSet's spec the agent says it carries hard evictions out on the node; in a PID
/// namespace of its own it says it cannot, and why.
#[test]
fn the_kill_on_the_node_needs_the_hosts_pid_namespace() {
    require_root();
    let (archive, reference) = image();
    runtime()
        .block_on(async {
            let ctrd = Containerd::start(Options::default()).await?;
            ctrd.import_archive(&archive, &reference).await?;
            let (config, ca) = kubernetes_mode();
            let files: &[(&str, &[u8])] = &[("ca.crt", &ca), ("token", b"token\n")];
            let shipped = daemonset()?;
            assert!(
                shipped.host_pid(),
                "the DaemonSet asks for the host's PID namespace"
            );
            let custom = Custom {
                config: &config,
                files,
                env: &[],
            };
            let agent =
                run_agent_with(&ctrd, &shipped, &reference, 1, |_| {}, Some(custom)).await?;
            wait_for_log(
                &agent,
                "hard memory and PID evictions are carried out on the node",
                "with the DaemonSet's spec the agent did not say it kills on the node",
            )
            .await?;
            ctrd.client().remove_container(&agent.id).await?;
            let mut own = shipped.clone();
            own.spec["hostPID"] = serde_json::Value::Bool(false);
            let custom = Custom {
                config: &config,
                files,
                env: &[],
            };
            let agent = run_agent_with(&ctrd, &own, &reference, 2, |_| {}, Some(custom)).await?;
            let log = wait_for_log(
                &agent,
                "cannot be carried out on the node here",
                "in a PID namespace of its own the agent did not say it cannot kill on the node",
            )
            .await?;
            assert!(log.contains("not in the host's PID namespace"), "{log}");
            anyhow::Ok(())
        })
        .unwrap();
}
