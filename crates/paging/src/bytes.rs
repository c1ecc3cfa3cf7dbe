//! Human-readable byte sizes: parsing (`"1.5GiB"`) and formatting.

use crate::{PagingError, Result};

/// What [`parse_bytes`] accepts, appended to every error message.
const ACCEPTED: &str = "expected a positive number of bytes with an optional unit, \
     e.g. 123456, 900M, 900MiB, 1.5GB or \"0.9 GiB\" \
     (K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000)";

/// Parses a byte size such as `"1.3GiB"`, `"900MiB"`, `"900M"`, `"2G"`,
/// `"1.5GB"`, `"512KiB"`, `"123456"` or `"0.9 GiB"`.
///
/// Units are case-insensitive and may be separated from the number by
/// spaces. `K`, `M`, `G`, `T` and `KiB`, `MiB`, `GiB`, `TiB` are binary
/// (powers of 1024); `KB`, `MB`, `GB`, `TB` are decimal (powers of 1000);
/// `B` or no unit means bytes. The number may have a fractional part; the
/// result is rounded down to whole bytes. Empty, negative, zero (also after
/// rounding), non-numeric and out-of-range sizes give
/// [`PagingError::BadSize`].
pub fn parse_bytes(s: &str) -> Result<u64> {
    let bad = |why: &str| PagingError::BadSize(format!("invalid size {s:?}: {why}; {ACCEPTED}"));

    let text = s.trim();
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());

    if !number.bytes().any(|b| b.is_ascii_digit()) {
        return Err(bad("it does not start with a number"));
    }
    if number.bytes().filter(|&b| b == b'.').count() > 1 {
        return Err(bad("the number has more than one decimal point"));
    }
    let Some(multiplier) = unit_multiplier(unit) else {
        return Err(bad(&format!("unknown unit {unit:?}")));
    };

    let bytes = if number.contains('.') {
        let value: f64 = number
            .parse()
            .map_err(|_| bad("the number cannot be read"))?;
        let bytes = (value * multiplier as f64).floor();
        // The number is digits and a point, so never NaN or negative. 2^64
        // is exactly representable; anything at or above it does not fit.
        if bytes >= 18_446_744_073_709_551_616.0 {
            return Err(bad("it is too large"));
        }
        bytes as u64
    } else {
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
            .ok_or_else(|| bad("it is too large"))?
    };

    if bytes == 0 {
        return Err(bad("it is zero"));
    }
    Ok(bytes)
}

/// Bytes per unit for a (possibly empty) unit suffix, ignoring case.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_uppercase();
    let (prefix, rest) = match unit.chars().next() {
        None => return Some(1),
        Some(c) => unit.split_at(c.len_utf8()),
    };
    let power = match prefix {
        "B" if rest.is_empty() => return Some(1),
        "K" => 1,
        "M" => 2,
        "G" => 3,
        "T" => 4,
        _ => return None,
    };
    let base: u64 = match rest {
        "" | "I" | "IB" => 1024,
        "B" => 1000,
        _ => return None,
    };
    Some(base.pow(power))
}

/// Formats a byte count for people: `12 B`, `4.9 KiB`, `900.0 MiB`,
/// `1.30 GiB`.
///
/// Binary units are used throughout. Kibibytes and mebibytes get one
/// decimal, gibibytes and larger two, plain bytes none.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut value = b as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let decimals = if unit < 2 { 1 } else { 2 };
    format!("{value:.decimals$} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const KI: u64 = 1024;
    const MI: u64 = 1024 * 1024;
    const GI: u64 = 1024 * 1024 * 1024;

    #[test]
    fn parses_accepted_forms() {
        let cases: &[(&str, u64)] = &[
            ("123456", 123_456),
            ("1", 1),
            ("12B", 12),
            ("12 b", 12),
            ("512KiB", 512 * KI),
            ("512k", 512 * KI),
            ("512Ki", 512 * KI),
            ("512KB", 512_000),
            ("900MiB", 900 * MI),
            ("900M", 900 * MI),
            ("900m", 900 * MI),
            ("900mib", 900 * MI),
            ("900MB", 900_000_000),
            ("2G", 2 * GI),
            ("2GiB", 2 * GI),
            ("1.5GB", 1_500_000_000),
            ("1.5GiB", 3 * GI / 2),
            ("1.3GiB", (1.3 * GI as f64) as u64),
            ("0.9 GiB", (0.9 * GI as f64) as u64),
            ("  0.9   gib  ", (0.9 * GI as f64) as u64),
            (".5K", 512),
            ("3.", 3),
            ("1T", 1 << 40),
            ("1TB", 1_000_000_000_000),
            ("1.5", 1),
            ("16777215TiB", ((1 << 24) - 1) << 40),
            ("18446744073709551615", u64::MAX),
        ];
        for &(text, want) in cases {
            match parse_bytes(text) {
                Ok(got) => assert_eq!(got, want, "parse_bytes({text:?})"),
                Err(e) => panic!("parse_bytes({text:?}) failed: {e}"),
            }
        }
    }

    #[test]
    fn rejects_bad_forms() {
        for text in [
            "",
            "   ",
            "0",
            "0GiB",
            "0.0001B",
            "-1",
            "-1G",
            "+1G",
            "NaN",
            "nan",
            "inf",
            "1e9",
            "G",
            "1.2.3M",
            "1 2",
            "12XB",
            "12 bytes",
            "1GiBB",
            "1Bi",
            "1PiB",
            "18446744073709551616",
            "16777216TiB",
            "16777216.0TiB",
            "99999999999999999999999999G",
            "17179869184G",
            "1,5G",
            "1µB",
        ] {
            match parse_bytes(text) {
                Err(PagingError::BadSize(msg)) => {
                    assert!(msg.contains(&format!("{text:?}")), "{msg}");
                    assert!(msg.contains("KiB"), "{msg}");
                }
                other => panic!("parse_bytes({text:?}) should fail, got {other:?}"),
            }
        }
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(12), "12 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.0 KiB");
        assert_eq!(format_bytes(5000), "4.9 KiB");
        assert_eq!(format_bytes(943_718_400), "900.0 MiB");
        assert_eq!(format_bytes(1_395_864_371), "1.30 GiB");
        assert_eq!(format_bytes(3 << 40), "3.00 TiB");
        assert_eq!(format_bytes(u64::MAX), "16.00 EiB");
    }

    #[test]
    fn format_then_parse_is_close() {
        for b in [1u64, 999, 4096, 5000, 943_718_400, 1_395_864_371, 7 << 40] {
            let back = parse_bytes(&format_bytes(b)).unwrap();
            let err = back.abs_diff(b) as f64 / b as f64;
            assert!(err < 0.01, "{b} -> {} -> {back}", format_bytes(b));
        }
    }
}
