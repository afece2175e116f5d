//! Where a lock lives in ZooKeeper's tree and what its nodes hold: the directory of
//! (prefix, name), the queue nodes' names, the holder's description in a queue node and
//! the `--hold-at-least` node. Pure: no I/O. Part of [`super`].
//!
//! Lock `NAME` under prefix `P` is the directory `/enc(P)/enc(NAME)` (below the
//! chroot). `enc` keeps `A-Z a-z 0-9 . _ - :` and writes every other byte as `%XX`, so
//! a `/` of the name stays inside one node name and two different (prefix, name) pairs
//! never share a directory; the names ZooKeeper refuses or reserves (`.`, `..`, the
//! empty name, `zookeeper` at the root) are written with an escape of their own.

use std::time::Duration;

use crate::backend::{AcquireRequest, Holder};

/// The name of the `--hold-at-least` node in a lock's directory.
pub const HOLD: &str = "hold";

/// How queue node names start: `lock-<token>-<sequence>`.
const QUEUE: &str = "lock-";

/// One node name for `s` (see the module documentation).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b':' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    match out.as_str() {
        // `%` never stands alone in an encoding, nor `%2E` for a dot, nor `%7A` for `z`.
        "" => "%".into(),
        "." => "%2E".into(),
        ".." => "%2E%2E".into(),
        "zookeeper" => "%7Aookeeper".into(),
        _ => out,
    }
}

/// The directory of lock `name` under `prefix`.
pub fn lock_dir(prefix: &str, name: &str) -> String {
    format!("/{}/{}", encode(prefix), encode(name))
}

/// The path a queue node is created with (ZooKeeper appends the sequence number).
pub fn queue_prefix(dir: &str, token: &str) -> String {
    format!("{dir}/{QUEUE}{token}-")
}

/// A queue node in a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueNode {
    /// Its name in the directory.
    pub name: String,
    /// The token of the lockrun that made it.
    pub token: String,
    /// Its sequence number: the queue's order.
    pub sequence: i64,
}

