//! Go duration syntax (`time.ParseDuration`), as the kubelet reads `1m30s`, and [`GoDuration`],
//! the one spelling of a duration in the agent's config file.

use std::{fmt, str::FromStr, time::Duration};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration")]
    Empty,
    #[error("expected a Go duration such as 30s, 1m30s or 1.5h")]
    Format,
    #[error("missing unit; expected one of ns us ms s m h")]
    MissingUnit,
    #[error("unknown unit {0:?}; expected one of ns us ms s m h")]
    UnknownUnit(String),
    #[error("duration is out of range")]
    OutOfRange,
    #[error("must not be negative")]
    Negative,
}

/// Parses a Go duration into signed nanoseconds. Accepts what `time.ParseDuration` accepts:
/// an optional sign, then one or more `<number><unit>` with decimal fractions allowed, or `0`.
pub fn parse_go_duration(s: &str) -> Result<i64, DurationError> {
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let (negative, mut rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(DurationError::Format);
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(DurationError::Format);
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_nanos: u128 = match unit {
            "" => return Err(DurationError::MissingUnit),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(DurationError::UnknownUnit(other.to_string())),
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| DurationError::OutOfRange)?
        };
        let mut amount = whole
            .checked_mul(unit_nanos)
            .ok_or(DurationError::OutOfRange)?;
        // Fractions are truncated to whole nanoseconds, as Go does. Every step is checked:
        // the input decides how large `amount` already is.
        let mut scale = unit_nanos;
        for d in frac_part.bytes() {
            if scale < 10 {
                break;
            }
            scale /= 10;
            amount = amount
                .checked_add(u128::from(d - b'0') * scale)
                .ok_or(DurationError::OutOfRange)?;
        }
        if amount > 1u128 << 63 {
            return Err(DurationError::OutOfRange);
        }
        total = total.checked_add(amount).ok_or(DurationError::OutOfRange)?;
        if total > 1u128 << 63 {
            return Err(DurationError::OutOfRange);
        }
    }
    if negative {
        // total <= 2^63 here, so the i128 negation cannot overflow.
        let total = i128::try_from(total).map_err(|_| DurationError::OutOfRange)?;
        i64::try_from(-total).map_err(|_| DurationError::OutOfRange)
    } else {
        i64::try_from(total).map_err(|_| DurationError::OutOfRange)
    }
}

/// A duration in the agent's config: a Go duration (`30s`, `1m30s`, `100ms`), never negative.
/// Every duration in the config file goes through this one type, as `metav1.Duration` does in
/// Kubernetes component configs; it prints as Go's `Duration.String` prints (`1m30s`, `2m0s`,
/// `100ms`), so the effective configuration reads back as the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(Duration);

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration(Duration::ZERO);

    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    /// The duration itself.
    pub const fn get(self) -> Duration {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<GoDuration> for Duration {
    fn from(d: GoDuration) -> Duration {
        d.0
    }
}

impl TryFrom<Duration> for GoDuration {
    type Error = DurationError;

    /// A duration Go can hold (at most 2562047h47m16.854775807s).
    fn try_from(d: Duration) -> Result<Self, DurationError> {
        if d.as_nanos() > i64::MAX as u128 {
            return Err(DurationError::OutOfRange);
        }
        Ok(Self(d))
    }
}

impl FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, DurationError> {
        let nanos = parse_go_duration(s)?;
        let nanos = u64::try_from(nanos).map_err(|_| DurationError::Negative)?;
        Ok(Self(Duration::from_nanos(nanos)))
    }
}

impl fmt::Display for GoDuration {
    /// Go's `time.Duration.String`: `0s`, `1.5µs`, `100ms`, `1.5s`, `1m30s`, `2h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // At most i64::MAX nanoseconds (parsing and `TryFrom` keep it there).
        let u = u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX);
        const SECOND: u64 = 1_000_000_000;
        if u == 0 {
            return f.write_str("0s");
        }
        if u < SECOND {
            let (unit, prec) = match u {
                ..1_000 => ("ns", 0),
                1_000..1_000_000 => ("\u{b5}s", 3),
                _ => ("ms", 6),
            };
            return write!(f, "{}{unit}", with_fraction(u, prec));
        }
        let seconds = with_fraction(u % (60 * SECOND), 9);
        let minutes = u / (60 * SECOND);
        match (minutes / 60, minutes % 60) {
            (0, 0) => write!(f, "{seconds}s"),
            (0, m) => write!(f, "{m}m{seconds}s"),
            (h, m) => write!(f, "{h}h{m}m{seconds}s"),
        }
    }
}

