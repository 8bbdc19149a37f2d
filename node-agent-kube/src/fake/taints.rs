//! Node patches in the fake: what the API server refuses in a patch of a Node (the patch's own
//! shape, then the taints' validation of `validateNodeTaints`), and [`NodeStore`], one Node
//! kept by the fake with its `resourceVersion`, so read-modify-write is tested as the server
//! runs it: a merge patch carrying a `resourceVersion` other than the node's answers 409
//! Conflict, and every change bumps the version.

use std::sync::{Arc, Mutex};

use serde_json::{json, Map, Value};

use super::{
    reply::{bad_request, merge_patch_object},
    Reply, Seen,
};

const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
const JSON_PATCH_OPS: [&str; 6] = ["add", "remove", "replace", "move", "copy", "test"];

/// `Node "<name>" is invalid: <field>: <problem>` with its causes, as the API server writes it.
fn invalid(node: &str, causes: &[(String, String)]) -> Reply {
    let message = causes
        .iter()
        .map(|(field, problem)| format!("{field}: {problem}"))
        .collect::<Vec<_>>()
        .join(", ");
    Reply::status_with(
        422,
        "Invalid",
        &format!("Node {node:?} is invalid: {message}"),
        json!({"name": node, "kind": "Node", "causes": causes.iter()
            .map(|(field, problem)| json!({"reason": "FieldValueInvalid", "message": problem, "field": field}))
            .collect::<Vec<_>>()}),
    )
}

/// A label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
fn label_value(v: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(ok)
            && v.ends_with(ok)
            && v.chars().all(|c| ok(c) || "-_.".contains(c)))
}

/// A qualified name: `[prefix/]name`, the name a non-empty label value, the prefix a DNS
/// subdomain.
fn qualified_name(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    prefix_ok && !name.is_empty() && label_value(name)
}

/// The causes the API server gives for a taint list (`spec.taints`), none when it is valid.
pub fn taint_problems(taints: &Value) -> Vec<(String, String)> {
    let Some(list) = taints.as_array() else {
        return if taints.is_null() {
            Vec::new()
        } else {
            vec![("spec.taints".into(), "must be a list".into())]
        };
    };
    let mut causes = Vec::new();
    let mut seen = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("spec.taints[{i}]{f}");
        let (key, effect) = (t["key"].as_str(), t["effect"].as_str());
        if !t.is_object() {
            causes.push((at(""), "must be an object".into()));
            continue;
        }
        if !key.is_some_and(qualified_name) {
            causes.push((
                at(".key"),
                format!("Invalid value: {:?}: a qualified name", t["key"]),
            ));
        }
        if !t["value"].is_null() && !t["value"].as_str().is_some_and(label_value) {
            causes.push((
                at(".value"),
                format!("Invalid value: {:?}: a label value", t["value"]),
            ));
        }
        if !effect.is_some_and(|e| EFFECTS.contains(&e)) {
            causes.push((at(".effect"), format!("Unsupported value: {:?}: supported values: \"NoExecute\", \"NoSchedule\", \"PreferNoSchedule\"", t["effect"])));
        }
        if seen.contains(&(key, effect)) {
            causes.push((
                at(""),
                "Duplicate value: taints must be unique by key and effect pair".into(),
            ));
        }
        seen.push((key, effect));
    }
    causes
}

/// Checks a PATCH of `nodes/<name>` as the API server would before applying it.
pub fn node_patch(body: &Value, media: &str, node: &str) -> Result<(), Reply> {
    merge_patch_object(body, media)?;
    if media == "application/json-patch+json" {
        for op in body.as_array().into_iter().flatten() {
            let name = op["op"].as_str().unwrap_or("");
            let path_ok = op["path"].as_str().is_some_and(|p| p.starts_with('/'));
            let needs_value = matches!(name, "add" | "replace" | "test");
            let needs_from = matches!(name, "move" | "copy");
            if !JSON_PATCH_OPS.contains(&name)
                || !path_ok
                || (needs_value && op.get("value").is_none())
                || (needs_from && !op["from"].is_string())
            {
                return Err(bad_request(&format!("invalid JSON patch operation: {op}")));
            }
            if needs_value && op["path"] == "/spec/taints" {
                let causes = taint_problems(&op["value"]);
                if !causes.is_empty() {
                    return Err(invalid(node, &causes));
                }
            }
        }
        return Ok(());
    }
    if let Some(version) = body.pointer("/metadata/resourceVersion") {
        if !version.is_string() {
            return Err(bad_request("metadata.resourceVersion must be a string"));
        }
    }
    if let Some(taints) = body.pointer("/spec/taints") {
        let causes = taint_problems(taints);
        if !causes.is_empty() {
            return Err(invalid(node, &causes));
        }
    }
    Ok(())
}

