//! `cargo xtask image`: the agent as an OCI image, and the container runtime the tests run it
//! in.
//!
//! The image is `FROM scratch` plus one static binary (`deploy/Containerfile`): a release build
//! on the host's GNU target with `-C target-feature=+crt-static`, the eBPF object embedded.
//! Static glibc resolves names from `/etc/hosts` and DNS without NSS modules (glibc 2.34+),
//! which is all a scratch image offers. (musl would need rustup to fetch its standard library
//! and a musl C compiler for `ring`; the GNU target needs neither.) buildah builds it without a
//! daemon and without network, in a storage of its own under `target/image/`, and saves it as
//! an OCI archive that `ctr -n k8s.io images import` and `podman load` read.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{
    agent::{cargo_with_object, ebpf, workspace_root},
    toolchain::{is_root, run, EbpfToolchain},
};

/// Debian packages the container tests use, each with a file that shows it is installed:
/// the runtime (containerd with its CRI plugin, runc), pods' networking (CNI plugins, `ip`),
/// the image builder, and a static userland for test images.
const RUNTIME_PACKAGES: &[(&str, &str)] = &[
    ("containerd", "/usr/bin/containerd"),
    ("runc", "/usr/sbin/runc"),
    ("containernetworking-plugins", "/usr/lib/cni/bridge"),
    ("iproute2", "/usr/sbin/ip"),
    ("buildah", "/usr/bin/buildah"),
    ("busybox-static", "/usr/share/doc/busybox-static"),
];

/// The image's name; kustomize's `images:` maps `node-agent` to it.
pub const IMAGE_NAME: &str = "localhost/node-agent";
/// The size the image must stay under (issue 14).
const SIZE_LIMIT: u64 = 30 << 20;

/// Installs the runtime packages that are missing; idempotent, says what it does.
pub fn setup_runtime() -> anyhow::Result<()> {
    let missing: Vec<&str> = RUNTIME_PACKAGES
        .iter()
        .filter(|(_, proof)| !Path::new(proof).exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        eprintln!("xtask: container runtime ready (containerd, runc, CNI plugins, buildah, busybox-static)");
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("this host has no apt-get; install by hand: {} (containerd 1.6+ with its CRI plugin, runc, the CNI reference plugins in /usr/lib/cni, buildah, a static busybox at /bin/busybox)", missing.join(" "));
    }
    crate::toolchain::apt_install(&missing)
}

/// What `cargo xtask image` made.
#[derive(Debug)]
pub struct Image {
    /// `localhost/node-agent:<version>`.
    pub reference: String,
    pub archive: PathBuf,
}

fn host_target() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// Where the build's commands write: the terminal, or a log file (a build beside the tests).
#[derive(Debug, Clone, Copy)]
enum Output<'a> {
    Terminal,
    Log(&'a std::fs::File),
}

impl Output<'_> {
    /// Runs `cmd` with its output here.
    fn run(self, cmd: &mut Command) -> anyhow::Result<()> {
        if let Output::Log(file) = self {
            cmd.stdout(file.try_clone()?).stderr(file.try_clone()?);
        }
        run(cmd)
    }
}

/// The static release binary, eBPF object embedded.
fn static_agent(tc: &EbpfToolchain, out: Output<'_>) -> anyhow::Result<PathBuf> {
    static_binary(tc, out, "node-agent", "node-agent")
}

/// kubectl node-agent's static release binary (`cargo xtask plugin`).
pub fn static_plugin(tc: &EbpfToolchain) -> anyhow::Result<PathBuf> {
    static_binary(
        tc,
        Output::Terminal,
        "kubectl-node-agent",
        "kubectl-node_agent",
    )
}

/// A package's static release binary. Built with the eBPF object named as for the agent, so
/// the crates the two binaries share are built once for both.
fn static_binary(
    tc: &EbpfToolchain,
    out: Output<'_>,
    package: &str,
    binary: &str,
) -> anyhow::Result<PathBuf> {
    let object = ebpf(tc)?;
    let target = host_target();
    let mut cmd = cargo_with_object(&object, "build");
    // `--target` keeps RUSTFLAGS off build scripts and proc macros, which must stay dynamic,
    // and gives the static build a directory of its own next to the ordinary release build.
    cmd.args([
        "--package",
        package,
        "--locked",
        "--release",
        "--target",
        &target,
    ])
    .env("RUSTFLAGS", "-C target-feature=+crt-static")
    // Symbols stay (readable panics); the debug info of the standard library goes.
    .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    out.run(&mut cmd)
        .with_context(|| format!("building the static {binary}"))?;
    let binary = workspace_root()
        .join("target")
        .join(&target)
        .join("release")
        .join(binary);
    let file = Command::new("file").arg(&binary).output();
    if let Ok(out) = file {
        let text = String::from_utf8_lossy(&out.stdout);
        if text.contains("dynamically linked") {
            bail!("{} is dynamically linked: {text}", binary.display());
        }
    }
    Ok(binary)
}

