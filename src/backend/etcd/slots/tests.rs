//! Tests of [`super`]: slot and waiter keys, a waiter's place, the choice made from a
//! read, and the transactions.

use super::*;
use crate::backend::etcd::wire::{CompareResult, CompareTarget, Request, TargetUnion};

/// The keys of "job" for a semaphore of 3.
fn job() -> SlotKeys {
    SlotKeys::new("lockrun:", "job", 3)
}

/// The keys of "job" for a plain lock.
fn plain() -> SlotKeys {
    SlotKeys::new("lockrun:", "job", 1)
}

/// A stored key of slot `slot` of "job", with `value`, at revision `rev`.
fn kv(slot: u32, value: &str, rev: i64) -> KeyValue {
    KeyValue {
        key: job().key(slot).into_bytes(),
        create_revision: rev,
        mod_revision: rev,
        value: value.as_bytes().to_vec(),
        lease: 7,
    }
}

/// A waiter's key on lease `lease`, created at `rev`.
fn waiter(lease: i64, rev: i64) -> KeyValue {
    KeyValue {
        key: job().waiter_key(lease).into_bytes(),
        create_revision: rev,
        mod_revision: rev,
        value: Vec::new(),
        lease,
    }
}

/// A holder's value of a semaphore of `slots`.
fn of(slots: u32) -> String {
    format!(r#"{{"token":"t","host":"h","pid":1,"since_ms":1,"slots":{slots}}}"#)
}

const PLAIN: &str = r#"{"token":"t","host":"h","pid":1,"since_ms":1}"#;

/// The slots held by `slots` (slot, value), created at revisions 10, 11, ...
fn held(slots: &[(u32, &str)]) -> Held {
    let kvs = slots
        .iter()
        .enumerate()
        .map(|(i, &(slot, value))| kv(slot, value, 10 + i as i64));
    job().read(kvs).held
}

#[test]
fn slot_0_is_the_plain_locks_key_and_the_others_follow_a_hash() {
    let k = job();
    assert_eq!(k.key(0), "lockrun:{job}");
    assert_eq!(k.key(1), "lockrun:{job}#1");
    assert_eq!(k.key(999), "lockrun:{job}#999");
    assert_eq!(k.start(), b"lockrun:{job}");
    assert_eq!(k.end(), b"lockrun:{job}$");
    // Every slot key lies in [start, end); no key of another name does (the name is
    // closed by '}', and every byte a name may hold sorts before it).
    for slot in [0, 1, 9, 10, 999, u32::MAX] {
        let key = k.key(slot).into_bytes();
        assert!(k.start() <= key.as_slice() && key < k.end(), "{slot}");
        assert_eq!(k.slot_of(&key), Some(slot));
    }
    for other in ["jobs", "job-1", "job.x", "job:1", "job/1", "job_1", "jo"] {
        let key = SlotKeys::new("lockrun:", other, 1).key(0).into_bytes();
        assert!(
            !(k.start() <= key.as_slice() && key < k.read_end()),
            "{other}"
        );
        assert_eq!(k.slot_of(&key), None, "{other}");
    }
}

#[test]
fn only_canonical_slot_keys_are_slots() {
    let k = job();
    for foreign in [
        "lockrun:{job}#",
        "lockrun:{job}#0",
        "lockrun:{job}#01",
        "lockrun:{job}#1x",
        "lockrun:{job}#-1",
        "lockrun:{job}#4294967296",
        "lockrun:{job}!1",
        "lockrun:{job} 1",
        "lockrun:jo",
    ] {
        assert_eq!(k.slot_of(foreign.as_bytes()), None, "{foreign}");
    }
    let mut stray = kv(0, PLAIN, 3);
    stray.key = b"lockrun:{job}!x".to_vec();
    let read = k.read([kv(2, &of(3), 4), stray, waiter(9, 6), kv(0, &of(3), 5)]);
    assert_eq!(read.held.keys().copied().collect::<Vec<_>>(), [0, 2]);
    assert_eq!(read.queue, [waiter(9, 6)]);
}

#[test]
fn waiter_keys_are_a_range_of_their_own_after_the_slots() {
    let k = job();
    assert_eq!(k.waiter_key(0x2a), "lockrun:{job}%000000000000002a");
    assert_eq!(k.read_end(), b"lockrun:{job}&");
    let w = k.waiter_key(i64::MAX).into_bytes();
    assert!(k.end() <= w && w < k.read_end());
    assert_eq!(k.slot_of(&w), None);
    // A plain lock has no queue: its reads cover the slots alone.
    assert_eq!(plain().read_end(), b"lockrun:{job}$");
    assert!(!plain().queued() && job().queued());
}

#[test]
fn the_record_key_lies_outside_every_range_a_take_reads_or_compares() {
    for k in [job(), plain()] {
        assert_eq!(k.record_key(), "lockrun:{job}:last");
        assert_eq!(k.ok_key(), "lockrun:{job}:ok");
        for r in [k.record_key().into_bytes(), k.ok_key().into_bytes()] {
            assert!(r.as_slice() >= job().read_end().as_slice() && r > k.end());
            assert_eq!((k.slot_of(&r), k.is_waiter(&r)), (None, false));
            let mut stray = kv(0, PLAIN, 3);
            stray.key = r;
            assert_eq!(k.read([stray]), Read::default());
        }
    }
}

#[test]
fn a_waiters_place_counts_those_who_queued_before_it() {
    let queue = [waiter(1, 30), waiter(2, 10), waiter(3, 20), waiter(4, 50)];
    let ours = job().waiter_key(3).into_bytes();
    let p = place(&queue, &ours, 20);
    assert_eq!(p.ahead, 1);
    assert_eq!(p.next_ahead, Some(job().waiter_key(2).into_bytes()));
    // A newcomer, whose key the read did not see yet, comes after every one.
    let newcomer = job().waiter_key(5).into_bytes();
    let p = place(&queue, &newcomer, 60);
    assert_eq!(p.ahead, 4);
    assert_eq!(p.next_ahead, Some(job().waiter_key(4).into_bytes()));
    let first = job().waiter_key(2).into_bytes();
    assert_eq!(place(&queue, &first, 10), Place::default());
    assert_eq!(place(&[], &ours, 20), Place::default());
}

#[test]
fn the_lowest_free_slot_is_taken() {
    assert_eq!(choose(&held(&[]), 3, 0), Choice::Take(0));
    assert_eq!(choose(&held(&[(0, &of(3))]), 3, 0), Choice::Take(1));
    let gap = held(&[(0, &of(3)), (2, &of(3))]);
    assert_eq!(choose(&gap, 3, 0), Choice::Take(1));
    let low = held(&[(1, &of(3)), (2, &of(3))]);
    assert_eq!(choose(&low, 3, 0), Choice::Take(0));
    let full = held(&[(0, &of(3)), (1, &of(3)), (2, &of(3))]);
    assert_eq!(choose(&full, 3, 0), Choice::Busy);
    assert_eq!(choose(&held(&[(0, PLAIN)]), 1, 0), Choice::Busy);
    assert_eq!(choose(&held(&[]), 1, 0), Choice::Take(0));
}

#[test]
fn a_free_slot_goes_to_the_waiters_who_came_first() {
    // Two free slots: the two first waiters may take one each, the third waits.
    let one_held = held(&[(1, &of(3))]);
    assert_eq!(choose(&one_held, 3, 0), Choice::Take(0));
    assert_eq!(choose(&one_held, 3, 1), Choice::Take(0));
    assert_eq!(choose(&one_held, 3, 2), Choice::Busy);
    assert_eq!(choose(&held(&[]), 3, 3), Choice::Busy);
    // A conflict is refused whatever the place.
    assert_eq!(choose(&held(&[(0, PLAIN)]), 3, 5), Choice::Conflict(1));
}

#[test]
fn a_holder_taken_with_another_n_is_a_conflict() {
    // A plain holder (or a record from before semaphores) is a holder of 1.
    assert_eq!(choose(&held(&[(0, PLAIN)]), 3, 0), Choice::Conflict(1));
    let foreign = held(&[(0, "not json")]);
    assert_eq!(choose(&foreign, 3, 0), Choice::Conflict(1));
    // A semaphore's holders, seen by a plain acquirer, even with slot 0 free.
    assert_eq!(choose(&held(&[(0, &of(2))]), 1, 0), Choice::Conflict(2));
    assert_eq!(choose(&held(&[(1, &of(3))]), 1, 0), Choice::Conflict(3));
    // A larger N, on a slot we would not even look at.
    assert_eq!(choose(&held(&[(5, &of(8))]), 3, 0), Choice::Conflict(8));
    // A conflict wins over a free slot and over a full semaphore.
    let mixed = held(&[(0, &of(3)), (1, &of(4))]);
    assert_eq!(choose(&mixed, 3, 0), Choice::Conflict(4));
    // A record claiming our N on a slot beyond it was taken with more.
    assert_eq!(choose(&held(&[(4, &of(3))]), 3, 0), Choice::Conflict(5));
}

#[test]
fn the_first_try_puts_slot_0_only_if_no_key_of_the_name_exists() {
    let txn = first_try(&plain(), "v", 42);
    assert_eq!(
        txn.compare,
        [
            Compare::created_at("lockrun:{job}", 0),
            Compare::none_in("lockrun:{job}#", "lockrun:{job}$"),
            // An older lockrun's key of the plain lock.
            Compare::created_at("lockrun:job", 0),
        ]
    );
    assert_eq!(txn.success, [RequestOp::put("lockrun:{job}", "v", 42)]);
    assert_eq!(
        txn.failure,
        [
            RequestOp::range_of("lockrun:{job}", "lockrun:{job}$"),
            RequestOp::range_of("lockrun:job", ""),
        ]
    );
    // A semaphore's also needs nobody waiting, and queues us when it fails.
    let txn = first_try(&job(), "v", 42);
    assert_eq!(
        txn.compare,
        [
            Compare::created_at("lockrun:{job}", 0),
            Compare::none_in("lockrun:{job}#", "lockrun:{job}$"),
            Compare::none_in("lockrun:{job}%", "lockrun:{job}&"),
        ]
    );
    assert_eq!(txn.success, [RequestOp::put("lockrun:{job}", "v", 42)]);
    assert_eq!(
        txn.failure,
        [
            RequestOp::range_of("lockrun:{job}", "lockrun:{job}&"),
            RequestOp::put("lockrun:{job}%000000000000002a", "", 42),
        ]
    );
}

#[test]
fn taking_a_slot_checks_it_is_free_and_nothing_changed_since_the_read() {
    let read = held(&[(0, &of(4)), (1, &of(4)), (3, &of(4))]);
    let four = SlotKeys::new("lockrun:", "job", 4);
    let txn = take(&four, &read, 20, 2, "v", 42);
    assert_eq!(
        txn.compare,
        [
            Compare::created_at("lockrun:{job}#2", 0),
            Compare::unchanged_in("lockrun:{job}", "lockrun:{job}$", 21),
            Compare::modified_at("lockrun:{job}", 10),
            Compare::modified_at("lockrun:{job}#1", 11),
        ]
    );
    let unchanged = &txn.compare[1];
    assert_eq!(unchanged.result, CompareResult::Less as i32);
    assert_eq!(unchanged.target, CompareTarget::Mod as i32);
    assert_eq!(unchanged.target_union, Some(TargetUnion::ModRevision(21)));
    // Our waiter key goes with the take.
    assert_eq!(
        txn.success,
        [
            RequestOp::put("lockrun:{job}#2", "v", 42),
            RequestOp::delete("lockrun:{job}%000000000000002a"),
        ]
    );
    assert_eq!(
        txn.failure,
        [RequestOp::range_of("lockrun:{job}", "lockrun:{job}&")]
    );
    let Some(Request::Put(put)) = &txn.success[0].request else {
        panic!("no put in {txn:?}")
    };
    assert_eq!(put.lease, 42);
    // A plain lock has no waiter key, and reads its slots alone.
    let txn = take(&plain(), &Held::new(), 20, 0, "v", 42);
    assert_eq!(txn.success, [RequestOp::put("lockrun:{job}", "v", 42)]);
    assert_eq!(txn.compare[2], Compare::created_at("lockrun:job", 0));
    assert_eq!(
        txn.failure,
        [
            RequestOp::range_of("lockrun:{job}", "lockrun:{job}$"),
            RequestOp::range_of("lockrun:job", ""),
        ]
    );
}

#[test]
fn a_take_never_has_more_compares_than_etcd_allows() {
    let value = of(1000);
    let many: Vec<(u32, &str)> = (0..999).map(|slot| (slot, value.as_str())).collect();
    let read = held(&many);
    assert_eq!(choose(&read, 1000, 0), Choice::Take(999));
    let txn = take(&job(), &read, 5000, 999, "v", 1);
    assert_eq!(txn.compare.len(), MAX_TXN_COMPARES);
    assert_eq!(txn.compare[0], Compare::created_at("lockrun:{job}#999", 0));
    // A small semaphore compares every held slot below the one taken.
    let read = held(&many[..126]);
    assert_eq!(take(&job(), &read, 5000, 126, "v", 1).compare.len(), 128);
}

/// Prefixes with the bytes the keys use as separators, and pairs that the layout
/// before braces (`PREFIXNAME`) merged.
const PREFIXES: [&str; 20] = [
    "",
    "lockrun:",
    "lockrun:teamA:",
    "lockrun:teamA",
    "{",
    "}",
    "{}",
    "a{",
    "a}",
    "a{b}",
    "a{b}#",
    "a{b}#1",
    "a{b}%",
    "#",
    "%",
    "$",
    "p#1",
    "}#1{",
    "é{",
    "lockrun:{job}#",
];
const NAMES: [&str; 10] = [
    "job",
    "teamA:job",
    "A:job",
    "b",
    "1",
    "slots",
    "a",
    "a:b",
    "x/y",
    ".",
];

/// Every key a lock of (prefix, name) may write: its slots (of a semaphore of 12)
/// and a few waiters.
fn all_keys(prefix: &str, name: &str) -> Vec<String> {
    let k = SlotKeys::new(prefix, name, 12);
    let waiters = [0, 1, 0x2a, i64::MAX].map(|id| k.waiter_key(id));
    (0..12).map(|i| k.key(i)).chain(waiters).collect()
}

#[test]
fn no_two_prefix_and_name_pairs_share_a_key() {
    assert_eq!(
        SlotKeys::new("lockrun:teamA:", "job", 1).key(0),
        "lockrun:teamA:{job}"
    );
    assert_eq!(
        SlotKeys::new("lockrun:", "teamA:job", 1).key(0),
        "lockrun:{teamA:job}"
    );
    let mut seen = std::collections::HashMap::new();
    for prefix in PREFIXES {
        for name in NAMES {
            assert!(crate::name::LockName::parse(name).is_ok(), "{name}");
            for key in all_keys(prefix, name) {
                if let Some(other) = seen.insert(key.clone(), (prefix, name)) {
                    panic!("{key:?} is a key of {other:?} and of ({prefix:?}, {name:?})");
                }
            }
        }
    }
    // Names hold no brace: nothing can close a name early.
    for name in ["b}", "{b", "a}#1"] {
        assert!(crate::name::LockName::parse(name).is_err(), "{name}");
    }
}

#[test]
fn a_lock_reads_no_key_of_another_lock_as_its_own() {
    for prefix in PREFIXES {
        for name in NAMES {
            let k = SlotKeys::new(prefix, name, 12);
            for other_prefix in PREFIXES {
                for other_name in NAMES {
                    if (prefix, name) == (other_prefix, other_name) {
                        continue;
                    }
                    for key in all_keys(other_prefix, other_name) {
                        let key = key.into_bytes();
                        let what = format!("{key:?} of ({other_prefix:?}, {other_name:?})");
                        assert_eq!(k.slot_of(&key), None, "{what} in ({prefix:?}, {name:?})");
                        assert!(!k.is_waiter(&key), "{what} in ({prefix:?}, {name:?})");
                        // Only a prefix with a '}' puts its keys in another lock's range.
                        let inside = k.start() <= key.as_slice() && key < k.read_end();
                        assert!(
                            !inside || other_prefix.contains('}') || prefix.contains('}'),
                            "{what} in the range of ({prefix:?}, {name:?})"
                        );
                    }
                }
            }
        }
    }
    // A key in the range that is another lock's (prefix "lockrun:{job}#") is no slot
    // and no waiter of "job".
    let foreign = SlotKeys::new("lockrun:{job}#", "1", 1).key(0);
    assert_eq!(foreign, "lockrun:{job}#{1}");
    let k = job();
    assert!(k.start() <= foreign.as_bytes() && foreign.as_bytes() < k.end().as_slice());
    let mut stray = kv(0, PLAIN, 3);
    stray.key = foreign.into_bytes();
    let mut odd_waiter = waiter(9, 4);
    odd_waiter.key = b"lockrun:{job}%{000000000000002a}".to_vec();
    let read = k.read([stray, odd_waiter, kv(1, &of(3), 5)]);
    assert_eq!(read.held.keys().copied().collect::<Vec<_>>(), [1]);
    assert!(read.queue.is_empty());
}

#[test]
fn waiter_keys_are_exactly_sixteen_hex_digits() {
    let k = job();
    assert!(k.is_waiter(k.waiter_key(0x2a).as_bytes()));
    assert!(k.is_waiter(k.waiter_key(i64::MAX).as_bytes()));
    for odd in [
        "lockrun:{job}%",
        "lockrun:{job}%2a",
        "lockrun:{job}%000000000000002A",
        "lockrun:{job}%000000000000002a0",
        "lockrun:{job}%00000000000000{x}",
        "lockrun:{jo}%000000000000002a",
    ] {
        assert!(!k.is_waiter(odd.as_bytes()), "{odd}");
    }
}

#[test]
fn an_older_lockruns_key_is_a_holder_for_a_plain_lock_only() {
    assert_eq!(plain().legacy(), Some("lockrun:job"));
    assert_eq!(job().legacy(), None);
    let mut old = kv(0, PLAIN, 3);
    old.key = b"lockrun:job".to_vec();
    let read = plain().read([old.clone()]);
    assert_eq!(read.held.get(&0), Some(&old));
    assert_eq!(choose(&read.held, 1, 0), Choice::Busy);
    // A semaphore's reads never hold it (nor does its range).
    assert!(job().read([old.clone()]).held.is_empty());
    assert!(!(job().start() <= old.key.as_slice() && old.key < job().read_end()));
    // Our own slot 0 wins when both are there.
    let ours = kv(0, PLAIN, 5);
    let read = plain().read([old, ours.clone()]);
    assert_eq!(read.held.get(&0), Some(&ours));
}
