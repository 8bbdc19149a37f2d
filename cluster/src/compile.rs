//! `cargo xtask cluster build`: the Kubernetes components and etcd, built from their Go modules
//! through `cluster/go` at the release its `go.mod` pins.
//!
//! Before building: the `replace` lines are checked against the pinned release's own `go.mod`
//! ([`crate::gomod::check_pinned`]), and `go mod verify` checks every module in the build list
//! against `go.sum`. The build itself runs with `-mod=readonly` (a `go.mod` that would need a
//! change is an error, never rewritten), `GOTOOLCHAIN=local` (the machine's Go, never one
//! downloaded behind the user's back) and `GOWORK=off`. The version is stamped with `-X`
//! ldflags as Kubernetes' own build does (`hack/lib/version.sh`), with the tree state
//! `archive`, its word for a build from a source archive: `kubectl version` and
//! `kubelet --version` say `v1.37.2`. etcd stamps its version from its module; its commit
//! stays "Not provided", which is true.
//!
//! A second run with nothing changed takes milliseconds: a stamp beside the binaries records
//! what they were built from (`go.mod`, `go.sum`, the Go version, the flags).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _};
use sha2::{Digest as _, Sha256};

use crate::{
    gomod::{self, Release},
    process::output_of,
};

/// The binaries `build` leaves in its output directory.
pub const BINARIES: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubelet",
    "kubectl",
    "etcd",
];

/// What was built, and where.
#[derive(Debug, Clone)]
pub struct Components {
    pub bin: PathBuf,
    pub release: Release,
}

impl Components {
    pub fn path(&self, binary: &str) -> PathBuf {
        self.bin.join(binary)
    }
}

/// The Go command: on PATH, or where Go's own installer puts it.
pub fn go_command() -> anyhow::Result<PathBuf> {
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("go"))
        .find(|p| p.is_file());
    on_path
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
        .context("Go 1.26 or later is needed to build Kubernetes (cargo xtask cluster build): `go` is neither on PATH nor at /usr/local/go/bin/go")
}

/// `go` in `module`, as every build here runs it: the module as pinned (`-mod=readonly`), the
/// machine's Go (`GOTOOLCHAIN=local`), no workspace, no cgo.
pub(crate) fn go_cmd(go: &Path, module: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(module)
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOTOOLCHAIN", "local")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0");
    cmd
}

/// The ldflags that stamp the version, as `hack/lib/version.sh` does.
fn ldflags(release: Release) -> String {
    let base = "k8s.io/component-base/version";
    let client = "k8s.io/client-go/pkg/version";
    let mut flags = vec!["-s".to_string(), "-w".to_string()];
    for pkg in [base, client] {
        flags.push(format!("-X {pkg}.gitVersion={}", release.tag()));
        flags.push(format!("-X {pkg}.gitMajor=1"));
        flags.push(format!("-X {pkg}.gitMinor={}", release.minor));
        flags.push(format!("-X {pkg}.gitTreeState=archive"));
    }
    flags.join(" ")
}

