//! Helm, built from its Go module (`cluster/helm/go.mod`) at the version that module pins, as
//! the cluster's components are built from theirs ([`crate::compile`]): `-mod=readonly`,
//! `GOTOOLCHAIN=local`, `GOWORK=off`, every module checked against `go.sum` (`go mod verify`)
//! before the build. The version is stamped with `-X` as Helm's own Makefile does, its tree
//! state `archive`: `helm version` says the pinned release. A second run with nothing changed
//! takes milliseconds (a stamp beside the binary records what it was built from).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _};
use sha2::{Digest as _, Sha256};

use crate::{compile::go_command, process::output_of};

/// Helm's module, and the package of its command.
pub const MODULE: &str = "helm.sh/helm/v4";
const COMMAND: &str = "helm.sh/helm/v4/cmd/helm";

/// The Helm release `go.mod` requires: `v4.3.2` from `helm.sh/helm/v4 v4.3.2`.
pub fn pinned_version(go_mod: &str) -> anyhow::Result<String> {
    let versions: Vec<&str> = go_mod
        .lines()
        .map(|l| l.trim().trim_start_matches("require").trim())
        .filter_map(|l| l.strip_prefix(MODULE)?.strip_prefix(' '))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    match versions.as_slice() {
        [v] if v.starts_with("v4.") && v[3..].split('.').all(|n| n.parse::<u32>().is_ok()) => {
            Ok(v.to_string())
        }
        [v] => {
            bail!("go.mod requires {MODULE} {v}, which is not a Helm 4 release (v4.MINOR.PATCH)")
        }
        [] => bail!("go.mod does not require {MODULE}"),
        _ => bail!("go.mod requires {MODULE} more than once: {versions:?}"),
    }
}

fn go_cmd(go: &Path, module: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(module)
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOTOOLCHAIN", "local")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0");
    cmd
}

/// Builds `helm` into `out` when it is missing or was built from something else; `module` is
/// `cluster/helm`. Returns the binary's path.
pub fn build(module: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let started = Instant::now();
    let read = |name: &str| {
        fs::read_to_string(module.join(name))
            .with_context(|| format!("reading {}", module.join(name).display()))
    };
    let (go_mod, go_sum) = (read("go.mod")?, read("go.sum")?);
    let version = pinned_version(&go_mod)?;
    let go = go_command()?;
    let go_version = output_of(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local"))?;
    let flags = format!(
        "-s -w -X {MODULE}/internal/version.version={version} \
         -X {MODULE}/internal/version.gitTreeState=archive"
    );
    let stamp_text = {
        let mut h = Sha256::new();
        for part in [&go_mod, &go_sum, go_version.trim(), &flags] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("{:x}", h.finalize())
    };
    let binary = out.join("helm");
    let stamp = out.join(".helm-built-from");
    if binary.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(stamp_text.as_str()) {
        return Ok(binary);
    }
    eprintln!(
        "xtask: building Helm {version} from its Go module ({}); about 3 min on 2 cores from a cold Go cache",
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
            .arg(COMMAND),
    )
    .context("go build of Helm")?;
    let said = output_of(Command::new(&binary).args(["version", "--short"]))
        .with_context(|| format!("{} version", binary.display()))?;
    if !said.trim().starts_with(&version) {
        bail!("helm version says {:?}, not {version}", said.trim());
    }
    fs::write(&stamp, &stamp_text).with_context(|| format!("writing {}", stamp.display()))?;
    eprintln!(
        "xtask: built Helm {version} in {:.0?} ({})",
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
        let ok = "module m\n\nrequire (\n\tgithub.com/x/y v1.0.0 // indirect\n\thelm.sh/helm/v4 v4.3.2 // indirect\n)\n";
        assert_eq!(pinned_version(ok).unwrap(), "v4.3.2");
        assert_eq!(
            pinned_version("require helm.sh/helm/v4 v4.0.1\n").unwrap(),
            "v4.0.1"
        );
        for (go_mod, needle) in [
            ("module m\n", "does not require"),
            ("require helm.sh/helm/v4 v3.1.0\n", "not a Helm 4 release"),
            ("require helm.sh/helm/v4 v4.x.1\n", "not a Helm 4 release"),
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
    }
}
