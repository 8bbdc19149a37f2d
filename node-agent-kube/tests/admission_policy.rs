//! The node-bound admission policy (deploy/admission-policy.yaml) means what it says: its CEL
//! expressions, evaluated as the API server would (match conditions, then variables in order,
//! then every validation; an expression that fails to evaluate refuses, as `failurePolicy:
//! Fail` does), against requests the agent makes on its own node, the same requests aimed at
//! another node, and requests from everyone else.
//!
//! Requests are built the way the API server hands them to CEL: empty fields are left out
//! (`subResource` of a plain delete, `extra` of a user without any), so an expression that
//! reads an optional field without `has()` fails here as it would there.

use std::path::PathBuf;

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    core::v1::ServiceAccount,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};

const NODE: &str = "worker-1";
const OTHER_NODE: &str = "worker-2";
const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";

fn deploy_file(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{name}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn the<T: serde::de::DeserializeOwned>(file: &str, kind: &str) -> T {
    let doc = deploy_file(file)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("{file}: no {kind}"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{file}: {kind}: {e}"))
}

/// A compiled policy: match conditions, variables and validations, in file order.
struct Policy {
    match_conditions: Vec<(String, cel::Program)>,
    variables: Vec<(String, cel::Program)>,
    validations: Vec<(cel::Program, String)>,
}

fn compile(what: &str, expression: &str) -> cel::Program {
    cel::Program::compile(expression).unwrap_or_else(|e| panic!("{what}: {expression}: {e}"))
}

fn policy() -> Policy {
    let vap: ValidatingAdmissionPolicy = the("admission-policy.yaml", "ValidatingAdmissionPolicy");
    let spec = vap.spec.expect("spec");
    Policy {
        match_conditions: spec
            .match_conditions
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let program = compile(&c.name, &c.expression);
                (c.name, program)
            })
            .collect(),
        variables: spec
            .variables
            .unwrap_or_default()
            .into_iter()
            .map(|v| {
                let program = compile(&v.name, &v.expression);
                (v.name, program)
            })
            .collect(),
        validations: spec
            .validations
            .unwrap_or_default()
            .into_iter()
            .map(|v| {
                let message = v.message.unwrap_or_else(|| v.expression.clone());
                (compile("validation", &v.expression), message)
            })
            .collect(),
    }
}

/// What the policy decides.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    /// No match condition holds: the policy does not look at the request.
    NotMatched,
    Allowed,
    /// Refused with this validation's message (or the evaluation error).
    Refused(String),
}

impl Policy {
    fn decide(&self, review: &Review) -> Decision {
        let mut context = cel::Context::default();
        for (name, value) in [
            ("request", &review.request),
            ("object", &review.object),
            ("oldObject", &review.old_object),
        ] {
            context.add_variable_from_value(name, cel::to_value(value).expect("JSON converts"));
        }
        context.add_variable_from_value("params", cel::Value::Null);
        for (name, program) in &self.match_conditions {
            match program.execute(&context) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Decision::NotMatched,
                other => return Decision::Refused(format!("match condition {name}: {other:?}")),
            }
        }
        let mut variables = std::collections::HashMap::new();
        for (name, program) in &self.variables {
            context.add_variable_from_value("variables", variables.clone());
            match program.execute(&context) {
                Ok(value) => {
                    variables.insert(name.clone(), value);
                }
                Err(e) => return Decision::Refused(format!("variable {name}: {e}")),
            }
        }
        context.add_variable_from_value("variables", variables);
        for (program, message) in &self.validations {
            match program.execute(&context) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Decision::Refused(message.clone()),
                other => return Decision::Refused(format!("{message}: evaluation: {other:?}")),
            }
        }
        Decision::Allowed
    }
}

/// One admission request with its objects.
struct Review {
    request: Value,
    object: Value,
    old_object: Value,
}

/// The agent's service account, with the node-name claim its pod-bound token carries.
const AGENT: &str = "system:serviceaccount:node-agent:node-agent";

struct User {
    name: &'static str,
    node_claim: Option<Vec<&'static str>>,
}

