//! Where a lock lives in ZooKeeper's tree and what its nodes hold: the directory of
//! (prefix, name), the queue nodes' names, the holder's description in a queue node,
//! a semaphore's slot nodes and the `--hold-at-least` nodes. Pure: no I/O. Part of
//! [`super`].
//!
//! Lock `NAME` under prefix `P` is the directory `/enc(P)/enc(NAME)` (below the
//! chroot). `enc` keeps `A-Z a-z 0-9 . _ - :` and writes every other byte as `%XX`, so
//! a `/` of the name stays inside one node name and two different (prefix, name) pairs
//! never share a directory; the names ZooKeeper refuses or reserves (`.`, `..`, the
//! empty name, `zookeeper` at the root) are written with an escape of their own.
//!
//! In the directory (names lockrun alone gives, so nothing else collides with them):
//! - `lock-<token>-<seq>`: a queue node of a plain lock (`--slots 1`), as before
//!   semaphores; `lock-<token>-n<N>-<seq>` one of a semaphore of N slots. The N in the
//!   name lets every acquirer see each other's N in the listing it reads anyway, without
//!   reading a node (a name without it is N = 1, also an older lockrun's);
//! - `slot-<i>` (ephemeral): slot i of a semaphore is held; it describes its holder;
//! - `hold` (slot 0, the plain lock's) and `hold-<i>` (slot i ≥ 1), persistent: the
//!   `--hold-at-least` of the slot's last holder;
//! - `last` and `ok` (persistent, or TTL): the record of the lock's last run, and of
//!   its last success (`record.rs`).

use std::time::Duration;

use crate::backend::{AcquireRequest, Holder};

/// The name of the `--hold-at-least` node of a plain lock (and of slot 0).
pub const HOLD: &str = "hold";

/// How queue node names start: `lock-<token>[-n<N>]-<sequence>`.
const QUEUE: &str = "lock-";

/// How slot node names start: `slot-<i>`.
const SLOT: &str = "slot-";

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

/// The name a node name of [`encode`]'s spelling stands for; `None` for any other
/// spelling (a node lockrun did not name).
pub fn decode(node: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(node.len());
    let mut it = node.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hex = [it.next()?, it.next()?];
            bytes.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            bytes.push(b);
        }
    }
    let s = String::from_utf8(bytes).ok()?;
    (encode(&s) == node).then_some(s)
}

/// The directory of every lock under `prefix` (each lock is a directory in it).
pub fn prefix_dir(prefix: &str) -> String {
    format!("/{}", encode(prefix))
}

/// The directory of lock `name` under `prefix`.
pub fn lock_dir(prefix: &str, name: &str) -> String {
    format!("/{}/{}", encode(prefix), encode(name))
}

/// The path a queue node for `slots` is created with (ZooKeeper appends the sequence
/// number).
pub fn queue_prefix(dir: &str, token: &str, slots: u32) -> String {
    match slots {
        1 => format!("{dir}/{QUEUE}{token}-"),
        n => format!("{dir}/{QUEUE}{token}-n{n}-"),
    }
}

/// The name of slot `slot`'s node.
pub fn slot_name(slot: u32) -> String {
    format!("{SLOT}{slot}")
}

/// The name of slot `slot`'s hold node (slot 0's is the plain lock's).
pub fn hold_name(slot: u32) -> String {
    match slot {
        0 => HOLD.to_owned(),
        i => format!("{HOLD}-{i}"),
    }
}

/// The slot of a slot node's name (`slot-<i>`, written as lockrun writes it).
pub fn slot_of(name: &str) -> Option<u32> {
    number(name.strip_prefix(SLOT)?)
}

/// The slot of a hold node's name (`hold` for 0, `hold-<i>` for i ≥ 1).
pub fn hold_of(name: &str) -> Option<u32> {
    match name.strip_prefix(HOLD)? {
        "" => Some(0),
        rest => number(rest.strip_prefix('-')?).filter(|&i| i > 0),
    }
}

/// A decimal number as lockrun writes one (no sign, no leading zero).
fn number(digits: &str) -> Option<u32> {
    let n: u32 = digits.parse().ok()?;
    (n.to_string() == digits).then_some(n)
}

