//! `cargo xtask plugin`: kubectl node-agent as one static binary, packed for krew.
//!
//! Writes `target/krew/kubectl-node_agent-linux-amd64.tar.gz` (the binary and LICENSE, with
//! fixed owners and times) and `target/krew/node-agent.yaml`: deploy/krew/node-agent.yaml
//! with that archive's sha256, which `kubectl krew install --manifest=... --archive=...`
//! checks. Both manifests are checked first against the rules krew applies to a manifest
//! (its `ValidatePlugin`, read from krew's source and written here anew) and against the
//! archive (the files it names are in it, the version is the crate's).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context as _};
use serde::Deserialize;

use crate::{agent::workspace_root, toolchain::EbpfToolchain};

/// deploy/krew's manifest: what it is checked against.
pub const MANIFEST: &str = "deploy/krew/node-agent.yaml";
const ARCHIVE: &str = "kubectl-node_agent-linux-amd64.tar.gz";

/// The parts of a krew `Plugin` (apiVersion krew.googlecontainertools.github.com/v1alpha2)
/// that krew checks, every field spelt as krew's.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Plugin {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub version: String,
    #[serde(default)]
    pub homepage: Option<String>,
    #[serde(default)]
    pub short_description: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub caveats: Option<String>,
    #[serde(default)]
    pub platforms: Vec<Platform>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Platform {
    pub selector: Option<Selector>,
    #[serde(default)]
    pub uri: String,
    #[serde(default)]
    pub sha256: String,
    #[serde(default)]
    pub files: Option<Vec<FileOperation>>,
    #[serde(default)]
    pub bin: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    #[serde(default)]
    pub match_labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub match_expressions: Option<Vec<serde_yaml_ng::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOperation {
    pub from: String,
    pub to: String,
}

/// The manifest's text, read as krew reads it, checked by krew's rules; `name` is the name
/// the file gives it (krew wants the file named after the plugin).
pub fn check(text: &str, name: &str) -> anyhow::Result<Plugin> {
    let plugin: Plugin = serde_yaml_ng::from_str(text).context("not a krew Plugin manifest")?;
    ensure!(
        plugin.api_version == "krew.googlecontainertools.github.com/v1alpha2",
        "apiVersion {:?}: krew reads krew.googlecontainertools.github.com/v1alpha2",
        plugin.api_version
    );
    ensure!(
        plugin.kind == "Plugin",
        "kind {:?}: expected Plugin",
        plugin.kind
    );
    let safe = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    ensure!(
        safe,
        "plugin name {name:?}: letters, digits, '_' and '-' only"
    );
    ensure!(
        plugin.metadata.name == name,
        "metadata.name {:?}: the file is named for {name:?}",
        plugin.metadata.name
    );
    let spec = &plugin.spec;
    ensure!(
        !spec.short_description.is_empty(),
        "spec.shortDescription: empty"
    );
    ensure!(
        !spec.short_description.contains(['\r', '\n']),
        "spec.shortDescription: one line"
    );
    for (field, text) in [
        ("description", &spec.description),
        ("caveats", &spec.caveats),
    ] {
        ensure!(
            text.as_ref().is_none_or(|t| !t.trim().is_empty()),
            "spec.{field}: given but empty"
        );
    }
    ensure!(
        spec.homepage
            .as_ref()
            .is_none_or(|h| h.starts_with("https://") || h.starts_with("http://")),
        "spec.homepage: a URL"
    );
    ensure!(!spec.platforms.is_empty(), "spec.platforms: none");
    ensure!(
        is_semver(&spec.version),
        "spec.version {:?}: a semantic version with a leading v (v0.1.0)",
        spec.version
    );
    for (i, p) in spec.platforms.iter().enumerate() {
        let at = |field: &str| format!("spec.platforms[{i}].{field}");
        ensure!(!p.uri.is_empty(), "{}: empty", at("uri"));
        ensure!(
            p.sha256.len() == 64
                && p.sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{} {:?}: 64 lowercase hex digits",
            at("sha256"),
            p.sha256
        );
        ensure!(!p.bin.is_empty(), "{}: empty", at("bin"));
        if let Some(files) = &p.files {
            ensure!(
                !files.is_empty(),
                "{}: leave it out or name a file",
                at("files")
            );
            for f in files {
                ensure!(
                    !f.from.is_empty() && !f.to.is_empty(),
                    "{}: from and to are both needed",
                    at("files")
                );
            }
        }
        let selector = p
            .selector
            .as_ref()
            .with_context(|| format!("{}: none (krew needs one)", at("selector")))?;
        let labels = selector.match_labels.as_ref();
        let expressions = selector.match_expressions.as_ref();
        ensure!(
            labels.is_some() || expressions.is_some_and(|e| !e.is_empty()),
            "{}: empty",
            at("selector")
        );
        ensure!(
            labels.is_none_or(|l| !l.is_empty()),
            "{}: matchLabels given but empty",
            at("selector")
        );
        for key in labels.into_iter().flat_map(|l| l.keys()) {
            ensure!(
                key == "os" || key == "arch",
                "{}: key {key:?} (krew selects on os and arch only)",
                at("selector")
            );
        }
    }
    Ok(plugin)
}

/// `v` then major.minor.patch, with an optional pre-release or build suffix.
fn is_semver(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let core = rest.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `cargo xtask plugin`.
pub fn plugin(tc: &EbpfToolchain) -> anyhow::Result<()> {
    let root = workspace_root();
    let template_path = root.join(MANIFEST);
    let template = std::fs::read_to_string(&template_path)
        .with_context(|| format!("reading {}", template_path.display()))?;
    let plugin = check(&template, "node-agent").context(MANIFEST)?;
    let version = crate_version(&root.join("kubectl-node-agent/Cargo.toml"))?;
    ensure!(
        plugin.spec.version == format!("v{version}"),
        "{MANIFEST}: spec.version {} is not kubectl-node-agent's version v{version}",
        plugin.spec.version
    );
    let binary = crate::image::static_plugin(tc)?;
    let out = root.join("target/krew");
    let stage = out.join("stage");
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    std::fs::create_dir_all(&stage)?;
    std::fs::copy(&binary, stage.join("kubectl-node_agent"))
        .with_context(|| format!("copying {}", binary.display()))?;
    std::fs::copy(root.join("LICENSE"), stage.join("LICENSE"))?;
    let archive = out.join(ARCHIVE);
    pack(&stage, &archive)?;
    // The files the manifest installs are in the archive, and `bin` is one of them.
    let listed = list(&archive)?;
    for p in &plugin.spec.platforms {
        for f in p.files.iter().flatten() {
            ensure!(
                listed.iter().any(|l| l == &f.from),
                "{MANIFEST}: files.from {:?} is not in the archive ({listed:?})",
                f.from
            );
        }
        ensure!(
            listed.iter().any(|l| l == &p.bin),
            "{MANIFEST}: bin {:?} is not in the archive",
            p.bin
        );
    }
    let sha = sha256(&archive)?;
    let manifest = with_sha256(&template, &sha)?;
    check(&manifest, "node-agent").context("the written manifest")?;
    let manifest_path = out.join("node-agent.yaml");
    std::fs::write(&manifest_path, manifest)?;
    std::fs::remove_dir_all(&stage).ok();
    eprintln!(
        "xtask: {} ({:.1} MiB, sha256 {sha}) and {}",
        archive.display(),
        std::fs::metadata(&archive)?.len() as f64 / f64::from(1 << 20),
        manifest_path.display()
    );
    eprintln!(
        "xtask: install with krew: kubectl krew install --manifest={} --archive={}",
        manifest_path.display(),
        archive.display()
    );
    eprintln!(
        "xtask: or without: install -m 0755 {} /usr/local/bin/",
        binary.display()
    );
    Ok(())
}

fn crate_version(manifest: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(manifest)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
        })
        .map(String::from)
        .with_context(|| format!("no version in {}", manifest.display()))
}

