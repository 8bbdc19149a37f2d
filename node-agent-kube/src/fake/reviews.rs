//! TokenReview and SubjectAccessReview as the API server answers them: the users the fake knows
//! by their tokens, and the non-resource URLs RBAC lets each user or group `get`. The fake
//! answers these two routes itself (after [`super::strict`]'s checks), so a test only says who
//! exists and what they may do.

use serde_json::{json, Value};

use super::Reply;

/// A user a token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub token: String,
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// Who exists, and the non-resource URLs RBAC grants (subject: a user or a group; verb; path).
#[derive(Debug, Clone, Default)]
pub struct Reviews {
    pub users: Vec<User>,
    pub grants: Vec<(String, String, String)>,
}

impl Reviews {
    /// The TokenReview's answer: the spec echoed and the status, as the API server writes it.
    pub fn token_review(&self, body: &Value) -> Reply {
        let token = body["spec"]["token"].as_str().unwrap_or("");
        let status = match self.users.iter().find(|u| u.token == token) {
            Some(u) => {
                json!({"authenticated": true, "user": {"username": u.name, "uid": u.uid, "groups": u.groups}})
            }
            None => {
                json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]", "user": {}})
            }
        };
        Reply::json(
            201,
            json!({"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1", "metadata": {"creationTimestamp": null},
                   "spec": body["spec"], "status": status})
            .to_string(),
        )
    }

    /// The SubjectAccessReview's answer: allowed when RBAC grants the user or one of its
    /// groups the verb on the path.
    pub fn access_review(&self, body: &Value) -> Reply {
        let spec = &body["spec"];
        let user = spec["user"].as_str().unwrap_or("");
        let groups: Vec<&str> = spec["groups"]
            .as_array()
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let verb = spec["nonResourceAttributes"]["verb"].as_str().unwrap_or("");
        let path = spec["nonResourceAttributes"]["path"].as_str().unwrap_or("");
        let allowed = self.grants.iter().any(|(subject, v, p)| {
            (subject == user || groups.contains(&subject.as_str())) && v == verb && p == path
        });
        let mut status = json!({"allowed": allowed});
        if !allowed {
            status["reason"] = json!(format!("RBAC: no rule grants {user} {verb} {path}"));
        }
        Reply::json(
            201,
            json!({"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "metadata": {"creationTimestamp": null},
                   "spec": spec, "status": status})
            .to_string(),
        )
    }
}
