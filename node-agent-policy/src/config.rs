//! Eviction configuration in the kubelet's own forms (KubeletConfiguration YAML fields and
//! command-line flags), validated as the kubelet's `ParseThresholdConfig` validates it.

mod fields;

use std::time::Duration;

use serde_yaml_ng::Value;

pub use self::fields::{EvictionFields, SignalMap, EVICTION_FIELDS};
use crate::duration::{DurationError, GoDuration};
use crate::quantity::{Format, Quantity, QuantityError};
use crate::signal::{Signal, UnknownSignal};

/// The kubelet's default `evictionHard` on Linux (`DefaultEvictionHard`), used when no hard
/// thresholds are configured at all.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// The kubelet's default `evictionPressureTransitionPeriod`.
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(5 * 60);

/// A threshold value: an absolute quantity or a fraction of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    Quantity(Quantity),
    /// A fraction in `0.0..=1.0`, held as `f32` as the kubelet holds it, so that rounding
    /// matches the kubelet to the byte.
    Percentage(f32),
}

impl ThresholdValue {
    /// The absolute quantity for a capacity, as the kubelet's `GetThresholdQuantity`.
    pub fn resolve(&self, capacity: i64) -> Quantity {
        match self {
            ThresholdValue::Quantity(q) => *q,
            ThresholdValue::Percentage(p) => {
                // int64(float64(capacity) * float64(percentage)), truncating, as the kubelet.
                let value = (capacity as f64 * f64::from(*p)) as i64;
                Quantity::from_int(value, Format::BinarySi)
            }
        }
    }
}

/// One eviction threshold: the signal is met while its available value is below `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
    /// How long the threshold must be met before it is acted on; zero for a hard threshold.
    pub grace_period: Duration,
    /// Once acted on, the threshold stays met until available reaches `value` plus this.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// A threshold with no grace period is hard, including a soft one configured with `0s`
    /// (the kubelet's `isHardEvictionThreshold`).
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// A validated eviction configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    thresholds: Vec<Threshold>,
    max_pod_grace_period_seconds: i64,
    pressure_transition_period: Duration,
}

/// Why an eviction configuration is refused. Every variant names the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid YAML: {source}")]
    Yaml {
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A field of the wrong type, or one that is not an eviction field (its path, and what
    /// serde expected there).
    #[error("{path}: {message}")]
    Field { path: String, message: String },
    #[error("{field}: expected {expected}")]
    Type {
        field: String,
        expected: &'static str,
    },
    #[error("kind: expected KubeletConfiguration, found {found:?}")]
    Kind { found: String },
    #[error("{field}: {source}")]
    Signal {
        field: String,
        #[source]
        source: UnknownSignal,
    },
    #[error("{field}: {value:?} holds an operator; write only the value (e.g. 500Mi or 10%), the operator < is implied")]
    Operator { field: String, value: String },
    #[error("{field}: {value:?} is not a quantity: {source}")]
    Quantity {
        field: String,
        value: String,
        #[source]
        source: QuantityError,
    },
    #[error("{field}: {value:?} is not a percentage; expected a number followed by %, e.g. 10%")]
    Percentage { field: String, value: String },
    #[error("{field}: {value:?} is out of range; expected a percentage from 0% to 100%")]
    PercentageRange { field: String, value: String },
    #[error("{field}: {value:?} must be positive")]
    NotPositive { field: String, value: String },
    #[error("{field}: {value:?} must not be negative")]
    Negative { field: String, value: String },
    #[error("{field}: {value:?} is not a duration: {source}")]
    Duration {
        field: String,
        value: String,
        #[source]
        source: DurationError,
    },
    #[error("{field}: a soft threshold needs a grace period; set {grace_field}")]
    MissingGracePeriod { field: String, grace_field: String },
    #[error("{field}: malformed pair {pair:?}; expected {expected}")]
    MalformedPair {
        field: String,
        pair: String,
        expected: &'static str,
    },
}

/// Eviction settings as kubelet command-line flags, each as it would be written after `=`.
/// A flag left `None` was not given.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvictionFlags<'a> {
    /// `--eviction-hard`, e.g. `memory.available<500Mi,nodefs.available<10%`.
    pub eviction_hard: Option<&'a str>,
    /// `--eviction-soft`, same syntax as `--eviction-hard`.
    pub eviction_soft: Option<&'a str>,
    /// `--eviction-soft-grace-period`, e.g. `memory.available=1m30s`.
    pub eviction_soft_grace_period: Option<&'a str>,
    /// `--eviction-max-pod-grace-period`, whole seconds.
    pub eviction_max_pod_grace_period: Option<&'a str>,
    /// `--eviction-minimum-reclaim`, e.g. `memory.available=0Mi,nodefs.available=500Mi`.
    pub eviction_minimum_reclaim: Option<&'a str>,
    /// `--eviction-pressure-transition-period`, a Go duration.
    pub eviction_pressure_transition_period: Option<&'a str>,
    /// `--enforce-node-allocatable`, comma-separated.
    pub enforce_node_allocatable: Option<&'a str>,
}