/// The template with every `sha256:` line holding `sha`.
fn with_sha256(template: &str, sha: &str) -> anyhow::Result<String> {
    let mut replaced = 0;
    let text: Vec<String> = template
        .lines()
        .map(|line| match line.trim_start().strip_prefix("sha256:") {
            Some(_) => {
                replaced += 1;
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}sha256: \"{sha}\"")
            }
            None => line.to_string(),
        })
        .collect();
    ensure!(
        replaced == 1,
        "{MANIFEST}: expected one sha256 line, found {replaced}"
    );
    Ok(text.join("\n") + "\n")
}

/// A reproducible tar.gz of `dir`'s files: sorted, owner root, time 0, no gzip name or time.
fn pack(dir: &Path, archive: &Path) -> anyhow::Result<()> {
    let tar = archive.with_extension("");
    let status = Command::new("tar")
        .args([
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
        ])
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(dir)
        .arg(".")
        .status()
        .context("running tar")?;
    ensure!(status.success(), "tar failed: {status}");
    let _ = std::fs::remove_file(archive);
    let status = Command::new("gzip")
        .args(["-n", "-9"])
        .arg(&tar)
        .status()
        .context("running gzip")?;
    ensure!(status.success(), "gzip failed: {status}");
    let gz: PathBuf = PathBuf::from(format!("{}.gz", tar.display()));
    if gz != archive {
        std::fs::rename(&gz, archive)?;
    }
    Ok(())
}

