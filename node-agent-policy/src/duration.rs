//! Go duration syntax (`time.ParseDuration`), as the kubelet reads `1m30s`.

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
