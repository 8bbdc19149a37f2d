//! `kubectl node-agent explain POD`: what the agent of the pod's node lately saw and decided
//! about it, from the agent's own window (15 minutes): chosen for eviction, passed over and
//! why, kept over a local storage limit, its evictions' outcomes, OOM kills in it, memory
//! lines crossed; and what the agent chose instead when it did not choose this pod.

use std::io::Write as _;

use node_agent::inspect::{wire::EXPLAIN_PATH, Entry, Explanation};

use crate::{cluster::Cluster, error::PluginError, forward, status::age};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// The pod.
    #[arg(value_name = "POD")]
    pub pod: String,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default", value_name = "NAMESPACE")]
    pub namespace: String,
    /// Output format: json (the agent's answer whole); default: text.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Format>,
}

pub async fn run(cluster: &Cluster, args: &ExplainArgs) -> Result<(), PluginError> {
    for (flag, value) in [("namespace", &args.namespace), ("pod", &args.pod)] {
        if value.is_empty()
            || value.len() > 253
            || !value
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(PluginError::Flag {
                flag,
                value: value.clone(),
                problem: "not a Kubernetes name (lowercase letters, digits, '-' and '.')".into(),
            });
        }
    }
    let pod = cluster.pod(&args.namespace, &args.pod).await?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .ok_or_else(|| PluginError::NotScheduled {
            namespace: args.namespace.clone(),
            name: args.pod.clone(),
        })?;
    let uid = pod.metadata.uid.clone();
    let agent = cluster
        .agents(Some(&node))
        .await?
        .into_iter()
        .find(|a| a.reachable())
        .ok_or_else(|| PluginError::NoAgentOnNode {
            node: node.clone(),
            namespace: cluster.agent_namespace.clone(),
        })?;
    let mut target = format!(
        "{EXPLAIN_PATH}?namespace={}&pod={}",
        args.namespace, args.pod
    );
    if let Some(uid) = uid
        .as_deref()
        .filter(|u| u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
    {
        target.push_str(&format!("&uid={uid}"));
    }
    let explanation: Explanation = forward::get_json(cluster, &agent.name, &target)
        .await
        .map_err(|e| e.about(&node, &agent.name))?;
    let text = match args.output {
        Some(Format::Json) => serde_json::to_string_pretty(&explanation).unwrap_or_default(),
        None => render(&explanation, &agent.name),
    };
    writeln!(std::io::stdout().lock(), "{text}").map_err(PluginError::Output)
}

/// The explanation for people.
pub fn render(e: &Explanation, agent: &str) -> String {
    let node = e.node.as_deref().unwrap_or("?");
    let minutes = e.window_seconds / 60;
    let mut text = format!(
        "Pod {}/{} on node {node} (agent {agent}, {}), the last {minutes} minutes:\n",
        e.namespace,
        e.pod,
        e.mode.as_str()
    );
    if e.entries.is_empty() {
        text.push_str("  nothing: the agent neither chose it nor passed it over, and saw no OOM kill, memory line or eviction of it\n");
    }
    for entry in &e.entries {
        text.push_str(&format!("  {}\n", line(entry, &e.now)));
    }
    text.push_str("Now: ");
    match e.thresholds_met.as_slice() {
        [] => text.push_str("no threshold is met on this node.\n"),
        met => {
            let said: Vec<String> = met
                .iter()
                .map(|t| match (t.observed, t.threshold) {
                    (Some(o), Some(th)) => format!(
                        "{} ({} available, threshold {})",
                        t.label(),
                        node_agent::trace::signal_value(&t.signal, o),
                        node_agent::trace::signal_value(&t.signal, th)
                    ),
                    _ => t.label(),
                })
                .collect();
            text.push_str(&format!("thresholds met: {}.\n", said.join("; ")));
        }
    }
    let chosen_this = e
        .entries
        .iter()
        .any(|x| matches!(x.fact, node_agent::inspect::Fact::Chosen { .. }));
    if !e.others_chosen.is_empty() {
        text.push_str(match chosen_this {
            true => "The agent also chose:\n",
            false => "The agent chose other pods instead (ranked ahead of this one, or this one was no candidate):\n",
        });
        for other in &e.others_chosen {
            text.push_str(&format!(
                "  {}/{}: {}\n",
                other.namespace,
                other.pod,
                line(other, &e.now)
            ));
        }
    }
    text.trim_end().to_string()
}

/// `3m12s ago (x36 from 5m ago): chosen for eviction: ...`
fn line(entry: &Entry, now: &str) -> String {
    let last = age(&entry.last, now).unwrap_or_else(|| "?".into());
    let when = match entry.count {
        1 => format!("{last} ago"),
        n => format!(
            "{last} ago (x{n} since {} ago)",
            age(&entry.first, now).unwrap_or_else(|| "?".into())
        ),
    };
    format!("{when}: {}", entry.fact.describe())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn explanation(entries: serde_json::Value, others: serde_json::Value) -> Explanation {
        serde_json::from_value(serde_json::json!({
            "namespace": "shop", "pod": "web", "node": "n1", "mode": "dry-run",
            "window_seconds": 900, "entries": entries,
            "thresholds_met": [{"signal": "memory.available", "hard": true, "grace_period_passed": true,
                "observed": 104857600, "threshold": 209715200}],
            "others_chosen": others, "now": "2026-11-27T10:05:00Z"
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_passed_over_is_told_why_and_what_was_chosen_instead() {
        let e = explanation(
            serde_json::json!([{"first": "2026-11-27T10:00:00Z", "last": "2026-11-27T10:04:30Z", "count": 12,
                "namespace": "shop", "pod": "web", "what": "passed_over", "signal": "memory.available",
                "reason": "excluded_by_label_selector", "why": "it matches kubernetes.exclusions.labelSelector"}]),
            serde_json::json!([{"first": "2026-11-27T10:00:00Z", "last": "2026-11-27T10:04:30Z", "count": 12,
                "namespace": "shop", "pod": "cart", "what": "chosen", "signal": "memory.available",
                "hard": true, "observed": 104857600, "threshold": 209715200}]),
        );
        let text = render(&e, "node-agent-x");
        let want = [
            "Pod shop/web on node n1 (agent node-agent-x, dry-run), the last 15 minutes:",
            "  30s ago (x12 since 5m0s ago): passed over for memory.available: it matches kubernetes.exclusions.labelSelector",
            "Now: thresholds met: memory.available (100.0Mi available, threshold 200.0Mi).",
            "The agent chose other pods instead (ranked ahead of this one, or this one was no candidate):",
            "  shop/cart: 30s ago (x12 since 5m0s ago): chosen for eviction: memory.available hard threshold met (100.0Mi observed, threshold 200.0Mi)",
        ];
        assert_eq!(text.lines().collect::<Vec<_>>(), want, "{text}");
    }

    #[test]
    fn a_pod_the_agent_saw_nothing_of_says_so() {
        let e = explanation(serde_json::json!([]), serde_json::json!([]));
        let text = render(&e, "node-agent-x");
        assert!(
            text.contains("  nothing: the agent neither chose it nor passed it over"),
            "{text}"
        );
        assert!(!text.contains("instead"), "{text}");
    }
}