/// The archive's files, without the `./` tar puts before them.
fn list(archive: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new("tar")
        .arg("-tzf")
        .arg(archive)
        .output()
        .context("running tar -t")?;
    ensure!(out.status.success(), "tar -t {} failed", archive.display());
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

fn sha256(file: &Path) -> anyhow::Result<String> {
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", file.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_manifest_is_one_krew_takes() {
        let text = std::fs::read_to_string(workspace_root().join(MANIFEST)).unwrap();
        let plugin = check(&text, "node-agent").unwrap();
        let p = &plugin.spec.platforms[0];
        assert_eq!(
            p.bin, "kubectl-node_agent",
            "kubectl runs it as `kubectl node-agent`"
        );
        let version =
            crate_version(&workspace_root().join("kubectl-node-agent/Cargo.toml")).unwrap();
        assert_eq!(plugin.spec.version, format!("v{version}"));
        let written = with_sha256(&text, &"ab".repeat(32)).unwrap();
        assert_eq!(
            check(&written, "node-agent").unwrap().spec.platforms[0].sha256,
            "ab".repeat(32)
        );
    }

    #[test]
    fn manifests_krew_refuses_are_refused_naming_the_field() {
        let text = std::fs::read_to_string(workspace_root().join(MANIFEST)).unwrap();
        let rows = [
            (
                "metadata:\n  name: node-agent",
                "metadata:\n  name: other",
                "metadata.name \"other\"",
            ),
            (
                "version: v0.1.0",
                "version: 0.1.0",
                "spec.version \"0.1.0\"",
            ),
            (
                "          arch: amd64",
                "          arch: amd64\n          distro: debian",
                "key \"distro\"",
            ),
            (
                "      bin: kubectl-node_agent",
                "      bin: \"\"",
                "spec.platforms[0].bin: empty",
            ),
            ("kind: Plugin", "kind: Plugins", "kind \"Plugins\""),
            (
                "  shortDescription:",
                "  shortdescription:",
                "not a krew Plugin manifest",
            ),
        ];
        for (from, to, words) in rows {
            assert!(text.contains(from), "{from}");
            let bad = text.replacen(from, to, 1);
            let err = format!("{:#}", check(&bad, "node-agent").unwrap_err());
            assert!(err.contains(words), "{to}: {err}");
        }
        let bad_sha = with_sha256(&text, "XYZ").unwrap();
        let err = format!("{:#}", check(&bad_sha, "node-agent").unwrap_err());
        assert!(err.contains("64 lowercase hex digits"), "{err}");
    }
}