/// `v / 10^prec` with its fraction, trailing zeros (and a bare point) left out, as Go's
/// `fmtFrac` and `fmtInt` write it.
fn with_fraction(v: u64, prec: u32) -> String {
    let scale = 10u64.pow(prec);
    let (whole, fraction) = (v / scale, v % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:0width$}", width = prec as usize);
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = GoDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Go duration such as 30s, 1m30s or 100ms")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
                v.parse().map_err(|e| {
                    E::custom(format_args!(
                        "{v:?} is not a Go duration such as 30s, 1m30s or 100ms: {e}"
                    ))
                })
            }

            /// A bare number is what the old `*_seconds` and `*_millis` fields took.
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GoDuration, E> {
                Err(E::custom(format_args!(
                    "{v} has no unit; expected a Go duration such as {v}s or {v}ms"
                )))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoDuration, E> {
                Err(E::custom(format_args!(
                    "{v} has no unit; expected a Go duration such as 30s, 1m30s or 100ms"
                )))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoDuration, E> {
                Err(E::custom(format_args!(
                    "{v} has no unit; expected a Go duration such as 1.5s"
                )))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn parses_go_durations() {
        let cases: &[(&str, &str, i64)] = &[
            ("seconds", "30s", 30 * S),
            ("minutes and seconds", "1m30s", 90 * S),
            ("fractional hours", "1.5h", 5400 * S),
            ("bare zero", "0", 0),
            ("zero with unit", "0s", 0),
            ("milliseconds", "250ms", S / 4),
            ("micro sign", "3\u{b5}s", 3000),
            ("negative", "-1s", -S),
            ("leading dot fraction", ".5s", S / 2),
            ("the largest duration", "2562047h47m16.854775807s", i64::MAX),
            (
                "the smallest duration",
                "-2562047h47m16.854775808s",
                i64::MIN,
            ),
            (
                "fraction digits past nanoseconds are dropped",
                "1.0000000009s",
                S,
            ),
        ];
        for (behaviour, input, nanos) in cases {
            assert_eq!(parse_go_duration(input), Ok(*nanos), "{behaviour}");
        }
    }

    #[test]
    fn config_durations_print_as_go_prints_them_and_read_back() {
        let cases: &[(&str, &str)] = &[
            ("0", "0s"),
            ("0s", "0s"),
            ("1ns", "1ns"),
            ("1500ns", "1.5\u{b5}s"),
            ("100ms", "100ms"),
            ("1.25ms", "1.25ms"),
            ("1s", "1s"),
            ("1.5s", "1.5s"),
            ("90s", "1m30s"),
            ("2m", "2m0s"),
            ("1h", "1h0m0s"),
            ("1h0m0.000000001s", "1h0m0.000000001s"),
            ("2562047h47m16.854775807s", "2562047h47m16.854775807s"),
        ];
        for (written, printed) in cases {
            let d: GoDuration = written.parse().unwrap();
            assert_eq!(d.to_string(), *printed, "{written}");
            assert_eq!(printed.parse::<GoDuration>(), Ok(d), "{printed} reads back");
        }
        assert_eq!("-1s".parse::<GoDuration>(), Err(DurationError::Negative));
    }

    #[test]
    fn config_durations_are_strings_with_a_unit() {
        let read =
            |yaml: &str| serde_yaml_ng::from_str::<GoDuration>(yaml).map_err(|e| e.to_string());
        assert_eq!(read("1m30s"), Ok(GoDuration::from_secs(90)));
        let rows: &[(&str, &str)] = &[
            (
                "30",
                "30 has no unit; expected a Go duration such as 30s or 30ms",
            ),
            ("-30", "-30 has no unit"),
            ("1.5", "1.5 has no unit"),
            (
                "soon",
                "\"soon\" is not a Go duration such as 30s, 1m30s or 100ms: expected a Go duration",
            ),
            (
                "-1s",
                "\"-1s\" is not a Go duration such as 30s, 1m30s or 100ms: must not be negative",
            ),
            ("[1s]", "expected a Go duration such as 30s, 1m30s or 100ms"),
        ];
        for (yaml, needle) in rows {
            let error = read(yaml).expect_err(yaml);
            assert!(error.contains(needle), "{yaml}: {error}");
        }
    }

    #[test]
    fn refuses_malformed_durations() {
        let cases: &[(&str, &str, DurationError)] = &[
            ("empty", "", DurationError::Empty),
            ("number without unit", "30", DurationError::MissingUnit),
            (
                "days are not a Go unit",
                "1d",
                DurationError::UnknownUnit("d".into()),
            ),
            ("sign only", "-", DurationError::Format),
            ("dot only", ".s", DurationError::Format),
            (
                "inner sign",
                "1h-1m",
                DurationError::UnknownUnit("h-".into()),
            ),
            ("overflow", "9999999999h", DurationError::OutOfRange),
            (
                "one past the largest",
                "2562047h47m16.854775808s",
                DurationError::OutOfRange,
            ),
            (
                "a sum past the largest",
                "2562047h2562047h",
                DurationError::OutOfRange,
            ),
            // whole × unit fits u128 and the fraction pushes it over: this wrapped to 0.23 s
            // in release builds and panicked in debug ones.
            (
                "a fraction that overflows the integer part",
                "94522879700260684295381835.397777280960h",
                DurationError::OutOfRange,
            ),
            (
                "more digits than any integer holds",
                "1000000000000000000000000000000000000000000000ns",
                DurationError::OutOfRange,
            ),
        ];
        for (behaviour, input, expected) in cases {
            assert_eq!(
                parse_go_duration(input),
                Err(expected.clone()),
                "{behaviour}"
            );
        }
    }
}