/// Builds what is missing or stale into `out`; `module` is `cluster/go`.
pub fn build(module: &Path, out: &Path) -> anyhow::Result<Components> {
    let started = Instant::now();
    let go_mod_path = module.join("go.mod");
    let go_mod = fs::read_to_string(&go_mod_path)
        .with_context(|| format!("reading {}", go_mod_path.display()))?;
    let go_sum = fs::read_to_string(module.join("go.sum"))
        .with_context(|| format!("reading {}/go.sum", module.display()))?;
    let release = gomod::pinned_release(&go_mod)?;
    let go = go_command()?;
    let go_version = output_of(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local"))?;
    let flags = ldflags(release);
    let stamp_text = {
        let mut h = Sha256::new();
        for part in [
            go_mod.as_str(),
            go_sum.as_str(),
            go_version.trim(),
            flags.as_str(),
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("{:x}", h.finalize())
    };
    let stamp = out.join(".built-from");
    let components = Components {
        bin: out.to_path_buf(),
        release,
    };
    let all_there = BINARIES.iter().all(|b| out.join(b).is_file());
    if all_there && fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str()) {
        eprintln!(
            "xtask: Kubernetes {} and etcd are built ({}), nothing changed",
            release.tag(),
            out.display()
        );
        return Ok(components);
    }

    eprintln!(
        "xtask: building Kubernetes {} (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, kubectl) and etcd from their Go modules ({}); about 8 min on 2 quiet cores from a cold Go cache (40 beside a Rust build), a minute warm",
        release.tag(),
        go_version.trim()
    );
    // The pinned release's own go.mod, from the module proxy (or the module cache).
    let info = output_of(
        go_cmd(&go, module)
            .args(["mod", "download", "-json"])
            .arg(format!("k8s.io/kubernetes@{}", release.tag())),
    )
    .with_context(|| {
        format!(
            "fetching k8s.io/kubernetes@{} from the Go module proxy",
            release.tag()
        )
    })?;
    let info: serde_json::Value =
        serde_json::from_str(&info).context("`go mod download -json` printed no JSON")?;
    let upstream = info
        .get("GoMod")
        .and_then(|v| v.as_str())
        .context("`go mod download -json` names no GoMod file")?;
    let upstream = fs::read_to_string(upstream).with_context(|| format!("reading {upstream}"))?;
    gomod::check_pinned(&go_mod, &upstream)?;

    crate::process::run(go_cmd(&go, module).args(["mod", "download"]))
        .context("downloading the modules go.sum lists")?;
    crate::process::run(go_cmd(&go, module).args(["mod", "verify"]))
        .context("`go mod verify`: a module in the cache does not match go.sum")?;

    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let _ = fs::remove_file(&stamp);
    let mut packages: Vec<String> = gomod::KUBERNETES_COMMANDS
        .iter()
        .map(|c| format!("k8s.io/kubernetes/cmd/{c}"))
        .collect();
    packages.push(gomod::ETCD_MAIN.to_string());
    let mut cmd = go_cmd(&go, module);
    cmd.args(["build", "-trimpath", "-ldflags", &flags, "-o"])
        .arg(format!("{}/", out.display()))
        .args(&packages);
    crate::process::run(&mut cmd).context("go build of the Kubernetes components")?;
    // etcd's main package is its module root: `go build` names the binary after the last
    // path element before the major version suffix, `server`.
    let etcd_built = out.join("server");
    if etcd_built.is_file() {
        fs::rename(&etcd_built, out.join("etcd")).context("naming the etcd binary")?;
    }
    for binary in BINARIES {
        let path = out.join(binary);
        let flag: &[&str] = if *binary == "kubectl" {
            &["version", "--client"]
        } else {
            &["--version"]
        };
        let version = output_of(Command::new(&path).args(flag))
            .with_context(|| format!("{} --version", path.display()))?;
        let want = if *binary == "etcd" {
            "etcd Version: 3.".to_string()
        } else {
            release.tag()
        };
        if !version.contains(&want) {
            bail!("{binary} --version says {:?}, not {want}", version.trim());
        }
    }
    fs::write(&stamp, &stamp_text).with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!(
        "xtask: built Kubernetes {} and etcd in {:.0?} ({})",
        release.tag(),
        started.elapsed(),
        out.display()
    );
    Ok(components)
}

/// `cargo xtask cluster pin v1.X.Y`: writes `go.mod` for that release, its replace lines
/// generated from the release's own `go.mod`, then `go mod tidy` writes `go.sum`.
pub fn pin(module: &Path, tag: &str) -> anyhow::Result<()> {
    let release = Release::parse(tag)?;
    let go = go_command()?;
    let scratch = tempfile::tempdir().context("a scratch module")?;
    fs::write(
        scratch.path().join("go.mod"),
        "module scratch\n\ngo 1.26.0\n",
    )?;
    let info = output_of(
        go_cmd(&go, scratch.path())
            .env("GOFLAGS", "-mod=mod")
            .args(["mod", "download", "-json"])
            .arg(format!("k8s.io/kubernetes@{}", release.tag())),
    )
    .with_context(|| format!("fetching k8s.io/kubernetes@{}", release.tag()))?;
    let info: serde_json::Value = serde_json::from_str(&info)?;
    let upstream = info
        .get("GoMod")
        .and_then(|v| v.as_str())
        .context("`go mod download -json` names no GoMod file")?;
    let upstream = fs::read_to_string(upstream)?;
    let replacements = gomod::staging_replacements(&upstream, release)?;
    fs::create_dir_all(module)?;
    fs::write(
        module.join("go.mod"),
        gomod::initial_go_mod(release, &replacements),
    )?;
    let _ = fs::remove_file(module.join("go.sum"));
    crate::process::run(
        go_cmd(&go, module)
            .env("GOFLAGS", "-mod=mod")
            .args(["mod", "tidy"]),
    )
    .context("go mod tidy")?;
    let written = fs::read_to_string(module.join("go.mod"))?;
    gomod::check_pinned(&written, &upstream)?;
    eprintln!(
        "xtask: cluster/go pinned to Kubernetes {} ({} staging modules replaced); commit go.mod and go.sum",
        release.tag(),
        replacements.len()
    );
    Ok(())
}