/// A queue node in a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueNode {
    /// Its name in the directory.
    pub name: String,
    /// The token of the lockrun that made it.
    pub token: String,
    /// The N of `--slots` it was made with (1 when its name has none).
    pub slots: u32,
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
            let (token, slots) = match token.rsplit_once("-n") {
                Some((t, n)) => match number(n).filter(|&n| n > 1) {
                    Some(n) => (t, n),
                    None => (token, 1),
                },
                None => (token, 1),
            };
            Some(QueueNode {
                name: name.clone(),
                token: token.to_owned(),
                slots,
                sequence,
            })
        })
        .collect();
    nodes.sort_by_key(|n| n.sequence);
    nodes
}

/// What a queue node holds: the token and who we are, for `status`, with the session
/// timeout the server granted (the longest a crashed holder keeps the lock), and the N
/// of a semaphore (a plain lock's value is the same as before semaphores).
pub fn queue_value(req: &AcquireRequest, granted: Duration, slots: u32) -> Vec<u8> {
    let mut v = serde_json::json!({
        "token": req.token, "host": req.host, "pid": req.pid,
        "ttl_ms": granted.as_millis() as u64,
    });
    if slots > 1 {
        v["slots"] = slots.into();
    }
    v.to_string().into_bytes()
}

/// A semaphore's queue node value once it holds `slot`: written to the queue node and
/// given to the slot node when the slot is claimed.
pub fn with_slot(value: &[u8], slot: u32) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    if !v.is_object() {
        v = serde_json::json!({});
    }
    v["slot"] = slot.into();
    v.to_string().into_bytes()
}

/// The token a node's value names (empty if none).
pub fn token_in(value: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    v["token"].as_str().unwrap_or_default().to_owned()
}

/// The slot a semaphore's queue node holds, as its value says (none before its claim,
/// and never for a plain lock's).
pub fn slot_in(value: &[u8]) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    v["slot"].as_u64().and_then(|s| u32::try_from(s).ok())
}

/// The holder described by a queue or slot node's value and its stat: `czxid` its
/// creation zxid, `mzxid` its last modification's, `mtime` that modification's time by
/// the server's clock. The fencing token is the creation zxid of a plain lock's node;
/// a semaphore's queue node was written by its slot's claim (a slot node was created
/// by it), so its token is that write's zxid. The time is when the lock was taken (a
/// waiter touches its node when it takes the lock; a claim writes it).
pub fn holder_from(value: &[u8], czxid: i64, mzxid: i64, mtime: i64) -> Holder {
    let v: serde_json::Value = serde_json::from_slice(value).unwrap_or_default();
    let zxid = match v.get("slot") {
        Some(_) => mzxid,
        None => czxid,
    };
    Holder {
        since_ms: u64::try_from(mtime).unwrap_or(0),
        fencing_token: u64::try_from(zxid).unwrap_or(0),
        ttl_left: Duration::from_millis(v["ttl_ms"].as_u64().unwrap_or(0)),
        ..Holder::from_json(&v)
    }
}

