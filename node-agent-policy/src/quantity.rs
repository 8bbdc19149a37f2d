//! Kubernetes quantities (`resource.Quantity`): parsing and the canonical text form the kubelet
//! prints in eviction messages. Values are held exactly, in nano-units, so `100m` and `1.5Gi`
//! compare like the API machinery compares them.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// How a quantity prints, as in `resource.Format`: it follows the suffix it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Binary suffixes (`Ki`, `Mi`, ...).
    BinarySi,
    /// Decimal suffixes (`m`, `k`, `M`, ...) and plain numbers.
    DecimalSi,
    /// Exponent form (`1e9`).
    DecimalExponent,
}

/// A Kubernetes quantity: an exact value plus the format it prints in.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error("quantities must match [+-]<digits>[.<digits>]<suffix>, e.g. 500Mi, 1.5G, 100m, 1e9")]
    Format,
    #[error("unknown suffix {0:?}; expected one of n u m k M G T P E Ki Mi Gi Ti Pi Ei or an exponent e<N>")]
    Suffix(String),
    #[error("quantity is out of range")]
    OutOfRange,
}

/// Nano-units per unit.
pub(crate) const NANOS: i128 = 1_000_000_000;

impl Quantity {
    /// An integer quantity in the given format, as `resource.NewQuantity(v, format)`.
    pub fn from_int(value: i64, format: Format) -> Quantity {
        Quantity {
            nanos: i128::from(value) * NANOS,
            format,
        }
    }

    /// The value in nano-units (`1` is `1_000_000_000`).
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The format this quantity prints in.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The value rounded up to an integer, as `Quantity.Value()`; saturates at the `i64` range
    /// (where Go's result is undefined). For input that must fit, use [`Quantity::checked_value`].
    pub fn value(&self) -> i64 {
        self.checked_value()
            .unwrap_or(if self.nanos < 0 { i64::MIN } else { i64::MAX })
    }

    /// The value rounded up to an integer, or [`QuantityError::OutOfRange`] when an `i64`
    /// cannot hold it (only decimal quantities can be that large: binary ones are capped).
    pub fn checked_value(&self) -> Result<i64, QuantityError> {
        let whole = self.nanos.div_euclid(NANOS) + i128::from(self.nanos.rem_euclid(NANOS) != 0);
        i64::try_from(whole).map_err(|_| QuantityError::OutOfRange)
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// Compares values, ignoring format.
    pub fn cmp_value(&self, other: &Quantity) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }

    /// The sum, as `Quantity.Add`: it keeps this quantity's format unless this one is zero.
    /// Saturates at the `i128` nano-unit range.
    pub fn saturating_add(&self, other: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    /// Parses as `resource.ParseQuantity`: sign, digits with an optional fraction, then a
    /// suffix. Precision finer than a nano-unit rounds away from zero, as the API machinery does.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let bytes = s.as_bytes();
        let mut pos = 0;
        let negative = match bytes[0] {
            b'-' => {
                pos = 1;
                true
            }
            b'+' => {
                pos = 1;
                false
            }
            _ => false,
        };
        let int_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let int_digits = &s[int_start..pos];
        let mut frac_digits = "";
        if pos < bytes.len() && bytes[pos] == b'.' {
            pos += 1;
            let frac_start = pos;
            while pos < bytes.len() && bytes[pos].is_ascii_digit() {
                pos += 1;
            }
            frac_digits = &s[frac_start..pos];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(QuantityError::Format);
        }
        let suffix = &s[pos..];
        let (decimal_exp, binary_exp, format) = interpret_suffix(suffix)?;

        let mut mantissa: i128 = 0;
        for d in int_digits.bytes().chain(frac_digits.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(d - b'0')))
                .ok_or(QuantityError::OutOfRange)?;
        }
        let frac_len = i32::try_from(frac_digits.len()).map_err(|_| QuantityError::OutOfRange)?;
        // value = mantissa * 10^(decimal_exp - frac_len) * 2^binary_exp, held in nanos.
        let exp10 = decimal_exp - frac_len + 9;
        let mut nanos = mantissa
            .checked_mul(1i128 << binary_exp)
            .ok_or(QuantityError::OutOfRange)?;
        if exp10 >= 0 {
            let scale = pow10(exp10).ok_or(QuantityError::OutOfRange)?;
            nanos = nanos.checked_mul(scale).ok_or(QuantityError::OutOfRange)?;
        } else {
            match pow10(-exp10) {
                Some(scale) => {
                    let rounded_up = nanos % scale != 0;
                    nanos = nanos / scale + i128::from(rounded_up);
                }
                // Smaller than a nano-unit: rounds up to one nano-unit unless zero.
                None => nanos = i128::from(nanos != 0),
            }
        }
        // ParseQuantity caps binary amounts at the int64 range ("the max is just a simple
        // cap"); decimal ones stay exact.
        if format == Format::BinarySi {
            nanos = nanos.min(MAX_BINARY_NANOS);
        }
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }
}

