//! What the etcd backend stores and reads besides the key itself: the lease's whole
//! seconds, our random lease IDs, and the holder's description in the key's value.
//! Part of [`super`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::{AcquireRequest, BackendError, Holder};

/// The longest lease: a longer one is refused before it is granted (etcd would grant
/// up to about 285 years, a lock that never frees); a key found without a lease is
/// given this much.
pub use crate::backend::MAX_LEASE;

/// etcd TTLs are whole seconds: round up, so the server keeps the lease at least `d`.
pub fn ttl_secs(d: Duration) -> i64 {
    i64::try_from(d.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

/// [`ttl_secs`] of a lease to be granted, or a refusal when it is longer than
/// [`MAX_LEASE`].
pub fn lease_secs(d: Duration) -> Result<i64, BackendError> {
    if d > MAX_LEASE {
        return Err(BackendError::Refused(format!(
            "a lease of {} is longer than the 24 h an etcd lock lease may last: \
             use a shorter --ttl or --hold-at-least",
            humantime::format_duration(d)
        )));
    }
    Ok(ttl_secs(d))
}

/// A random, positive lease ID (etcd chooses one when given 0).
pub fn new_lease_id() -> i64 {
    let raw = u64::from_str_radix(&crate::token::random_hex(8), 16).unwrap_or(1);
    i64::try_from(raw >> 1).unwrap_or(1).max(1)
}

/// The key's value: the token and who we are, for `status`; with `--slots` above 1,
/// also the slot and the N (`slots`) it was taken with. A plain lock's value has neither,
/// as before semaphores (a holder without them is slot 0 of 1).
pub fn holder_value(req: &AcquireRequest, slot: u32, slots: u32) -> String {
    let since_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut v = serde_json::json!({
        "token": req.token, "host": req.host, "pid": req.pid, "since_ms": since_ms,
    });
    if slots > 1 {
        v["slot"] = slot.into();
        v["slots"] = slots.into();
    }
    v.to_string()
}

/// Reads a holder from a key's value (anything but our JSON gives empty fields).
pub fn holder_from(value: &[u8], create_revision: i64, ttl: i64) -> Holder {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    Holder {
        fencing_token: u64::try_from(create_revision).unwrap_or(0),
        // -1: the lease is gone and the key about to be.
        ttl_left: Duration::from_secs(u64::try_from(ttl).unwrap_or(0)),
        ..Holder::from_json(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(999)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(2)), 2);
        assert_eq!(ttl_secs(Duration::from_millis(2001)), 3);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
    }

    #[test]
    fn a_lease_longer_than_a_day_is_refused() {
        assert_eq!(lease_secs(MAX_LEASE), Ok(86_400));
        for long in [MAX_LEASE + Duration::from_millis(1), Duration::MAX] {
            let Err(BackendError::Refused(e)) = lease_secs(long) else {
                panic!("{long:?} was taken")
            };
            assert!(e.contains("24 h"), "{e}");
        }
    }

    #[test]
    fn lease_ids_are_positive_and_differ() {
        let (a, b) = (new_lease_id(), new_lease_id());
        assert!(a > 0 && b > 0);
        assert_ne!(a, b);
    }

    #[test]
    fn holder_round_trips_through_the_value() {
        let req = AcquireRequest {
            token: "ab".repeat(16),
            ttl: Duration::from_secs(30),
            host: "web1".into(),
            pid: 4242,
        };
        let plain = holder_value(&req, 0, 1);
        let h = holder_from(plain.as_bytes(), 77, 12);
        assert_eq!(
            (h.host.as_str(), h.pid, h.fencing_token),
            ("web1", 4242, 77)
        );
        assert_eq!(h.ttl_left, Duration::from_secs(12));
        assert!(h.since_ms > 1_600_000_000_000);
        // A plain lock's value is what it was before semaphores.
        assert!(!plain.contains("slot"), "{plain}");
        assert_eq!((h.slot, h.slots), (0, 1));
        let h = holder_from(holder_value(&req, 2, 5).as_bytes(), 78, 12);
        assert_eq!((h.slot, h.slots, h.pid), (2, 5, 4242));
        let foreign = holder_from(b"not json", 5, -1);
        assert_eq!((foreign.host.as_str(), foreign.pid), ("", 0));
        assert_eq!(foreign.ttl_left, Duration::ZERO);
    }
}
