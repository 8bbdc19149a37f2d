//! The Go module that builds the Kubernetes components (`cluster/go/go.mod`), as text.
//!
//! `k8s.io/kubernetes` cannot be required as it is published: its own `go.mod` requires every
//! staging module (`k8s.io/api`, `k8s.io/client-go`, …) at `v0.0.0` and replaces each with a
//! directory of its repository (`./staging/src/k8s.io/api`). A module that requires it must
//! replace each of those with the staging module's published release, `v0.<minor>.<patch>`
//! for Kubernetes `v1.<minor>.<patch>` (kubernetes#79384). The list is read from that
//! release's own `go.mod`, never written by hand: [`staging_replacements`] derives it, and
//! [`check_pinned`] refuses a committed `go.mod` whose `replace` block says anything else.

use std::collections::BTreeMap;

use anyhow::{bail, Context as _};

/// Where the components' main packages are, in `k8s.io/kubernetes`.
pub const KUBERNETES_COMMANDS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubelet",
    "kubectl",
];

/// etcd's server: its `main` package is the module root.
pub const ETCD_MAIN: &str = "go.etcd.io/etcd/server/v3";

/// The module that requires Kubernetes.
pub const MODULE_PATH: &str = "node-agent.io/cluster/components";

/// A Kubernetes release, `v1.<minor>.<patch>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub minor: u32,
    pub patch: u32,
}

impl Release {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let rest = text
            .strip_prefix("v1.")
            .with_context(|| format!("{text:?} is not a Kubernetes release (v1.MINOR.PATCH)"))?;
        let (minor, patch) = rest
            .split_once('.')
            .with_context(|| format!("{text:?} is not a Kubernetes release (v1.MINOR.PATCH)"))?;
        let number = |s: &str| {
            s.parse::<u32>()
                .with_context(|| format!("{text:?} is not a Kubernetes release (v1.MINOR.PATCH)"))
        };
        Ok(Self {
            minor: number(minor)?,
            patch: number(patch)?,
        })
    }

    /// `v1.37.2`.
    pub fn tag(self) -> String {
        format!("v1.{}.{}", self.minor, self.patch)
    }

    /// The staging modules' matching release, `v0.37.2`.
    pub fn staging_tag(self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }
}

/// Every `replace <module> => ./staging/...` of Kubernetes' own `go.mod`, as module → the
/// published release it must be replaced with. Refuses a `go.mod` with none (not
/// `k8s.io/kubernetes`'s) and a staging directory that does not name its module.
pub fn staging_replacements(
    upstream_go_mod: &str,
    release: Release,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (module, target) in replace_directives(upstream_go_mod) {
        let Some(dir) = target.strip_prefix("./staging/src/") else {
            continue;
        };
        if dir != module {
            bail!("Kubernetes' go.mod replaces {module} with ./staging/src/{dir}, not its own directory");
        }
        let target = format!("{module} {}", release.staging_tag());
        out.insert(module, target);
    }
    if out.is_empty() {
        bail!("no `replace … => ./staging/…` line in the go.mod read: not k8s.io/kubernetes's");
    }
    Ok(out)
}

/// `(module, target)` of every replace directive, in block form or on one line; a version on
/// the left (`m v1 => …`) is dropped.
fn replace_directives(go_mod: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_block = false;
    for raw in go_mod.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        let body = if in_block {
            if line == ")" {
                in_block = false;
                continue;
            }
            line
        } else if let Some(rest) = line.strip_prefix("replace") {
            let rest = rest.trim();
            if rest == "(" {
                in_block = true;
                continue;
            }
            rest
        } else {
            continue;
        };
        if let Some((left, right)) = body.split_once("=>") {
            let module = left.split_whitespace().next().unwrap_or("").to_string();
            let target = right.split_whitespace().collect::<Vec<_>>().join(" ");
            if !module.is_empty() && !target.is_empty() {
                out.push((module, target));
            }
        }
    }
    out
}

/// The `go.mod` `cargo xtask cluster pin` writes before `go mod tidy` fills in the rest.
pub fn initial_go_mod(release: Release, replacements: &BTreeMap<String, String>) -> String {
    let mut text = String::new();
    text.push_str(
        "// The Kubernetes components and etcd that `cargo xtask cluster` runs, built from their\n",
    );
    text.push_str("// Go modules. Written by `cargo xtask cluster pin`, with the replace lines generated from\n");
    text.push_str("// k8s.io/kubernetes's own go.mod, then `go mod tidy`; `cargo xtask cluster build` refuses it\n");
    text.push_str("// when the replace lines no longer match. Do not edit by hand.\n");
    text.push_str(&format!("module {MODULE_PATH}\n\ngo 1.26.0\n\ntool (\n"));
    for command in KUBERNETES_COMMANDS {
        text.push_str(&format!("\tk8s.io/kubernetes/cmd/{command}\n"));
    }
    text.push_str(&format!("\t{ETCD_MAIN}\n)\n\n"));
    text.push_str(&format!("require k8s.io/kubernetes {}\n\n", release.tag()));
    text.push_str("replace (\n");
    for (module, target) in replacements {
        text.push_str(&format!("\t{module} => {target}\n"));
    }
    text.push_str(")\n");
    text
}

