//! The endpoint's requests, parsed from the request target alone (`GET` only, no body):
//! `/v1/status`, `/v1/trace?kind=oom_kill,eviction&namespace=shop&pod=web`,
//! `/v1/explain?namespace=shop&pod=web&uid=...`. Strict: an unknown path or parameter, a
//! repeated one, a value that is no Kubernetes name, and percent-encoding (no name needs it)
//! are refused, each naming what was wrong. Pure.

use super::wire::{EXPLAIN_PATH, STATUS_PATH, TRACE_PATH};
use crate::trace::{Filter, FilterError};

/// The longest value taken (a DNS subdomain, and for `--pod` a namespace before it).
const MAX_VALUE: usize = 253 + 1 + 63;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Status,
    /// The live stream, filtered as `node-agent trace` filters it.
    Trace {
        kinds: Vec<String>,
        namespace: Option<String>,
        pod: Option<String>,
    },
    Explain(ExplainQuery),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplainQuery {
    pub namespace: String,
    pub pod: String,
    /// The pod's UID (from the API), to find what the agent saw before it named the pod.
    pub uid: Option<String>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error(
        "no such path {0:?}: this endpoint serves {STATUS_PATH}, {TRACE_PATH} and {EXPLAIN_PATH}"
    )]
    NotFound(String),
    #[error("{path} takes no parameter {name:?}; it takes {takes}")]
    Unknown {
        path: &'static str,
        name: String,
        takes: &'static str,
    },
    #[error("parameter {0:?} is given twice")]
    Repeated(String),
    #[error("parameter {0:?} is required")]
    Missing(&'static str),
    #[error("parameter {name:?}: {problem}")]
    Bad { name: String, problem: String },
    #[error(transparent)]
    Kind(#[from] FilterError),
}

impl Request {
    /// The request for a target such as `/v1/trace?kind=oom_kill`.
    pub fn parse(target: &str) -> Result<Request, QueryError> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let params = params(query)?;
        let takes =
            |path: &'static str, allowed: &'static [&'static str], text: &'static str| match params
                .iter()
                .find(|(k, _)| !allowed.contains(&k.as_str()))
            {
                Some((k, _)) => Err(QueryError::Unknown {
                    path,
                    name: k.clone(),
                    takes: text,
                }),
                None => Ok(()),
            };
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        match path {
            STATUS_PATH => {
                takes(STATUS_PATH, &[], "none")?;
                Ok(Request::Status)
            }
            TRACE_PATH => {
                takes(
                    TRACE_PATH,
                    &["kind", "namespace", "pod"],
                    "kind, namespace, pod",
                )?;
                let kinds: Vec<String> = get("kind")
                    .map(|k| {
                        k.split(',')
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                // The kinds are checked as `node-agent trace --kind` checks them.
                Filter::new(&kinds, None, None, None)?;
                let namespace = get("namespace").map(|v| name("namespace", v)).transpose()?;
                let pod = get("pod").map(pod_filter).transpose()?;
                Ok(Request::Trace {
                    kinds,
                    namespace,
                    pod,
                })
            }
            EXPLAIN_PATH => {
                takes(
                    EXPLAIN_PATH,
                    &["namespace", "pod", "uid"],
                    "namespace, pod, uid",
                )?;
                let namespace = name(
                    "namespace",
                    get("namespace").ok_or(QueryError::Missing("namespace"))?,
                )?;
                let pod = name("pod", get("pod").ok_or(QueryError::Missing("pod"))?)?;
                let uid = get("uid").map(uid).transpose()?;
                Ok(Request::Explain(ExplainQuery {
                    namespace,
                    pod,
                    uid,
                }))
            }
            other => Err(QueryError::NotFound(cut(other))),
        }
    }

    /// The trace filter of a trace request.
    pub fn trace_filter(&self) -> Option<Filter> {
        match self {
            Request::Trace {
                kinds,
                namespace,
                pod,
            } => Filter::new(kinds, None, pod.clone(), namespace.clone()).ok(),
            _ => None,
        }
    }
}

/// `a=1&b=2`, each name at most once.
fn params(query: &str) -> Result<Vec<(String, String)>, QueryError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k.contains(['%', '+']) || v.contains(['%', '+']) {
            return Err(QueryError::Bad {
                name: cut(k),
                problem: "percent-encoding is not taken: names and kinds need none".into(),
            });
        }
        if out.iter().any(|(seen, _)| seen == k) {
            return Err(QueryError::Repeated(cut(k)));
        }
        out.push((k.to_string(), v.to_string()));
    }
    Ok(out)
}

fn bad(name: &str, problem: impl Into<String>) -> QueryError {
    QueryError::Bad {
        name: name.to_string(),
        problem: problem.into(),
    }
}

/// A namespace or pod name: a DNS subdomain (lowercase letters, digits, `-` and `.`).
fn name(param: &str, v: String) -> Result<String, QueryError> {
    if v.is_empty() || v.len() > 253 {
        return Err(bad(param, "must be 1 to 253 characters"));
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(bad(
            param,
            format!(
                "{:?} is not a Kubernetes name (lowercase letters, digits, '-' and '.')",
                cut(&v)
            ),
        ));
    }
    Ok(v)
}

/// `--pod` of trace: a name, `namespace/name` or a UID prefix.
fn pod_filter(v: String) -> Result<String, QueryError> {
    if v.is_empty() || v.len() > MAX_VALUE {
        return Err(bad("pod", format!("must be 1 to {MAX_VALUE} characters")));
    }
    match v.split_once('/') {
        Some((ns, pod)) => {
            name("pod", ns.to_string())?;
            name("pod", pod.to_string())?;
        }
        None => {
            name("pod", v.clone())?;
        }
    }
    Ok(v)
}

fn uid(v: String) -> Result<String, QueryError> {
    if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(bad("uid", "must be a pod UID (hex digits and '-')"));
    }
    Ok(v)
}

