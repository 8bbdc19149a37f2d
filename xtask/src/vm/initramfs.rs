//! The VM's whole userland, as one initramfs: busybox, the init script, the agent, the test
//! binaries and their helpers (debug info stripped), the shared libraries `ldd` names for them,
//! and the plan the init script follows.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::toolchain::run;

/// The init script: mounts, cgroup v2 set-up, then the plan; results on the first serial port.
const INIT: &str = include_str!("init.sh");
/// Where busybox-static installs busybox.
pub const BUSYBOX: &str = "/bin/busybox";
/// Where the agent lives inside the VM (`NODE_AGENT_BIN`).
pub const GUEST_AGENT: &str = "/vmtest/bin/node-agent";
/// Where the eBPF object lives inside the VM (for `attach-stress`).
pub const GUEST_OBJECT: &str = "/vmtest/node-agent-ebpf.o";

/// One step of the plan the init script follows.
#[derive(Debug, Clone)]
pub enum Step {
    /// One test of a libtest binary, run alone: `binary --exact name`.
    Test { binary: String, name: String },
    /// A command of its own (the attach/detach stress).
    Run { label: String, argv: Vec<String> },
}

impl Step {
    /// The plan line: tab-separated fields that busybox `read` splits.
    fn line(&self) -> String {
        match self {
            Self::Test { binary, name } => format!("test\t/vmtest/bin/{binary}\t{name}\n"),
            Self::Run { label, argv } => format!("run\t{label}\t{}\n", argv.join(" ")),
        }
    }
}

/// What goes in besides busybox and the init script.
pub struct Contents<'a> {
    pub agent: &'a Path,
    pub object: &'a Path,
    /// Test binaries: (name inside the VM, host path).
    pub tests: &'a [(String, PathBuf)],
    /// Helper binaries, placed at their host paths: the tests name them by
    /// `env!("CARGO_BIN_EXE_...")`, an absolute path fixed at build time.
    pub helpers: &'a [PathBuf],
    pub plan: &'a [Step],
    /// Per-test time limit inside the VM, seconds.
    pub test_timeout_secs: u64,
}

/// Builds `<dir>/initramfs.cpio` (newc, uncompressed: the guest unpacks it faster than it
/// would decompress it under emulation). Returns its path.
pub fn build(dir: &Path, contents: &Contents) -> anyhow::Result<PathBuf> {
    let root = dir.join("root");
    let _ = fs::remove_dir_all(&root);
    for sub in ["bin", "dev", "proc", "sys", "tmp", "run", "vmtest/bin"] {
        fs::create_dir_all(root.join(sub))?;
    }
    let mut binaries: Vec<(PathBuf, PathBuf)> = vec![
        (PathBuf::from(BUSYBOX), root.join("bin/busybox")),
        (contents.agent.to_path_buf(), guest(&root, GUEST_AGENT)),
    ];
    for (name, host) in contents.tests {
        binaries.push((host.clone(), root.join("vmtest/bin").join(name)));
    }
    for host in contents.helpers {
        binaries.push((host.clone(), guest(&root, host)));
    }
    let mut libraries = BTreeSet::new();
    for (host, into) in &binaries {
        copy_stripped(host, into)?;
        libraries.extend(shared_libraries(host)?);
    }
    for library in &libraries {
        // `ldd` names each library by the path the loader opens (a symlink to the file).
        let into = guest(&root, library);
        fs::create_dir_all(into.parent().expect("absolute path"))?;
        fs::copy(library, &into).with_context(|| format!("copying {}", library.display()))?;
    }
    fs::copy(contents.object, guest(&root, GUEST_OBJECT))?;
    let init = root.join("init");
    fs::write(
        &init,
        INIT.replace("@TEST_TIMEOUT@", &contents.test_timeout_secs.to_string()),
    )?;
    set_executable(&init)?;
    let plan: String = contents.plan.iter().map(Step::line).collect();
    fs::write(root.join("vmtest/plan"), plan)?;

    let cpio = dir.join("initramfs.cpio");
    let file = fs::File::create(&cpio).with_context(|| format!("creating {}", cpio.display()))?;
    run(Command::new("sh")
        .args([
            "-c",
            "find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0",
        ])
        .current_dir(&root)
        .stdout(file))
    .context("writing the initramfs with cpio")?;
    Ok(cpio)
}

/// `path` (absolute on the host) inside the staging root.
fn guest(root: &Path, path: impl AsRef<Path>) -> PathBuf {
    root.join(path.as_ref().strip_prefix("/").unwrap_or(path.as_ref()))
}

/// Copies a binary without its debug info (symbols stay, for backtraces): the debug builds
/// are ten times larger with it.
fn copy_stripped(from: &Path, to: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(to.parent().expect("file inside the staging root"))?;
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(from))
    .with_context(|| format!("copying {} (strip is in binutils)", from.display()))
}

fn set_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The shared libraries and the loader a dynamically linked binary needs, as `ldd` names
/// them; none for a static binary.
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .env("LC_ALL", "C")
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // glibc's ldd exits 1 and says so for static binaries.
        let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        if all.contains("not a dynamic executable") || all.contains("statically linked") {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed: {all}", binary.display());
    }
    parse_ldd(&text).with_context(|| format!("ldd {}", binary.display()))
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and `/lib64/ld-linux-x86-64.so.2
/// (0x...)` name files; `linux-vdso.so.1 (0x...)` is the kernel's. A library ldd cannot find
/// is an error, not a VM that fails later.
fn parse_ldd(text: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.contains("not found") {
            bail!("a library is missing: {line}");
        }
        if line.contains("statically linked") {
            continue;
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            found.push(PathBuf::from(path));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_names_the_libraries_and_the_loader_but_not_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f11)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f12)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f13)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn a_library_ldd_cannot_find_is_an_error() {
        let text = "\tlibfoo.so.1 => not found\n";
        assert!(parse_ldd(text).is_err());
    }

    #[test]
    fn plan_lines_are_tab_separated() {
        let test = Step::Test {
            binary: "kernel_memory".into(),
            name: "an_oom".into(),
        };
        assert_eq!(test.line(), "test\t/vmtest/bin/kernel_memory\tan_oom\n");
        let stress = Step::Run {
            label: "stress".into(),
            argv: vec!["/x/attach-stress".into(), "--rounds".into(), "5".into()],
        };
        assert_eq!(stress.line(), "run\tstress\t/x/attach-stress --rounds 5\n");
    }
}
