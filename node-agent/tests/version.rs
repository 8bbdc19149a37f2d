//! `node-agent --version` names the commit the binary was built from: HEAD of the checkout it
//! was built in, or, built outside one, says so.

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-agent"))
        .arg("--version")
        .output()
        .expect("node-agent --version");
    assert!(out.status.success());
    let said = String::from_utf8(out.stdout).unwrap();
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--verify", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string());
    let commit = match (std::env::var("NODE_AGENT_GIT_COMMIT"), head) {
        (Ok(given), _) if !given.trim().is_empty() => given.trim().to_string(),
        (_, Some(head)) => head,
        (_, None) => "unknown: not built from a git checkout".to_string(),
    };
    assert!(
        said.starts_with(&format!(
            "node-agent {} (commit {commit}",
            env!("CARGO_PKG_VERSION")
        )),
        "{said}"
    );
    assert!(said.contains(", rustc "), "{said}");
}
