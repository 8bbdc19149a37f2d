//! The checks the real API server (and the kubelet's authenticated API) applies before any
//! handler runs, in its order: authentication (401), content negotiation (406), routing (404,
//! 405), authorization (403, for a resource a test denies), the body's media type (415),
//! decoding (400) and validation (400, 422). A request that fails one is answered as the API
//! server would and never reaches the test's responder.

use serde_json::{json, Value};

use super::{
    reply::{bad_request, merge_patch_object},
    Reply, Seen,
};

/// The content types the API server accepts for a PATCH.
const PATCH_TYPES: [&str; 4] = [
    "application/strategic-merge-patch+json",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
];

/// The routes the agent may use, by (method, path pattern, what the handler checks, the RBAC
/// resource authorized); `*` is one path segment.
const ROUTES: &[(&str, &str, Kind, &str)] = &[
    // The kubelet's own API (fine-grained kubelet authorization: nodes/pods, nodes/stats).
    ("GET", "/pods", Kind::Read, "nodes/pods"),
    ("GET", "/stats/summary", Kind::Read, "nodes/stats"),
    // The same through the API server's node proxy: a CONNECT of nodes/proxy, verb get.
    (
        "GET",
        "/api/v1/nodes/*/proxy/pods",
        Kind::Read,
        "nodes/proxy",
    ),
    (
        "GET",
        "/api/v1/nodes/*/proxy/stats/summary",
        Kind::Read,
        "nodes/proxy",
    ),
    ("GET", "/api/v1/pods", Kind::Read, "pods"),
    // The agent pods on its node, asked once at SIGTERM (a rollout's hand-over).
    ("GET", "/api/v1/namespaces/*/pods", Kind::Read, "pods"),
    ("GET", "/api/v1/nodes/*", Kind::Read, "nodes"),
    ("PATCH", "/api/v1/nodes/*", Kind::Node, "nodes"),
    (
        "PATCH",
        "/api/v1/nodes/*/status",
        Kind::NodeStatus,
        "nodes/status",
    ),
    (
        "DELETE",
        "/api/v1/namespaces/*/pods/*",
        Kind::Delete,
        "pods",
    ),
    (
        "PATCH",
        "/api/v1/namespaces/*/pods/*/status",
        Kind::PodStatus,
        "pods/status",
    ),
    (
        "POST",
        "/api/v1/namespaces/*/pods/*/eviction",
        Kind::Eviction,
        "pods/eviction",
    ),
    (
        "POST",
        "/apis/events.k8s.io/v1/namespaces/*/events",
        Kind::Event,
        "events",
    ),
    (
        "PATCH",
        "/apis/events.k8s.io/v1/namespaces/*/events/*",
        Kind::EventSeries,
        "events",
    ),
    // Who may read the agent's /metrics (`access.rs`): create of the two review kinds.
    (
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        Kind::TokenReview,
        "tokenreviews",
    ),
    (
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        Kind::AccessReview,
        "subjectaccessreviews",
    ),
];

/// The user every accepted token belongs to: the agent's service account.
pub const AGENT_USER: &str = "system:serviceaccount:node-agent:node-agent";

