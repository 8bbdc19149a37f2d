//! `deploy/components/monitoring` against a real Prometheus server (Debian's `prometheus`,
//! unpacked by `cargo xtask setup`; PROMETHEUS names it) on loopback, with a data directory of
//! its own, scraping a running agent under real pressure: the real kernel, real memory
//! cgroups, the strict fake cluster. The agent evicts, sees an OOM kill, runs out of pods it
//! may evict, refuses a config reload and loses its pod source; then every query of the
//! Grafana dashboard and every alert expression must evaluate to data, and the alerts for a
//! refused reload, no evictable pod and a blind pod source must fire (`/api/v1/alerts`). The rules are loaded as shipped except their
//! `for:` periods, cut to a second so that the test need not wait minutes (`promtool test
//! rules` in deploy_render checks the periods themselves). It scrapes as the shipped
//! ServiceMonitor does, with a bearer token (`bearerTokenFile`), which the agent, under the
//! default `metricsAccess: kubernetes`, has the (fake) API server review: the shipped
//! monitoring still scrapes behind the agent's authorization.

use std::{
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use node_agent_kube::fake::{Reply, Seen};
use node_agent_tests::{
    fake_cluster::{free_port, wait_until, PodSpec, NODE},
    move_into, require_root, scaled, set_memory_limit,
    world::{wait, World},
    Helper,
};
use serde_json::Value;

const MEM_HELPER: &str = env!("CARGO_BIN_EXE_mem-helper");

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/components/monitoring")
}