fn agent_on(node: &'static str) -> User {
    User {
        name: AGENT,
        node_claim: Some(vec![node]),
    }
}

fn request(
    user: &User,
    (group, resource, sub_resource): (&str, &str, &str),
    operation: &str,
    namespace: &str,
    name: &str,
) -> Value {
    let mut user_info =
        json!({"username": user.name, "uid": "0b5e", "groups": ["system:serviceaccounts"]});
    if let Some(nodes) = &user.node_claim {
        user_info["extra"] = json!({
            NODE_NAME_CLAIM: nodes,
            "authentication.kubernetes.io/pod-name": ["node-agent-x7k2p"],
        });
    }
    let mut request = Map::new();
    request.insert("uid".into(), json!("705ab4f5-6393-11e8-b7cc-42010a800002"));
    request.insert(
        "resource".into(),
        json!({"group": group, "version": "v1", "resource": resource}),
    );
    request.insert("name".into(), json!(name));
    request.insert("operation".into(), json!(operation));
    request.insert("userInfo".into(), user_info);
    // Left out when empty, as the API server's conversion does (omitempty).
    if !sub_resource.is_empty() {
        request.insert("subResource".into(), json!(sub_resource));
    }
    if !namespace.is_empty() {
        request.insert("namespace".into(), json!(namespace));
    }
    Value::Object(request)
}

fn pod(node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "web-0", "namespace": "shop", "uid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
           "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]}})
}

fn delete_pod(user: &User, pod_node: &str) -> Review {
    Review {
        request: request(user, ("", "pods", ""), "DELETE", "shop", "web-0"),
        object: Value::Null,
        old_object: pod(pod_node),
    }
}

fn patch_pod_status(user: &User, pod_node: &str) -> Review {
    let mut evicted = pod(pod_node);
    evicted["status"] = json!({"phase": "Failed", "reason": "Evicted"});
    Review {
        request: request(user, ("", "pods", "status"), "UPDATE", "shop", "web-0"),
        object: evicted,
        old_object: pod(pod_node),
    }
}

fn create_pod(user: &User, pod_node: &str) -> Review {
    Review {
        request: request(user, ("", "pods", ""), "CREATE", "shop", "web-0"),
        object: pod(pod_node),
        old_object: Value::Null,
    }
}

fn evict(user: &User, uid: Option<&str>) -> Review {
    let mut delete_options = json!({"gracePeriodSeconds": 30});
    if let Some(uid) = uid {
        delete_options["preconditions"] = json!({"uid": uid});
    }
    Review {
        request: request(user, ("", "pods", "eviction"), "CREATE", "shop", "web-0"),
        object: json!({"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": "web-0", "namespace": "shop"},
                       "deleteOptions": delete_options}),
        old_object: Value::Null,
    }
}

fn patch_node_status(user: &User, node: &str) -> Review {
    let node_object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}});
    Review {
        request: request(user, ("", "nodes", "status"), "UPDATE", "", node),
        object: node_object.clone(),
        old_object: node_object,
    }
}

const TAINT_KEY: &str = "node-agent.io/pressure";

fn taint(key: &str, effect: &str) -> Value {
    json!({"key": key, "effect": effect, "value": "MemoryPressure"})
}

fn node_with(node: &str, taints: Option<Vec<Value>>) -> Value {
    let mut n = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"podCIDR": "10.0.1.0/24"}});
    if let Some(t) = taints {
        n["spec"]["taints"] = Value::Array(t);
    }
    n
}

/// An UPDATE of `nodes/<node>` from `old` taints to `new`; `edit` changes the new object more.
fn patch_node(
    user: &User,
    node: &str,
    old: Option<Vec<Value>>,
    new: Option<Vec<Value>>,
    edit: fn(&mut Value),
) -> Review {
    let mut object = node_with(node, new);
    edit(&mut object);
    Review {
        request: request(user, ("", "nodes", ""), "UPDATE", "", node),
        object,
        old_object: node_with(node, old),
    }
}

