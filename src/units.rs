//! Durations, times and untrusted text as messages show them. A leaf: it depends on
//! nothing in the crate.

use std::borrow::Cow;
use std::time::{Duration, UNIX_EPOCH};

/// A duration rounded to milliseconds, for messages (`1s 484ms`).
pub(crate) fn ms(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// The last millisecond RFC 3339 can write: 9999-12-31T23:59:59.999Z. humantime panics
/// on a later time, and a stored holder's start time is whatever a backend holds.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

/// Milliseconds since the Unix epoch as RFC 3339 (seconds, UTC), or `None` past the
/// year 9999, which RFC 3339 cannot write (a time read from a backend is untrusted: a
/// broken or hostile writer may store any number there).
pub(crate) fn rfc3339_ms(ms: u64) -> Option<String> {
    (ms <= LAST_RFC3339_MS).then(|| {
        humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
    })
}

/// `text` with every control character escaped (`\n`, `\u{1b}`, ...), for a text line
/// that shows something read from a backend: a host name with a newline or a terminal
/// escape must not forge a line or repaint the screen of the person reading it.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_to_the_millisecond() {
        assert_eq!(ms(Duration::from_micros(1_484_999)), "1s 484ms");
        assert_eq!(ms(Duration::from_micros(999)), "0s");
    }

    #[test]
    fn times_past_the_year_9999_are_not_written() {
        assert_eq!(
            rfc3339_ms(1_714_557_600_000).unwrap(),
            "2024-05-01T10:00:00Z"
        );
        assert_eq!(rfc3339_ms(LAST_RFC3339_MS).unwrap(), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339_ms(LAST_RFC3339_MS + 1), None);
        assert_eq!(rfc3339_ms(u64::MAX), None);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(printable("web-1 é"), Cow::Borrowed("web-1 é")));
        assert_eq!(
            printable("h\nlockrun: acquired lock\u{1b}[2J\t\u{7f}"),
            "h\\nlockrun: acquired lock\\u{1b}[2J\\t\\u{7f}"
        );
    }
}
