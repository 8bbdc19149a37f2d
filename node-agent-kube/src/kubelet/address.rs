//! Which of its Node's addresses the kubelet is dialled at, pure: the first address of the
//! preferred types in `status.addresses` (as the API server and metrics-server choose theirs,
//! `--kubelet-preferred-address-types`), at the port the kubelet publishes in
//! `status.daemonEndpoints.kubeletEndpoint.Port`. Entries that cannot be dialled (an `InternalIP`
//! that is no IP address, a `Hostname` that is no DNS name) are left aside and named; a Node
//! with none usable of the preferred types is an error naming every entry and why.

use std::{fmt, net::IpAddr};

use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The kubelet's own default port (`--port`), used when the Node publishes none.
pub const DEFAULT_PORT: u16 = 10250;

/// The most entries of `status.addresses` an error or log line names, and the most characters
/// of each: a lying API server cannot make one line arbitrarily long.
const NAMED_ENTRIES: usize = 8;
const NAMED_CHARS: usize = 64;

/// A `NodeAddressType` of the Kubernetes API, spelt as the API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeAddressType {
    Hostname,
    #[serde(rename = "InternalIP")]
    InternalIp,
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    #[serde(rename = "InternalDNS")]
    InternalDns,
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
}

impl NodeAddressType {
    /// metrics-server's default order with `InternalIP` first: node names and hostnames often
    /// do not resolve from a pod, and the internal address is the one every CNI routes to.
    pub const DEFAULT_ORDER: [Self; 5] = [
        Self::InternalIp,
        Self::Hostname,
        Self::InternalDns,
        Self::ExternalDns,
        Self::ExternalIp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hostname => "Hostname",
            Self::InternalIp => "InternalIP",
            Self::ExternalIp => "ExternalIP",
            Self::InternalDns => "InternalDNS",
            Self::ExternalDns => "ExternalDNS",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [
            Self::Hostname,
            Self::InternalIp,
            Self::ExternalIp,
            Self::InternalDns,
            Self::ExternalDns,
        ]
        .into_iter()
        .find(|t| t.as_str() == text)
    }

    fn is_ip(self) -> bool {
        matches!(self, Self::InternalIp | Self::ExternalIp)
    }
}

impl fmt::Display for NodeAddressType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The part of a Node this reads; the rest of the object is ignored, and these fields are read
/// as JSON values so that a malformed one is named rather than failing the whole object.
#[derive(Debug, Default, Deserialize)]
pub struct NodePart {
    #[serde(default)]
    pub status: Option<NodeStatusPart>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatusPart {
    #[serde(default)]
    pub addresses: Option<Value>,
    #[serde(default)]
    pub daemon_endpoints: Option<Value>,
}

/// The address chosen, and what else the Node says the kubelet is called.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub kind: NodeAddressType,
    /// As the Node writes it (an IP address or a DNS name).
    pub address: String,
    pub port: u16,
    /// Whether the port came from `status.daemonEndpoints` (else [`DEFAULT_PORT`]).
    pub port_published: bool,
    /// The Node's `Hostname` addresses other than the chosen one: a kubelet's self-signed
    /// certificate names its hostname only, so its certificate may name one of these instead.
    pub hostnames: Vec<String>,
    /// Entries of the preferred types left aside, each with why.
    pub refused: Vec<String>,
}

impl Chosen {
    /// `https://<address>:<port>`, an IPv6 address in brackets.
    pub fn url(&self) -> String {
        if self.address.contains(':') {
            format!("https://[{}]:{}", self.address, self.port)
        } else {
            format!("https://{}:{}", self.address, self.port)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("node {node} has no status.addresses (has its kubelet registered it?)")]
    None { node: String },
    #[error("node {node}: status.addresses is {found}, not a list of {{type, address}}")]
    NotAList { node: String, found: String },
    #[error(
        "node {node}: none of status.addresses is a usable {wanted} (kubelet.preferredAddressTypes); it holds {present}"
    )]
    NoneUsable {
        node: String,
        wanted: String,
        present: String,
    },
    #[error(
        "node {node}: status.daemonEndpoints.kubeletEndpoint.Port is {found}, not a port (1 to 65535)"
    )]
    BadPort { node: String, found: String },
}