/// Builds the binary and the image; saves the image as an OCI archive under `target/image/`.
pub fn image(tc: &EbpfToolchain) -> anyhow::Result<Image> {
    setup_runtime()?;
    built(tc, Output::Terminal)
}

fn built(tc: &EbpfToolchain, out: Output<'_>) -> anyhow::Result<Image> {
    let binary = static_agent(tc, out)?;
    let root = workspace_root();
    let work = root.join("target/image");
    let context = work.join("context");
    // A fresh buildah storage each time: nothing accumulates, nothing outside target/.
    let storage = work.join("storage");
    for dir in [&context, &storage] {
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(&binary, context.join("node-agent"))
        .with_context(|| format!("copying {} into the build context", binary.display()))?;

    let version = env!("CARGO_PKG_VERSION");
    let reference = format!("{IMAGE_NAME}:{version}");
    let revision = git_revision(&root);
    let buildah = |args: &[&str]| {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(storage.join("root"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        cmd
    };
    let containerfile = root.join("deploy/Containerfile");
    let mut bud = buildah(&[
        "bud",
        "--isolation",
        "chroot",
        "--timestamp",
        "0",
        "--pull-never",
    ]);
    bud.arg("--file")
        .arg(&containerfile)
        .args(["--tag", &reference])
        .args([
            "--label",
            &format!("org.opencontainers.image.version={version}"),
        ])
        .args([
            "--label",
            &format!("org.opencontainers.image.revision={revision}"),
        ])
        .arg(&context);
    out.run(&mut bud).context("buildah bud")?;

    let archive = work.join(format!("node-agent-{version}.oci.tar"));
    let _ = std::fs::remove_file(&archive);
    let destination = format!("oci-archive:{}:{reference}", archive.display());
    out.run(&mut buildah(&["push", &reference, &destination]))
        .context("buildah push")?;
    std::fs::remove_dir_all(&storage).ok();

    let binary_bytes = std::fs::metadata(&binary)?.len();
    let archive_bytes = std::fs::metadata(&archive)?.len();
    eprintln!(
        "xtask: image {reference}: {} (binary {}, static); archive {}",
        mib(archive_bytes),
        mib(binary_bytes),
        archive.display()
    );
    eprintln!(
        "xtask: load it with `ctr -n k8s.io images import {}` (or `podman load -i`), then \
         `kustomize edit set image node-agent={reference}` in deploy/",
        archive.display()
    );
    // The archive is what a node pulls; the binary is what its unpacked layer takes on disk.
    let largest = archive_bytes.max(binary_bytes);
    if largest > SIZE_LIMIT {
        bail!(
            "the image takes {} (archive {}, unpacked {}), over the {} limit",
            mib(largest),
            mib(archive_bytes),
            mib(binary_bytes),
            mib(SIZE_LIMIT)
        );
    }
    Ok(Image { reference, archive })
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn git_revision(root: &Path) -> String {
    Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The image for the container test, built on a thread of its own beside the unit and
/// kernel tests (which mostly wait on the kernel, timers and the fake cluster): its release
/// build is the longest step of `cargo xtask test`. Its output goes to target/image/build.log,
/// whose end is shown if it fails. Not root: nothing to build, the test runner says why.
pub struct Background(Option<std::thread::JoinHandle<anyhow::Result<Image>>>);

pub fn for_tests(tc: &EbpfToolchain) -> anyhow::Result<Background> {
    if !is_root() {
        return Ok(Background(None));
    }
    // Packages first, in the foreground: apt says what it installs.
    setup_runtime()?;
    let tc = tc.clone();
    let log_path = workspace_root().join("target/image/build.log");
    std::fs::create_dir_all(log_path.parent().expect("target/image"))?;
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    eprintln!(
        "xtask: building the image for the container test beside the other tests (output: {})",
        log_path.display()
    );
    let started = std::time::Instant::now();
    let handle = std::thread::spawn(move || {
        let result = built(&tc, Output::Log(&log));
        let tail = || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        match &result {
            Ok(image) => eprintln!(
                "xtask: the image for the container test is built ({:.1} s): {}",
                started.elapsed().as_secs_f64(),
                image.archive.display()
            ),
            Err(e) => eprintln!(
                "xtask: the image for the container test failed: {e:#}\n{}",
                tail()
            ),
        }
        result
    });
    Ok(Background(Some(handle)))
}

impl Background {
    /// Waits for the image: the environment the container test reads it from.
    pub fn wait(&mut self) -> anyhow::Result<Vec<(&'static str, String)>> {
        let handle = self
            .0
            .take()
            .context("the image for the container test is built once, by root")?;
        let image = handle
            .join()
            .map_err(|_| anyhow::anyhow!("the image build's thread panicked"))??;
        Ok(vec![
            (
                "NODE_AGENT_IMAGE_ARCHIVE",
                image.archive.display().to_string(),
            ),
            ("NODE_AGENT_IMAGE", image.reference),
        ])
    }
}
