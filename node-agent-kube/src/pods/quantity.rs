//! Kubernetes resource quantities ("128Mi", "1G", "250m", "1e3") as integers.

/// A quantity in base units, rounded up (bytes for memory and storage).
pub fn parse_units(q: &str) -> Option<u64> {
    parse_scaled(q, 1)
}

/// A quantity in thousandths of a unit, rounded up (millicores for CPU).
pub fn parse_millis(q: &str) -> Option<u64> {
    parse_scaled(q, 1000)
}

fn parse_scaled(q: &str, scale: u128) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    // Multiplier as a fraction num/den.
    let (num, den): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..].parse().ok()?;
            (10u128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) || frac.len() > 9 {
        return None;
    }
    let frac_den = 10u128.pow(frac.len() as u32);
    let mantissa: u128 = format!("{int}{frac}").parse().ok()?;
    let top = mantissa.checked_mul(num)?.checked_mul(scale)?;
    let bottom = den * frac_den;
    u64::try_from(top.div_ceil(bottom)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_like_the_api_server() {
        let rows: &[(&str, Option<u64>, Option<u64>)] = &[
            ("128Mi", Some(134_217_728), Some(134_217_728_000)),
            ("1G", Some(1_000_000_000), Some(1_000_000_000_000)),
            ("250m", Some(1), Some(250)),
            ("1.5", Some(2), Some(1500)),
            ("2", Some(2), Some(2000)),
            ("1e3", Some(1000), Some(1_000_000)),
            ("0.5Gi", Some(536_870_912), Some(536_870_912_000)),
            ("", None, None),
            ("12Q", None, None),
            ("-1", None, None),
        ];
        for (q, units, millis) in rows {
            assert_eq!(parse_units(q), *units, "{q} units");
            assert_eq!(parse_millis(q), *millis, "{q} millis");
        }
    }
}
