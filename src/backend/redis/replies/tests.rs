//! Unit tests of [`super`] (`backend::redis::replies`).

use super::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn busy(slot: i64, slots: i64) -> Value {
    Value::Array(vec![
        Value::Int(0),
        bulk("host1"),
        bulk("42"),
        bulk("1700000000000"),
        bulk("1700000000000123"),
        Value::Int(2500),
        Value::Int(slot),
        Value::Int(slots),
    ])
}

#[test]
fn acquire_replies_parse() {
    let ok = Value::Array(vec![
        Value::Int(1),
        bulk("1700000000000123"),
        Value::Int(2),
        bulk("001"),
    ]);
    assert_eq!(
        parse::<AcquireReply>(Script::Acquire, ok),
        Ok(AcquireReply::Acquired {
            fencing_token: 1_700_000_000_000_123,
            slot: 2,
            free: vec![false, false, true],
        })
    );
    let Ok(AcquireReply::Busy(h)) = parse::<AcquireReply>(Script::Acquire, busy(1, 3)) else {
        panic!()
    };
    assert_eq!((h.host.as_str(), h.pid), ("host1", 42));
    assert_eq!(h.fencing_token, 1_700_000_000_000_123);
    assert_eq!(h.ttl_left, Duration::from_millis(2500));
    assert_eq!((h.slot, h.slots), (1, 3));
}

#[test]
fn a_slot_kept_for_a_woken_waiter_is_busy_with_an_unknown_holder() {
    // The acquire script's answer when the free slot is kept for a woken waiter and
    // no slot is held: no holder to name, ask again when its priority lapses.
    let kept = Value::Array(vec![
        Value::Int(0),
        bulk(""),
        bulk("0"),
        bulk("0"),
        bulk("0"),
        Value::Int(1500),
        Value::Int(0),
        Value::Int(1),
    ]);
    let Ok(AcquireReply::Busy(h)) = parse::<AcquireReply>(Script::Acquire, kept) else {
        panic!()
    };
    assert_eq!(
        h,
        Holder {
            ttl_left: Duration::from_millis(1500),
            slots: 1,
            ..Holder::default()
        }
    );
}

#[test]
fn a_conflict_names_the_holders_n() {
    for theirs in [Value::Int(3), bulk("3")] {
        let v = Value::Array(vec![Value::Int(2), theirs]);
        assert_eq!(
            parse::<AcquireReply>(Script::Acquire, v),
            Ok(AcquireReply::Conflict(3))
        );
    }
    // A plain holder (no `slots` field) is one of 1.
    let v = Value::Array(vec![Value::Int(2), bulk("1")]);
    assert_eq!(
        parse::<AcquireReply>(Script::Acquire, v),
        Ok(AcquireReply::Conflict(1))
    );
    for theirs in [bulk("0"), bulk("1001"), bulk("x"), Value::Nil] {
        let v = Value::Array(vec![Value::Int(2), theirs.clone()]);
        assert!(
            parse::<AcquireReply>(Script::Acquire, v).is_err(),
            "{theirs:?}"
        );
    }
}

#[test]
fn a_server_that_may_evict_is_named_with_its_policy() {
    for maxmemory in [Value::Int(10_485_760), bulk("10485760")] {
        let v = Value::Array(vec![Value::Int(3), bulk("allkeys-lru"), maxmemory]);
        assert_eq!(
            parse::<AcquireReply>(Script::Acquire, v),
            Ok(AcquireReply::Evicting {
                policy: "allkeys-lru".into(),
                maxmemory: 10_485_760
            })
        );
    }
    for (policy, maxmemory) in [
        (bulk("allkeys-lru"), bulk("0")),
        (bulk("allkeys-lru"), bulk("-1")),
        (bulk(""), bulk("1")),
        (bulk("volatile lru; rm"), bulk("1")),
        (bulk(&"x".repeat(65)), bulk("1")),
        (Value::Nil, bulk("1")),
    ] {
        let v = Value::Array(vec![Value::Int(3), policy, maxmemory]);
        assert!(
            parse::<AcquireReply>(Script::Acquire, v.clone()).is_err(),
            "{v:?}"
        );
    }
}