/// RFC 7386: `patch` merged into `target` (null removes, objects merge, the rest replaces).
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let object = target.as_object_mut().expect("made an object above");
    for (k, v) in fields {
        if v.is_null() {
            object.remove(k);
        } else {
            merge(object.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// One Node held by the fake: answers `GET` and merge or strategic merge `PATCH` of
/// `/api/v1/nodes/<name>` (for `spec.taints`, which has no merge key, both replace the list).
#[derive(Debug, Clone)]
pub struct NodeStore {
    node: Arc<Mutex<Value>>,
}

impl NodeStore {
    /// `node` is a Node object; its `metadata.resourceVersion` is set to "1" if absent.
    pub fn new(mut node: Value) -> Self {
        if node.pointer("/metadata/resourceVersion").is_none() {
            node["metadata"]["resourceVersion"] = json!("1");
        }
        Self {
            node: Arc::new(Mutex::new(node)),
        }
    }

    fn name(&self) -> String {
        self.node.lock().unwrap()["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The node as stored now.
    pub fn node(&self) -> Value {
        self.node.lock().unwrap().clone()
    }

    /// Changes the node as another client would (a new `resourceVersion`).
    pub fn change(&self, f: impl FnOnce(&mut Value)) {
        let mut node = self.node.lock().unwrap();
        f(&mut node);
        bump(&mut node);
    }

    /// The answer for `seen` if it is a request about this node, else `None`.
    pub fn answer(&self, seen: &Seen) -> Option<Reply> {
        let path = format!("/api/v1/nodes/{}", self.name());
        // A query (`resourceVersion=0`: served from the API server's cache) reads the same node.
        if seen.path.split('?').next() != Some(path.as_str()) {
            return None;
        }
        let mut node = self.node.lock().unwrap();
        match seen.method.as_str() {
            "GET" => Some(Reply::json(200, node.to_string())),
            "PATCH" => {
                let media = seen.content_type.as_deref().unwrap_or("");
                if !media.starts_with("application/merge-patch+json")
                    && !media.starts_with("application/strategic-merge-patch+json")
                {
                    return Some(Reply::status(
                        500,
                        "InternalError",
                        "the fake's NodeStore applies merge patches only",
                    ));
                }
                let wanted = seen.body.pointer("/metadata/resourceVersion");
                if wanted.is_some_and(|v| Some(v) != node.pointer("/metadata/resourceVersion")) {
                    return Some(Reply::status(409, "Conflict", &format!(
                        "Operation cannot be fulfilled on nodes {:?}: the object has been modified; please apply your changes to the latest version and try again",
                        self.name_of(&node))));
                }
                let mut patch = seen.body.clone();
                if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("resourceVersion");
                }
                merge(&mut node, &patch);
                bump(&mut node);
                Some(Reply::json(200, node.to_string()))
            }
            _ => None,
        }
    }

    fn name_of(&self, node: &Value) -> String {
        node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

fn bump(node: &mut Value) {
    let next = node["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    node["metadata"]["resourceVersion"] = json!(next.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_are_validated_as_the_api_server_does() {
        let rows = [
            (
                "valid",
                json!([{"key": "node-agent.io/pressure", "effect": "NoSchedule", "value": "MemoryPressure"}]),
                0,
            ),
            ("null list", Value::Null, 0),
            ("not a list", json!({"key": "a"}), 1),
            ("no key", json!([{"effect": "NoSchedule"}]), 1),
            (
                "bad key",
                json!([{"key": "Bad_Prefix/x", "effect": "NoSchedule"}]),
                1,
            ),
            (
                "bad effect",
                json!([{"key": "a", "effect": "NoScheduling"}]),
                1,
            ),
            (
                "bad value",
                json!([{"key": "a", "effect": "NoSchedule", "value": "a b"}]),
                1,
            ),
            (
                "duplicate key and effect",
                json!([{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoSchedule", "value": "x"}]),
                1,
            ),
            (
                "same key, other effect",
                json!([{"key": "a", "effect": "NoSchedule"}, {"key": "a", "effect": "NoExecute"}]),
                0,
            ),
        ];
        for (what, taints, problems) in rows {
            assert_eq!(
                taint_problems(&taints).len(),
                problems,
                "{what}: {:?}",
                taint_problems(&taints)
            );
        }
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge(&mut target, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(target, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }
}