/// What a hold node of `--hold-at-least` holds: the holder that left it (its fencing
/// token and acquisition time included; its slot and N for a semaphore's) and how
/// long it keeps the slot after the node's last write, by the server's clock.
pub fn hold_value(holder: &Holder, keep: Duration) -> Vec<u8> {
    let mut v = serde_json::json!({
        "host": holder.host, "pid": holder.pid, "since_ms": holder.since_ms,
        "fencing_token": holder.fencing_token, "keep_ms": keep.as_millis() as u64,
    });
    if holder.slots > 1 {
        v["slot"] = holder.slot.into();
        v["slots"] = holder.slots.into();
    }
    v.to_string().into_bytes()
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
    fn node_names_read_back_in_lockruns_spelling_only() {
        for name in ["job", "team/job", "a%2Fb", "zookeeper", "é", "x:y.z_1-2"] {
            assert_eq!(decode(&encode(name)).as_deref(), Some(name));
        }
        assert_eq!(decode("team%2fjob"), None);
        assert_eq!(decode("a%2"), None);
        assert_eq!(decode("zookeeper"), None);
    }

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
        assert_eq!(queue_prefix("/p/n", "aa", 1), "/p/n/lock-aa-");
    }

    #[test]
    fn a_semaphores_queue_nodes_carry_their_n_and_a_plain_ones_do_not() {
        assert_eq!(queue_prefix("/p/n", "aa", 3), "/p/n/lock-aa-n3-");
        let children: Vec<String> = [
            "lock-aa-n3-0000000001",
            "lock-bb-0000000002",
            "lock-cc-n1-0000000003",
            "lock-dd-n03-0000000004",
            "lock-ee-nx-0000000005",
            "lock-ff-n1000-0000000006",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let q: Vec<(String, u32)> = queue(&children)
            .into_iter()
            .map(|n| (n.token, n.slots))
            .collect();
        let q: Vec<(&str, u32)> = q.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        // Only lockrun's own spelling of N > 1 counts; anything else is part of a token.
        assert_eq!(
            q,
            vec![
                ("aa", 3),
                ("bb", 1),
                ("cc-n1", 1),
                ("dd-n03", 1),
                ("ee-nx", 1),
                ("ff", 1000)
            ]
        );
    }

    #[test]
    fn slot_and_hold_names_round_trip_and_slot_0_keeps_the_plain_hold() {
        assert_eq!(
            (slot_name(0), slot_name(7)),
            ("slot-0".into(), "slot-7".into())
        );
        assert_eq!(
            (hold_name(0), hold_name(2)),
            ("hold".into(), "hold-2".into())
        );
        for i in [0, 1, 9, 999] {
            assert_eq!(slot_of(&slot_name(i)), Some(i));
            assert_eq!(hold_of(&hold_name(i)), Some(i));
        }
        for stranger in [
            "slot-", "slot-01", "slot-+1", "slot--1", "slot-x", "slots-1",
        ] {
            assert_eq!(slot_of(stranger), None, "{stranger}");
        }
        for stranger in ["hold-0", "hold-01", "hold-", "holds", "hold-x", "hold1"] {
            assert_eq!(hold_of(stranger), None, "{stranger}");
        }
        // None of them is a queue node, nor a queue node one of them.
        let names: Vec<String> = vec![slot_name(1), hold_name(0), hold_name(1)];
        assert!(queue(&names).is_empty());
        assert_eq!(slot_of("lock-aa-0000000001"), None);
        assert_eq!(hold_of("lock-aa-0000000001"), None);
    }

    #[test]
    fn a_claim_writes_the_slot_and_the_token_becomes_the_claims_zxid() {
        let req = AcquireRequest {
            token: "ab".repeat(16),
            ttl: Duration::from_secs(30),
            host: "web1".into(),
            pid: 4242,
        };
        let plain = queue_value(&req, Duration::from_secs(40), 1);
        assert!(!String::from_utf8_lossy(&plain).contains("slot"));
        let queued = queue_value(&req, Duration::from_secs(40), 3);
        assert_eq!(slot_in(&queued), None);
        let claimed = with_slot(&queued, 2);
        assert_eq!(slot_in(&claimed), Some(2));
        assert_eq!(token_in(&claimed), req.token);
        let h = holder_from(&claimed, 10, 25, 1_000);
        assert_eq!((h.slot, h.slots, h.fencing_token), (2, 3, 25));
        // Before its claim (and for a plain lock) the token is the creation zxid.
        let h = holder_from(&queued, 10, 25, 1_000);
        assert_eq!((h.slot, h.slots, h.fencing_token), (0, 3, 10));
        let (hold, on) = hold_from(
            &hold_value(
                &holder_from(&claimed, 10, 25, 1_000),
                Duration::from_secs(1),
            ),
            1_000,
            1_500,
        );
        assert!(on);
        assert_eq!((hold.slot, hold.slots, hold.fencing_token), (2, 3, 25));
        assert_eq!(slot_in(b"not json"), None);
        assert_eq!(slot_in(&with_slot(b"not json", 1)), Some(1));
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
            &queue_value(&req, Duration::from_secs(40), 1),
            77,
            78,
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
        let stranger = holder_from(b"not json", 5, 6, -1);
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