/// One `signal -> value` entry together with the name of the field it came from.
struct Entry {
    field: String,
    signal: String,
    value: String,
}

/// Settings as written, before validation.
#[derive(Default)]
struct RawSettings {
    /// `None` when not given at all: the kubelet's defaults apply.
    hard: Option<Vec<Entry>>,
    soft: Vec<Entry>,
    soft_grace_period: Vec<Entry>,
    minimum_reclaim: Vec<Entry>,
    /// (field, value) of the maximum pod grace period, in seconds.
    max_pod_grace_period: Option<(String, i64)>,
    pressure_transition_period: Option<Duration>,
    enforce_node_allocatable: Option<Vec<String>>,
    /// How the grace period field is named in this form, for error messages.
    grace_field: String,
}

impl Default for EvictionConfig {
    /// The kubelet's defaults: the default hard thresholds, no soft ones, a 5m transition period.
    fn default() -> Self {
        build(RawSettings {
            grace_field: "evictionSoftGracePeriod".into(),
            ..RawSettings::default()
        })
        .expect("the kubelet's default thresholds are valid")
    }
}

impl EvictionConfig {
    /// The thresholds in force, hard ones first, then soft, then those derived for
    /// `allocatableMemory.available`.
    pub fn thresholds(&self) -> &[Threshold] {
        &self.thresholds
    }

    /// `evictionMaxPodGracePeriod`, seconds (0 when not set, as in the kubelet).
    pub fn max_pod_grace_period_seconds(&self) -> i64 {
        self.max_pod_grace_period_seconds
    }

    /// `evictionPressureTransitionPeriod`.
    pub fn pressure_transition_period(&self) -> Duration {
        self.pressure_transition_period
    }

    /// Reads a KubeletConfiguration YAML (or JSON) document, or a mapping holding only the
    /// eviction fields. In a whole KubeletConfiguration other fields are ignored; in a bare
    /// mapping an unknown field is refused, so a misspelt field is not silently dropped.
    pub fn from_kubelet_yaml(text: &str) -> Result<EvictionConfig, ConfigError> {
        let value: Value =
            serde_yaml_ng::from_str(text).map_err(|source| ConfigError::Yaml { source })?;
        Self::from_yaml_value(&value, "")
    }

    /// As [`EvictionConfig::from_kubelet_yaml`], from an already parsed value; `prefix` is put
    /// before field names in errors (e.g. `config.`).
    pub fn from_yaml_value(value: &Value, prefix: &str) -> Result<EvictionConfig, ConfigError> {
        let fields = EvictionFields::from_kubelet_value(value.clone(), prefix)?;
        Self::from_fields(&fields, prefix)
    }

