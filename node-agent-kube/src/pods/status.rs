//! Whether a source the agent decides on delivers: the pod source (kubelet or API server) and
//! the cluster connection. [`assess_pods`] and [`assess_cluster`] are pure; the daemon shows
//! their answer on `/readyz`, as a gauge, and in one log line per transition
//! ([`StateLog`]), never once per refresh.

use std::{
    fmt,
    time::{Duration, Instant, SystemTime},
};

use http::StatusCode;

use super::{records::ProblemKind, PodSnapshot, StaleError};
use crate::transport::LastAnswer;

/// What a source delivers now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    Ready,
    /// Nothing read yet.
    Starting,
    /// The last read failed: why.
    Failing(String),
    /// The data is older than the staleness bound.
    Stale(String),
    /// It answers, but with nothing the agent can decide on: why.
    Unusable(String),
}

impl SourceState {
    pub fn is_ready(&self) -> bool {
        *self == Self::Ready
    }

    /// The state's name, for the log.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Starting => "starting",
            Self::Failing(_) => "failing",
            Self::Stale(_) => "stale",
            Self::Unusable(_) => "unusable",
        }
    }
}

impl fmt::Display for SourceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ready => f.write_str("ready"),
            Self::Starting => f.write_str("not read yet"),
            Self::Failing(why) => write!(f, "cannot be read: {why}"),
            Self::Stale(why) | Self::Unusable(why) => f.write_str(why),
        }
    }
}

/// The pod source's state from its latest snapshot (None before one), the error of its last
/// read if that failed, and the staleness bound.
pub fn assess_pods(
    snapshot: Option<&PodSnapshot>,
    last_error: Option<&str>,
    now: SystemTime,
    bound: Duration,
) -> SourceState {
    if let Some(error) = last_error {
        return SourceState::Failing(error.to_string());
    }
    let Some(snapshot) = snapshot else {
        return SourceState::Starting;
    };
    if let Err(e) = snapshot.check_fresh(now, bound) {
        return SourceState::Stale(match e {
            StaleError::TooOld { age, bound } => format!(
                "its data is {:.0?} old, above the {bound:?} staleness bound (the source has not answered since)",
                age
            ),
            other => other.to_string(),
        });
    }
    if snapshot.listed == 0 {
        return SourceState::Unusable(
            "it lists no pods, not even the agent's own: is kubernetes.nodeName this node?".into(),
        );
    }
    let left_out = snapshot
        .problems
        .iter()
        .filter(|p| {
            matches!(
                p.kind,
                ProblemKind::PodUnreadable | ProblemKind::DuplicateUid
            )
        })
        .count();
    if snapshot.pods.is_empty() && left_out > 0 {
        return SourceState::Unusable(format!(
            "none of its {} pods can be read ({left_out} left out)",
            snapshot.listed
        ));
    }
    SourceState::Ready
}

/// The cluster connection's state from the API server's last answer (to any request): an
/// answer that is not one (unreachable, TLS, timeout), authentication or RBAC refusing the
/// agent (401, 403), or server errors (5xx) fail it; any other answer shows the server
/// reached and serving the agent.
pub fn assess_cluster(last: Option<&LastAnswer>) -> SourceState {
    let Some(last) = last else {
        return SourceState::Starting;
    };
    match &last.outcome {
        Err(error) => SourceState::Failing(error.clone()),
        Ok(status) => match *status {
            StatusCode::UNAUTHORIZED => SourceState::Failing(format!(
                "{}: 401 Unauthorized (the agent's token is not accepted)",
                last.request
            )),
            StatusCode::FORBIDDEN => SourceState::Failing(format!(
                "{}: 403 Forbidden (RBAC does not grant the agent this; see deploy/rbac.yaml)",
                last.request
            )),
            s if s.is_server_error() => {
                SourceState::Failing(format!("{}: HTTP {s} from the API server", last.request))
            }
            _ => SourceState::Ready,
        },
    }
}

/// Whether the last answer is too old to say anything about the connection now.
pub fn is_old(last: Option<&LastAnswer>, now: Instant, max_age: Duration) -> bool {
    last.is_none_or(|l| now.saturating_duration_since(l.at) > max_age)
}

/// One line per transition of one source's state.
#[derive(Debug)]
pub struct StateLog {
    source: &'static str,
    last: Option<SourceState>,
}

impl StateLog {
    pub fn new(source: &'static str) -> Self {
        Self { source, last: None }
    }

