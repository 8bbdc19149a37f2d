//! `kubectl node-agent status`: one row per node, from each agent's own status (read through
//! its inspection endpoint) and its pod (which DaemonSet runs it). Exits non-zero when an
//! agent is not ready or cannot be read.

use std::{collections::BTreeSet, io::Write as _};

use futures::{stream, StreamExt as _};
use node_agent::{
    inspect::{wire::STATUS_PATH, StatusReply},
    trace::Record,
};
use serde::Serialize;

use crate::{
    cluster::{AgentPod, Cluster},
    error::PluginError,
    forward::{self, ForwardError},
    trace::select::{self, Nodes},
};

/// Agents asked at once.
const CONCURRENCY: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Wide,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Only the agents of these nodes (repeatable, or comma-separated).
    #[arg(long, value_name = "NODE")]
    pub node: Vec<String>,
    /// Only the agents of the nodes this label selector picks.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Output format: wide (every column) or json; default: the table.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Format>,
}

/// One node's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub node: String,
    pub pod: String,
    pub daemonset: Option<String>,
    pub phase: String,
    /// The agent's own status, when it could be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusReply>,
    /// Why it could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Row {
    pub fn ready(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.ready)
    }
}

/// Returns whether every agent is ready.
pub async fn run(cluster: &Cluster, args: &StatusArgs) -> Result<bool, PluginError> {
    let nodes = Nodes {
        named: select::node_names(&args.node)?,
        labelled: match &args.selector {
            Some(selector) => Some(cluster.nodes(selector).await?),
            None => None,
        },
    };
    let agents: Vec<AgentPod> = cluster
        .agents(None)
        .await?
        .into_iter()
        .filter(|a| a.node.is_none() || nodes.selects(a.node_name()))
        .collect();
    if agents.is_empty() {
        return Err(PluginError::NoAgents {
            namespace: cluster.agent_namespace.clone(),
            selected: nodes.said(args.selector.as_deref()),
        });
    }
    let answers: Vec<(AgentPod, Result<StatusReply, ForwardError>)> = stream::iter(agents)
        .map(|agent| async move {
            let answer = match agent.reachable() {
                true => forward::get_json::<StatusReply>(cluster, &agent.name, STATUS_PATH).await,
                false => Err(ForwardError::Failed(format!("pod is {}", state(&agent)))),
            };
            (agent, answer)
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut rows = Vec::with_capacity(answers.len());
    for (agent, answer) in answers {
        let (status, error) = match answer {
            Ok(s) => (Some(s), None),
            // A refusal is the same for every agent: said once, as the command's error.
            Err(ForwardError::Refused(e)) => return Err(e),
            Err(ForwardError::Failed(why)) => (None, Some(why)),
        };
        rows.push(Row {
            node: agent.node_name().to_string(),
            pod: agent.name.clone(),
            daemonset: agent.daemonset.clone(),
            phase: state(&agent),
            status,
            error,
        });
    }
    rows.sort_by(|a, b| (&a.node, &a.pod).cmp(&(&b.node, &b.pod)));
    let all_ready = rows.iter().all(Row::ready);
    let text = match args.output {
        Some(Format::Json) => serde_json::to_string_pretty(&rows).unwrap_or_default(),
        Some(Format::Wide) => render(&rows, true),
        None => render(&rows, false),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}").map_err(PluginError::Output)?;
    Ok(all_ready)
}

fn state(agent: &AgentPod) -> String {
    match agent.deleting {
        true => format!("{} (terminating)", agent.phase),
        false => agent.phase.clone(),
    }
}

/// The table, and below it why each agent that is not ready is not.
pub fn render(rows: &[Row], wide: bool) -> String {
    let mut header = vec!["NODE", "POD"];
    if wide {
        header.push("DAEMONSET");
    }
    header.extend([
        "MODE",
        "READY",
        "MEMORY",
        "THRESHOLDS MET",
        "LAST EVICTION",
        "LAST OOM KILL",
        "VERSION",
    ]);
    if wide {
        header.extend(["STARTED", "COMMIT"]);
    }
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    let mut reasons = Vec::new();
    for row in rows {
        let mut cells = vec![row.node.clone(), row.pod.clone()];
        if wide {
            cells.push(row.daemonset.clone().unwrap_or_else(|| "-".into()));
        }
        match &row.status {
            Some(s) => {
                cells.push(s.mode.as_str().to_string());
                cells.push(if s.ready { "yes" } else { "no" }.to_string());
                cells.push(s.memory_mechanism.clone());
                cells.push(match s.thresholds_met.as_slice() {
                    [] => "-".into(),
                    met => met
                        .iter()
                        .map(|t| t.label())
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(","),
                });
                cells.push(last(s.last_eviction.as_ref(), &s.now, wide));
                cells.push(last(s.last_oom_kill.as_ref(), &s.now, wide));
                cells.push(match wide {
                    true => s.version.clone(),
                    false => format!("{} ({})", s.version, short_commit(&s.commit)),
                });
                if wide {
                    cells.push(age(&s.started, &s.now).unwrap_or_else(|| "?".into()));
                    cells.push(s.commit.clone());
                }
                if !s.ready {
                    reasons.push(format!(
                        "{}: {}",
                        row.node,
                        s.readiness.replace('\n', "\n  ")
                    ));
                }
            }
            None => {
                cells.extend(["?".into(), "unreachable".into()]);
                cells.extend(std::iter::repeat_n(
                    "?".to_string(),
                    if wide { 7 } else { 5 },
                ));
                reasons.push(format!(
                    "{}: the agent could not be read: {}",
                    row.node,
                    row.error.as_deref().unwrap_or("unknown")
                ));
            }
        }
        table.push(cells);
    }
    let mut text = columns(&table);
    for reason in reasons {
        text.push('\n');
        text.push_str(&reason);
    }
    text
}

/// Columns padded to their widest cell, two spaces apart (as kubectl prints tables).
fn columns(table: &[Vec<String>]) -> String {
    let n = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            table
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    table
        .iter()
        .map(|row| {
            row.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
                .collect::<Vec<_>>()
                .join("   ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `41s shop/web dry_run` for an eviction, `3m hog in shop/web/main` for a kill; `-` for none.
fn last(record: Option<&Record>, now: &str, wide: bool) -> String {
    let Some(record) = record else {
        return "-".into();
    };
    let (time, what) = match record {
        Record::Eviction {
            time,
            namespace,
            name,
            result,
            signal,
            ..
        } => (
            time,
            match wide {
                true => format!("{namespace}/{name} {} ({signal})", result.as_str()),
                false => format!("{namespace}/{name} {}", result.as_str()),
            },
        ),
        Record::OomKill(kill) => (
            &kill.time,
            format!("{} in {}", kill.comm, kill.cgroup.label()),
        ),
        other => return other.kind().to_string(),
    };
    format!("{} {what}", age(time, now).unwrap_or_else(|| "?".into()))
}

fn short_commit(commit: &str) -> &str {
    match commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        true => &commit[..7],
        false => "commit unknown",
    }
}

/// kubectl's ages: `45s`, `3m12s`, `2h5m`, `3d4h`, from two RFC 3339 times (the agent's
/// clock for both, so a skewed local clock does not matter).
pub fn age(then: &str, now: &str) -> Option<String> {
    let then: jiff::Timestamp = then.parse().ok()?;
    let now: jiff::Timestamp = now.parse().ok()?;
    let secs = (now.as_second() - then.as_second()).max(0);
    Some(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let rows = [
            ("2026-11-27T10:00:00Z", "2026-11-27T10:00:45Z", Some("45s")),
            (
                "2026-11-27T10:00:00Z",
                "2026-11-27T10:03:12Z",
                Some("3m12s"),
            ),
            ("2026-11-27T10:00:00Z", "2026-11-27T10:42:00Z", Some("42m")),
            ("2026-11-27T10:00:00Z", "2026-11-27T15:05:00Z", Some("5h5m")),
            ("2026-11-27T10:00:00Z", "2026-11-28T20:00:00Z", Some("34h")),
            ("2026-11-25T10:00:00Z", "2026-11-28T14:00:00Z", Some("3d4h")),
            ("2026-11-27T10:00:05Z", "2026-11-27T10:00:00Z", Some("0s")),
            ("", "2026-11-27T10:00:00Z", None),
        ];
        for (then, now, want) in rows {
            assert_eq!(age(then, now).as_deref(), want, "{then} → {now}");
        }
    }

    fn status(ready: bool) -> StatusReply {
        serde_json::from_value(serde_json::json!({
            "version": "0.1.0", "commit": "0123456789abcdef", "node": "n1",
            "mode": "dry-run", "ready": ready,
            "readiness": if ready { "ready" } else { "not ready: signal sources degraded:\nimagefs: gone" },
            "memory_mechanism": "sampler",
            "thresholds_met": [{"signal": "memory.available", "hard": true, "grace_period_passed": true}],
            "last_eviction": {"kind": "eviction", "time": "2026-11-27T10:00:00Z", "namespace": "shop", "name": "web",
                "signal": "memory.available", "hard": true, "observed": 1, "threshold": 2,
                "grace_period_seconds": 1, "result": "dry_run", "message": "m"},
            "started": "2026-11-27T09:00:00Z", "now": "2026-11-27T10:00:41Z"
        }))
        .unwrap()
    }

    fn row(node: &str, status: Option<StatusReply>, error: Option<&str>) -> Row {
        Row {
            node: node.into(),
            pod: format!("node-agent-{node}"),
            daemonset: Some("node-agent".into()),
            phase: "Running".into(),
            status,
            error: error.map(String::from),
        }
    }

    #[test]
    fn one_row_per_node_and_why_each_is_not_ready_below() {
        let rows = vec![
            row("n1", Some(status(true)), None),
            row("n2", Some(status(false)), None),
            row("n3", None, Some("nothing listens on 127.0.0.1:9465")),
        ];
        let text = render(&rows, false);
        let lines: Vec<&str> = text.lines().collect();
        let cells = |line: &str| -> Vec<String> {
            line.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        };
        assert_eq!(
            cells(lines[0]),
            [
                "NODE",
                "POD",
                "MODE",
                "READY",
                "MEMORY",
                "THRESHOLDS MET",
                "LAST EVICTION",
                "LAST OOM KILL",
                "VERSION"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "n1",
                "node-agent-n1",
                "dry-run",
                "yes",
                "sampler",
                "memory.available",
                "41s shop/web dry_run",
                "-",
                "0.1.0 (0123456)"
            ]
        );
        assert_eq!(cells(lines[2])[3], "no", "{text}");
        assert_eq!(cells(lines[3])[2..4], ["?", "unreachable"], "{text}");
        assert_eq!(lines[4], "n2: not ready: signal sources degraded:");
        assert_eq!(lines[5], "  imagefs: gone");
        assert_eq!(
            lines[6],
            "n3: the agent could not be read: nothing listens on 127.0.0.1:9465"
        );
        let wide = render(&rows, true);
        assert!(wide.lines().next().unwrap().contains("DAEMONSET"), "{wide}");
        assert!(
            wide.contains("shop/web dry_run (memory.available)"),
            "{wide}"
        );
        assert!(wide.contains("0123456789abcdef"), "{wide}");
        assert!(rows[0].ready() && !rows[1].ready() && !rows[2].ready());
    }
}
