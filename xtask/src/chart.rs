//! `cargo xtask chart`: deploy/chart linted, packaged (target/chart/node-agent-VERSION.tgz)
//! and, with `--push oci://REGISTRY/PATH`, pushed there as an OCI artifact, all by Helm built
//! from its Go module ([`node_agent_cluster::chart`] says what is checked).

use crate::agent::workspace_root;

#[derive(Debug, clap::Args)]
pub struct ChartArgs {
    /// Push the packaged chart to this OCI registry path (oci://HOST[:PORT]/PATH), as Helm's
    /// OCI artifact: `helm install node-agent oci://HOST/PATH/node-agent --version VERSION`.
    #[arg(long)]
    pub push: Option<String>,
    /// Reach the registry over plain HTTP (a registry on this machine, for a test).
    #[arg(long, requires = "push")]
    pub plain_http: bool,
}

pub fn chart(args: &ChartArgs) -> anyhow::Result<()> {
    let helm = crate::tools::helm()?;
    let root = workspace_root();
    let package = node_agent_cluster::chart::package(
        &helm,
        &root.join("deploy/chart"),
        &root.join("target/chart"),
        // The workspace's version: the agent's, and its image's tag (crate::image).
        env!("CARGO_PKG_VERSION"),
    )?;
    eprintln!("xtask: the chart is packaged: {}", package.display());
    if let Some(to) = &args.push {
        let digest = node_agent_cluster::chart::push(&helm, &package, to, args.plain_http)?;
        eprintln!(
            "xtask: pushed to {to}/node-agent as an OCI artifact ({digest}); install it with `helm install node-agent {to}/node-agent --version {} -n node-agent`",
            env!("CARGO_PKG_VERSION")
        );
    }
    Ok(())
}
