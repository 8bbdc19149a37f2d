//! The images the cluster runs, built on this machine (no registry can be reached): the pods'
//! sandbox image and the workload image from `cluster/images/*/Containerfile`, with buildah
//! (no daemon) from Debian's busybox-static and the project's static `pod-workload`; the
//! agent's image is `cargo xtask image`'s. All are imported into each node's containerd, in
//! the `k8s.io` namespace the kubelet uses. Nothing is ever pulled: a pod naming an image that
//! is not there fails with `ErrImageNeverPull`, and containerd's pull of a missing sandbox
//! image fails at once (no network), naming the image.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::{
    layout::Layout,
    node_components::PAUSE_IMAGE,
    process::{output_of, run, Namespaces},
};

/// The workload image pods of the tests and benchmarks run.
pub const WORKLOAD_IMAGE: &str = "localhost/node-agent-cluster/workload:1";

/// Debian's busybox-static.
const BUSYBOX: &str = "/bin/busybox";
/// The applets linked into the workload image's /bin.
const APPLETS: &[&str] = &[
    "sh",
    "sleep",
    "cat",
    "echo",
    "dd",
    "ls",
    "mkdir",
    "rm",
    "true",
    "false",
    "head",
    "tail",
    "df",
    "du",
    "ps",
    "kill",
    "wc",
    "date",
    "env",
    "fallocate",
    "sync",
    "grep",
    "touch",
];

/// One image archive to import.
#[derive(Debug, Clone)]
pub struct Archive {
    pub reference: String,
    pub path: PathBuf,
}

fn host_target() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// Builds `pod-workload` statically (release) and returns the binary.
fn workload_binary(workspace: &Path) -> anyhow::Result<PathBuf> {
    let target = host_target();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .current_dir(workspace)
        .args([
            "build",
            "--locked",
            "--release",
            "--package",
            "pod-workload",
            "--target",
            &target,
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static"))
    .context("building pod-workload (static)")?;
    let binary = workspace
        .join("target")
        .join(&target)
        .join("release/pod-workload");
    let file = output_of(Command::new("file").arg(&binary)).unwrap_or_default();
    if file.contains("dynamically linked") {
        bail!("{} is dynamically linked: {file}", binary.display());
    }
    Ok(binary)
}

/// Builds the sandbox and workload images into `<cluster>/images/*.oci.tar`.
pub fn build(workspace: &Path, layout: &Layout) -> anyhow::Result<Vec<Archive>> {
    if !Path::new(BUSYBOX).is_file() {
        bail!("{BUSYBOX} is missing: `cargo xtask setup` installs Debian's busybox-static");
    }
    let binary = workload_binary(workspace)?;
    let work = layout.images();
    let storage = work.join("storage");
    if storage.exists() {
        fs::remove_dir_all(&storage).with_context(|| format!("removing {}", storage.display()))?;
    }
    let mut out = Vec::new();
    for (name, reference) in [("pause", PAUSE_IMAGE), ("workload", WORKLOAD_IMAGE)] {
        let context = work.join(name);
        if context.exists() {
            fs::remove_dir_all(&context)?;
        }
        fs::create_dir_all(&context)?;
        if name == "pause" {
            fs::copy(&binary, context.join("pod-workload"))?;
        } else {
            let bin = context.join("rootfs/bin");
            fs::create_dir_all(&bin)?;
            fs::create_dir_all(context.join("rootfs/tmp"))?;
            fs::copy(BUSYBOX, bin.join("busybox"))?;
            fs::copy(&binary, bin.join("pod-workload"))?;
            for applet in APPLETS {
                std::os::unix::fs::symlink("busybox", bin.join(applet))?;
            }
        }
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
        let containerfile = workspace.join(format!("cluster/images/{name}/Containerfile"));
        output_of(
            buildah(&[
                "bud",
                "--isolation",
                "chroot",
                "--timestamp",
                "0",
                "--pull-never",
            ])
            .arg("--file")
            .arg(&containerfile)
            .args(["--tag", reference])
            .arg(&context),
        )
        .with_context(|| format!("buildah bud {}", containerfile.display()))?;
        let archive = work.join(format!("{name}.oci.tar"));
        let _ = fs::remove_file(&archive);
        output_of(&mut buildah(&[
            "push",
            reference,
            &format!("oci-archive:{}:{reference}", archive.display()),
        ]))
        .with_context(|| format!("buildah push {reference}"))?;
        out.push(Archive {
            reference: reference.to_string(),
            path: archive,
        });
    }
    let _ = fs::remove_dir_all(&storage);
    Ok(out)
}

/// Imports `archives` into the node's containerd (`k8s.io` namespace) and checks each is there.
pub fn import(ns: Namespaces, archives: &[Archive]) -> anyhow::Result<()> {
    for archive in archives {
        let mut cmd = Command::new("ctr");
        cmd.args([
            "--address",
            "/run/containerd/containerd.sock",
            "-n",
            "k8s.io",
            "images",
            "import",
        ])
        .arg(&archive.path);
        let _entered = ns.enter(&mut cmd)?;
        output_of(&mut cmd).with_context(|| {
            format!(
                "importing {} ({})",
                archive.reference,
                archive.path.display()
            )
        })?;
    }
    let mut list = Command::new("ctr");
    list.args([
        "--address",
        "/run/containerd/containerd.sock",
        "-n",
        "k8s.io",
        "images",
        "ls",
        "-q",
    ]);
    let _entered = ns.enter(&mut list)?;
    let listed = output_of(&mut list)?;
    for archive in archives {
        let name = archive.reference.trim_start_matches("docker.io/");
        if !listed
            .lines()
            .any(|l| l.trim() == name || l.trim().ends_with(&format!("/{name}")))
        {
            bail!(
                "containerd does not list {} after importing it: {listed}",
                archive.reference
            );
        }
    }
    Ok(())
}
