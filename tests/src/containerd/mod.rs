//! A real containerd (Debian's 1.6 with its CRI plugin, and runc) started by a test with its
//! own config, root, state and socket, optionally on a small tmpfs so disk pressure is real.
//! Pods and containers are created through the CRI as the kubelet would create them (cgroupfs
//! driver, cgroup parents `…/kubepods/<qos>/pod<uid>`), under a cgroup of the test's own.
//!
//! Dropping the fixture stops and removes every sandbox and container, kills containerd and
//! any shim it left, unmounts what it mounted and removes its cgroups and directory — also
//! when the test failed. Every wait is bounded.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_cri::{CriClient, CriSettings, Endpoint};

use crate::oci::{BuiltImage, ImageSpec};

mod host;
mod pods;

use host::{
    delete_link, kill_shims, make_shared_mount, mount_tmpfs, remove_cgroups, unmount_below, which,
    FixtureLock, CAP_SYS_RESOURCE,
};
pub use host::{has_capability, statvfs};
pub use pods::Pod;

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
# Its "opt" directory in the fixture's, not the host's /opt/containerd.
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
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