/// The queue nodes of a directory listing, first in line first. Anything else in the
/// directory (the hold node, a stranger's node) is left out.
pub fn queue(children: &[String]) -> Vec<QueueNode> {
    let mut nodes: Vec<QueueNode> = children
        .iter()
        .filter_map(|name| {
            let rest = name.strip_prefix(QUEUE)?;
            let (token, sequence) = rest.rsplit_once('-')?;
            let sequence = sequence
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| sequence.parse::<i64>().ok())??;
            Some(QueueNode {
                name: name.clone(),
                token: token.to_owned(),
                sequence,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.sequence);
    nodes
}

/// What a queue node holds: the token and who we are, for `status`, with the session
/// timeout the server granted (the longest a crashed holder keeps the lock).
pub fn queue_value(req: &AcquireRequest, granted: Duration) -> Vec<u8> {
    serde_json::json!({
        "token": req.token, "host": req.host, "pid": req.pid,
        "ttl_ms": granted.as_millis() as u64,
    })
    .to_string()
    .into_bytes()
}

/// The holder described by a queue node's value. `since_ms` is the node's last
/// modification by the server's clock (a waiter touches its node when it takes the
/// lock); `czxid` its creation zxid, the fencing token.
pub fn holder_from(value: &[u8], czxid: i64, since_ms: i64) -> Holder {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    Holder {
        since_ms: u64::try_from(since_ms).unwrap_or(0),
        fencing_token: u64::try_from(czxid).unwrap_or(0),
        ttl_left: Duration::from_millis(v["ttl_ms"].as_u64().unwrap_or(0)),
        ..Holder::from_json(&v)
    }
}

/// What the hold node of `--hold-at-least` holds: the holder that left it (its
/// fencing token and acquisition time included) and how long it keeps the lock after
/// the node's creation, by the server's clock.
pub fn hold_value(holder: &Holder, keep: Duration) -> Vec<u8> {
    serde_json::json!({
        "host": holder.host, "pid": holder.pid, "since_ms": holder.since_ms,
        "fencing_token": holder.fencing_token, "keep_ms": keep.as_millis() as u64,
    })
    .to_string()
    .into_bytes()
}

/// A hold node read back: its holder (with the time left at `server_now_ms`, both
/// milliseconds of the server's clock; zero once over) and whether it is still on.
pub fn hold_from(value: &[u8], created_ms: i64, server_now_ms: i64) -> (Holder, bool) {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    let keep_ms = i64::try_from(v["keep_ms"].as_u64().unwrap_or(0)).unwrap_or(i64::MAX);
    let left_ms = created_ms
        .saturating_add(keep_ms)
        .saturating_sub(server_now_ms);
    let holder = Holder {
        fencing_token: v["fencing_token"].as_u64().unwrap_or(0),
        ttl_left: Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)),
        ..Holder::from_json(&v)
    };
    (holder, left_ms > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_become_one_node_name_each() {
        assert_eq!(lock_dir("lockrun:", "team/job"), "/lockrun:/team%2Fjob");
        assert_eq!(encode("a%2Fb"), "a%252Fb");
        assert_eq!(encode("é"), "%C3%A9");
        for reserved in ["", ".", "..", "zookeeper"] {
            let e = encode(reserved);
            assert!(!["", ".", "..", "zookeeper"].contains(&e.as_str()), "{e}");
            assert!(!e.contains('/'));
        }
    }

    #[test]
    fn different_prefix_and_name_pairs_never_share_a_directory() {
        let parts = [
            "",
            "a",
            "a/b",
            "a%2Fb",
            "b",
            ".",
            "..",
            "%",
            "%2E",
            "zookeeper",
            "%7Aookeeper",
            "lockrun:",
            "lockrun:/x",
            "x/",
            "/x",
            "a:b",
            "a%",
        ];
        let mut seen = std::collections::HashMap::new();
        for p in parts {
            for n in parts {
                if let Some(old) = seen.insert(lock_dir(p, n), (p, n)) {
                    panic!("{:?} and {:?} share {}", old, (p, n), lock_dir(p, n));
                }
            }
        }
    }

    #[test]
    fn the_queue_is_ordered_by_sequence_and_ignores_other_nodes() {
        let children: Vec<String> = [
            "lock-bb-0000000012",
            "hold",
            "lock-aa-0000000003",
            "lock-cc-x",
            "other",
            "lock-dd-0000000010",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q = queue(&children);
        let order: Vec<(&str, i64)> = q.iter().map(|n| (n.token.as_str(), n.sequence)).collect();
        assert_eq!(order, vec![("aa", 3), ("dd", 10), ("bb", 12)]);
        assert_eq!(q[0].name, "lock-aa-0000000003");
        assert_eq!(queue_prefix("/p/n", "aa"), "/p/n/lock-aa-");
    }

    #[test]
    fn holders_round_trip_through_the_values() {
        let req = AcquireRequest {
            token: "ab".repeat(16),
            ttl: Duration::from_secs(30),
            host: "web1".into(),
            pid: 4242,
        };
        let h = holder_from(
            &queue_value(&req, Duration::from_secs(40)),
            77,
            1_700_000_000_000,
        );
        assert_eq!(
            (h.host.as_str(), h.pid, h.fencing_token),
            ("web1", 4242, 77)
        );
        assert_eq!(
            (h.since_ms, h.ttl_left),
            (1_700_000_000_000, Duration::from_secs(40))
        );
        let stranger = holder_from(b"not json", 5, -1);
        assert_eq!((stranger.pid, stranger.since_ms), (0, 0));

        let held = hold_value(&h, Duration::from_secs(3));
        let (hold, on) = hold_from(&held, 1_000, 2_500);
        assert!(on);
        assert_eq!(hold.ttl_left, Duration::from_millis(1_500));
        assert_eq!((hold.fencing_token, hold.pid), (77, 4242));
        let (over, on) = hold_from(&held, 1_000, 4_000);
        assert!(!on);
        assert_eq!(over.ttl_left, Duration::ZERO);
    }
}
