//! How long a command that runs on (`trace`) lasts: its `--timeout`, Ctrl-C or SIGTERM. A leaf:
//! the command line parses durations with it, the commands wait on it.

use std::time::Duration;

/// A positive duration as Kubernetes writes them (`30s`, `5m`, `1h30m`).
pub fn duration(text: &str) -> Result<Duration, String> {
    let ns = node_agent_policy::parse_go_duration(text).map_err(|e| e.to_string())?;
    match u64::try_from(ns) {
        Ok(ns) if ns > 0 => Ok(Duration::from_nanos(ns)),
        _ => Err(format!("{text:?} must be a positive duration such as 30s")),
    }
}

/// When a command that runs on stops: after `--timeout`, on Ctrl-C, or on SIGTERM.
pub struct Stop {
    deadline: Option<tokio::time::Instant>,
    term: Option<tokio::signal::unix::Signal>,
}

impl Stop {
    pub fn new(timeout: Option<Duration>) -> Stop {
        Stop {
            deadline: timeout.map(|d| tokio::time::Instant::now() + d),
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok(),
        }
    }

    pub async fn wait(&mut self) {
        let deadline = async {
            match self.deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let term = async {
            match &mut self.term {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = deadline => {}
            () = term => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_kubernetes_durations() {
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(duration("0s").unwrap_err().contains("positive"));
        assert!(duration("soon").is_err());
    }
}
