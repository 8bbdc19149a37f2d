//! What `kubectl node-agent trace` prints: each record as `node-agent trace` prints it with
//! the node in front (a table column, or a `node` field of the JSON line), and the plugin's
//! own notices about agents joining, leaving or not answering. Pure.

use node_agent::trace::Record;
use serde::Serialize;

/// Width of the node column.
const NODE: usize = 20;

/// One line of the merged stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Record(Box<Record>),
    Notice(Notice),
}

/// Something about an agent itself, said in the stream where it happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    pub kind: NoticeKind,
    /// RFC 3339, this machine's clock.
    pub time: String,
    pub pod: String,
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NoticeKind {
    /// Its stream is followed (at the start, or a new agent pod on a selected node).
    #[serde(rename = "agent_joined")]
    Joined,
    /// Its stream ended: the pod went, its node left the selection, or the stream broke
    /// (then it is tried again while the pod runs).
    #[serde(rename = "agent_left")]
    Left,
    /// It could not be read; tried again while its pod runs.
    #[serde(rename = "agent_unreachable")]
    Unreachable,
}

impl NoticeKind {
    fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Joined => "agent_joined",
            NoticeKind::Left => "agent_left",
            NoticeKind::Unreachable => "agent_unreachable",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

pub fn header(format: Format) -> Option<String> {
    match format {
        Format::Table => Some(format!("{:<NODE$} {}", "NODE", Record::TABLE_HEADER)),
        Format::Json => None,
    }
}

/// One line of output.
pub fn render(node: &str, line: &Line, format: Format) -> String {
    match (format, line) {
        (Format::Table, Line::Record(r)) => format!("{:<NODE$} {}", tail(node), r.table_row()),
        (Format::Table, Line::Notice(n)) => format!(
            "{:<NODE$} {:<15} {:<16} {:<28} {:<7} {}",
            tail(node),
            time_of_day(&n.time),
            n.kind.as_str(),
            n.pod,
            "-",
            n.detail
        ),
        (Format::Json, Line::Record(r)) => {
            let mut value = serde_json::to_value(r.as_ref()).unwrap_or_default();
            if let Some(object) = value.as_object_mut() {
                object.insert("node".into(), node.into());
            }
            value.to_string()
        }
        (Format::Json, Line::Notice(n)) => {
            let mut value = serde_json::to_value(n).unwrap_or_default();
            if let Some(object) = value.as_object_mut() {
                object.insert("node".into(), node.into());
            }
            value.to_string()
        }
    }
}

/// `23:05:25.123456` from `2026-11-22T23:05:25.123456Z`.
fn time_of_day(rfc3339: &str) -> &str {
    rfc3339
        .split_once('T')
        .map_or(rfc3339, |(_, t)| t.trim_end_matches('Z'))
}

/// At most the column's width, the end kept (node names differ at their end).
fn tail(s: &str) -> String {
    let n = s.chars().count();
    if n <= NODE {
        return s.to_string();
    }
    let keep: String = s.chars().skip(n - (NODE - 1)).collect();
    format!("…{keep}")
}

/// A record's own time (ns since the epoch), if it reads.
pub fn time_of(line: &Line) -> Option<i128> {
    let text = match line {
        Line::Record(r) => r.time(),
        Line::Notice(n) => &n.time,
    };
    text.parse::<jiff::Timestamp>()
        .ok()
        .map(|t| t.as_nanosecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eviction() -> Line {
        Line::Record(Box::new(
            serde_json::from_value(
                serde_json::json!({"kind": "eviction", "time": "2026-11-27T10:00:01.5Z",
                "namespace": "shop", "name": "web", "signal": "memory.available", "hard": true,
                "observed": 1048576, "threshold": 209715200, "grace_period_seconds": 1,
                "result": "dry_run", "message": "m"}),
            )
            .unwrap(),
        ))
    }

    fn joined() -> Line {
        Line::Notice(Notice {
            kind: NoticeKind::Joined,
            time: "2026-11-27T10:00:00Z".into(),
            pod: "node-agent-x".into(),
            detail: "following its stream".into(),
        })
    }

    #[test]
    fn each_line_names_its_node_in_the_table_and_in_json() {
        let rows: Vec<(&str, Line, Format, &str)> = vec![
            (
                "a record: the node, then node-agent trace's own row",
                eviction(),
                Format::Table,
                "node-agent-1         10:00:01.5      eviction         shop/web                     -       dry_run: memory.available 1.0Mi < 200.0Mi",
            ),
            (
                "a notice in the same columns",
                joined(),
                Format::Table,
                "node-agent-1         10:00:00        agent_joined     node-agent-x                 -       following its stream",
            ),
            (
                "a record's JSON gains the node",
                eviction(),
                Format::Json,
                "\"node\":\"node-agent-1\"",
            ),
            (
                "a notice's JSON has its kind and node",
                joined(),
                Format::Json,
                "{\"detail\":\"following its stream\",\"kind\":\"agent_joined\",\"node\":\"node-agent-1\",\"pod\":\"node-agent-x\",\"time\":\"2026-11-27T10:00:00Z\"}",
            ),
        ];
        for (what, line, format, want) in rows {
            let got = render("node-agent-1", &line, format);
            assert!(got.contains(want), "{what}:\n  {got}\n  wanted {want}");
        }
        assert!(header(Format::Table)
            .unwrap()
            .starts_with("NODE                 TIME"));
        assert_eq!(header(Format::Json), None);
        let long = render(&"n".repeat(40), &joined(), Format::Table);
        assert!(
            long.starts_with(&format!("…{}", "n".repeat(NODE - 1))),
            "{long}"
        );
    }

    #[test]
    fn a_line_is_ordered_by_its_own_time() {
        assert_eq!(time_of(&eviction()), Some(1_795_773_601_500_000_000),);
        let mut bad = joined();
        if let Line::Notice(n) = &mut bad {
            n.time = String::new();
        }
        assert_eq!(time_of(&bad), None);
    }
}