    /// Takes the state now; logs and returns true when its kind changed.
    pub fn note(&mut self, state: &SourceState) -> bool {
        let changed = self.last.as_ref().map(SourceState::kind) != Some(state.kind());
        if changed {
            let source = self.source;
            match state {
                SourceState::Ready => tracing::info!(source, "source ready"),
                SourceState::Starting => tracing::info!(source, "source not read yet"),
                _ => tracing::warn!(source, state = state.kind(), why = %state,
                    "source not ready: /readyz answers 503 naming it until it is"),
            }
        }
        self.last = Some(state.clone());
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::records::Problem;

    fn snapshot(listed: usize, pods: usize, left_out: usize, at: SystemTime) -> PodSnapshot {
        let problem = |i| Problem {
            pod: format!("shop/p{i}"),
            kind: ProblemKind::PodUnreadable,
            detail: "x".into(),
        };
        PodSnapshot {
            pods: vec![node_agent_policy::PodInfo::default(); pods],
            containers: Default::default(),
            observed_at: at,
            problems: (0..left_out).map(problem).collect(),
            listed,
            listed_uids: Default::default(),
            kubelet_max_pids: None,
        }
    }

    #[test]
    fn the_pod_source_is_ready_only_with_fresh_usable_data() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let bound = Duration::from_secs(30);
        let s = Duration::from_secs;
        /// (behaviour, the snapshot, the last read's error, now, the state, words it says)
        type Row = (
            &'static str,
            Option<PodSnapshot>,
            Option<&'static str>,
            SystemTime,
            &'static str,
            &'static str,
        );
        let rows: Vec<Row> = vec![
            ("nothing yet", None, None, t0, "starting", ""),
            (
                "the last read failed",
                Some(snapshot(3, 3, 0, t0)),
                Some("kubelet: GET /pods: TLS handshake failed: UnknownIssuer"),
                t0,
                "failing",
                "UnknownIssuer",
            ),
            (
                "fresh",
                Some(snapshot(3, 3, 0, t0)),
                None,
                t0 + s(10),
                "ready",
                "",
            ),
            (
                "older than the bound",
                Some(snapshot(3, 3, 0, t0)),
                None,
                t0 + s(31),
                "stale",
                "31s old, above the 30s",
            ),
            (
                "no pods at all",
                Some(snapshot(0, 0, 0, t0)),
                None,
                t0,
                "unusable",
                "lists no pods",
            ),
            (
                "every pod unreadable",
                Some(snapshot(2, 0, 2, t0)),
                None,
                t0,
                "unusable",
                "none of its 2 pods",
            ),
            (
                "one of three unreadable",
                Some(snapshot(3, 2, 1, t0)),
                None,
                t0,
                "ready",
                "",
            ),
            (
                "only terminal pods",
                Some(snapshot(2, 0, 0, t0)),
                None,
                t0,
                "ready",
                "",
            ),
        ];
        for (what, snap, error, now, kind, words) in rows {
            let state = assess_pods(snap.as_ref(), error, now, bound);
            assert_eq!(state.kind(), kind, "{what}: {state}");
            assert!(state.to_string().contains(words), "{what}: {state}");
        }
    }

    #[test]
    fn the_cluster_connection_fails_on_no_answer_refusals_and_server_errors() {
        let at = Instant::now();
        let answer = |outcome| LastAnswer {
            at,
            request: "GET /api/v1/nodes/n1".into(),
            outcome,
        };
        let rows = [
            ("no answer yet", None, "starting"),
            (
                "unreachable",
                Some(answer(Err(
                    "api server: GET /api/v1/nodes/n1: unreachable".into()
                ))),
                "failing",
            ),
            ("401", Some(answer(Ok(StatusCode::UNAUTHORIZED))), "failing"),
            ("403", Some(answer(Ok(StatusCode::FORBIDDEN))), "failing"),
            (
                "503",
                Some(answer(Ok(StatusCode::SERVICE_UNAVAILABLE))),
                "failing",
            ),
            ("200", Some(answer(Ok(StatusCode::OK))), "ready"),
            (
                "404 (a pod gone) is an answer",
                Some(answer(Ok(StatusCode::NOT_FOUND))),
                "ready",
            ),
            (
                "429 (load shed) is an answer",
                Some(answer(Ok(StatusCode::TOO_MANY_REQUESTS))),
                "ready",
            ),
        ];
        for (what, last, kind) in rows {
            assert_eq!(assess_cluster(last.as_ref()).kind(), kind, "{what}");
        }
        let forbidden = assess_cluster(Some(&answer(Ok(StatusCode::FORBIDDEN)))).to_string();
        assert!(
            forbidden.contains("GET /api/v1/nodes/n1: 403 Forbidden (RBAC"),
            "{forbidden}"
        );
        assert!(is_old(None, at, Duration::from_secs(1)));
        assert!(!is_old(
            Some(&answer(Ok(StatusCode::OK))),
            at,
            Duration::from_secs(1)
        ));
        assert!(is_old(
            Some(&answer(Ok(StatusCode::OK))),
            at + Duration::from_secs(2),
            Duration::from_secs(1)
        ));
    }

    #[test]
    fn the_log_speaks_on_transitions_only() {
        let mut log = StateLog::new("pods");
        let failing = |why: &str| SourceState::Failing(why.into());
        let rows = [
            (SourceState::Starting, true),
            (failing("TLS"), true),
            (failing("TLS, again"), false),
            (failing("timeout"), false),
            (SourceState::Ready, true),
            (SourceState::Ready, false),
            (SourceState::Stale("old".into()), true),
        ];
        for (i, (state, logged)) in rows.into_iter().enumerate() {
            assert_eq!(log.note(&state), logged, "row {i}: {state}");
        }
    }
}
