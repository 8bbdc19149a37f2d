//! The kubelet's eviction fields as written, by their KubeletConfiguration names, read with
//! serde: the `eviction:` section of the agent's config, a scenario's `config:`, and the
//! eviction part of the kubelet's own config file. Threshold values stay text here (`500Mi`,
//! `10%`, `1m30s`); [`super::EvictionConfig::from_fields`] validates them as the kubelet's
//! `ParseThresholdConfig` does.

use std::fmt;

use serde::{
    de,
    ser::{SerializeMap, Serializer},
    Deserialize, Deserializer, Serialize,
};

use crate::duration::GoDuration;

/// The KubeletConfiguration eviction fields. A field left out (or `null`) takes the kubelet's
/// default, as in the kubelet: above all, no `evictionHard` means the kubelet's default hard
/// thresholds, while `evictionHard: {}` means none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EvictionFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<SignalMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_soft: Option<SignalMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_soft_grace_period: Option<SignalMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_minimum_reclaim: Option<SignalMap>,
    /// Seconds; an int32 in KubeletConfiguration, so the kubelet cannot decode more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction_pressure_transition_period: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce_node_allocatable: Option<Vec<String>>,
}

/// The KubeletConfiguration field names [`EvictionFields`] holds.
pub const EVICTION_FIELDS: [&str; 7] = [
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "enforceNodeAllocatable",
];

impl EvictionFields {
    /// Every field set: what was written, and the kubelet's default where nothing was (the
    /// effective eviction settings, in the kubelet's own terms).
    pub fn with_kubelet_defaults(&self) -> EvictionFields {
        let hard = super::DEFAULT_EVICTION_HARD
            .iter()
            .map(|(s, v)| (s.to_string(), v.to_string()))
            .collect();
        EvictionFields {
            eviction_hard: Some(self.eviction_hard.clone().unwrap_or(SignalMap(hard))),
            eviction_soft: Some(self.eviction_soft.clone().unwrap_or_default()),
            eviction_soft_grace_period: Some(
                self.eviction_soft_grace_period.clone().unwrap_or_default(),
            ),
            eviction_minimum_reclaim: Some(
                self.eviction_minimum_reclaim.clone().unwrap_or_default(),
            ),
            eviction_max_pod_grace_period: Some(self.eviction_max_pod_grace_period.unwrap_or(0)),
            eviction_pressure_transition_period: Some(
                self.eviction_pressure_transition_period.unwrap_or(
                    GoDuration::try_from(super::DEFAULT_PRESSURE_TRANSITION_PERIOD)
                        .unwrap_or_default(),
                ),
            ),
            enforce_node_allocatable: Some(
                self.enforce_node_allocatable
                    .clone()
                    .unwrap_or_else(|| vec!["pods".to_string()]),
            ),
        }
    }
}

/// A `signal: value` mapping in file order, values as written (YAML's plain numbers as their
/// text). A signal given twice is refused: YAML forbids duplicate keys, and which one the
/// kubelet would take is not defined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignalMap(pub Vec<(String, String)>);

impl FromIterator<(String, String)> for SignalMap {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl Serialize for SignalMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for SignalMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = SignalMap;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a mapping of eviction signals to values, e.g. {memory.available: 500Mi}",
                )
            }

            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<SignalMap, A::Error> {
                let mut entries: Vec<(String, String)> = Vec::new();
                while let Some(signal) = map.next_key::<String>()? {
                    let ScalarText(value) = map.next_value()?;
                    if entries.iter().any(|(s, _)| *s == signal) {
                        return Err(de::Error::custom(format_args!("{signal} is given twice")));
                    }
                    entries.push((signal, value));
                }
                Ok(SignalMap(entries))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A scalar as text: YAML reads `1000` as a number where the kubelet reads a quantity.
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ScalarText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity, a percentage or a Go duration (e.g. 500Mi, 10%, 1m30s)")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ScalarText, E> {
                Ok(ScalarText(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}