/// `2^63 - 1` units, the most a binary-suffixed quantity holds after parsing.
const MAX_BINARY_NANOS: i128 = i64::MAX as i128 * NANOS;

fn pow10(exp: i32) -> Option<i128> {
    10i128.checked_pow(u32::try_from(exp).ok()?)
}

/// (decimal exponent, binary exponent, format) for a suffix, as the API machinery's suffixer.
fn interpret_suffix(suffix: &str) -> Result<(i32, u32, Format), QuantityError> {
    let decimal = |e| Ok((e, 0, Format::DecimalSi));
    let binary = |e| Ok((0, e, Format::BinarySi));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or_else(|| suffix_error(suffix))?;
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(suffix_error(suffix));
            }
            let exp: i32 = rest.parse().map_err(|_| QuantityError::OutOfRange)?;
            if !(-60..=60).contains(&exp) {
                return Err(QuantityError::OutOfRange);
            }
            Ok((exp, 0, Format::DecimalExponent))
        }
    }
}

fn suffix_error(suffix: &str) -> QuantityError {
    if suffix.contains(|c: char| c.is_ascii_digit() || c == '.' || c == '-' || c == '+') {
        QuantityError::Format
    } else {
        QuantityError::Suffix(suffix.to_string())
    }
}

impl fmt::Display for Quantity {
    /// The canonical form of `Quantity.String()`: `1536Mi`, `1Gi`, `500M`, `100m`, `1e9`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let mut format = self.format;
        if format == Format::BinarySi
            && (self.nanos.abs() < 1024 * NANOS || self.nanos % NANOS != 0)
        {
            // Small or fractional binary quantities print in decimal, to avoid rounding.
            format = Format::DecimalSi;
        }
        if format == Format::BinarySi {
            let mut amount = self.nanos / NANOS;
            let mut exp = 0;
            while exp < 6 && amount % 1024 == 0 {
                amount /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return write!(f, "{amount}{suffix}");
        }
        let mut amount = self.nanos;
        let mut exp: i32 = -9;
        while amount % 10 == 0 {
            amount /= 10;
            exp += 1;
        }
        let down = exp.rem_euclid(3);
        amount *= 10i128.pow(down.unsigned_abs());
        exp -= down;
        if format == Format::DecimalExponent {
            return if exp == 0 {
                write!(f, "{amount}")
            } else {
                write!(f, "{amount}e{exp}")
            };
        }
        while exp > 18 {
            amount *= 1000;
            exp -= 3;
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        write!(f, "{amount}{suffix}")
    }
}

/// An amount of bytes in the agent's config, written as a Kubernetes quantity (`1Mi`, `8Gi`,
/// `500M`, or a plain number of bytes). Every size in the config file goes through this one
/// type: a whole number of bytes (`1m` is a thousandth of one), not negative, within the int64
/// range the API machinery holds. It prints in the quantity's canonical form.
#[derive(Debug, Clone, Copy)]
pub struct ByteSize {
    bytes: u64,
    quantity: Quantity,
}

/// Why a quantity is not a size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error("must not be negative")]
    Negative,
    #[error("is not a whole number of bytes (`m` is a thousandth; mebibytes are Mi)")]
    Fraction,
    #[error("is beyond what 64 bits of bytes hold")]
    OutOfRange,
}

