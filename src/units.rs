//! Durations as messages show them. A leaf: it depends on nothing in the crate.

use std::time::Duration;

/// A duration rounded to milliseconds, for messages (`1s 484ms`).
pub(crate) fn ms(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_to_the_millisecond() {
        assert_eq!(ms(Duration::from_micros(1_484_999)), "1s 484ms");
        assert_eq!(ms(Duration::from_micros(999)), "0s");
    }
}
