//! Tools the tests run that are Go programs, each built from its own Go module under
//! `cluster/` at the version that module pins, as the cluster's components are built from
//! theirs ([`crate::compile`]): `-mod=readonly`, `GOTOOLCHAIN=local`, `GOWORK=off`, every module
//! checked against `go.sum` (`go mod verify`) before the build, the version stamped with `-X`
//! as the project's own build does and checked in what the binary says. A second run with
//! nothing changed takes milliseconds (a stamp beside the binary records what it was built
//! from). [`HELM`] installs deploy/chart; [`REGISTRY`] (the CNCF Distribution registry) holds
//! the chart's OCI artifact in a test.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _};
use sha2::{Digest as _, Sha256};

use crate::{
    compile::{go_cmd, go_command},
    process::output_of,
};

/// A Go program built from its module.
#[derive(Debug, Clone, Copy)]
pub struct GoTool {
    /// The binary's name, and the directory of its Go module under `cluster/`.
    pub name: &'static str,
    /// The module `go.mod` requires, whose release is the tool's version.
    pub module: &'static str,
    /// The major version the module path names (`v4` for `helm.sh/helm/v4`).
    pub major: u32,
    /// The main package.
    pub command: &'static str,
    /// The variable of the version `-X` sets.
    pub version_var: &'static str,
    /// The arguments that make the binary say its version.
    pub version_args: &'static [&'static str],
}

/// Helm, which installs deploy/chart.
pub const HELM: GoTool = GoTool {
    name: "helm",
    module: "helm.sh/helm/v4",
    major: 4,
    command: "helm.sh/helm/v4/cmd/helm",
    version_var: "helm.sh/helm/v4/internal/version.version",
    version_args: &["version", "--short"],
};

/// The CNCF Distribution registry, an OCI registry on this machine for the chart's artifact.
pub const REGISTRY: GoTool = GoTool {
    name: "registry",
    module: "github.com/distribution/distribution/v3",
    major: 3,
    command: "github.com/distribution/distribution/v3/cmd/registry",
    version_var: "github.com/distribution/distribution/v3/version.version",
    version_args: &["--version"],
};

impl GoTool {
    /// The release of its module `go.mod` requires: `v4.3.2` from `helm.sh/helm/v4 v4.3.2`.
    pub fn pinned_version(&self, go_mod: &str) -> anyhow::Result<String> {
        let module = self.module;
        let versions: Vec<&str> = go_mod
            .lines()
            .map(|l| l.trim().trim_start_matches("require").trim())
            .filter_map(|l| l.strip_prefix(module)?.strip_prefix(' '))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        let prefix = format!("v{}.", self.major);
        let release = |v: &str| {
            v.strip_prefix(&prefix)
                .is_some_and(|rest| rest.split('.').all(|n| n.parse::<u32>().is_ok()))
        };
        match versions.as_slice() {
            [v] if release(v) => Ok(v.to_string()),
            [v] => bail!(
                "go.mod requires {module} {v}, which is not a release of it (v{}.MINOR.PATCH)",
                self.major
            ),
            [] => bail!("go.mod does not require {module}"),
            _ => bail!("go.mod requires {module} more than once: {versions:?}"),
        }
    }
}

/// Builds `tool` into `out` when it is missing or was built from something else; `module` is
/// its Go module's directory (`cluster/<name>`). Returns the binary's path.
pub fn build(tool: &GoTool, module: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let started = Instant::now();
    let read = |name: &str| {
        fs::read_to_string(module.join(name))
            .with_context(|| format!("reading {}", module.join(name).display()))
    };
    let (go_mod, go_sum) = (read("go.mod")?, read("go.sum")?);
    let version = tool.pinned_version(&go_mod)?;
    let name = tool.name;
    let go = go_command()?;
    let go_version = output_of(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local"))?;
    let flags = format!("-s -w -X {}={version}", tool.version_var);
    let stamp_text = {
        let mut h = Sha256::new();
        for part in [&go_mod, &go_sum, go_version.trim(), &flags] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("{:x}", h.finalize())
    };
    let binary = out.join(name);
    let stamp = out.join(format!(".{name}-built-from"));
    if binary.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str()) {
        return Ok(binary);
    }
    eprintln!(
        "xtask: building {name} {version} from its Go module ({}); a few minutes on 2 cores from a cold Go cache",
        go_version.trim()
    );
    crate::process::run(go_cmd(&go, module).args(["mod", "download"]))
        .context("downloading the modules go.sum lists")?;
    crate::process::run(go_cmd(&go, module).args(["mod", "verify"]))
        .context("`go mod verify`: a module in the cache does not match go.sum")?;
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let _ = fs::remove_file(&stamp);
    crate::process::run(
        go_cmd(&go, module)
            .args(["build", "-trimpath", "-ldflags", &flags, "-o"])
            .arg(&binary)
            .arg(tool.command),
    )
    .with_context(|| format!("go build of {name}"))?;
    let said = output_of(Command::new(&binary).args(tool.version_args))
        .with_context(|| format!("{} {}", binary.display(), tool.version_args.join(" ")))?;
    if !said.split_whitespace().any(|w| w == version) {
        bail!("{name} says it is {:?}, not {version}", said.trim());
    }
    fs::write(&stamp, &stamp_text).with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!(
        "xtask: built {name} {version} in {:.0?} ({})",
        started.elapsed(),
        binary.display()
    );
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_release_is_read_from_go_mod_or_refused_naming_why() {
        let pinned_version = |go_mod: &str| HELM.pinned_version(go_mod);
        let ok = "module m\n\nrequire (\n\tgithub.com/x/y v1.0.0 // indirect\n\thelm.sh/helm/v4 v4.3.2 // indirect\n)\n";
        assert_eq!(pinned_version(ok).unwrap(), "v4.3.2");
        assert_eq!(
            pinned_version("require helm.sh/helm/v4 v4.0.1\n").unwrap(),
            "v4.0.1"
        );
        for (go_mod, needle) in [
            ("module m\n", "does not require"),
            ("require helm.sh/helm/v4 v3.1.0\n", "not a release of it"),
            ("require helm.sh/helm/v4 v4.x.1\n", "not a release of it"),
            (
                "require helm.sh/helm/v4 v4.1.0\nrequire helm.sh/helm/v4 v4.2.0\n",
                "more than once",
            ),
            // Another module whose path begins with Helm's.
            ("require helm.sh/helm/v4extra v4.1.0\n", "does not require"),
        ] {
            let e = pinned_version(go_mod).unwrap_err().to_string();
            assert!(e.contains(needle), "{go_mod:?}: {e}");
        }
        assert_eq!(
            REGISTRY
                .pinned_version("require github.com/distribution/distribution/v3 v3.1.2\n")
                .unwrap(),
            "v3.1.2"
        );
    }
}