/// Echoed text from a client, cut short.
fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_parsed_or_refused_naming_what_was_wrong() {
        let trace = |kinds: &[&str], namespace: Option<&str>, pod: Option<&str>| Request::Trace {
            kinds: kinds.iter().map(|s| s.to_string()).collect(),
            namespace: namespace.map(String::from),
            pod: pod.map(String::from),
        };
        let explain = |ns: &str, pod: &str, uid: Option<&str>| {
            Request::Explain(ExplainQuery {
                namespace: ns.into(),
                pod: pod.into(),
                uid: uid.map(String::from),
            })
        };
        let rows: Vec<(&str, Result<Request, &str>)> = vec![
            ("/v1/status", Ok(Request::Status)),
            ("/v1/trace", Ok(trace(&[], None, None))),
            (
                "/v1/trace?kind=oom_kill,eviction&namespace=shop&pod=web",
                Ok(trace(&["oom_kill", "eviction"], Some("shop"), Some("web"))),
            ),
            (
                "/v1/trace?pod=shop/web-1",
                Ok(trace(&[], None, Some("shop/web-1"))),
            ),
            (
                "/v1/explain?namespace=shop&pod=web-1&uid=0a1b-2c",
                Ok(explain("shop", "web-1", Some("0a1b-2c"))),
            ),
            (
                "/v1/explain?pod=web&namespace=shop",
                Ok(explain("shop", "web", None)),
            ),
            ("/metrics", Err("no such path \"/metrics\"")),
            (
                "/v1/status?x=1",
                Err("takes no parameter \"x\"; it takes none"),
            ),
            ("/v1/trace?kind=oom", Err("--kind \"oom\" is not one of")),
            ("/v1/trace?node=a", Err("takes no parameter \"node\"")),
            ("/v1/trace?pod=a&pod=b", Err("\"pod\" is given twice")),
            (
                "/v1/trace?namespace=Shop",
                Err("\"Shop\" is not a Kubernetes name"),
            ),
            ("/v1/trace?pod=a%2Fb", Err("percent-encoding is not taken")),
            ("/v1/explain?namespace=shop", Err("\"pod\" is required")),
            ("/v1/explain?pod=web", Err("\"namespace\" is required")),
            (
                "/v1/explain?namespace=&pod=web",
                Err("must be 1 to 253 characters"),
            ),
            (
                "/v1/explain?namespace=a&pod=b&uid=zz",
                Err("must be a pod UID"),
            ),
        ];
        for (target, want) in rows {
            let got = Request::parse(target);
            match (&got, &want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{target}"),
                (Err(e), Err(words)) => {
                    assert!(e.to_string().contains(words), "{target}: {e}")
                }
                _ => panic!("{target}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_long_value_is_refused_and_never_echoed_whole() {
        let long = "a".repeat(10_000);
        let err = Request::parse(&format!("/v1/explain?namespace={long}&pod=b"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 to 253"), "{err}");
        let err = Request::parse(&format!("/{long}")).unwrap_err().to_string();
        assert!(err.len() < 200, "{err}");
    }
}
