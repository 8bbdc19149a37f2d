//! A real containerd (Debian's 1.6 with its CRI plugin, and runc) started by a test with its
//! own config, root, state and socket, optionally on a small tmpfs so disk pressure is real.
//! Pods and containers are created through the CRI as the kubelet would create them (cgroupfs
//! driver, cgroup parents `…/kubepods/<qos>/pod<uid>`), under a cgroup of the test's own.
//!
//! Dropping the fixture stops and removes every sandbox and container, kills containerd and
//! any shim it left, unmounts what it mounted and removes its cgroups and directory — also
//! when the test failed. Every wait is bounded.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_cri::{proto, CriClient, CriSettings, Endpoint};

use crate::oci::{BuiltImage, ImageSpec};

/// The sandbox ("pause") image every fixture imports first: busybox sleeping.
pub const PAUSE_IMAGE: &str = "localhost/node-agent-test/pause:1";
/// Pods' addresses, on the fixture's bridge. One containerd runs at a time, so one subnet.
const POD_SUBNET: &str = "10.231.0.0/24";
/// How long containerd gets to come up, and cleanup to finish.
const START_LIMIT: Duration = Duration::from_secs(30);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start containerd.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Put containerd's root (images, snapshots, writable layers) on a tmpfs of this size.
    pub small_fs_bytes: Option<u64>,
}

/// A running containerd owned by one test.
pub struct Containerd {
    dir: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    small_fs: Option<PathBuf>,
    /// The test's own cgroup directory name, below every hierarchy's root.
    cgroup_root: String,
    /// The pods' bridge on the host (at most 15 characters).
    bridge: String,
    child: Option<Child>,
    client: CriClient,
    /// Held for the fixture's life; released after cleanup (fields drop after `drop`).
    _lock: FixtureLock,
}

/// A pod sandbox created through the CRI, with the config it was created with (the CRI wants
/// it again for each container).
#[derive(Debug, Clone)]
pub struct Pod {
    pub sandbox_id: String,
    pub uid: String,
    pub config: proto::PodSandboxConfig,
}

impl Containerd {
    /// Starts containerd and waits until its CRI answers `Version`; imports the pause image.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        crate::require_root();
        for tool in ["containerd", "ctr", "runc", "ip"] {
            if which(tool).is_none() {
                bail!("{tool} is not installed: run `cargo xtask setup` (Debian's containerd and runc)");
            }
        }
        let lock = FixtureLock::acquire()?;
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let label = format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(format!("node-agent-containerd-{label}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut fixture = Self {
            root: dir.join("root"),
            socket: dir.join("containerd.sock"),
            small_fs: None,
            cgroup_root: format!("node-agent-test-cri-{label}"),
            bridge: format!("natest{}", std::process::id() % 100_000),
            child: None,
            client: CriClient::lazy(&CriSettings {
                endpoint: Endpoint::from_path(dir.join("containerd.sock")),
                timeout: CALL_TIMEOUT,
            }),
            dir,
            _lock: lock,
        };
        // From here on, Drop cleans up whatever was done.
        // A node under systemd has every mount shared; pods' `HostToContainer` mounts need it.
        // This machine's root is private, so the fixture's directory becomes a shared mount.
        make_shared_mount(&fixture.dir)?;
        if let Some(bytes) = options.small_fs_bytes {
            let fs = fixture.dir.join("fs");
            std::fs::create_dir_all(&fs)?;
            mount_tmpfs(&fs, bytes)?;
            fixture.small_fs = Some(fs.clone());
            fixture.root = fs.join("root");
        }
        fixture.write_config()?;
        let log = std::fs::File::create(fixture.dir.join("containerd.log"))?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(fixture.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting containerd")?;
        fixture.child = Some(child);
        fixture.wait_ready().await?;
        let pause = ImageSpec::busybox(PAUSE_IMAGE)?.with_cmd(&["/bin/sleep", "2147483647"]);
        fixture.build_and_import(&pause, "pause").await?;
        Ok(fixture)
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let cni = self.dir.join("cni");
        std::fs::create_dir_all(&cni)?;
        // Pods get a network namespace of their own on a bridge of the fixture's, as with a
        // typical CNI: the test reaches a pod at its IP from the host. No masquerading and no
        // default route: nothing leaves the host; the bridge goes with the fixture.
        std::fs::write(
            cni.join("10-node-agent-test.conflist"),
            serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "node-agent-test",
                "plugins": [
                    {"type": "loopback"},
                    {
                        "type": "bridge",
                        "bridge": self.bridge,
                        "isGateway": true,
                        "ipMasq": false,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": self.dir.join("ipam"),
                            "ranges": [[{"subnet": POD_SUBNET}]],
                        },
                    },
                ],
            })
            .to_string(),
        )?;
        let d = self.dir.display();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stats_collect_period = 1
  restrict_oom_score_adj = {restrict_oom}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