/// `GET /api/v1/nodes/<node>/proxy/pods`: a CONNECT of nodes/proxy, its object the options.
fn node_proxy(user: &User, node: &str) -> Review {
    Review {
        request: request(user, ("", "nodes", "proxy"), "CONNECT", "", node),
        object: json!({"kind": "NodeProxyOptions", "apiVersion": "v1", "path": "pods"}),
        old_object: Value::Null,
    }
}

fn delete_node(user: &User, node: &str) -> Review {
    Review {
        request: request(user, ("", "nodes", ""), "DELETE", "", node),
        object: Value::Null,
        old_object: node_with(node, None),
    }
}

fn event(user: &User, reporting_node: &str, regarding: Value) -> Review {
    Review {
        request: request(
            user,
            ("events.k8s.io", "events", ""),
            "CREATE",
            "default",
            "x.17f",
        ),
        object: json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                       "metadata": {"name": "x.17f", "namespace": "default"},
                       "reportingController": "node-agent.io/node-agent",
                       "reportingInstance": format!("node-agent-{reporting_node}"),
                       "regarding": regarding, "reason": "EvictionThresholdMet"}),
        old_object: Value::Null,
    }
}

/// An event about a pod as the agent writes it (`Evicted`, `NodeAgentOOMKill`): its node as
/// the related object, unless `related` says otherwise.
fn pod_event(user: &User, related: Option<Value>) -> Review {
    let mut review = event(user, NODE, pod_ref());
    review.request["namespace"] = json!("shop");
    review.object["metadata"]["namespace"] = json!("shop");
    review.object["reason"] = json!("NodeAgentOOMKill");
    if let Some(related) = related {
        review.object["related"] = related;
    }
    review
}

/// A merge patch of an event's series (its repeats), reaching admission as an UPDATE of the
/// whole event: `reported_from` is the node whose agent reported the event before.
fn count_series(user: &User, reported_from: &str) -> Review {
    let mut old = pod_event(user, Some(node_ref(NODE))).object;
    old["reportingInstance"] = json!(format!("node-agent-{reported_from}"));
    let mut object = old.clone();
    object["reportingInstance"] = json!(format!("node-agent-{NODE}"));
    object["series"] = json!({"count": 7, "lastObservedTime": "2026-11-25T23:00:00.000000Z"});
    let mut request = request(
        user,
        ("events.k8s.io", "events", ""),
        "UPDATE",
        "shop",
        "x.17f",
    );
    request["namespace"] = json!("shop");
    Review {
        request,
        object,
        old_object: old,
    }
}

fn node_ref(node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": node})
}

fn pod_ref() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "6ba7"})
}

/// What a row expects of the decision.
type Expect = Box<dyn Fn(&Decision) -> bool>;