    /// Validates the eviction fields as the kubelet does; `prefix` is put before field names
    /// in errors (e.g. `eviction.`).
    pub fn from_fields(
        fields: &EvictionFields,
        prefix: &str,
    ) -> Result<EvictionConfig, ConfigError> {
        let entries = |map: &Option<SignalMap>, name: &str| -> Option<Vec<Entry>> {
            map.as_ref().map(|map| {
                map.0
                    .iter()
                    .map(|(signal, value)| Entry {
                        field: format!("{prefix}{name}[{signal}]"),
                        signal: signal.clone(),
                        value: value.clone(),
                    })
                    .collect()
            })
        };
        build(RawSettings {
            hard: entries(&fields.eviction_hard, "evictionHard"),
            soft: entries(&fields.eviction_soft, "evictionSoft").unwrap_or_default(),
            soft_grace_period: entries(
                &fields.eviction_soft_grace_period,
                "evictionSoftGracePeriod",
            )
            .unwrap_or_default(),
            minimum_reclaim: entries(&fields.eviction_minimum_reclaim, "evictionMinimumReclaim")
                .unwrap_or_default(),
            max_pod_grace_period: fields
                .eviction_max_pod_grace_period
                .map(|s| (format!("{prefix}evictionMaxPodGracePeriod"), i64::from(s))),
            pressure_transition_period: fields
                .eviction_pressure_transition_period
                .map(GoDuration::get),
            enforce_node_allocatable: fields.enforce_node_allocatable.clone(),
            grace_field: format!("{prefix}evictionSoftGracePeriod"),
        })
    }