"#,
            root = self.root.display(),
            sock = self.socket.display(),
            cni = cni.display(),
            restrict_oom = !has_capability(CAP_SYS_RESOURCE),
        );
        std::fs::write(self.dir.join("config.toml"), config)?;
        Ok(())
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "containerd exited at start ({status}):\n{}",
                    self.log_tail()
                );
            }
            if self.socket.exists() {
                if let Ok(version) = self.client.version().await {
                    if version.runtime_api_version == "v1" {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd's CRI did not answer within {START_LIMIT:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines of containerd's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn client(&self) -> &CriClient {
        &self.client
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::from_path(&self.socket)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A scratch directory that goes with the fixture.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's root directory (on the small filesystem when there is one).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The small filesystem's mount point.
    pub fn small_fs(&self) -> Option<&Path> {
        self.small_fs.as_deref()
    }

    /// The test cgroup below which all pods live (`/<it>/kubepods/...`), hierarchy-relative.
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.cgroup_root)
    }

    /// `ctr -n k8s.io images import`: what the kubelet's pull would leave behind. Waits until
    /// the CRI lists the image.
    pub async fn import(&self, image: &BuiltImage) -> anyhow::Result<()> {
        self.import_archive(&image.tar, &image.name).await
    }

    /// Imports an OCI archive (a layout tar whose index names the image `name`).
    pub async fn import_archive(&self, tar: &Path, name: &str) -> anyhow::Result<()> {
        let output = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(tar)
            .output()
            .context("running ctr images import")?;
        if !output.status.success() {
            bail!(
                "ctr images import {} failed ({}): {}",
                tar.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let deadline = Instant::now() + START_LIMIT;
        while self.client.image_status(name).await?.is_none() {
            if Instant::now() > deadline {
                bail!(
                    "{} imported but the CRI does not list {name}",
                    tar.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// The pod's IP on the fixture's bridge.
    pub async fn pod_ip(&self, pod: &Pod) -> anyhow::Result<String> {
        let status = self.client.pod_sandbox_status(&pod.sandbox_id).await?;
        status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .filter(|ip| !ip.is_empty())
            .context("the sandbox has no IP")
    }

    /// The host PID of a running container's first process (containerd's verbose status).
    pub async fn container_pid(&self, id: &str) -> anyhow::Result<u32> {
        let status = self.client.container_status(id).await?;
        let info = status.info.get("info").context("no verbose info")?;
        let info: serde_json::Value = serde_json::from_str(info)?;
        info["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .filter(|p| *p > 0)
            .with_context(|| format!("no pid in the container's info: {info}"))
    }

    /// What a container printed so far (the CRI log file, one `<time> <stream> <tag> <line>`
    /// per line; the lines themselves are returned).
    pub fn container_log(pod: &Pod, config: &proto::ContainerConfig) -> String {
        let path = Path::new(&pod.config.log_directory).join(&config.log_path);
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Writes `spec` into the fixture's directory and imports it.
    pub async fn build_and_import(
        &self,
        spec: &ImageSpec,
        file: &str,
    ) -> anyhow::Result<BuiltImage> {
        let image = spec.write(&self.dir.join(format!("{file}.tar")))?;
        self.import(&image).await?;
        std::fs::remove_file(&image.tar).ok();
        Ok(image)
    }

    /// The cgroup parent the kubelet (cgroupfs driver) gives a pod of this QoS class.
    pub fn cgroup_parent(&self, qos: &str, uid: &str) -> String {
        match qos {
            "guaranteed" => format!("/{}/kubepods/pod{uid}", self.cgroup_root),
            _ => format!("/{}/kubepods/{qos}/pod{uid}", self.cgroup_root),
        }
    }

    /// A sandbox config as the kubelet writes it; callers adjust it before `run_pod`.
    pub fn pod_config(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        qos: &str,
    ) -> proto::PodSandboxConfig {
        let labels: HashMap<String, String> = [
            (node_agent_cri::model::POD_UID_LABEL, uid),
            (node_agent_cri::model::POD_NAME_LABEL, name),
            (node_agent_cri::model::POD_NAMESPACE_LABEL, namespace),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        proto::PodSandboxConfig {
            metadata: Some(proto::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: self
                .dir
                .join("pods")
                .join(format!("{namespace}_{name}_{uid}"))
                .to_string_lossy()
                .into_owned(),
            labels,
            linux: Some(proto::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(qos, uid),
                security_context: Some(proto::LinuxSandboxSecurityContext {
                    namespace_options: Some(proto::NamespaceOption::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn run_pod(&self, config: proto::PodSandboxConfig) -> anyhow::Result<Pod> {
        std::fs::create_dir_all(&config.log_directory)?;
        let uid = config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let sandbox_id = self
            .client
            .run_pod_sandbox(config.clone())
            .await
            .with_context(|| format!("containerd's log:\n{}", self.log_tail()))?;
        Ok(Pod {
            sandbox_id,
            uid,
            config,
        })
    }

    /// A container config as the kubelet writes it: its labels, log path and image.
    pub fn container_config(
        pod: &Pod,
        name: &str,
        attempt: u32,
        image: &str,
        command: &[&str],
    ) -> proto::ContainerConfig {
        let mut labels = pod.config.labels.clone();
        labels.insert("io.kubernetes.container.name".into(), name.into());
        proto::ContainerConfig {
            metadata: Some(proto::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(proto::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| s.to_string()).collect(),
            log_path: format!("{name}/{attempt}.log"),
            labels,
            linux: Some(proto::LinuxContainerConfig::default()),
            ..Default::default()
        }
    }

    /// Creates (and with `start`, starts) a container in `pod`; returns its ID.
    pub async fn run_container(
        &self,
        pod: &Pod,
        config: proto::ContainerConfig,
        start: bool,
    ) -> anyhow::Result<String> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        std::fs::create_dir_all(Path::new(&pod.config.log_directory).join(&name))?;
        let log = || format!("containerd's log:\n{}", self.log_tail());
        let id = self
            .client
            .create_container(&pod.sandbox_id, config, pod.config.clone())
            .await
            .with_context(log)?;
        if start {
            self.client.start_container(&id).await.with_context(log)?;
        }
        Ok(id)
    }

    /// Waits until the container is in `state`, at most `limit`.
    pub async fn wait_state(
        &self,
        id: &str,
        state: node_agent_cri::model::ContainerState,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let containers = self.client.list_containers(None).await?;
            let now = containers.iter().find(|c| c.id == id).map(|c| c.state);
            if now == Some(state) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("container {id} is {now:?}, not {state:?}, after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (size, available) of the small filesystem, from statvfs.
    pub fn small_fs_usage(&self) -> anyhow::Result<(u64, u64)> {
        let path = self
            .small_fs
            .as_deref()
            .context("the fixture has no small filesystem")?;
        statvfs(path)
    }

    /// Best effort, bounded: removes every sandbox (and with it its containers) through the CRI.
    /// Uses a client of its own: the fixture's channel lives on the test's runtime, which is
    /// blocked while the fixture drops.
    async fn remove_everything(&self) {
        let client = CriClient::lazy(&CriSettings {
            endpoint: self.endpoint(),
            timeout: CALL_TIMEOUT,
        });
        let work = async {
            if let Ok(containers) = client.list_containers(None).await {
                for c in containers {
                    let _ = client.stop_container(&c.id, 0).await;
                    let _ = client.remove_container(&c.id).await;
                }
            }
            if let Ok(sandboxes) = client.list_pod_sandboxes().await {
                for s in sandboxes {
                    let _ = client.stop_pod_sandbox(&s.id).await;
                    let _ = client.remove_pod_sandbox(&s.id).await;
                }
            }
        };
        if tokio::time::timeout(START_LIMIT, work).await.is_err() {
            eprintln!(
                "containerd fixture: removing sandboxes took over {START_LIMIT:?}; killing instead"
            );
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The test may be inside a runtime; cleanup gets a thread and a runtime of its own.
        if self.child.is_some() {
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt.block_on(self.remove_everything()),
                        Err(e) => eprintln!("containerd fixture: no runtime for cleanup: {e}"),
                    }
                });
            });
        }
        if let Some(mut child) = self.child.take() {
            // SAFETY: signals the process we started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        kill_shims(&self.socket);
        delete_link(&self.bridge);
        remove_cgroups(&self.cgroup_root);
        unmount_below(&self.dir);
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!(
                "containerd fixture: could not remove {}: {e}",
                self.dir.display()
            );
        }
    }
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process's bounding set holds a capability. Some sandboxes (CI runners, this
/// project's build machines) drop CAP_SYS_RESOURCE, without which no process may lower an OOM
/// score: runc then fails the sandbox's `oom_score_adj = -998`. containerd's
/// `restrict_oom_score_adj` keeps scores at or above its own there, as it does when rootless.
pub fn has_capability(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << cap) != 0)
}

/// One fixture at a time on the machine, across threads, test binaries and worktrees: they
/// share the pods' subnet, and the machine is small.
struct FixtureLock(
    #[expect(dead_code, reason = "held open: the lock lives as long as the file")] std::fs::File,
);

impl FixtureLock {
    const PATH: &'static str = "/run/lock/node-agent-containerd-fixture.lock";
    const WAIT: Duration = Duration::from_secs(600);

    fn acquire() -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd as _;
        std::fs::create_dir_all("/run/lock")?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::PATH)
            .with_context(|| format!("opening {}", Self::PATH))?;
        let deadline = Instant::now() + Self::WAIT;
        // SAFETY: flock on a descriptor we own.
        while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if Instant::now() > deadline {
                bail!(
                    "another containerd fixture held {} for {:?}",
                    Self::PATH,
                    Self::WAIT
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self(file))
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Removes a network link if it exists (the pods' bridge).
fn delete_link(name: &str) {
    if Path::new("/sys/class/net").join(name).exists() {
        let status = Command::new("ip").args(["link", "delete", name]).status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("containerd fixture: could not delete link {name}: {status:?}");
        }
    }
}

fn make_shared_mount(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: mount(2) reads the NUL-terminated paths only; the other arguments are constants.
    let bind = unsafe {
        libc::mount(
            c.as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if bind != 0 {
        bail!(
            "bind-mounting {} onto itself: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: as above.
    let shared = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED | libc::MS_REC,
            std::ptr::null(),
        )
    };
    if shared != 0 {
        bail!(
            "making {} a shared mount: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn mount_tmpfs(at: &Path, bytes: u64) -> anyhow::Result<()> {
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o"])
        .arg(format!("size={bytes},mode=0755"))
        .arg("node-agent-test")
        .arg(at)
        .status()
        .context("running mount")?;
    if !status.success() {
        bail!(
            "mounting a tmpfs of {bytes} bytes at {} failed ({status})",
            at.display()
        );
    }
    Ok(())
}

pub fn statvfs(path: &Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        bail!(
            "statvfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    let frsize = s.f_frsize as u64;
    Ok((s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize))
}

/// containerd's shims outlive it by design; kill those started for this socket.
fn kill_shims(socket: &Path) {
    let needle = socket.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("containerd-shim") && cmdline.contains(&needle) {
            // SAFETY: sending a signal has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Every cgroup hierarchy's mount point (v1 controllers and v2).
fn cgroup_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(left.split_whitespace().nth(4)?))
        })
        .collect()
}

/// Kills what is left in the test's cgroups and removes them in every hierarchy.
fn remove_cgroups(name: &str) {
    for mount in cgroup_mounts() {
        let dir = mount.join(name);
        if dir.exists() {
            crate::remove_tree(&dir);
        }
    }
}

/// Lazily unmounts every mount at or below `dir`, deepest first (rootfs overlays, shm, the
/// small filesystem).
fn unmount_below(dir: &Path) {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        use std::os::unix::ffi::OsStrExt as _;
        let Ok(c) = std::ffi::CString::new(point.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: umount2 reads the NUL-terminated path only.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "containerd fixture: umount {}: {}",
                point.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}
