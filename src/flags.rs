//! What every group of clap flags shares: defaults written once, in the
//! `#[arg(default_value…)]` attributes that `--help` shows, and the one
//! duration syntax (`500ms`, `5s`, `2m`, `1h`, `30d`) every duration flag takes.

use std::time::Duration;

/// The values a group of flags takes when none is given: their clap
/// defaults, with every environment variable ignored, so that defaults are
/// written once, in the `#[arg(default_value…)]` that `--help` shows.
pub fn defaults_of<A: clap::Args + clap::FromArgMatches>() -> Result<A, clap::Error> {
    let command = A::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    A::from_arg_matches(&command.try_get_matches_from(["defaults"])?)
}

/// A setting refused at start-up, naming its flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {value}: {message}")]
pub struct SettingError {
    /// The flag.
    pub flag: &'static str,
    /// The value given.
    pub value: String,
    /// Why it is refused: the invariant it would break.
    pub message: &'static str,
}

/// A duration that `parse_duration` refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. 500ms, 5s, 2m, 1m30s)")]
pub struct DurationError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses `500ms`, `5s`, `2m`, `1h`, `1m30s`, `250us`, `0`; whole numbers only.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_owned(),
        reason,
    };
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c.is_whitespace())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        let part = match unit {
            "ns" => Some(Duration::from_nanos(value)),
            "us" | "µs" => Some(Duration::from_micros(value)),
            "ms" => Some(Duration::from_millis(value)),
            "s" | "sec" => Some(Duration::from_secs(value)),
            "m" | "min" => value.checked_mul(60).map(Duration::from_secs),
            "h" => value.checked_mul(3600).map(Duration::from_secs),
            "d" => value.checked_mul(86_400).map(Duration::from_secs),
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| err("too large"))?;
    }
    Ok(total)
}

/// Formats a duration so that `parse_duration` reads it back: `30s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.subsec_nanos();
    let secs = d.as_secs();
    if nanos == 0 {
        // The largest unit that divides it, as a person would write it.
        match secs {
            0 => "0s".to_owned(),
            s if s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
            s if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
            s if s.is_multiple_of(60) => format!("{}m", s / 60),
            s => format!("{s}s"),
        }
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", d.as_micros())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration(" 0 ").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0ms").unwrap(), Duration::ZERO);
    }

    #[test]
    fn durations_without_unit_or_number_are_refused() {
        for bad in [
            "",
            "5",
            "ms",
            "5x",
            "1.5s",
            "-1s",
            "s5",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        let err = parse_duration("5").unwrap_err().to_string();
        assert!(err.contains("missing unit"), "{err}");
    }

    #[test]
    fn formatted_durations_parse_back() {
        for d in [
            Duration::ZERO,
            Duration::from_secs(30),
            Duration::from_millis(1500),
            Duration::from_micros(7),
            Duration::from_nanos(3),
        ] {
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(7_200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(30 * 86_400)), "30d");
    }
}
