//! kubectl, as users run it: the cluster's own (built at the pinned release) with the admin
//! kubeconfig, through the forwarded API server on this host's loopback. Every call has a
//! time bound, and a failure names the command and what kubectl said.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::layout::Layout;

/// How long one kubectl call may take unless told otherwise.
pub const CALL_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct Kubectl {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
}

/// What a finished call printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    pub fn new(layout: &Layout) -> Self {
        Self {
            binary: layout.binary("kubectl"),
            kubeconfig: layout.admin_kubeconfig(),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG");
        cmd
    }

    /// Runs with `stdin` (if any), bounded by `limit`; kills kubectl past it.
    pub fn call(
        &self,
        args: &[&str],
        stdin: Option<&str>,
        limit: Duration,
    ) -> anyhow::Result<Output> {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| {
            format!("starting {} (is the cluster built?)", self.binary.display())
        })?;
        if let Some(input) = stdin {
            use std::io::Write as _;
            let mut pipe = child.stdin.take().expect("piped");
            let input = input.to_string();
            std::thread::spawn(move || {
                let _ = pipe.write_all(input.as_bytes());
            });
        }
        // Read both pipes while it runs: a large answer must not block kubectl.
        let mut out_pipe = child.stdout.take().expect("piped");
        let mut err_pipe = child.stderr.take().expect("piped");
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out_pipe, &mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err_pipe, &mut s);
            s
        });
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                bail!("kubectl {} took longer than {limit:?}", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Output {
            success: status.success(),
            stdout: out_reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        })
    }

    /// Runs and returns stdout; a failure is an error with kubectl's stderr.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.call(args, None, CALL_LIMIT)?;
        if !out.success {
            bail!("kubectl {} failed: {}", args.join(" "), out.stderr.trim());
        }
        Ok(out.stdout)
    }

    /// `kubectl apply -f -` of `manifest`.
    pub fn apply(&self, manifest: &str) -> anyhow::Result<String> {
        let out = self.call(&["apply", "-f", "-"], Some(manifest), CALL_LIMIT)?;
        if !out.success {
            bail!("kubectl apply failed: {}", out.stderr.trim());
        }
        Ok(out.stdout)
    }

    /// The JSON of `kubectl get ARGS -o json`.
    pub fn get_json(&self, args: &[&str]) -> anyhow::Result<serde_json::Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.run(&all)?;
        serde_json::from_str(&text)
            .with_context(|| format!("kubectl {} printed no JSON", all.join(" ")))
    }

    /// Polls `check` every 500 ms until it gives `Some`, up to `limit`; the error names `what`
    /// and the last answer.
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Self) -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let start = Instant::now();
        loop {
            let last = match check(self) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => "not yet".to_string(),
                Err(e) => format!("{e:#}"),
            };
            if start.elapsed() > limit {
                bail!("{what}: not within {limit:?} (last: {last})");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}
