//! Sizes and durations as people write them (`256MiB`, `1.5GiB`, `30s`,
//! `2m`), parsed once for every front end: manifests, backend settings,
//! the CLI's flags.

use std::time::Duration;

/// A size or duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// Not a number followed by an optional unit.
    #[error("{text:?} is not a size (examples: 268435456, 256MiB, 1.5GiB)")]
    NotASize {
        /// What was given.
        text: String,
    },
    /// A number with a unit this parser does not know.
    #[error("{text:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB or TiB)")]
    UnknownSizeUnit {
        /// What was given.
        text: String,
        /// The unit part.
        unit: String,
    },
    /// More bytes than a `u64` holds.
    #[error("{text:?} is too large")]
    TooLarge {
        /// What was given.
        text: String,
    },
    /// Not a duration.
    #[error("{text:?} is not a duration (examples: 500ms, 30s, 10m, 1h, 0)")]
    NotADuration {
        /// What was given.
        text: String,
    },
}

/// Splits `text` into its number and its unit (spaces between allowed).
fn split_number(text: &str) -> (&str, &str) {
    let t = text.trim();
    let at = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(at);
    (number, unit.trim())
}

/// Parses a size in bytes: `268435456`, `256MiB`, `1.5GiB`, `512k`, `64M`.
/// Units are binary (`K`, `KB` and `KiB` are all 1024 bytes), case does
/// not matter; a fraction is rounded down to whole bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let (number, unit) = split_number(text);
    let not_a_size = || UnitError::NotASize {
        text: text.to_string(),
    };
    if number.is_empty() {
        return Err(not_a_size());
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(UnitError::UnknownSizeUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    let too_large = || UnitError::TooLarge {
        text: text.to_string(),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(too_large);
    }
    let fraction: f64 = number.parse().map_err(|_| not_a_size())?;
    let bytes = fraction * multiplier as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

/// A size as [`parse_size`] reads it back, exact: `2GiB`, `1536MiB`,
/// `4097` (bytes, when no binary unit divides it).
pub fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses a duration: `500ms`, `30s`, `10m`, `1h`, `1d`, a bare number of
/// seconds, `1.5h`; `0` is [`Duration::ZERO`].
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (number, unit) = split_number(text);
    let not_a_duration = || UnitError::NotADuration {
        text: text.to_string(),
    };
    let n: f64 = number.parse().map_err(|_| not_a_duration())?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(not_a_duration()),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| not_a_duration())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        for bytes in [1, 4097, 1 << 10, 3 << 29, 2 << 30, 10 << 30, 5 << 40] {
            assert_eq!(
                parse_size(&size_text(bytes)),
                Ok(bytes),
                "{}",
                size_text(bytes)
            );
        }
        assert_eq!(size_text(2 << 30), "2GiB");
        assert!(matches!(
            parse_size("12 parsecs"),
            Err(UnitError::UnknownSizeUnit { .. })
        ));
        assert!(matches!(parse_size("MiB"), Err(UnitError::NotASize { .. })));
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(UnitError::TooLarge { .. })
        ));
    }

    #[test]
    fn every_whole_size_round_trips_through_each_unit() {
        // Seeded, generated: n of each unit is n times the unit.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..500 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let n = seed % 1_000_000;
            for (unit, shift) in [("", 0), ("KiB", 10), ("M", 20), ("gb", 30)] {
                assert_eq!(parse_size(&format!("{n}{unit}")), Ok(n << shift));
            }
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("3 fortnights").is_err());
    }
}