/// One entry of `status.addresses`, judged.
struct Entry {
    kind: Option<NodeAddressType>,
    /// The entry as written, cut for messages.
    shown: String,
    address: Result<String, String>,
}

fn cut(text: &str) -> String {
    if text.chars().count() <= NAMED_CHARS {
        return text.to_string();
    }
    let kept: String = text.chars().take(NAMED_CHARS).collect();
    format!("{kept}…")
}

/// Whether `address` can be dialled and named in a certificate as an entry of `kind`.
fn judge(kind: NodeAddressType, address: &str) -> Result<String, String> {
    if address.is_empty() {
        return Err("empty".into());
    }
    if kind.is_ip() {
        return address
            .parse::<IpAddr>()
            .map(|ip| ip.to_string())
            .map_err(|_| "not an IP address".into());
    }
    // A hostname override may be an IP address; otherwise a DNS name.
    if address.parse::<IpAddr>().is_ok() {
        return Ok(address.to_string());
    }
    match ServerName::try_from(address) {
        Ok(ServerName::DnsName(_)) => Ok(address.to_string()),
        _ => Err("not a DNS name".into()),
    }
}

fn read_entry(value: &Value) -> Entry {
    let text = |key| value.get(key).and_then(Value::as_str);
    match (text("type"), text("address")) {
        (Some(t), Some(a)) => {
            let kind = NodeAddressType::parse(t);
            Entry {
                kind,
                shown: format!("{}={}", cut(t), cut(a)),
                address: match kind {
                    Some(k) => judge(k, a),
                    None => Err("not an address type the agent knows".into()),
                },
            }
        }
        _ => Entry {
            kind: None,
            shown: cut(&value.to_string()),
            address: Err("not a {type, address} pair of strings".into()),
        },
    }
}

fn port(node: &str, endpoints: Option<&Value>) -> Result<Option<u16>, AddressError> {
    let Some(value) = endpoints
        .and_then(|e| e.get("kubeletEndpoint"))
        .and_then(|k| k.get("Port"))
        .filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    match value.as_u64() {
        // The kubelet publishes 0 before it serves: not published.
        Some(0) => Ok(None),
        Some(p) if p <= u64::from(u16::MAX) => Ok(Some(p as u16)),
        _ => Err(AddressError::BadPort {
            node: node.to_string(),
            found: cut(&value.to_string()),
        }),
    }
}