#[test]
fn the_policy_binds_the_agents_writes_to_its_node() {
    let policy = policy();
    let agent = agent_on(NODE);
    let no_claim = User {
        name: AGENT,
        node_claim: None,
    };
    let two_nodes = User {
        name: AGENT,
        node_claim: Some(vec![NODE, OTHER_NODE]),
    };
    let admin = User {
        name: "kubernetes-admin",
        node_claim: None,
    };
    let namesake = User {
        name: "system:serviceaccount:elsewhere:node-agent",
        node_claim: Some(vec![NODE]),
    };
    use Decision::{Allowed, NotMatched};
    let refused = |needle: &'static str| move |d: &Decision| matches!(d, Decision::Refused(m) if m.contains(needle));
    let own_node = refused("only its own node");
    let own_pods = refused("only pods on its own node");
    let bound_token = refused("token of its own pod");
    let uid = refused("pod's UID");
    let own_events = refused("events must come from its own node");
    let own_taint = refused("only its own taint");
    let pod_node = refused("must name its own node as the related object");
    let own_update = refused("only the events it reported from its own node");
    let (ours, other) = (
        taint(TAINT_KEY, "NoSchedule"),
        taint("dedicated", "NoSchedule"),
    );
    let same = |_: &mut Value| {};

    #[rustfmt::skip]
    let rows: Vec<(&str, Review, Expect)> = vec![
        ("evicting with the pod's UID", evict(&agent, Some("6ba7")), Box::new(|d| *d == Allowed)),
        ("evicting without a UID precondition", evict(&agent, None), Box::new(uid)),
        ("evicting with an empty UID", evict(&agent, Some("")), Box::new(uid)),
        ("patching its own node's status", patch_node_status(&agent, NODE), Box::new(|d| *d == Allowed)),
        ("patching another node's status", patch_node_status(&agent, OTHER_NODE), Box::new(own_node)),
        ("adding its taint to a node without taints", patch_node(&agent, NODE, None, Some(vec![ours.clone()]), same), Box::new(|d| *d == Allowed)),
        ("adding its taint after another", patch_node(&agent, NODE, Some(vec![other.clone()]), Some(vec![other.clone(), ours.clone()]), same), Box::new(|d| *d == Allowed)),
        ("removing its taint, the other kept", patch_node(&agent, NODE, Some(vec![other.clone(), ours.clone()]), Some(vec![other.clone()]), same), Box::new(|d| *d == Allowed)),
        ("removing the last taint (taints: [])", patch_node(&agent, NODE, Some(vec![ours.clone()]), Some(vec![]), same), Box::new(|d| *d == Allowed)),
        ("adding its taint to another node", patch_node(&agent, OTHER_NODE, None, Some(vec![ours.clone()]), same), Box::new(own_node)),
        ("removing another controller's taint", patch_node(&agent, NODE, Some(vec![other.clone(), ours.clone()]), Some(vec![ours.clone()]), same), Box::new(own_taint)),
        ("adding a taint of another key", patch_node(&agent, NODE, None, Some(vec![other.clone()]), same), Box::new(own_taint)),
        ("its key with the NoExecute effect", patch_node(&agent, NODE, None, Some(vec![taint(TAINT_KEY, "NoExecute")]), same), Box::new(own_taint)),
        ("labelling its node", patch_node(&agent, NODE, None, None, |n| n["metadata"]["labels"]["x"] = json!("y")), Box::new(own_taint)),
        ("annotating its node", patch_node(&agent, NODE, None, None, |n| n["metadata"]["annotations"] = json!({"x": "y"})), Box::new(own_taint)),
        ("cordoning its node", patch_node(&agent, NODE, None, None, |n| n["spec"]["unschedulable"] = json!(true)), Box::new(own_taint)),
        ("deleting its node", delete_node(&agent, NODE), Box::new(own_taint)),
        ("reading its own kubelet through the node proxy", node_proxy(&agent, NODE), Box::new(|d| *d == Allowed)),
        ("reading another node's kubelet through the node proxy", node_proxy(&agent, OTHER_NODE), Box::new(own_node)),
        ("the node proxy with a token without the claim", node_proxy(&no_claim, NODE), Box::new(bound_token)),
        ("anyone else tainting any node", patch_node(&admin, OTHER_NODE, None, Some(vec![other.clone()]), same), Box::new(|d| *d == NotMatched)),
        ("deleting a pod on its node", delete_pod(&agent, NODE), Box::new(|d| *d == Allowed)),
        ("deleting a pod on another node", delete_pod(&agent, OTHER_NODE), Box::new(own_pods)),
        ("deleting a pod not yet scheduled", delete_pod(&agent, ""), Box::new(own_pods)),
        ("marking a pod on its node Evicted", patch_pod_status(&agent, NODE), Box::new(|d| *d == Allowed)),
        ("marking a pod on another node Evicted", patch_pod_status(&agent, OTHER_NODE), Box::new(own_pods)),
        ("creating a pod, even on its node", create_pod(&agent, NODE), Box::new(own_pods)),
        ("an event about its node", event(&agent, NODE, node_ref(NODE)), Box::new(|d| *d == Allowed)),
        ("an event about a pod, its node related", pod_event(&agent, Some(node_ref(NODE))), Box::new(|d| *d == Allowed)),
        ("an event about a pod with no related node", pod_event(&agent, None), Box::new(pod_node)),
        ("an event about a pod, another node related", pod_event(&agent, Some(node_ref(OTHER_NODE))), Box::new(pod_node)),
        ("an event about a pod, a pod related", pod_event(&agent, Some(pod_ref())), Box::new(pod_node)),
        ("counting its own event's series", count_series(&agent, NODE), Box::new(|d| *d == Allowed)),
        ("taking over another node's event", count_series(&agent, OTHER_NODE), Box::new(own_update)),
        ("an event about another node", event(&agent, NODE, node_ref(OTHER_NODE)), Box::new(own_events)),
        ("an event claiming another node's agent", event(&agent, OTHER_NODE, pod_ref()), Box::new(own_events)),
        ("a token without the node-name claim", patch_node_status(&no_claim, NODE), Box::new(bound_token)),
        ("evicting with a token without the claim", evict(&no_claim, Some("6ba7")), Box::new(bound_token)),
        ("a claim naming two nodes", delete_pod(&two_nodes, NODE), Box::new(bound_token)),
        ("anyone else deleting any pod", delete_pod(&admin, OTHER_NODE), Box::new(|d| *d == NotMatched)),
        ("anyone else patching any node", patch_node_status(&admin, OTHER_NODE), Box::new(|d| *d == NotMatched)),
        ("a namesake account in another namespace", delete_pod(&namesake, OTHER_NODE), Box::new(|d| *d == NotMatched)),
    ];
    let mut wrong = Vec::new();
    for (behaviour, review, expected) in rows {
        let decision = policy.decide(&review);
        if !expected(&decision) {
            wrong.push(format!("{behaviour}: {decision:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_policy_matches_every_write_the_agent_may_make_and_is_enforced() {
    let vap: ValidatingAdmissionPolicy = the("admission-policy.yaml", "ValidatingAdmissionPolicy");
    let spec = vap.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .expect("resource rules");
    let covered = |group: &str, resource: &str, operation: &str| {
        rules.iter().any(|r| {
            r.api_groups
                .as_deref()
                .unwrap_or_default()
                .iter()
                .any(|g| g == group)
                && r.resources
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|x| x == resource)
                && r.operations
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o == operation)
        })
    };
    for (group, resource, operation) in [
        ("", "pods", "DELETE"),
        ("", "pods/status", "UPDATE"),
        ("", "pods/eviction", "CREATE"),
        ("", "nodes/status", "UPDATE"),
        ("", "nodes", "UPDATE"),
        ("", "nodes/proxy", "CONNECT"),
        ("events.k8s.io", "events", "CREATE"),
        ("events.k8s.io", "events", "UPDATE"),
    ] {
        assert!(
            covered(group, resource, operation),
            "{operation} {group}/{resource} is not matched"
        );
    }
    // The reviews behind metricsAccess: kubernetes change nothing and name no node: left
    // unmatched, so the policy can never refuse the agent the means to tell who may read it.
    for (group, resource) in [
        ("authentication.k8s.io", "tokenreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
    ] {
        assert!(
            !covered(group, resource, "CREATE"),
            "{group}/{resource} is matched"
        );
    }

    let binding: ValidatingAdmissionPolicyBinding =
        the("admission-policy.yaml", "ValidatingAdmissionPolicyBinding");
    let binding = binding.spec.expect("binding spec");
    assert_eq!(binding.policy_name.as_deref(), vap.metadata.name.as_deref());
    assert_eq!(
        binding.validation_actions.as_deref(),
        Some(&["Deny".to_string()][..])
    );
    assert!(binding.match_resources.is_none(), "bound everywhere");
}

#[test]
fn the_policy_names_the_shipped_service_account() {
    let sa: ServiceAccount = the("serviceaccount.yaml", "ServiceAccount");
    let username = format!(
        "system:serviceaccount:{}:{}",
        sa.metadata.namespace.as_deref().expect("namespace"),
        sa.metadata.name.as_deref().expect("name")
    );
    assert_eq!(username, AGENT);
    let vap: ValidatingAdmissionPolicy = the("admission-policy.yaml", "ValidatingAdmissionPolicy");
    let conditions = vap
        .spec
        .and_then(|s| s.match_conditions)
        .expect("match conditions");
    assert!(
        conditions
            .iter()
            .any(|c| c.expression.contains(&format!("'{username}'"))),
        "the match condition names {username}"
    );
}