/// The 403 for a `resource` RBAC does not grant: the kubelet's plain-text answer on its own
/// routes, else the API server's Status (`forbiddenMessage`).
fn forbidden(req: &Seen, path: &str, resource: &str, wild: &[String]) -> Reply {
    let verb = match req.method.as_str() {
        "GET" if req.path.contains("watch=true") => "watch",
        "GET" if path == "/api/v1/pods" => "list",
        "GET" => "get",
        "POST" => "create",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => other,
    };
    if !path.starts_with("/api") {
        // The kubelet's filter (`InstallAuthFilter`) lists every subresource it asked about:
        // with fine-grained authorization `/pods` is `pods`, then `proxy` (either grants it).
        let (kind, sub) = resource.split_once('/').unwrap_or((resource, ""));
        let asked = if sub == "pods" { "pods proxy" } else { sub };
        return Reply {
            content_type: "text/plain; charset=utf-8",
            ..Reply::json(
                403,
                format!("Forbidden (user={AGENT_USER}, verb={verb}, resource={kind}, subresource(s)=[{asked}])\n"),
            )
        };
    }
    let group = [
        "events.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
    ]
    .into_iter()
    .find(|g| path.starts_with(&format!("/apis/{g}/")))
    .unwrap_or("");
    let kind = resource.split('/').next().unwrap_or(resource);
    // The message names a grouped resource with its group (`events.events.k8s.io`), and the
    // details carry the group, and the name only when there is one.
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let (name, scope) = match (
        path.starts_with("/api/v1/namespaces/") || !group.is_empty(),
        wild,
    ) {
        (true, [ns, name, ..]) => (name.clone(), format!("in the namespace {ns:?}")),
        (true, [ns]) => (String::new(), format!("in the namespace {ns:?}")),
        (_, [name, ..]) => (name.clone(), "at the cluster scope".to_string()),
        _ => (String::new(), "at the cluster scope".to_string()),
    };
    let who = if name.is_empty() {
        format!("{qualified} is forbidden")
    } else {
        format!("{qualified} {name:?} is forbidden")
    };
    Reply::status_with(
        403,
        "Forbidden",
        &format!("{who}: User {AGENT_USER:?} cannot {verb} resource {resource:?} in API group {group:?} {scope}"),
        status_details(&name, group, kind, None),
    )
}

/// A Status' `details` as the API server writes them: `name` and `group` only when not empty.
fn status_details(name: &str, group: &str, kind: &str, causes: Option<Value>) -> Value {
    let mut details = json!({"kind": kind});
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    if let Some(causes) = causes {
        details["causes"] = causes;
    }
    details
}

/// deploy/admission-policy.yaml's ValidatingAdmissionPolicy refusing a request, as the API
/// server answers it: after validation (a 422 goes first), 403 Forbidden, the policy and its
/// binding named before the validation's message, which is also the one cause.
fn policy_denied(name: &str, group: &str, kind: &str, message: &str) -> Reply {
    let denial = format!(
        "ValidatingAdmissionPolicy 'node-agent-own-node' with binding 'node-agent-own-node' denied request: {message}"
    );
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    Reply::status_with(
        403,
        "Forbidden",
        &format!("{qualified} {name:?} is forbidden: {denial}"),
        status_details(name, group, kind, Some(json!([{"message": denial}]))),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    TokenReview,
    AccessReview,
    Read,
    Node,
    NodeStatus,
    PodStatus,
    Delete,
    Eviction,
    Event,
    EventSeries,
}

fn matches(pattern: &str, path: &str) -> Option<Vec<String>> {
    let (p, s): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), path.split('/').collect());
    if p.len() != s.len() {
        return None;
    }
    let mut wild = Vec::new();
    for (p, s) in p.iter().zip(&s) {
        match *p {
            // The API server routes on the raw path and decodes each segment after.
            "*" if !s.is_empty() => wild.push(percent_decode(s)),
            "*" => return None,
            p if p == *s => {}
            _ => return None,
        }
    }
    Some(wild)
}

/// A path segment as the server reads it: `%XX` turned back into its byte (invalid escapes
/// kept as written).
pub fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn invalid(kind: &str, name: &str, causes: &[(&str, &str)]) -> Reply {
    let message = causes
        .iter()
        .map(|(field, problem)| format!("{field}: {problem}"))
        .collect::<Vec<_>>()
        .join(", ");
    Reply::status_with(
        422,
        "Invalid",
        &format!("{kind} {name:?} is invalid: {message}"),
        json!({"name": name, "kind": kind, "causes": causes.iter()
            .map(|(field, problem)| json!({"reason": "FieldValueRequired", "message": problem, "field": field}))
            .collect::<Vec<_>>()}),
    )
}