/// The address of the first of `preferred` types the Node holds a usable entry of (in the
/// Node's order within a type), and its kubelet's port. Pure.
pub fn choose(
    node: &str,
    status: Option<&NodeStatusPart>,
    preferred: &[NodeAddressType],
) -> Result<Chosen, AddressError> {
    let none = || AddressError::None {
        node: node.to_string(),
    };
    let addresses = status
        .and_then(|s| s.addresses.as_ref())
        .filter(|a| !a.is_null())
        .ok_or_else(none)?;
    let list = addresses.as_array().ok_or_else(|| AddressError::NotAList {
        node: node.to_string(),
        found: cut(&addresses.to_string()),
    })?;
    if list.is_empty() {
        return Err(none());
    }
    let entries: Vec<Entry> = list.iter().map(read_entry).collect();
    let refusal = |e: &Entry| match &e.address {
        Err(why) => Some(format!("{} ({why})", e.shown)),
        Ok(_) => None,
    };
    let chosen = preferred.iter().find_map(|want| {
        entries
            .iter()
            .filter(|e| e.kind == Some(*want))
            .find_map(|e| e.address.as_ref().ok().map(|a| (*want, a.clone())))
    });
    let Some((kind, address)) = chosen else {
        let mut present: Vec<String> = entries
            .iter()
            .take(NAMED_ENTRIES)
            .map(|e| refusal(e).unwrap_or_else(|| e.shown.clone()))
            .collect();
        if entries.len() > NAMED_ENTRIES {
            present.push(format!("and {} more", entries.len() - NAMED_ENTRIES));
        }
        return Err(AddressError::NoneUsable {
            node: node.to_string(),
            wanted: preferred
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            present: present.join(", "),
        });
    };
    let port = port(node, status.and_then(|s| s.daemon_endpoints.as_ref()))?;
    let mut hostnames: Vec<String> = Vec::new();
    for e in &entries {
        if let (Some(NodeAddressType::Hostname), Ok(a)) = (e.kind, &e.address) {
            if *a != address && !hostnames.contains(a) {
                hostnames.push(a.clone());
            }
        }
    }
    let refused = entries
        .iter()
        .filter(|e| e.kind.is_some_and(|k| preferred.contains(&k)))
        .filter_map(refusal)
        .take(NAMED_ENTRIES)
        .collect();
    Ok(Chosen {
        kind,
        address,
        port: port.unwrap_or(DEFAULT_PORT),
        port_published: port.is_some(),
        hostnames,
        refused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use NodeAddressType::{ExternalIp, Hostname, InternalDns, InternalIp};

    fn status(addresses: Value, port: Value) -> NodeStatusPart {
        NodeStatusPart {
            addresses: Some(addresses),
            daemon_endpoints: Some(json!({"kubeletEndpoint": {"Port": port}})),
        }
    }

    fn kubeadm() -> Value {
        json!([{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "worker-1"}])
    }

    #[test]
    fn the_first_usable_address_of_the_preferred_types_is_dialled() {
        let default = &NodeAddressType::DEFAULT_ORDER[..];
        /// (behaviour, addresses, port, preferred, URL, names the certificate may carry instead)
        type Row = (
            &'static str,
            Value,
            Value,
            &'static [NodeAddressType],
            &'static str,
            &'static [&'static str],
        );
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("kubeadm: the InternalIP, the hostname as the other name", kubeadm(), json!(10250), default,
                "https://10.0.0.5:10250", &["worker-1"]),
            ("the port the kubelet publishes", kubeadm(), json!(10251), default,
                "https://10.0.0.5:10251", &["worker-1"]),
            ("no port published: the kubelet's default", kubeadm(), json!(0), default,
                "https://10.0.0.5:10250", &["worker-1"]),
            ("the configured order wins over the Node's", kubeadm(), json!(10250), &[Hostname, InternalIp],
                "https://worker-1:10250", &[]),
            ("no InternalIP: the next preferred type",
                json!([{"type": "ExternalIP", "address": "203.0.113.7"}, {"type": "InternalDNS", "address": "ip-10-0-0-5.ec2.internal"}]),
                json!(10250), default, "https://ip-10-0-0-5.ec2.internal:10250", &[]),
            ("an IPv6 InternalIP in brackets",
                json!([{"type": "InternalIP", "address": "fd00::5"}, {"type": "Hostname", "address": "worker-1"}]),
                json!(10250), default, "https://[fd00::5]:10250", &["worker-1"]),
            ("a garbage InternalIP is passed over for the next entry",
                json!([{"type": "InternalIP", "address": "ten.zero"}, {"type": "InternalIP", "address": "10.0.0.6"}]),
                json!(10250), default, "https://10.0.0.6:10250", &[]),
            ("dual stack: the Node's first InternalIP",
                json!([{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "InternalIP", "address": "fd00::5"}]),
                json!(10250), default, "https://10.0.0.5:10250", &[]),
            ("a type the agent does not know is ignored",
                json!([{"type": "Bogus", "address": "x"}, {"type": "InternalIP", "address": "10.0.0.5"}]),
                json!(10250), default, "https://10.0.0.5:10250", &[]),
        ];
        for (what, addresses, port, preferred, url, names) in rows {
            let chosen = choose("worker-1", Some(&status(addresses, port)), preferred)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(chosen.url(), url, "{what}");
            assert_eq!(chosen.hostnames, names, "{what}");
        }
    }

    #[test]
    fn a_node_without_a_usable_address_is_an_error_naming_each_entry() {
        let default = &NodeAddressType::DEFAULT_ORDER[..];
        #[rustfmt::skip]
        let rows: Vec<(&str, Option<NodeStatusPart>, &[NodeAddressType], &str)> = vec![
            ("no status at all", None, default, "node worker-1 has no status.addresses"),
            ("an empty list", Some(status(json!([]), json!(10250))), default, "has no status.addresses"),
            ("not a list", Some(status(json!({"InternalIP": "10.0.0.5"}), json!(10250))), default,
                "status.addresses is {\"InternalIP\":\"10.0.0.5\"}, not a list"),
            ("none of the preferred types", Some(status(kubeadm(), json!(10250))), &[ExternalIp],
                "none of status.addresses is a usable ExternalIP (kubelet.preferredAddressTypes); it holds InternalIP=10.0.0.5, Hostname=worker-1"),
            ("a garbage IP, the only one", Some(status(json!([{"type": "InternalIP", "address": "999.1.1.1"}]), json!(10250))), default,
                "it holds InternalIP=999.1.1.1 (not an IP address)"),
            ("a hostname that is no DNS name", Some(status(json!([{"type": "Hostname", "address": "work er"}]), json!(10250))), &[Hostname],
                "Hostname=work er (not a DNS name)"),
            ("an entry that is not a pair of strings", Some(status(json!([{"type": "InternalIP", "address": 10}]), json!(10250))), default,
                "(not a {type, address} pair of strings)"),
            ("an empty address", Some(status(json!([{"type": "InternalDNS", "address": ""}]), json!(10250))), &[InternalDns],
                "InternalDNS= (empty)"),
            ("a port that is no port", Some(status(kubeadm(), json!(70000))), default,
                "status.daemonEndpoints.kubeletEndpoint.Port is 70000, not a port"),
            ("a port that is a string", Some(status(kubeadm(), json!("10250"))), default,
                "Port is \"10250\", not a port"),
        ];
        for (what, status, preferred, want) in rows {
            let err = choose("worker-1", status.as_ref(), preferred)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{what}: {err}");
        }
    }

    #[test]
    fn what_a_lying_node_says_is_cut_in_messages() {
        let long = "x".repeat(10_000);
        let many: Vec<Value> = (0..100)
            .map(|_| json!({"type": "InternalIP", "address": long}))
            .collect();
        let err = choose(
            "worker-1",
            Some(&status(Value::Array(many), json!(10250))),
            &[InternalIp],
        )
        .unwrap_err()
        .to_string();
        assert!(err.len() < 1500, "{} bytes", err.len());
        assert!(err.ends_with("and 92 more"), "{err}");
    }

    #[test]
    fn refused_entries_are_kept_for_the_log() {
        let chosen = choose(
            "worker-1",
            Some(&status(
                json!([{"type": "InternalIP", "address": "garbage"}, {"type": "Hostname", "address": "worker-1"}]),
                json!(10250),
            )),
            &NodeAddressType::DEFAULT_ORDER,
        )
        .unwrap();
        assert_eq!(
            (chosen.kind, chosen.address.as_str()),
            (Hostname, "worker-1")
        );
        assert_eq!(chosen.refused, ["InternalIP=garbage (not an IP address)"]);
        assert!(
            chosen.hostnames.is_empty(),
            "the chosen name is not repeated"
        );
    }

    #[test]
    fn address_types_read_and_print_as_the_api_spells_them() {
        let types: Vec<NodeAddressType> =
            serde_yaml_ng::from_str("[InternalIP, Hostname, InternalDNS, ExternalDNS, ExternalIP]")
                .unwrap();
        assert_eq!(types, NodeAddressType::DEFAULT_ORDER);
        assert!(serde_yaml_ng::from_str::<NodeAddressType>("InternalIp").is_err());
        assert_eq!(
            serde_yaml_ng::to_string(&InternalIp).unwrap().trim(),
            "InternalIP"
        );
    }
}
