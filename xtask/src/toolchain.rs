//! Finding, and installing when missing, the toolchain that builds the eBPF object.
//!
//! Two routes (see `shared/toolchain.md` for the recipe):
//! - a rustup nightly with `rust-src` (the usual developer laptop): `rustup run nightly cargo`;
//! - Debian's `rustc-web` 1.96 with `rust-web-src`: `/usr/bin/cargo` with
//!   `RUSTC=/usr/bin/rustc` and `RUSTC_BOOTSTRAP=1`, which lets it accept `-Z build-std=core`.
//!
//! Either way `bpf-linker` (built against LLVM 22) links the object.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

/// Debian packages of the Debian route: compiler, its library source (for build-std), its
/// clippy (to lint the eBPF crate), and what bpf-linker links against.
const DEBIAN_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "rust-web-clippy",
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(Debug, Clone)]
pub enum Route {
    RustupNightly,
    Debian,
}

/// How to invoke cargo for the eBPF crate.
#[derive(Debug, Clone)]
pub struct EbpfToolchain {
    pub route: Route,
    pub bpf_linker: PathBuf,
}

impl EbpfToolchain {
    /// A `cargo` command for the eBPF crate, with a clean environment: nothing the outer
    /// (host) cargo set may leak into the BPF build.
    pub fn cargo(&self, subcommand: &str) -> Command {
        let mut cmd = match self.route {
            Route::RustupNightly => {
                let mut c = Command::new("rustup");
                c.args(["run", "nightly", "cargo"]);
                c
            }
            Route::Debian => Command::new("/usr/bin/cargo"),
        };
        cmd.arg(subcommand);
        for (key, _) in env::vars_os() {
            let key = key.to_string_lossy();
            let leaks = (key.starts_with("CARGO") && key != "CARGO_HOME")
                || key.starts_with("RUSTC")
                || key.starts_with("RUSTDOC")
                || key == "RUSTFLAGS"
                || key == "RUSTUP_TOOLCHAIN";
            if leaks {
                cmd.env_remove(key.as_ref());
            }
        }
        if matches!(self.route, Route::Debian) {
            cmd.env("RUSTC", "/usr/bin/rustc")
                .env("RUSTC_BOOTSTRAP", "1");
        }
        // Debian route: /usr/bin first, so cargo runs Debian's cargo-clippy/clippy-driver rather
        // than rustup's proxies (which sit next to bpf-linker in ~/.cargo/bin); then bpf-linker.
        let linker_dir = self.bpf_linker.parent().unwrap_or(Path::new("/"));
        let mut path = Vec::new();
        if matches!(self.route, Route::Debian) {
            path.push(PathBuf::from("/usr/bin"));
        }
        path.push(linker_dir.to_path_buf());
        path.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        cmd.env(
            "PATH",
            env::join_paths(path).expect("PATH entries came from PATH"),
        );
        cmd
    }
}

/// The toolchain if it is complete, else an error naming what is missing.
pub fn require() -> anyhow::Result<EbpfToolchain> {
    find().map_err(|missing| {
        anyhow::anyhow!("the eBPF toolchain is incomplete: {missing}; run `cargo xtask setup`")
    })
}

/// Installs whatever is missing, then returns the toolchain. Says what it does.
pub fn setup() -> anyhow::Result<EbpfToolchain> {
    // The Debian route also needs Debian's clippy, to lint the eBPF crate.
    let debian_clippy_missing =
        matches!(route(), Some(Route::Debian)) && !Path::new("/usr/bin/clippy-driver").exists();
    if let Ok(tc) = find().map_err(drop).and_then(|tc| {
        if debian_clippy_missing {
            Err(())
        } else {
            Ok(tc)
        }
    }) {
        eprintln!(
            "xtask: eBPF toolchain ready ({:?} route, {})",
            tc.route,
            tc.bpf_linker.display()
        );
        return Ok(tc);
    }
    if route().is_none()
        || debian_clippy_missing
        || !Path::new(LLVM_PREFIX).join("bin/llvm-config").exists()
    {
        install_debian_packages()?;
    }
    if bpf_linker().is_none() {
        install_bpf_linker()?;
    }
    let tc = require()?;
    eprintln!(
        "xtask: eBPF toolchain ready ({:?} route, {})",
        tc.route,
        tc.bpf_linker.display()
    );
    Ok(tc)
}

fn find() -> Result<EbpfToolchain, String> {
    let route = route().ok_or_else(|| {
        "no compiler can build for bpfel-unknown-none: need a rustup nightly with rust-src, or \
         Debian's rustc-web, cargo-web and rust-web-src"
            .to_string()
    })?;
    let bpf_linker = bpf_linker()
        .ok_or_else(|| format!("bpf-linker {BPF_LINKER_VERSION} (LLVM 22) is not installed"))?;
    Ok(EbpfToolchain { route, bpf_linker })
}

fn route() -> Option<Route> {
    if rustup_nightly_has_rust_src() {
        return Some(Route::RustupNightly);
    }
    let debian_ok = Path::new("/usr/bin/rustc").exists()
        && Path::new("/usr/bin/cargo").exists()
        && Path::new("/usr/lib/rustlib/src/rust/library/Cargo.lock").exists();
    debian_ok.then_some(Route::Debian)
}

fn rustup_nightly_has_rust_src() -> bool {
    let Ok(out) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    if !out.status.success() {
        return false;
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    sysroot
        .join("lib/rustlib/src/rust/library/Cargo.lock")
        .exists()
}

fn bpf_linker() -> Option<PathBuf> {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    env::split_paths(&env::var_os("PATH").unwrap_or_default())
        .chain(cargo_home.map(|h| h.join("bin")))
        .map(|dir| dir.join("bpf-linker"))
        .find(|p| p.is_file())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn install_debian_packages() -> anyhow::Result<()> {
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!(
            "this host has no apt-get. Install by hand: either a rustup nightly with rust-src \
             (`rustup toolchain install nightly --component rust-src`) or Rust 1.96 with its \
             library source, plus LLVM 22 development files (llvm-config at \
             {LLVM_PREFIX}/bin/llvm-config), then `cargo install bpf-linker --version \
             {BPF_LINKER_VERSION} --no-default-features --features llvm-22`"
        );
    }
    apt_install(DEBIAN_PACKAGES)
}

/// `apt-get update`, then installs `packages` (without recommends); root required.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let list = packages.join(" ");
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("this host has no apt-get: install the equivalent of Debian's {list}");
    }
    if !is_root() {
        bail!("installing Debian packages needs root: run `sudo apt-get install -y {list}`, then `cargo xtask setup` again");
    }
    eprintln!("xtask: installing Debian packages: {list}");
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

fn install_bpf_linker() -> anyhow::Result<()> {
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .args([
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--locked",
        ])
        .args(["--no-default-features", "--features", "llvm-22"])
        .env("LLVM_PREFIX", LLVM_PREFIX))
}

/// Runs a command, inheriting stdio; an error names the command and its exit status.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

pub fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
