//! The kernels the VM tests boot: Debian's cloud kernel packages, fetched with `apt-get
//! download` through a private apt configuration under `target/vm/apt` (the host's sources,
//! lists and package state are neither read nor changed), and cached under `target/vm/kernels`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use super::Mechanism;
use crate::toolchain::{describe, run};

/// One kernel the VM tests boot. The package name carries Debian's kernel ABI, so it pins the
/// kernel; the exact Debian version of the package is recorded when it is fetched.
///
/// To add a kernel: add a row (`apt-cache search` with `APT_CONFIG=target/vm/apt/apt.conf`
/// lists the candidates once `cargo xtask vm-test` has run), add its suite to [`SOURCES`] if
/// it is new, and say which memory mechanism the agent must get there.
#[derive(Debug)]
pub struct Kernel {
    /// What `--kernel` takes.
    pub series: &'static str,
    pub package: &'static str,
    /// The suite it comes from (documentation: apt finds it by name in [`SOURCES`]).
    pub suite: &'static str,
    /// The memory mechanisms the agent may pick on this kernel; anything else fails the run.
    pub mechanisms: &'static [Mechanism],
}

pub const KERNELS: &[Kernel] = &[
    Kernel {
        series: "6.1",
        package: "linux-image-6.1.0-56-cloud-amd64",
        suite: "bookworm-security",
        // Debian's cloud kernels have BPF trampolines: fexit on the page counter, the cheapest.
        mechanisms: &[Mechanism::Fexit],
    },
    Kernel {
        series: "6.12",
        package: "linux-image-6.12.117+deb12-cloud-amd64",
        suite: "bookworm-security",
        mechanisms: &[Mechanism::Fexit],
    },
    Kernel {
        series: "6.18",
        package: "linux-image-6.18.15+deb13-cloud-amd64",
        suite: "trixie-backports",
        mechanisms: &[Mechanism::Fexit],
    },
];

/// The suites of the private apt configuration.
const SOURCES: &[(&str, &str)] = &[
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian", "bookworm-updates"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
    ("http://deb.debian.org/debian", "bookworm-backports"),
    ("http://deb.debian.org/debian", "trixie-backports"),
];
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

pub fn by_series(series: &str) -> anyhow::Result<&'static Kernel> {
    KERNELS
        .iter()
        .find(|k| k.series == series)
        .with_context(|| {
            let known: Vec<_> = KERNELS.iter().map(|k| k.series).collect();
            format!("--kernel {series:?} is not one of {}", known.join(", "))
        })
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub bzimage: PathBuf,
    /// The Debian version of the package, e.g. `6.1.192-2`.
    pub version: String,
    /// Whether it came from the cache rather than the archive.
    pub cached: bool,
}

/// The kernel images of `kernels`, from the cache or else from the archive (one `apt-get
/// update` for all that are missing).
pub fn fetch_all(kernels: &[&Kernel], vm_dir: &Path) -> anyhow::Result<Vec<Fetched>> {
    let mut apt = None;
    kernels
        .iter()
        .map(|kernel| {
            if let Some(cached) = cached(kernel, vm_dir) {
                return Ok(cached);
            }
            let apt = match &mut apt {
                Some(apt) => apt,
                None => {
                    let fresh = PrivateApt::new(&vm_dir.join("apt"))?;
                    fresh.update()?;
                    apt.insert(fresh)
                }
            };
            download(apt, kernel, vm_dir)
        })
        .collect()
}

fn kernel_dir(kernel: &Kernel, vm_dir: &Path) -> PathBuf {
    vm_dir.join("kernels").join(kernel.package)
}

fn cached(kernel: &Kernel, vm_dir: &Path) -> Option<Fetched> {
    let dir = kernel_dir(kernel, vm_dir);
    let bzimage = dir.join("vmlinuz");
    let version = fs::read_to_string(dir.join("version")).ok()?;
    bzimage.is_file().then(|| Fetched {
        bzimage,
        version: version.trim().to_string(),
        cached: true,
    })
}