impl ByteSize {
    /// `bytes` in binary form (`1048576` prints as `1Mi`); past `i64::MAX` it saturates there.
    pub fn from_bytes(bytes: u64) -> Self {
        let bytes = bytes.min(i64::MAX as u64);
        Self {
            bytes,
            quantity: Quantity::from_int(bytes as i64, Format::BinarySi),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl PartialEq for ByteSize {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for ByteSize {}

impl FromStr for ByteSize {
    type Err = ByteSizeError;

    fn from_str(s: &str) -> Result<Self, ByteSizeError> {
        let quantity: Quantity = s.parse()?;
        if quantity.is_negative() {
            return Err(ByteSizeError::Negative);
        }
        if quantity.nanos() % NANOS != 0 {
            return Err(ByteSizeError::Fraction);
        }
        let bytes = quantity
            .checked_value()
            .map_err(|_| ByteSizeError::OutOfRange)?;
        Ok(Self {
            bytes: bytes.unsigned_abs(),
            quantity,
        })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.quantity.fmt(f)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size as a Kubernetes quantity such as 512Mi, 8Gi or 1000000")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(|e| {
                    E::custom(format_args!(
                        "{v:?} is not a size as a Kubernetes quantity such as 512Mi or 8Gi: {e}"
                    ))
                })
            }

            /// YAML reads `1048576` as a number; the API machinery takes numbers too.
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                self.visit_str(&v.to_string())
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                self.visit_str(&v.to_string())
            }

            /// YAML reads `1e3` as a float: a whole one within range is that many bytes.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                if v.is_finite() && v.fract() == 0.0 && v.abs() < 9.2e18 {
                    return self.visit_i64(v as i64);
                }
                Err(E::custom(format_args!(
                    "{v} is not a whole number of bytes; expected a Kubernetes quantity such as 512Mi"
                )))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_whole_bytes_in_quantities() {
        let read =
            |yaml: &str| serde_yaml_ng::from_str::<ByteSize>(yaml).map_err(|e| e.to_string());
        /// The bytes and how they print, or a fragment of the refusal.
        type Expected = Result<(u64, &'static str), &'static str>;
        #[rustfmt::skip]
        let rows: &[(&str, Expected)] = &[
            ("1Mi", Ok((1 << 20, "1Mi"))),
            ("1e3", Ok((1000, "1k"))),
            ("-1e3", Err("must not be negative")),
            ("1048576", Ok((1 << 20, "1048576"))),
            ("'4096'", Ok((4096, "4096"))),
            ("1.5Gi", Ok((3 << 29, "1536Mi"))),
            ("500M", Ok((500_000_000, "500M"))),
            ("0", Ok((0, "0"))),
            ("1m", Err("\"1m\" is not a size as a Kubernetes quantity such as 512Mi or 8Gi: is not a whole number of bytes")),
            ("-1Gi", Err("must not be negative")),
            ("20E", Err("is beyond what 64 bits of bytes hold")),
            ("lots", Err("\"lots\" is not a size")),
            ("1.5", Err("1.5 is not a whole number of bytes")),
            ("-5", Err("must not be negative")),
            ("{a: 1}", Err("expected a size as a Kubernetes quantity")),
        ];
        for (yaml, want) in rows {
            match (read(yaml), want) {
                (Ok(size), Ok((bytes, printed))) => {
                    assert_eq!(
                        (size.bytes(), size.to_string().as_str()),
                        (*bytes, *printed),
                        "{yaml}"
                    );
                    assert_eq!(
                        printed.parse::<ByteSize>(),
                        Ok(size),
                        "{printed} reads back"
                    );
                }
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{yaml}: {e}"),
                (got, _) => panic!("{yaml}: {got:?}, expected {want:?}"),
            }
        }
        assert_eq!(ByteSize::from_bytes(1 << 20).to_string(), "1Mi");
    }

    #[test]
    fn parses_and_prints_canonically() {
        let cases: &[(&str, &str, &str, i64)] = &[
            ("binary suffix keeps its form", "500Mi", "500Mi", 500 << 20),
            ("binary suffix canonicalises up", "1024Mi", "1Gi", 1 << 30),
            ("fractional binary is exact", "1.5Gi", "1536Mi", 3 << 29),
            ("decimal suffix", "500M", "500M", 500_000_000),
            ("decimal fraction", "1.5G", "1500M", 1_500_000_000),
            ("plain number", "1000000", "1M", 1_000_000),
            ("milli rounds up in value", "100m", "100m", 1),
            ("exponent form", "1e9", "1e9", 1_000_000_000),
            ("upper-case exponent", "1E3", "1e3", 1000),
            (
                "exa is a suffix, not an exponent",
                "1E",
                "1E",
                1_000_000_000_000_000_000,
            ),
            ("kilo", "2k", "2k", 2000),
            ("small binary prints decimal", "0.5Ki", "512", 512),
            ("zero", "0", "0", 0),
            ("explicit plus sign", "+1Ki", "1Ki", 1024),
            ("leading fraction dot", ".5M", "500k", 500_000),
            ("negative", "-1Gi", "-1Gi", -(1 << 30)),
            ("nano", "5n", "5n", 1),
        ];
        for (behaviour, input, printed, value) in cases {
            let q: Quantity = input
                .parse()
                .unwrap_or_else(|e| panic!("{behaviour}: {input}: {e}"));
            assert_eq!(q.to_string(), *printed, "{behaviour}");
            assert_eq!(q.value(), *value, "{behaviour}");
        }
    }

    #[test]
    fn refuses_malformed_quantities() {
        let cases: &[(&str, &str, QuantityError)] = &[
            ("empty", "", QuantityError::Empty),
            ("operator inside the value", "<500Mi", QuantityError::Format),
            ("no digits", "Mi", QuantityError::Format),
            ("upper-case kilo", "1K", QuantityError::Suffix("K".into())),
            (
                "unknown suffix",
                "12parsecs",
                QuantityError::Suffix("parsecs".into()),
            ),
            ("two dots", "1.5.5", QuantityError::Format),
            ("space", "1 Gi", QuantityError::Suffix(" Gi".into())),
            (
                "percentage is not a quantity",
                "10%",
                QuantityError::Suffix("%".into()),
            ),
            ("huge exponent", "1e99", QuantityError::OutOfRange),
        ];
        for (behaviour, input, expected) in cases {
            assert_eq!(
                input.parse::<Quantity>().unwrap_err(),
                *expected,
                "{behaviour}"
            );
        }
    }

    #[test]
    fn binary_quantities_cap_at_the_int64_range_like_parse_quantity() {
        // apimachinery's ParseQuantity caps BinarySI amounts at 2^63-1 ("the max is just a
        // simple cap"); decimal ones stay exact, however large.
        const MAX_NANOS: i128 = i64::MAX as i128 * NANOS;
        #[rustfmt::skip]
        let rows: &[(&str, &str, i128, &str)] = &[
            ("8Ei is one past the cap", "8Ei", MAX_NANOS, "9223372036854775807"),
            ("10Ei is capped", "10Ei", MAX_NANOS, "9223372036854775807"),
            ("a huge binary mantissa is capped", "99999999999999999999Ki", MAX_NANOS, "9223372036854775807"),
            ("the cap holds for negatives", "-10Ei", -MAX_NANOS, "-9223372036854775807"),
            ("just below the cap is exact", "8191Pi", (8191 << 50) * NANOS, "8191Pi"),
            ("decimal beyond int64 stays exact", "20E", 20 * NANOS * 1_000_000_000_000_000_000, "20E"),
            ("a plain number beyond int64 stays exact", "9223372036854775808", 9_223_372_036_854_775_808 * NANOS, "9223372036854775808"),
        ];
        for (behaviour, input, nanos, printed) in rows {
            let q: Quantity = input.parse().unwrap_or_else(|e| panic!("{behaviour}: {e}"));
            assert_eq!(q.nanos(), *nanos, "{behaviour}");
            assert_eq!(q.to_string(), *printed, "{behaviour}");
        }
    }

    #[test]
    fn checked_value_refuses_what_int64_cannot_hold() {
        #[rustfmt::skip]
        let rows: &[(&str, Result<i64, QuantityError>)] = &[
            ("1Gi", Ok(1 << 30)),
            ("100m", Ok(1)),
            ("-100m", Ok(0)),
            ("10Ei", Ok(i64::MAX)),
            ("9223372036854775807", Ok(i64::MAX)),
            ("9223372036854775808", Err(QuantityError::OutOfRange)),
            ("9223372036854775807.5", Err(QuantityError::OutOfRange)),
            ("20E", Err(QuantityError::OutOfRange)),
            ("-9223372036854775808", Ok(i64::MIN)),
            ("-9223372036854775809", Err(QuantityError::OutOfRange)),
        ];
        for (input, expected) in rows {
            let q: Quantity = input.parse().expect("a quantity");
            assert_eq!(q.checked_value(), *expected, "{input}");
        }
    }

    #[test]
    fn integer_quantities_print_like_new_quantity() {
        assert_eq!(
            Quantity::from_int(1536 << 20, Format::BinarySi).to_string(),
            "1536Mi"
        );
        assert_eq!(
            Quantity::from_int(50_000, Format::BinarySi).to_string(),
            "50000"
        );
        assert_eq!(
            Quantity::from_int(1000, Format::DecimalSi).to_string(),
            "1k"
        );
        assert_eq!(Quantity::from_int(100, Format::BinarySi).to_string(), "100");
    }
}