    /// Reads the kubelet's eviction flags. Flags not given follow the kubelet's defaults.
    pub fn from_flags(flags: &EvictionFlags<'_>) -> Result<EvictionConfig, ConfigError> {
        let mut raw = RawSettings {
            grace_field: "--eviction-soft-grace-period".into(),
            ..RawSettings::default()
        };
        if let Some(text) = flags.eviction_hard {
            raw.hard = Some(flag_pairs(text, "--eviction-hard", '<')?);
        }
        if let Some(text) = flags.eviction_soft {
            raw.soft = flag_pairs(text, "--eviction-soft", '<')?;
        }
        if let Some(text) = flags.eviction_soft_grace_period {
            raw.soft_grace_period = flag_pairs(text, "--eviction-soft-grace-period", '=')?;
        }
        if let Some(text) = flags.eviction_minimum_reclaim {
            raw.minimum_reclaim = flag_pairs(text, "--eviction-minimum-reclaim", '=')?;
        }
        if let Some(text) = flags.eviction_max_pod_grace_period {
            let field = "--eviction-max-pod-grace-period".to_string();
            let seconds = text.trim().parse::<i32>().map_err(|_| ConfigError::Type {
                field: field.clone(),
                expected: "a whole number of seconds",
            })?;
            raw.max_pod_grace_period = Some((field, i64::from(seconds)));
        }
        if let Some(text) = flags.eviction_pressure_transition_period {
            raw.pressure_transition_period = Some(parse_non_negative_duration(
                "--eviction-pressure-transition-period",
                text,
            )?);
        }
        if let Some(text) = flags.enforce_node_allocatable {
            raw.enforce_node_allocatable = Some(
                text.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
        build(raw)
    }
}

impl EvictionFields {
    /// The eviction fields of a KubeletConfiguration document (its other fields ignored), or
    /// of a mapping that holds only eviction fields (anything else refused by name); `prefix`
    /// is put before paths in errors.
    pub fn from_kubelet_value(
        mut value: Value,
        prefix: &str,
    ) -> Result<EvictionFields, ConfigError> {
        if value.is_null() {
            return Ok(EvictionFields::default());
        }
        if let Value::Mapping(map) = &mut value {
            if let Some(kind) = map.remove("kind") {
                if kind.as_str() != Some("KubeletConfiguration") {
                    return Err(ConfigError::Kind {
                        found: match kind {
                            Value::String(s) => s,
                            other => serde_yaml_ng::to_string(&other)
                                .unwrap_or_default()
                                .trim()
                                .to_string(),
                        },
                    });
                }
                map.retain(|k, _| k.as_str().is_some_and(|k| EVICTION_FIELDS.contains(&k)));
            }
            map.remove("apiVersion");
        }
        Self::deserialize_at(value, prefix)
    }

    /// The fields from a value that holds only them, every error naming its path below
    /// `prefix` (`eviction.evictionHard.memory.available: ...`).
    pub fn deserialize_at(value: Value, prefix: &str) -> Result<EvictionFields, ConfigError> {
        serde_path_to_error::deserialize(value).map_err(|e| ConfigError::Field {
            path: joined_path(prefix, &e.path().to_string()),
            message: e.inner().to_string(),
        })
    }
}

/// `prefix` and a serde path (`.` when the error is at the top) as one path.
fn joined_path(prefix: &str, path: &str) -> String {
    match (prefix.trim_end_matches('.'), path) {
        ("", ".") => "document".to_string(),
        (p, ".") => p.to_string(),
        ("", path) => path.to_string(),
        (p, path) => format!("{p}.{path}"),
    }
}

/// `k<v,k<v` or `k=v,k=v` as the kubelet's flag types split them; a later key wins.
fn flag_pairs(text: &str, flag: &str, separator: char) -> Result<Vec<Entry>, ConfigError> {
    let mut entries: Vec<Entry> = Vec::new();
    for pair in text.split(',').filter(|s| !s.is_empty()) {
        let (signal, value) =
            pair.split_once(separator)
                .ok_or_else(|| ConfigError::MalformedPair {
                    field: flag.to_string(),
                    pair: pair.to_string(),
                    expected: if separator == '<' {
                        "signal<value"
                    } else {
                        "signal=value"
                    },
                })?;
        let signal = signal.trim().to_string();
        entries.retain(|e| e.signal != signal);
        entries.push(Entry {
            field: format!("{flag}[{signal}]"),
            signal,
            value: value.trim().to_string(),
        });
    }
    Ok(entries)
}

fn parse_signal(entry: &Entry) -> Result<Signal, ConfigError> {
    entry.signal.parse().map_err(|source| ConfigError::Signal {
        field: entry.field.clone(),
        source,
    })
}

fn refuse_operator(entry: &Entry) -> Result<(), ConfigError> {
    if entry.value.starts_with(['<', '>', '=', '!']) {
        return Err(ConfigError::Operator {
            field: entry.field.clone(),
            value: entry.value.clone(),
        });
    }
    Ok(())
}

/// `strconv.ParseFloat(strings.TrimRight(v, "%"), 32) / 100`, refusing what is not a number.
fn parse_percentage(entry: &Entry) -> Result<f32, ConfigError> {
    let number = entry.value.trim_end_matches('%');
    match number.parse::<f32>() {
        Ok(p) if p.is_finite() => Ok(p / 100.0),
        _ => Err(ConfigError::Percentage {
            field: entry.field.clone(),
            value: entry.value.clone(),
        }),
    }
}

fn parse_quantity(entry: &Entry) -> Result<Quantity, ConfigError> {
    entry
        .value
        .parse::<Quantity>()
        .map_err(|source| ConfigError::Quantity {
            field: entry.field.clone(),
            value: entry.value.clone(),
            source,
        })
}

/// `parseThresholdStatement`: `None` for `0%` and `100%`, which disable the threshold.
fn parse_threshold_value(entry: &Entry) -> Result<Option<ThresholdValue>, ConfigError> {
    refuse_operator(entry)?;
    if entry.value.ends_with('%') {
        if entry.value == "0%" || entry.value == "100%" {
            return Ok(None);
        }
        let p = parse_percentage(entry)?;
        if !(0.0..=1.0).contains(&p) {
            return Err(ConfigError::PercentageRange {
                field: entry.field.clone(),
                value: entry.value.clone(),
            });
        }
        return Ok(Some(ThresholdValue::Percentage(p)));
    }
    let q = parse_quantity(entry)?;
    if q.is_zero() || q.is_negative() {
        return Err(ConfigError::NotPositive {
            field: entry.field.clone(),
            value: entry.value.clone(),
        });
    }
    Ok(Some(ThresholdValue::Quantity(q)))
}

/// `parseMinimumReclaims`: a percentage must be positive, a quantity not negative (`0` is fine).
fn parse_min_reclaim(entry: &Entry) -> Result<ThresholdValue, ConfigError> {
    refuse_operator(entry)?;
    if entry.value.ends_with('%') {
        let p = parse_percentage(entry)?;
        if p <= 0.0 {
            return Err(ConfigError::NotPositive {
                field: entry.field.clone(),
                value: entry.value.clone(),
            });
        }
        return Ok(ThresholdValue::Percentage(p));
    }
    let q = parse_quantity(entry)?;
    if q.is_negative() {
        return Err(ConfigError::Negative {
            field: entry.field.clone(),
            value: entry.value.clone(),
        });
    }
    Ok(ThresholdValue::Quantity(q))
}

/// A Go duration written as text (a grace period, a flag), through the config's one duration
/// type.
fn parse_non_negative_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    match value.parse::<GoDuration>() {
        Ok(d) => Ok(d.get()),
        Err(DurationError::Negative) => Err(ConfigError::Negative {
            field: field.to_string(),
            value: value.to_string(),
        }),
        Err(source) => Err(ConfigError::Duration {
            field: field.to_string(),
            value: value.to_string(),
            source,
        }),
    }
}

fn parse_thresholds(
    entries: &[Entry],
) -> Result<Vec<(Signal, ThresholdValue, &Entry)>, ConfigError> {
    let mut out = Vec::new();
    for entry in entries {
        let signal = parse_signal(entry)?;
        if let Some(value) = parse_threshold_value(entry)? {
            out.push((signal, value, entry));
        }
    }
    Ok(out)
}

/// The value configured for a signal; a later entry wins, as a later flag pair does.
fn lookup<T: Copy>(list: &[(Signal, T)], signal: Signal) -> Option<T> {
    list.iter()
        .rev()
        .find(|(s, _)| *s == signal)
        .map(|(_, v)| *v)
}

/// Validates in the kubelet's order: hard, soft, grace periods, minimum reclaims, then the
/// grace period each soft threshold needs.
fn build(raw: RawSettings) -> Result<EvictionConfig, ConfigError> {
    let default_hard: Vec<Entry> = DEFAULT_EVICTION_HARD
        .iter()
        .map(|(signal, value)| Entry {
            field: format!("evictionHard[{signal}]"),
            signal: signal.to_string(),
            value: value.to_string(),
        })
        .collect();
    let hard = parse_thresholds(raw.hard.as_deref().unwrap_or(&default_hard))?;
    let soft = parse_thresholds(&raw.soft)?;

    let mut grace_periods = Vec::new();
    for entry in &raw.soft_grace_period {
        let signal = parse_signal(entry)?;
        grace_periods.push((
            signal,
            parse_non_negative_duration(&entry.field, &entry.value)?,
        ));
    }
    let mut min_reclaims = Vec::new();
    for entry in &raw.minimum_reclaim {
        min_reclaims.push((parse_signal(entry)?, parse_min_reclaim(entry)?));
    }

    let mut thresholds: Vec<Threshold> = hard
        .into_iter()
        .map(|(signal, value, _)| Threshold {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        })
        .collect();
    for (signal, value, entry) in soft {
        let grace_period =
            lookup(&grace_periods, signal).ok_or_else(|| ConfigError::MissingGracePeriod {
                field: entry.field.clone(),
                grace_field: format!("{}[{signal}]", raw.grace_field),
            })?;
        thresholds.push(Threshold {
            signal,
            value,
            grace_period,
            min_reclaim: None,
        });
    }
    for threshold in &mut thresholds {
        threshold.min_reclaim = lookup(&min_reclaims, threshold.signal);
    }
    // With node allocatable enforced on pods (the kubelet's default), every hard
    // memory.available threshold is mirrored on allocatableMemory.available.
    let enforce_pods = raw
        .enforce_node_allocatable
        .as_ref()
        .is_none_or(|list| list.iter().any(|k| k == "pods"));
    if enforce_pods {
        let mirrored: Vec<Threshold> = thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .collect();
        thresholds.extend(mirrored);
    }

    let max_pod_grace_period_seconds = match raw.max_pod_grace_period {
        Some((field, seconds)) if seconds < 0 => {
            return Err(ConfigError::Negative {
                field,
                value: seconds.to_string(),
            })
        }
        Some((_, seconds)) => seconds,
        None => 0,
    };
    let pressure_transition_period = raw
        .pressure_transition_period
        .unwrap_or(DEFAULT_PRESSURE_TRANSITION_PERIOD);
    Ok(EvictionConfig {
        thresholds,
        max_pod_grace_period_seconds,
        pressure_transition_period,
    })
}