/// A Prometheus server of the test's own; stopped and its directory removed on drop.
struct Prometheus {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Prometheus {
    /// Starts it scraping the agent at `target` every second as the ServiceMonitor's job
    /// (`job="node-agent"`, a `node` label, the token in `token_file` as its
    /// `bearerTokenFile`), evaluating `rules` every second.
    fn start(target: u16, rules: &str, token_file: &Path) -> anyhow::Result<Self> {
        let binary = std::env::var("PROMETHEUS").expect(
            "PROMETHEUS names the Prometheus server (set by `cargo xtask test`; `cargo xtask setup` unpacks Debian's prometheus)",
        );
        let dir =
            std::env::temp_dir().join(format!("node-agent-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::write(dir.join("rules.yaml"), rules)?;
        std::fs::write(
            dir.join("prometheus.yaml"),
            format!(
                "global: {{scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [rules.yaml]\n\
                 scrape_configs:\n  - job_name: node-agent\n    \
                 authorization: {{credentials_file: '{token}'}}\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target}']\n        labels: {{node: {NODE}}}\n",
                token = token_file.display(),
            ),
        )?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new(&binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let prometheus = Self { child, dir, port };
        wait_until(scaled(Duration::from_secs(30)), "Prometheus ready", || {
            prometheus
                .get("/-/ready")
                .is_ok_and(|(status, _)| status == 200)
        })
        .map_err(|e| anyhow::anyhow!("{e}; its log:\n{}", prometheus.log()))?;
        Ok(prometheus)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` over HTTP/1.0 (no chunked body): status and body.
    fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(scaled(Duration::from_secs(10))))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        let (head, body) = reply.split_once("\r\n\r\n").context("an HTTP reply")?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("an HTTP status")?;
        Ok((status, body.to_string()))
    }

    /// The result of an instant query, as Prometheus' JSON API gives it.
    fn query(&self, expr: &str) -> anyhow::Result<Vec<Value>> {
        let (status, body) = self.get(&format!("/api/v1/query?query={}", encode(expr)))?;
        let v: Value = serde_json::from_str(&body).with_context(|| format!("{expr}: {body}"))?;
        if status != 200 || v["status"] != "success" {
            bail!("{expr}: HTTP {status}: {body}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The names of the alerts in `state` (`pending`, `firing`).
    fn alerts(&self, state: &str) -> anyhow::Result<Vec<String>> {
        let (_, body) = self.get("/api/v1/alerts")?;
        let v: Value = serde_json::from_str(&body)?;
        Ok(v["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == state)
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_string))
            .collect())
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The shipped PrometheusRule's groups as a rules file, every `for:` cut to 1s.
fn rules() -> anyhow::Result<(String, Vec<(String, String)>)> {
    let text = std::fs::read_to_string(monitoring().join("prometheusrule.yaml"))?;
    let mut rule: Value = serde_yaml_ng::from_str(&text)?;
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array_mut().context("groups")? {
        for r in group["rules"].as_array_mut().context("rules")? {
            if r.get("for").is_some() {
                r["for"] = "1s".into();
            }
            alerts.push((
                r["alert"].as_str().context("alert")?.to_string(),
                r["expr"].as_str().context("expr")?.to_string(),
            ));
        }
    }
    let file = serde_json::json!({"groups": rule["spec"]["groups"]});
    Ok((serde_yaml_ng::to_string(&file)?, alerts))
}

/// Every query of the dashboard (rows included), with the title of its panel.
fn dashboard_queries() -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(monitoring().join("dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let mut queries = Vec::new();
    let mut panels: Vec<Value> = dashboard["panels"].as_array().cloned().unwrap_or_default();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().cloned().unwrap_or_default());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().context("a target without expr")?;
            queries.push((
                panel["title"].as_str().unwrap_or("?").to_string(),
                expr.to_string(),
            ));
        }
    }
    Ok(queries)
}

/// A dashboard query as Grafana sends it for "all nodes" over the last minutes.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$node", ".*")
        .replace("$__rate_interval", "5m")
}

/// An alert expression with `bool` after its last top-level comparison: the series it watches
/// come back as 0 or 1 instead of being filtered out, so a healthy node's count as data.
fn with_bool(expr: &str) -> String {
    let bytes = expr.as_bytes();
    let (mut depth, mut quoted, mut at) = (0i32, false, None);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => quoted = !quoted,
            _ if quoted => {}
            b'(' | b'{' | b'[' => depth += 1,
            b')' | b'}' | b']' => depth -= 1,
            b'=' | b'!' | b'>' | b'<' if depth == 0 => {
                // `==`, `!=`, `>=`, `<=` or `>`, `<`.
                let len = if bytes.get(i + 1) == Some(&b'=') {
                    2
                } else {
                    1
                };
                at = Some(i + len);
                i += len;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    match at {
        Some(end) => format!("{} bool{}", &expr[..end], &expr[end..]),
        None => expr.to_string(),
    }
}

#[test]
fn alert_expressions_get_bool_after_their_comparison() {
    assert_eq!(
        with_bool(r#"up{job="node-agent"} == 0"#),
        r#"up{job="node-agent"} == bool 0"#
    );
    assert_eq!(
        with_bool(r#"sum by (a) (increase(x{result!="ok",b=~"c|d"}[15m])) > 0"#),
        r#"sum by (a) (increase(x{result!="ok",b=~"c|d"}[15m])) > bool 0"#
    );
    assert_eq!(with_bool("max(x) >= 1"), "max(x) >= bool 1");
}

/// A sample's value as a number.
fn value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

#[test]
fn a_real_prometheus_fills_every_panel_and_fires_the_alerts() -> anyhow::Result<()> {
    require_root();
    let hog = PodSpec::new(
        "shop",
        "hog",
        "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "16Mi",
        'a',
    );
    let calm = PodSpec::new(
        "shop",
        "calm",
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        "512Mi",
        'b',
    );
    let oomer = PodSpec::new(
        "shop",
        "oomer",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "16Mi",
        'c',
    );
    let keeper = PodSpec::new(
        "batch",
        "keeper",
        "9a7b3c1d-2e4f-4a6b-8c0d-1e2f3a4b5c6d",
        "64Mi",
        'd',
    );
    let w = World::new("e2e-prometheus", &[hog, calm, oomer, keeper], MEM_HELPER)?;
    let kube = "  evictionWaitTimeout: 1s\n  exclusions: {namespaces: [batch]}\n";
    // The shipped access (metricsAccess: kubernetes), not the harness's loopback.
    let config = |agent: &str| {
        w.config(kube, agent)
            .replace("metricsAccess: loopback\n", "")
    };
    let mut daemon = w.start_text(&config(""))?;
    // Prometheus scrapes with its service account's token, as the ServiceMonitor says, and
    // RBAC grants its user get /metrics (kube-prometheus's prometheus-k8s role does).
    let monitor: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(
        monitoring().join("servicemonitor.yaml"),
    )?)?;
    assert_eq!(
        monitor["spec"]["endpoints"][0]["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus-k8s";
    w.fake.add_user(
        "prometheus-k8s-token",
        PROMETHEUS,
        &["system:serviceaccounts"],
    );
    w.fake.grant_url(PROMETHEUS, "get", "/metrics");
    let token_file = w.dir.join("prometheus-token");
    std::fs::write(&token_file, "prometheus-k8s-token")?;
    let (rules, alerts) = rules()?;
    let prometheus = Prometheus::start(w.port, &rules, &token_file)?;
    // Scraped before anything happens (Prometheus hands its targets to the scraper a few
    // seconds after start), so every counter's step up is seen as one.
    wait_until(
        scaled(Duration::from_secs(30)),
        "two scrapes of the agent",
        || {
            prometheus
                .query(r#"count_over_time(up{job="node-agent"}[1m]) >= 2"#)
                .is_ok_and(|r| !r.is_empty())
        },
    )?;

    // An OOM kill inside a pod with a limit of its own.
    let oomer_pod = w.dir_of("oomer").parent().context("pod dir")?.to_path_buf();
    set_memory_limit(&oomer_pod, 32 << 20)?;
    let mut victim = Helper::spawn(MEM_HELPER, &["oom".into()])?;
    move_into(w.dir_of("oomer"), victim.pid())?;
    victim.go()?;
    victim.wait_killed(scaled(Duration::from_secs(20)))?;

    // Real memory pressure: the hog, then calm, are evicted; the excluded keeper is all that
    // is left, and the agent says it may evict no pod.
    let _calm = w.load("calm", 120)?;
    let _hog = w.load("hog", 100)?;
    wait_until(wait(), "two evictions", || w.evictions().len() >= 2)?;
    daemon.wait_log("threshold met but no pod may be evicted", wait())?;

    // A refused reload: a duration without a unit.
    std::fs::write(&w.config, config("pressurePollInterval: 100\n"))?;
    daemon.process.signal(libc::SIGHUP);
    daemon.wait_log("invalid config; keeping the previous one", wait())?;

    // A blind pod source: the kubelet answers every pod list with a 500.
    w.cluster().hook = Some(Arc::new(|seen: &Seen| {
        (seen.method == "GET" && seen.path.split('?').next() == Some("/pods"))
            .then(|| Reply::status(500, "InternalError", "the kubelet is broken"))
    }));
    daemon.wait_log("source not ready", wait() * 3)?;

    // Prometheus has scraped what followed, and its rules have run on it: each alert fires
    // (the no-evictable-pod state ends once the pod data is stale, so not all at once).
    let expected = [
        "NodeAgentNoEvictablePod",
        "NodeAgentConfigReloadRefused",
        "NodeAgentBlind",
    ];
    let deadline = Instant::now() + scaled(Duration::from_secs(60));
    let mut fired: Vec<String> = Vec::new();
    let firing = loop {
        let firing = prometheus.alerts("firing")?;
        fired.extend(firing.iter().cloned());
        if expected.iter().all(|a| fired.iter().any(|f| f == a)) {
            break firing;
        }
        if Instant::now() > deadline {
            let exprs: Vec<String> = alerts
                .iter()
                .filter(|(a, _)| expected.contains(&a.as_str()))
                .map(|(a, e)| format!("{a}: {e} -> {:?}", prometheus.query(&with_bool(e))))
                .collect();
            bail!(
                "alerts fired within 60 s: {fired:?}, pending: {:?}; their expressions: {exprs:#?}; Prometheus said:\n{}",
                prometheus.alerts("pending")?,
                prometheus.log()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("fired: {fired:?}, firing now: {firing:?}");
    for quiet in [
        "NodeAgentDown",
        "NodeAgentRingBufferLosses",
        "NodeAgentEvictionsFailing",
    ] {
        assert!(
            !fired.iter().any(|f| f == quiet),
            "{quiet} fired: {fired:?}"
        );
    }

    // Every alert expression has series to watch.
    for (alert, expr) in &alerts {
        let result = prometheus.query(&with_bool(expr))?;
        assert!(!result.is_empty(), "{alert}: {expr} evaluates to nothing");
    }

    // Every dashboard query has data; the sampler's only where the sampler is the mechanism.
    let mechanism = prometheus.query("node_agent_memory_mechanism == 1")?;
    let sampler = mechanism
        .iter()
        .any(|m| m["metric"]["mechanism"] == "sampler");
    let queries = dashboard_queries()?;
    assert!(queries.len() >= 27, "{} queries", queries.len());
    let mut empty = Vec::new();
    for (panel, expr) in &queries {
        let result = prometheus.query(&as_grafana_sends(expr))?;
        let finite = result.iter().filter_map(value).any(f64::is_finite);
        let sampler_only = expr.contains("node_agent_memory_sampler_");
        match (finite, sampler_only && !sampler) {
            (true, false) | (false, true) => {}
            (false, false) => empty.push(format!("{panel}: {expr} -> {result:?}")),
            (true, true) => empty.push(format!("{panel}: {expr} has data without the sampler")),
        }
    }
    assert!(
        empty.is_empty(),
        "panels without data:\n{}",
        empty.join("\n")
    );
    // The figures are the agent's own: the evictions it made, the OOM kill it saw.
    let evicted = prometheus.query(&as_grafana_sends(
        r#"sum(increase(node_agent_evictions_total{job="node-agent",node=~"$node",result="evicted"}[$__rate_interval]))"#,
    ))?;
    assert!(
        evicted.iter().filter_map(value).any(|v| v >= 1.5),
        "{evicted:?}"
    );
    let ooms =
        prometheus.query(r#"node_agent_oom_kills_total{job="node-agent",namespace="shop"}"#)?;
    assert!(ooms.iter().filter_map(value).any(|v| v >= 1.0), "{ooms:?}");

    w.assert_nothing_refused();
    drop(prometheus);
    daemon.stop()
}
