//! The allowed range of every duration option, checked when the arguments are parsed
//! (clap's value parsers in [`crate::cli`] call [`Bounds::parse`], so a value from the
//! environment is checked too) and again by [`crate::config::RunConfig`].
//! A value out of range is refused in one line that gives the range; nothing of the
//! run starts. Part of [`crate::config`]; depends on nothing else in the crate.
//!
//! Why bounds at all: a TTL the backend cannot store (`--ttl 292000000000y`) used to
//! make the acquire script fail halfway, and durations far beyond what a timer can
//! represent used to reach `Instant + Duration` arithmetic. With every duration under
//! a year, no sum of an instant and a configured duration can overflow, and every
//! value the backends store as an expiry is one they accept.

use std::time::Duration;

use super::ConfigError;

/// A day: the longest lease every backend takes ([`crate::backend::MAX_LEASE`]).
const DAY: Duration = crate::backend::MAX_LEASE;

/// The range of one duration option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The option, as typed (`--ttl`).
    pub option: &'static str,
    /// The shortest value allowed.
    pub min: Duration,
    /// The longest value allowed.
    pub max: Duration,
    /// The range in words, in the humantime syntax the option takes (`100ms to 24h`).
    pub range: &'static str,
}

/// `--ttl`: from 100 ms (below that the lease ends before a renewal round trip on a
/// loaded host) to 24 h, as Consul bounds its session TTLs. Every backend stores the
/// TTL as an expiry in milliseconds or seconds; a day is far inside what each accepts,
/// and it is the expiry a lock found without one is given.
pub const TTL: Bounds = Bounds {
    option: "--ttl",
    min: Duration::from_millis(100),
    max: DAY,
    range: "100ms to 24h",
};

/// `--renew-every`: at least 10 ms (the finding was 1 ns: thousands of renewals a
/// second against a shared server), at most the longest TTL; shorter than `--ttl`
/// too, which [`crate::config::RunConfig`] checks once both are known.
pub const RENEW_EVERY: Bounds = Bounds {
    option: "--renew-every",
    min: Duration::from_millis(10),
    max: DAY,
    range: "10ms to 24h, and shorter than --ttl",
};

/// `--splay`: up to a day. A pause to spread a fleet's cron tick; longer than a day
/// would spread one day's runs into the next.
pub const SPLAY: Bounds = Bounds {
    option: "--splay",
    min: Duration::ZERO,
    max: DAY,
    range: "0 to 24h",
};

/// `--once-per`: from 1 ms to 7 days, the time every backend keeps a run record at
/// least (the fencing counter's on Redis, the record row's on PostgreSQL): a longer
/// period could outlive the success it is judged by.
pub const ONCE_PER: Bounds = Bounds {
    option: "--once-per",
    min: Duration::from_millis(1),
    max: Duration::from_secs(7 * 24 * 60 * 60),
    range: "1ms to 7d",
};

/// `--wait`: up to 365 days. Waiting is measured on the local clock only; a year is
/// longer than any sensible wait and keeps the deadline well inside tokio's timer
/// range (2^36 ms, about 2.2 years), so no waiting deadline can overflow.
pub const WAIT: Bounds = Bounds {
    option: "--wait",
    min: Duration::ZERO,
    max: Duration::from_secs(365 * 24 * 60 * 60),
    range: "0 to 365d",
};

/// `--hold-at-least`: at most the longest TTL. After the command ends, the lock is
/// kept by giving its key an expiry of the time left: the backends store it like a
/// TTL, so it gets the TTL's limit (and a lock is never kept longer than a lock
/// without an expiry would be).
pub const HOLD_AT_LEAST: Bounds = Bounds {
    option: "--hold-at-least",
    min: Duration::ZERO,
    max: DAY,
    range: "0 to 24h",
};

/// `--kill-after`: at most a day. On a lost lock SIGKILL comes at the lease deadline
/// anyway (at most a TTL later); the grace only matters after `--max-runtime` or for
/// what the command leaves running, where a day is more than any clean shutdown needs.
pub const KILL_AFTER: Bounds = Bounds {
    option: "--kill-after",
    min: Duration::ZERO,
    max: DAY,
    range: "0 to 24h",
};

/// `--max-runtime`: 0 (no limit) to 365 days, the same local-timer limit as `--wait`.
pub const MAX_RUNTIME: Bounds = Bounds {
    option: "--max-runtime",
    min: Duration::ZERO,
    max: Duration::from_secs(365 * 24 * 60 * 60),
    range: "0 (no limit) to 365d",
};

/// Every bound, for tests and documentation.
pub const ALL: &[Bounds] = &[
    TTL,
    RENEW_EVERY,
    WAIT,
    HOLD_AT_LEAST,
    KILL_AFTER,
    MAX_RUNTIME,
];

impl Bounds {
    /// Parses a humantime duration (`"0"` is zero) and checks it: clap's value parser.
    /// The error is the reason only; clap puts the option and the value before it.
    pub fn parse(&self, s: &str) -> Result<Duration, String> {
        let d = humantime::parse_duration(s.trim())
            .map_err(|e| format!("{e} (examples: 500ms, 30s, 5m, \"1h 30m\")"))?;
        self.check(d)
            .map_err(|_| format!("out of range: use {}", self.range))
    }

    /// Checks a duration against the range.
    pub fn check(&self, d: Duration) -> Result<Duration, ConfigError> {
        if (self.min..=self.max).contains(&d) {
            Ok(d)
        } else {
            Err(ConfigError::OutOfRange {
                option: self.option,
                range: self.range,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_in_words_is_the_range_checked() {
        for b in ALL {
            let (low, high) = b.range.split_once(" to ").unwrap();
            let low = low.split(' ').next().unwrap();
            let high = high.split(',').next().unwrap();
            assert_eq!(b.parse(low), Ok(b.min), "{}", b.option);
            assert_eq!(b.parse(high), Ok(b.max), "{}", b.option);
            assert_eq!(humantime::parse_duration(high).unwrap(), b.max);
        }
    }

    #[test]
    fn values_just_outside_the_range_are_refused_with_the_range() {
        for b in ALL {
            let above = b.max + Duration::from_nanos(1);
            let e = b.check(above).unwrap_err();
            assert!(e.to_string().contains(b.range), "{e}");
            assert!(e.to_string().starts_with(b.option), "{e}");
            if let Some(below) = b.min.checked_sub(Duration::from_nanos(1)) {
                assert!(b.check(below).is_err(), "{} {below:?}", b.option);
            }
        }
        assert!(TTL.parse("99ms").unwrap_err().contains("100ms to 24h"));
        assert!(RENEW_EVERY.parse("1ns").unwrap_err().contains("10ms"));
        assert!(WAIT.parse("366d").unwrap_err().contains("0 to 365d"));
    }

    #[test]
    fn values_too_large_for_a_duration_are_refused_not_a_panic() {
        for s in [
            "500000000000y",
            "292000000000y",
            "18446744073709551615s",
            "18446744073709551616s",
            "99999999999999999999999999h",
        ] {
            for b in ALL {
                assert!(b.parse(s).is_err(), "{} {s}", b.option);
            }
        }
        assert!(WAIT.parse("5x").unwrap_err().contains("examples"));
        assert!(WAIT.parse("-1s").is_err());
    }
}
