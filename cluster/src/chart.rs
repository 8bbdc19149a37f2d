//! `cargo xtask chart`: deploy/chart linted and packaged by Helm, and pushed to an OCI
//! registry as the OCI artifact Helm makes of it (config
//! `application/vnd.cncf.helm.config.v1+json`, one layer
//! `application/vnd.cncf.helm.chart.content.v1.tar+gzip`), from which `helm install
//! oci://REGISTRY/PATH/node-agent --version X` installs it. The chart's version must be the
//! agent's: a chart is never published for another agent than the image it names.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::process::output_of;

/// `version` and `appVersion` of the chart's Chart.yaml.
pub fn chart_versions(chart_yaml: &str) -> anyhow::Result<(String, String)> {
    let field = |key: &str| -> anyhow::Result<String> {
        let found: Vec<String> = chart_yaml
            .lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .map(|v| v.trim().trim_matches('"').to_string())
            .collect();
        match found.as_slice() {
            [v] if !v.is_empty() => Ok(v.clone()),
            _ => bail!("Chart.yaml has no single top-level {key}"),
        }
    };
    Ok((field("version")?, field("appVersion")?))
}

/// Lints `chart` (`helm lint --strict`) and packages it into `out`; refuses a chart whose
/// version or appVersion is not `agent_version`. Returns the package's path.
pub fn package(
    helm: &Path,
    chart: &Path,
    out: &Path,
    agent_version: &str,
) -> anyhow::Result<PathBuf> {
    let yaml = std::fs::read_to_string(chart.join("Chart.yaml"))
        .with_context(|| format!("reading {}/Chart.yaml", chart.display()))?;
    let (version, app_version) = chart_versions(&yaml)?;
    if version != agent_version || app_version != agent_version {
        bail!(
            "{}/Chart.yaml says version {version}, appVersion {app_version}; the agent is {agent_version}: both must be the agent's",
            chart.display()
        );
    }
    output_of(Command::new(helm).arg("lint").arg("--strict").arg(chart))
        .context("helm lint --strict")?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    output_of(
        Command::new(helm)
            .arg("package")
            .arg(chart)
            .arg("--destination")
            .arg(out),
    )
    .context("helm package")?;
    let package = out.join(format!("node-agent-{version}.tgz"));
    if !package.is_file() {
        bail!("helm package wrote no {}", package.display());
    }
    Ok(package)
}

/// `helm push PACKAGE oci://…`: the chart as an OCI artifact in that registry. Returns the
/// artifact's digest, as Helm names it.
pub fn push(helm: &Path, package: &Path, to: &str, plain_http: bool) -> anyhow::Result<String> {
    if !to.starts_with("oci://") {
        bail!("{to:?} is not an OCI registry reference (oci://HOST[:PORT]/PATH)");
    }
    let mut cmd = Command::new(helm);
    cmd.arg("push").arg(package).arg(to);
    if plain_http {
        cmd.arg("--plain-http");
    }
    // Helm says what it pushed on stderr; output_of folds it into its error only.
    let out = cmd.output().context("running helm push")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("helm push {} {to}: {}", package.display(), said.trim());
    }
    said.lines()
        .find_map(|l| l.trim().strip_prefix("Digest:"))
        .map(|d| d.trim().to_string())
        .with_context(|| format!("helm push named no digest: {}", said.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_are_read_from_chart_yaml_or_refused_naming_the_key() {
        let ok = "apiVersion: v2\nname: node-agent\nversion: 0.1.0\nappVersion: \"0.1.0\"\n";
        assert_eq!(
            chart_versions(ok).unwrap(),
            ("0.1.0".to_string(), "0.1.0".to_string())
        );
        for (yaml, key) in [
            ("appVersion: 1\n", "version"),
            ("version: 1\n", "appVersion"),
            ("version: 1\nversion: 2\nappVersion: 1\n", "version"),
            ("version:\nappVersion: 1\n", "version"),
        ] {
            let e = chart_versions(yaml).unwrap_err().to_string();
            assert!(
                e.contains(&format!("single top-level {key}")),
                "{yaml:?}: {e}"
            );
        }
    }
}