/// Checks `req` (with its raw body) as the API server would, RBAC granting everything but the
/// `denied` resources; `Err` is the server's answer. `Ok` says which route it is.
pub fn check(
    req: &Seen,
    raw_body: &[u8],
    tokens: &[String],
    denied: &[String],
) -> Result<Kind, Reply> {
    let authorized = req
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .is_some_and(|t| tokens.iter().any(|ok| ok == t));
    if !authorized {
        return Err(Reply::status(401, "Unauthorized", "Unauthorized"));
    }
    if let Some(accept) = &req.accept {
        if !(accept.contains("application/json") || accept.contains("*/*")) {
            return Err(Reply::status(
                406,
                "NotAcceptable",
                &format!(
                    "only the following media types are accepted: application/json; not {accept}"
                ),
            ));
        }
    }
    let path = req.path.split('?').next().unwrap_or("");
    let routed: Vec<_> = ROUTES
        .iter()
        .filter_map(|(m, p, k, r)| matches(p, path).map(|w| (*m, *k, *r, w)))
        .collect();
    if routed.is_empty() {
        return Err(Reply::status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let Some((_, kind, resource, wild)) = routed.into_iter().find(|(m, _, _, _)| *m == req.method)
    else {
        return Err(Reply::status(
            405,
            "MethodNotAllowed",
            &format!(
                "the server does not allow this method on the requested resource: {}",
                req.method
            ),
        ));
    };
    if denied.iter().any(|d| d == resource) {
        return Err(forbidden(req, path, resource, &wild));
    }
    if kind == Kind::Read {
        if !raw_body.is_empty() {
            return Err(bad_request("a GET carries no body"));
        }
        if (path == "/api/v1/pods"
            || (path.starts_with("/api/v1/namespaces/") && path.ends_with("/pods")))
            && !req.path.contains("fieldSelector=spec.nodeName%3D")
        {
            return Err(bad_request(
                "the agent lists only its node's pods (fieldSelector=spec.nodeName=<node>)",
            ));
        }
        return Ok(kind);
    }
    if raw_body.is_empty() {
        return if kind == Kind::Delete {
            Ok(kind)
        } else {
            Err(bad_request("the request has no body"))
        };
    }
    let content_type = req.content_type.as_deref().unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let patch = matches!(
        kind,
        Kind::Node | Kind::NodeStatus | Kind::PodStatus | Kind::EventSeries
    );
    if (patch && !PATCH_TYPES.contains(&media)) || (!patch && media != "application/json") {
        return Err(Reply::status(
            415,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format - {content_type:?}"),
        ));
    }
    let body: Value = serde_json::from_slice(raw_body)
        .map_err(|e| bad_request(&format!("the body is not valid JSON: {e}")))?;
    match kind {
        Kind::TokenReview => token_review(&body),
        Kind::AccessReview => access_review(&body),
        Kind::Eviction => eviction(&body, &wild[0], &wild[1]),
        Kind::Delete => delete_options(&body),
        Kind::Event => event(&body, &wild[0]),
        Kind::EventSeries => event_series(&body, media, &wild[1]),
        Kind::Node => super::taints::node_patch(&body, media, &wild[0]),
        Kind::NodeStatus => node_status(&body, media),
        Kind::PodStatus => pod_status(&body, media),
        Kind::Read => Ok(()),
    }
    .map(|()| kind)
}

fn token_review(body: &Value) -> Result<(), Reply> {
    type_meta(body, &["authentication.k8s.io/v1"], "TokenReview")?;
    if body["spec"]["token"].as_str().unwrap_or("").is_empty() {
        return Err(invalid(
            "TokenReview",
            "",
            &[("spec.token", "Required value")],
        ));
    }
    Ok(())
}

fn access_review(body: &Value) -> Result<(), Reply> {
    type_meta(body, &["authorization.k8s.io/v1"], "SubjectAccessReview")?;
    let spec = &body["spec"];
    let mut causes = Vec::new();
    let groups = spec["groups"].as_array().is_some_and(|g| !g.is_empty());
    if spec["user"].as_str().unwrap_or("").is_empty() && !groups {
        causes.push((
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    match (
        spec.get("resourceAttributes").filter(|v| !v.is_null()),
        spec.get("nonResourceAttributes").filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) | (None, None) => causes.push((
            "spec.nonResourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        (None, Some(attrs)) => {
            if attrs["path"].as_str().unwrap_or("").is_empty()
                || attrs["verb"].as_str().unwrap_or("").is_empty()
            {
                causes.push(("spec.nonResourceAttributes", "path and verb are required"));
            }
        }
        (Some(_), None) => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid("SubjectAccessReview", "", &causes))
    }
}

fn type_meta(body: &Value, versions: &[&str], kind: &str) -> Result<(), Reply> {
    let v = body["apiVersion"].as_str().unwrap_or("");
    let k = body["kind"].as_str().unwrap_or("");
    if !versions.contains(&v) || k != kind {
        return Err(bad_request(&format!(
            "expected {kind} in {versions:?}, got kind {k:?} apiVersion {v:?}"
        )));
    }
    Ok(())
}

fn namespace_matches(body: &Value, namespace: &str) -> Result<(), Reply> {
    match body["metadata"]["namespace"].as_str() {
        Some(ns) if ns != namespace => Err(bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

fn eviction(body: &Value, namespace: &str, name: &str) -> Result<(), Reply> {
    type_meta(body, &["policy/v1", "policy/v1beta1"], "Eviction")?;
    if body["metadata"]["name"].as_str() != Some(name) {
        return Err(bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    namespace_matches(body, namespace)?;
    if let Some(options) = body.get("deleteOptions") {
        delete_options(options)?;
    }
    Ok(())
}

fn delete_options(body: &Value) -> Result<(), Reply> {
    if !body.is_object() {
        return Err(bad_request("DeleteOptions must be an object"));
    }
    if let Some(grace) = body.get("gracePeriodSeconds") {
        if grace.as_i64().is_none_or(|g| g < 0) {
            return Err(invalid(
                "DeleteOptions",
                "",
                &[(
                    "gracePeriodSeconds",
                    "must be a whole number of seconds, not negative",
                )],
            ));
        }
    }
    if let Some(uid) = body.pointer("/preconditions/uid") {
        if !uid.is_string() {
            return Err(bad_request("preconditions.uid must be a string"));
        }
    }
    Ok(())
}

fn event(body: &Value, namespace: &str) -> Result<(), Reply> {
    type_meta(body, &["events.k8s.io/v1"], "Event")?;
    namespace_matches(body, namespace)?;
    let name = body["metadata"]["name"].as_str().unwrap_or("");
    let text = |field: &str| body[field].as_str().unwrap_or("");
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(("metadata.name", "name or generateName is required"));
    }
    if text("eventTime").is_empty() {
        causes.push(("eventTime", "Required value"));
    }
    for field in [
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        let value = text(field);
        if value.is_empty() || value.len() > 128 {
            causes.push((field, "Required value, at most 128 characters"));
        }
    }
    if !matches!(text("type"), "Normal" | "Warning") {
        causes.push(("type", "Unsupported value: must be Normal or Warning"));
    }
    if text("note").len() > 1024 {
        causes.push(("note", "Too long: may not be longer than 1024"));
    }
    if body["regarding"]["kind"].as_str().unwrap_or("").is_empty()
        || body["regarding"]["name"].as_str().unwrap_or("").is_empty()
    {
        causes.push(("regarding", "Required value"));
    }
    // A namespaced object's events live in its namespace.
    if body["regarding"]["kind"] == "Pod"
        && (body["regarding"]["namespace"].as_str() != Some(namespace)
            || body["regarding"]["uid"].as_str().unwrap_or("").is_empty())
    {
        causes.push((
            "regarding.namespace",
            "a pod's event is in the pod's namespace and names its UID",
        ));
    }
    if let Some(related) = body.get("related") {
        if related["kind"].as_str().unwrap_or("").is_empty()
            || related["name"].as_str().unwrap_or("").is_empty()
        {
            causes.push(("related", "kind and name are required"));
        }
    }
    // A new event may carry the repeats counted so far (client-go does, when the event its
    // series update was for is gone): as on update, a count of at least 2 and the last time.
    if let Some(series) = body.get("series") {
        if series["count"].as_i64().is_none_or(|c| c < 2)
            || series["lastObservedTime"].as_str().unwrap_or("").is_empty()
        {
            causes.push((
                "series",
                "count (at least 2) and lastObservedTime are required",
            ));
        }
    }
    if !causes.is_empty() {
        return Err(invalid("Event", name, &causes));
    }
    // deploy/admission-policy.yaml, as shipped: an event about a pod names the agent's node as
    // its related object.
    if body["regarding"]["kind"] == "Pod" && body["related"]["kind"] != "Node" {
        return Err(policy_denied(
            name,
            "events.k8s.io",
            "events",
            "the node agent's events about a pod must name its own node as the related object",
        ));
    }
    Ok(())
}

/// An event's repeats counted: a merge patch of `series` only, with a count of at least 2 (the
/// event itself is the first) and the last time it was seen.
fn event_series(body: &Value, media: &str, name: &str) -> Result<(), Reply> {
    if media != "application/merge-patch+json" {
        return Err(Reply::status(
            415,
            "UnsupportedMediaType",
            "an event's series is written with a merge patch",
        ));
    }
    let keys: Vec<&String> = body
        .as_object()
        .map(|o| o.keys().collect())
        .unwrap_or_default();
    let count = body.pointer("/series/count").and_then(Value::as_i64);
    let last = body
        .pointer("/series/lastObservedTime")
        .and_then(Value::as_str)
        .unwrap_or("");
    if keys != ["series"] || count.is_none_or(|c| c < 2) || last.is_empty() {
        return Err(invalid(
            "Event",
            name,
            &[(
                "series",
                "count (at least 2) and lastObservedTime, and nothing else",
            )],
        ));
    }
    Ok(())
}

fn node_status(body: &Value, media: &str) -> Result<(), Reply> {
    merge_patch_object(body, media)?;
    for c in body
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = c["type"].as_str().unwrap_or("");
        if kind.is_empty() || !matches!(c["status"].as_str(), Some("True" | "False" | "Unknown")) {
            return Err(invalid(
                "Node",
                "",
                &[(
                    "status.conditions",
                    "each needs a type and status True, False or Unknown",
                )],
            ));
        }
    }
    Ok(())
}

fn pod_status(body: &Value, media: &str) -> Result<(), Reply> {
    merge_patch_object(body, media)?;
    if let Some(phase) = body.pointer("/status/phase") {
        if !matches!(
            phase.as_str(),
            Some("Pending" | "Running" | "Succeeded" | "Failed" | "Unknown")
        ) {
            return Err(invalid("Pod", "", &[("status.phase", "Unsupported value")]));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The fake's refusals against what the real API server and kubelet answered (Kubernetes
    //! v1.37.2, `tests/tests/cluster_privilege.rs` on the real cluster): same status, same
    //! Status body field by field.

    use super::*;
    use crate::fake::Body;

    fn seen(method: &str, path: &str, content_type: Option<&str>, body: &Value) -> Seen {
        Seen {
            method: method.into(),
            path: path.into(),
            authorization: Some("Bearer t".into()),
            content_type: content_type.map(str::to_string),
            accept: Some("application/json".into()),
            body: body.clone(),
            rejected: None,
        }
    }

    fn refused(req: &Seen, denied: &[&str]) -> Reply {
        let raw = if req.body.is_null() {
            Vec::new()
        } else {
            req.body.to_string().into_bytes()
        };
        let denied: Vec<String> = denied.iter().map(|d| d.to_string()).collect();
        check(req, &raw, &["t".to_string()], &denied).expect_err("refused")
    }

    fn body(reply: &Reply) -> Value {
        match &reply.body {
            Body::Full(text) => serde_json::from_str(text).unwrap_or(json!(text)),
            other => panic!("a full body: {other:?}"),
        }
    }

    #[test]
    fn rbac_refusals_read_as_the_api_server_writes_them() {
        let user = AGENT_USER;
        let rows: Vec<(&str, Seen, &str, Value)> = vec![
            (
                "an eviction",
                seen(
                    "POST",
                    "/api/v1/namespaces/t-writes/pods/grower-0/eviction",
                    Some("application/json"),
                    &json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "grower-0", "namespace": "t-writes"}}),
                ),
                "pods/eviction",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": format!("pods \"grower-0\" is forbidden: User \"{user}\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"t-writes\""),
                    "details": {"name": "grower-0", "kind": "pods"}}),
            ),
            (
                "an event's series",
                seen(
                    "PATCH",
                    "/apis/events.k8s.io/v1/namespaces/t-series/events/looper.18ec2e595d7f8ce5",
                    Some("application/merge-patch+json"),
                    &json!({"series": {"count": 2, "lastObservedTime": "2026-11-28T10:22:07.000000Z"}}),
                ),
                "events",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": format!("events.events.k8s.io \"looper.18ec2e595d7f8ce5\" is forbidden: User \"{user}\" cannot patch resource \"events\" in API group \"events.k8s.io\" in the namespace \"t-series\""),
                    "details": {"name": "looper.18ec2e595d7f8ce5", "group": "events.k8s.io", "kind": "events"}}),
            ),
            (
                "a new event",
                seen(
                    "POST",
                    "/apis/events.k8s.io/v1/namespaces/default/events",
                    Some("application/json"),
                    &json!({}),
                ),
                "events",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": format!("events.events.k8s.io is forbidden: User \"{user}\" cannot create resource \"events\" in API group \"events.k8s.io\" in the namespace \"default\""),
                    "details": {"group": "events.k8s.io", "kind": "events"}}),
            ),
            (
                "the node's pods listed",
                seen(
                    "GET",
                    "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-agent-0",
                    None,
                    &Value::Null,
                ),
                "pods",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": format!("pods is forbidden: User \"{user}\" cannot list resource \"pods\" in API group \"\" at the cluster scope"),
                    "details": {"kind": "pods"}}),
            ),
            (
                "the node's status",
                seen(
                    "PATCH",
                    "/api/v1/nodes/node-agent-0/status",
                    Some("application/strategic-merge-patch+json"),
                    &json!({"status": {"conditions": [{"type": "NodeAgentPressure", "status": "False"}]}}),
                ),
                "nodes/status",
                json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                    "message": format!("nodes \"node-agent-0\" is forbidden: User \"{user}\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope"),
                    "details": {"name": "node-agent-0", "kind": "nodes"}}),
            ),
        ];
        for (what, req, resource, want) in rows {
            let reply = refused(&req, &[resource]);
            assert_eq!(reply.status, 403, "{what}");
            assert_eq!(reply.content_type, "application/json", "{what}");
            assert_eq!(body(&reply), want, "{what}");
        }
    }

    #[test]
    fn the_kubelet_refuses_in_plain_text_naming_every_subresource_it_asked_about() {
        for (path, resource, asked) in [
            ("/pods", "nodes/pods", "[pods proxy]"),
            ("/stats/summary", "nodes/stats", "[stats]"),
        ] {
            let reply = refused(&seen("GET", path, None, &Value::Null), &[resource]);
            assert_eq!(reply.status, 403);
            assert_eq!(reply.content_type, "text/plain; charset=utf-8");
            assert_eq!(
                reply.body,
                Body::Full(format!("Forbidden (user={AGENT_USER}, verb=get, resource=nodes, subresource(s)={asked})\n")),
                "{path}"
            );
        }
    }

    #[test]
    fn the_admission_policy_refuses_a_pod_event_without_its_node_as_the_api_server_does() {
        let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "exp1"}, "eventTime": "2026-11-28T09:00:00.000000Z",
            "reportingController": "node-agent.io/node-agent", "reportingInstance": "node-agent-node-agent-0",
            "action": "Evicting", "reason": "Evicted", "type": "Warning", "note": "x",
            "regarding": {"kind": "Pod", "namespace": "exp1", "name": "onghost", "uid": "u1", "apiVersion": "v1"}});
        let reply = refused(
            &seen(
                "POST",
                "/apis/events.k8s.io/v1/namespaces/exp1/events",
                Some("application/json"),
                &event,
            ),
            &[],
        );
        let denial = "ValidatingAdmissionPolicy 'node-agent-own-node' with binding 'node-agent-own-node' denied request: the node agent's events about a pod must name its own node as the related object";
        assert_eq!(reply.status, 403);
        assert_eq!(
            body(&reply),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
                "message": format!("events.events.k8s.io \"e1\" is forbidden: {denial}"),
                "details": {"name": "e1", "group": "events.k8s.io", "kind": "events", "causes": [{"message": denial}]}})
        );
    }
}