fn download(apt: &PrivateApt, kernel: &Kernel, vm_dir: &Path) -> anyhow::Result<Fetched> {
    let dir = kernel_dir(kernel, vm_dir);
    let download = vm_dir.join("kernels/download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    apt.download(kernel.package, &download)?;
    let deb = only_file(&download)?;
    let version = deb_field(&deb, "Version")?;

    let unpacked = download.join("unpacked");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))
        .with_context(|| format!("unpacking {}", deb.display()))?;
    let boot = unpacked.join("boot");
    let image = only_file_named(&boot, "vmlinuz-")?;
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    fs::rename(&image, dir.join("vmlinuz"))?;
    // The kernel's build config, kept beside it for whoever wonders what it has.
    if let Ok(config) = only_file_named(&boot, "config-") {
        fs::rename(config, dir.join("config"))?;
    }
    // Written last: a cache entry with a version file is complete.
    fs::write(dir.join("version"), format!("{version}\n"))?;
    fs::remove_dir_all(&download)?;
    Ok(Fetched {
        bzimage: dir.join("vmlinuz"),
        version,
        cached: false,
    })
}

/// apt with its own sources, lists, cache and (empty) package status, all under one directory.
struct PrivateApt {
    config: PathBuf,
}

impl PrivateApt {
    fn new(dir: &Path) -> anyhow::Result<Self> {
        for tool in ["apt-get", "dpkg-deb"] {
            if !Path::new("/usr/bin").join(tool).exists() {
                bail!("fetching Debian's kernels needs {tool} (Debian's apt and dpkg)");
            }
        }
        if !Path::new(KEYRING).exists() {
            bail!("{KEYRING} is missing: install debian-archive-keyring");
        }
        let etc = dir.join("etc");
        for sub in [
            etc.join("apt.conf.d"),
            etc.join("preferences.d"),
            etc.join("sources.list.d"),
            etc.join("trusted.gpg.d"),
            dir.join("state/lists/partial"),
            dir.join("cache/archives/partial"),
        ] {
            fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        }
        let sources: String = SOURCES
            .iter()
            .map(|(uri, suite)| format!("deb [signed-by={KEYRING}] {uri} {suite} main\n"))
            .collect();
        fs::write(etc.join("sources.list"), sources)?;
        let status = dir.join("state/status");
        if !status.exists() {
            fs::write(&status, "")?;
        }
        let config = dir.join("apt.conf");
        let d = dir.display();
        fs::write(
            &config,
            format!(
                "Dir::Etc \"{d}/etc\";\nDir::State \"{d}/state\";\n\
                 Dir::State::status \"{d}/state/status\";\nDir::Cache \"{d}/cache\";\n\
                 APT::Architecture \"amd64\";\nAPT::Architectures {{ \"amd64\"; }};\n\
                 Acquire::Languages \"none\";\nAPT::Sandbox::User \"root\";\n"
            ),
        )?;
        Ok(Self { config })
    }

    fn apt_get(&self) -> Command {
        let mut cmd = Command::new("apt-get");
        cmd.env("APT_CONFIG", &self.config)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .arg("-q");
        cmd
    }

    fn update(&self) -> anyhow::Result<()> {
        eprintln!("xtask: vm-test: updating the private apt lists (target/vm/apt)");
        run(self.apt_get().arg("update")).context("apt-get update with the private configuration")
    }

    fn download(&self, package: &str, into: &Path) -> anyhow::Result<()> {
        let mut cmd = self.apt_get();
        cmd.current_dir(into).args(["download", package]);
        run(&mut cmd).with_context(|| {
            format!(
                "{} failed: is {package} still in the archive? (`APT_CONFIG={} apt-cache search \
                 linux-image` lists what is)",
                describe(&cmd),
                self.config.display()
            )
        })
    }
}

fn deb_field(deb: &Path, field: &str) -> anyhow::Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .context("running dpkg-deb")?;
    let value = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || value.is_empty() {
        bail!("{} has no {field} field", deb.display());
    }
    Ok(value)
}

fn only_file(dir: &Path) -> anyhow::Result<PathBuf> {
    only_file_named(dir, "")
}

fn only_file_named(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one file {prefix}* in {}, found {found:?}",
            dir.display()
        ),
    }
}