#[test]
fn an_unchecked_answer_carries_the_servers_reason_around_the_answer() {
    let ok = Value::Array(vec![Value::Int(1), bulk("9"), Value::Int(0), bulk("1")]);
    let plain = parse::<Checked>(Script::Acquire, ok.clone()).unwrap();
    assert_eq!(plain.unchecked, None);
    assert!(matches!(
        plain.reply,
        AcquireReply::Acquired {
            fencing_token: 9,
            ..
        }
    ));
    let why = bulk("ERR The user executing the script can't run this command");
    let wrapped = Value::Array(vec![Value::Int(4), why.clone(), ok.clone()]);
    let got = parse::<Checked>(Script::Acquire, wrapped).unwrap();
    assert!(got.unchecked.unwrap().contains("can't run"));
    assert_eq!(got.reply, plain.reply);
    let busy_wrapped = Value::Array(vec![Value::Int(4), why.clone(), busy(0, 1)]);
    let got = parse::<Checked>(Script::Acquire, busy_wrapped).unwrap();
    assert!(matches!(got.reply, AcquireReply::Busy(_)) && got.unchecked.is_some());
    // Only one wrapping, around a well-formed answer; an Acquired answer is never one.
    let twice = Value::Array(vec![
        Value::Int(4),
        why.clone(),
        Value::Array(vec![Value::Int(4), why.clone(), ok.clone()]),
    ]);
    for v in [
        twice,
        Value::Array(vec![Value::Int(4), why.clone()]),
        Value::Array(vec![Value::Int(4), Value::Nil, ok.clone()]),
        Value::Array(vec![Value::Int(4), why, Value::Int(1)]),
    ] {
        assert!(
            parse::<Checked>(Script::Acquire, v.clone()).is_err(),
            "{v:?}"
        );
        assert!(
            parse::<AcquireReply>(Script::Acquire, v.clone()).is_err(),
            "{v:?}"
        );
    }
}

#[test]
fn a_malformed_reply_is_an_error_never_token_zero() {
    for v in [
        Value::Array(vec![Value::Int(1), bulk("0"), Value::Int(0), bulk("1")]),
        Value::Array(vec![
            Value::Int(1),
            bulk("garbage"),
            Value::Int(0),
            bulk("1"),
        ]),
        Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(-1), bulk("1")]),
        Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(1000), bulk("1")]),
        Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(0), bulk("")]),
        Value::Array(vec![Value::Int(1), bulk("5"), Value::Int(0), bulk("1x")]),
        Value::Array(vec![Value::Int(1), bulk("5")]),
        Value::Array(vec![Value::Int(1)]),
        Value::Array(vec![Value::Int(0), bulk("h")]),
        busy(0, 0),
        busy(-1, 3),
        Value::Int(1),
        Value::Nil,
    ] {
        let e = parse::<AcquireReply>(Script::Acquire, v.clone()).unwrap_err();
        assert!(e.0.contains("acquire script"), "{v:?}: {}", e.0);
    }
    assert!(parse::<Done>(Script::Renew, Value::Nil).is_err());
    assert_eq!(parse::<Done>(Script::Renew, Value::Int(0)), Ok(Done(false)));
}

#[test]
fn holder_replies_parse() {
    assert_eq!(
        parse::<HoldersReply>(Script::Inspect, Value::Array(vec![Value::Int(0)])),
        Ok(HoldersReply {
            theirs: 0,
            holders: vec![]
        })
    );
    let holder = |slot: i64| {
        Value::Array(vec![
            bulk("h"),
            bulk("7"),
            bulk("1"),
            bulk("9"),
            Value::Int(-1),
            Value::Int(slot),
            bulk("3"),
            bulk("tok"),
        ])
    };
    let v = Value::Array(vec![bulk("4"), holder(0), holder(2)]);
    let r = parse::<HoldersReply>(Script::Inspect, v).unwrap();
    assert_eq!(r.theirs, 4);
    let got: Vec<_> = r
        .holders
        .iter()
        .map(|s| {
            (
                s.holder.slot,
                s.holder.slots,
                s.holder.ttl_left,
                s.token.as_str(),
            )
        })
        .collect();
    assert_eq!(got, [(0, 3, MAX_LEASE, "tok"), (2, 3, MAX_LEASE, "tok")]);
    let h = &r.holders[0].holder;
    assert_eq!((h.pid, h.fencing_token), (7, 9));
    let short = Value::Array(vec![
        Value::Int(0),
        Value::Array(vec![bulk("h"), bulk("7")]),
    ]);
    assert!(parse::<HoldersReply>(Script::Force, short).is_err());
    assert!(parse::<HoldersReply>(Script::Force, Value::Array(vec![])).is_err());
    let flat = Value::Array(vec![Value::Int(0), bulk("h")]);
    assert!(parse::<HoldersReply>(Script::Force, flat).is_err());
}
