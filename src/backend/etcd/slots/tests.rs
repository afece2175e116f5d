//! Tests of [`super`]: slot keys, the choice made from a read, and the transactions.

use super::*;
use crate::backend::etcd::wire::{CompareResult, CompareTarget, Request, TargetUnion};

fn job() -> SlotKeys {
    SlotKeys::new("lockrun:", "job")
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

/// A holder's value of a semaphore of `slots`.
fn of(slots: u32) -> String {
    format!(r#"{{"token":"t","host":"h","pid":1,"since_ms":1,"slots":{slots}}}"#)
}

const PLAIN: &str = r#"{"token":"t","host":"h","pid":1,"since_ms":1}"#;

fn held(slots: &[(u32, &str)]) -> Held {
    job().held(
        slots
            .iter()
            .enumerate()
            .map(|(i, &(slot, value))| kv(slot, value, 10 + i as i64)),
    )
}

#[test]
fn slot_0_is_the_plain_locks_key_and_the_others_follow_a_hash() {
    let k = job();
    assert_eq!(k.key(0), "lockrun:job");
    assert_eq!(k.key(1), "lockrun:job#1");
    assert_eq!(k.key(999), "lockrun:job#999");
    assert_eq!(k.start(), b"lockrun:job");
    assert_eq!(k.end(), b"lockrun:job$");
    // Every slot key lies in [start, end); no key of another name does (names cannot
    // hold '#', and every byte a name may hold sorts after '$').
    for slot in [0, 1, 9, 10, 999, u32::MAX] {
        let key = k.key(slot).into_bytes();
        assert!(k.start() <= key.as_slice() && key < k.end(), "{slot}");
        assert_eq!(k.slot_of(&key), Some(slot));
    }
    for other in ["jobs", "job-1", "job.x", "job:1", "job/1", "job_1", "jo"] {
        let key = SlotKeys::new("lockrun:", other).key(0).into_bytes();
        assert!(!(k.start() <= key.as_slice() && key < k.end()), "{other}");
        assert_eq!(k.slot_of(&key), None, "{other}");
    }
}

#[test]
fn only_canonical_slot_keys_are_slots() {
    let k = job();
    for foreign in [
        "lockrun:job#",
        "lockrun:job#0",
        "lockrun:job#01",
        "lockrun:job#1x",
        "lockrun:job#-1",
        "lockrun:job#4294967296",
        "lockrun:job!1",
        "lockrun:job 1",
        "lockrun:jo",
    ] {
        assert_eq!(k.slot_of(foreign.as_bytes()), None, "{foreign}");
    }
    let mut stray = kv(0, PLAIN, 3);
    stray.key = b"lockrun:job!x".to_vec();
    let read = k.held([kv(2, &of(3), 4), stray, kv(0, &of(3), 5)]);
    assert_eq!(read.keys().copied().collect::<Vec<_>>(), [0, 2]);
}

#[test]
fn the_lowest_free_slot_is_taken() {
    assert_eq!(choose(&held(&[]), 3), Choice::Take(0));
    assert_eq!(choose(&held(&[(0, &of(3))]), 3), Choice::Take(1));
    assert_eq!(
        choose(&held(&[(0, &of(3)), (2, &of(3))]), 3),
        Choice::Take(1)
    );
    assert_eq!(
        choose(&held(&[(1, &of(3)), (2, &of(3))]), 3),
        Choice::Take(0)
    );
    let full = held(&[(0, &of(3)), (1, &of(3)), (2, &of(3))]);
    assert_eq!(choose(&full, 3), Choice::Full);
    assert_eq!(choose(&held(&[(0, PLAIN)]), 1), Choice::Full);
    assert_eq!(choose(&held(&[]), 1), Choice::Take(0));
}

#[test]
fn a_holder_taken_with_another_n_is_a_conflict() {
    // A plain holder (or a record from before semaphores) is a holder of 1.
    assert_eq!(choose(&held(&[(0, PLAIN)]), 3), Choice::Conflict(1));
    assert_eq!(choose(&held(&[(0, "not json")]), 3), Choice::Conflict(1));
    // A semaphore's holders, seen by a plain acquirer, even with slot 0 free.
    assert_eq!(choose(&held(&[(0, &of(2))]), 1), Choice::Conflict(2));
    assert_eq!(choose(&held(&[(1, &of(3))]), 1), Choice::Conflict(3));
    // A larger N, on a slot we would not even look at.
    assert_eq!(choose(&held(&[(5, &of(8))]), 3), Choice::Conflict(8));
    // A conflict wins over a free slot and over a full semaphore.
    assert_eq!(
        choose(&held(&[(0, &of(3)), (1, &of(4))]), 3),
        Choice::Conflict(4)
    );
    // A record claiming our N on a slot beyond it was taken with more.
    assert_eq!(choose(&held(&[(4, &of(3))]), 3), Choice::Conflict(5));
}

#[test]
fn the_first_try_puts_slot_0_only_if_no_key_of_the_name_exists() {
    let txn = first_try(&job(), "v", 42);
    assert_eq!(
        txn.compare,
        [
            Compare::created_at("lockrun:job", 0),
            Compare::none_in("lockrun:job#", "lockrun:job$"),
        ]
    );
    assert_eq!(txn.success, [RequestOp::put("lockrun:job", "v", 42)]);
    assert_eq!(
        txn.failure,
        [RequestOp::range_of("lockrun:job", "lockrun:job$")]
    );
}

#[test]
fn taking_a_slot_checks_it_is_free_and_nothing_changed_since_the_read() {
    let read = held(&[(0, &of(4)), (1, &of(4)), (3, &of(4))]);
    let txn = take(&job(), &read, 20, 2, "v", 42);
    assert_eq!(
        txn.compare,
        [
            Compare::created_at("lockrun:job#2", 0),
            Compare::unchanged_in("lockrun:job", "lockrun:job$", 21),
            Compare::modified_at("lockrun:job", 10),
            Compare::modified_at("lockrun:job#1", 11),
        ]
    );
    let unchanged = &txn.compare[1];
    assert_eq!(unchanged.result, CompareResult::Less as i32);
    assert_eq!(unchanged.target, CompareTarget::Mod as i32);
    assert_eq!(unchanged.target_union, Some(TargetUnion::ModRevision(21)));
    assert_eq!(txn.success, [RequestOp::put("lockrun:job#2", "v", 42)]);
    assert_eq!(
        txn.failure,
        [RequestOp::range_of("lockrun:job", "lockrun:job$")]
    );
    let Some(Request::Put(put)) = &txn.success[0].request else {
        panic!("no put in {txn:?}")
    };
    assert_eq!(put.lease, 42);
}

#[test]
fn a_take_never_has_more_compares_than_etcd_allows() {
    let value = of(1000);
    let many: Vec<(u32, &str)> = (0..999).map(|slot| (slot, value.as_str())).collect();
    let read = held(&many);
    assert_eq!(choose(&read, 1000), Choice::Take(999));
    let txn = take(&job(), &read, 5000, 999, "v", 1);
    assert_eq!(txn.compare.len(), MAX_TXN_COMPARES);
    assert_eq!(txn.compare[0], Compare::created_at("lockrun:job#999", 0));
    // A small semaphore compares every held slot below the one taken.
    let read = held(&many[..126]);
    assert_eq!(take(&job(), &read, 5000, 126, "v", 1).compare.len(), 128);
}