/// The Kubernetes release a `go.mod` of ours requires.
pub fn pinned_release(go_mod: &str) -> anyhow::Result<Release> {
    for raw in go_mod.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        let line = line.strip_prefix("require").map_or(line, str::trim);
        let mut words = line.split_whitespace();
        if words.next() == Some("k8s.io/kubernetes") {
            if let Some(version) = words.next() {
                return Release::parse(version);
            }
        }
    }
    bail!("the go.mod does not require k8s.io/kubernetes")
}

/// Refuses our `go.mod` unless its replace lines are exactly those generated from the pinned
/// release's own `go.mod`: none missing, none extra, none pointing elsewhere.
pub fn check_pinned(ours: &str, upstream_go_mod: &str) -> anyhow::Result<Release> {
    let release = pinned_release(ours)?;
    let want = staging_replacements(upstream_go_mod, release)?;
    let have: BTreeMap<String, String> = replace_directives(ours).into_iter().collect();
    let mut problems = Vec::new();
    for (module, target) in &want {
        match have.get(module) {
            None => problems.push(format!("{module} is not replaced (want => {target})")),
            Some(t) if t != target => problems.push(format!(
                "{module} => {t}, but {} says => {target}",
                release.tag()
            )),
            Some(_) => {}
        }
    }
    for module in have.keys() {
        if !want.contains_key(module) {
            problems.push(format!(
                "{module} is replaced, but {}'s go.mod has no staging module of that name",
                release.tag()
            ));
        }
    }
    if !problems.is_empty() {
        bail!(
            "cluster/go/go.mod does not match k8s.io/kubernetes {}'s own go.mod: {}; run `cargo xtask cluster pin {}` to write it again",
            release.tag(),
            problems.join("; "),
            release.tag()
        );
    }
    Ok(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: &str = "module k8s.io/kubernetes\n\ngo 1.26.0\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/client-go => ./staging/src/k8s.io/client-go // comment\n\tgithub.com/x/y v1.0.0 => github.com/x/y v1.0.1\n)\n\nreplace k8s.io/kubelet => ./staging/src/k8s.io/kubelet\n";

    fn release() -> Release {
        Release::parse("v1.37.2").unwrap()
    }

    #[test]
    fn releases_parse_and_name_their_staging_tag() {
        assert_eq!(
            release(),
            Release {
                minor: 37,
                patch: 2
            }
        );
        assert_eq!(release().staging_tag(), "v0.37.2");
        for bad in ["1.37.2", "v2.0.0", "v1.37", "v1.x.2", ""] {
            assert!(Release::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_staging_replace_becomes_its_published_release_and_others_are_left_out() {
        let got = staging_replacements(UPSTREAM, release()).unwrap();
        let want: Vec<(&str, &str)> = vec![
            ("k8s.io/api", "k8s.io/api v0.37.2"),
            ("k8s.io/client-go", "k8s.io/client-go v0.37.2"),
            ("k8s.io/kubelet", "k8s.io/kubelet v0.37.2"),
        ];
        let got: Vec<(&str, &str)> = got.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_go_mod_without_staging_lines_is_refused() {
        let err = staging_replacements("module x\n", release()).unwrap_err();
        assert!(err.to_string().contains("not k8s.io/kubernetes"), "{err}");
    }

    #[test]
    fn the_generated_go_mod_passes_its_own_check_and_names_the_release() {
        let replacements = staging_replacements(UPSTREAM, release()).unwrap();
        let ours = initial_go_mod(release(), &replacements);
        assert_eq!(check_pinned(&ours, UPSTREAM).unwrap(), release());
    }

    #[test]
    fn a_hand_edited_replace_block_is_refused_naming_each_difference() {
        let replacements = staging_replacements(UPSTREAM, release()).unwrap();
        let ours = initial_go_mod(release(), &replacements)
            .replace(
                "k8s.io/api => k8s.io/api v0.37.2",
                "k8s.io/api => k8s.io/api v0.36.0",
            )
            .replace(
                "\tk8s.io/kubelet => k8s.io/kubelet v0.37.2\n",
                "\tk8s.io/extra => ../extra\n",
            );
        let err = check_pinned(&ours, UPSTREAM).unwrap_err().to_string();
        for needle in [
            "k8s.io/api => k8s.io/api v0.36.0",
            "k8s.io/kubelet is not replaced",
            "k8s.io/extra is replaced",
            "cargo xtask cluster pin v1.37.2",
        ] {
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn the_pinned_release_is_read_from_a_require_block_too() {
        let text = "module m\nrequire (\n\tk8s.io/kubernetes v1.36.3\n\tother v1\n)\n";
        assert_eq!(
            pinned_release(text).unwrap(),
            Release {
                minor: 36,
                patch: 3
            }
        );
        assert!(pinned_release("module m\n").is_err());
    }
}
