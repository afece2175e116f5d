//! What only the Redis backend's semaphores (`--slots N`) have: the keys of slot `i`
//! (`lockrun:{NAME}#i`, in the hash tag's slot, with a lease each) and the limit key
//! that lets an acquirer of a smaller N see holders beyond its slots; a plain lock's
//! hash exactly as before semaphores; the scripts' answers to another N (nothing
//! written), to a wanted slot (Redlock's second round), to a release whose acquire
//! answer was lost; and one waiter woken per slot freed. The contract every backend
//! keeps is tested in the conformance suite.
//!
//! The scripts are called directly (EVAL) where the point is what the server side does
//! whatever lockrun's own checks let through.

use std::collections::HashMap;

use redis::Value;

use crate::support::*;

/// The keys of the acquire script for semaphore "job" of `n` slots.
fn acquire_keys(n: u32) -> Vec<String> {
    let mut keys = vec![
        fence_key("job"),
        waiter_key("job", "waiters"),
        waiter_key("job", "alive"),
        limit_key("job"),
    ];
    keys.extend((0..n).map(|i| slot_key("job", i)));
    keys
}

/// The keys of the release and force scripts for semaphore "job" of `n` slots.
fn release_keys(n: u32) -> Vec<String> {
    let mut keys = vec![
        waiter_key("job", "waiters"),
        waiter_key("job", "alive"),
        limit_key("job"),
    ];
    keys.extend((0..n).map(|i| slot_key("job", i)));
    keys
}

/// Runs script `name` on "job" with `keys` and `args`.
fn eval(redis: &RedisServer, name: &str, keys: &[String], args: &[&str]) -> Result<Value, String> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    redis
        .eval_lockrun_script(name, &keys, args)
        .map_err(|e| e.to_string())
}

/// The acquire script on "job" of `n` slots for `token`, as waiter `waiter` ('' for
/// none), for slot `wanted` ('' for the lowest free).
fn acquire(redis: &RedisServer, n: u32, token: &str, waiter: &str, wanted: &str) -> Value {
    let args = [token, "60000", "host1", "42", waiter, "6000", wanted];
    eval(redis, "acquire", &acquire_keys(n), &args).expect("the acquire script ran")
}

/// `{1, fence, slot, free}` → `(slot, free)`, or a panic naming the answer.
fn acquired(v: &Value) -> (i64, String) {
    match v {
        Value::Array(a) => match a.as_slice() {
            [Value::Int(1), _, Value::Int(slot), Value::BulkString(free)] => {
                (*slot, String::from_utf8_lossy(free).into_owned())
            }
            _ => panic!("not acquired: {v:?}"),
        },
        _ => panic!("not acquired: {v:?}"),
    }
}

fn hgetall(redis: &RedisServer, key: &str) -> HashMap<String, String> {
    redis.query(redis::cmd("HGETALL").arg(key))
}

/// A holder of "job" with `opts`, running until "go" in its scratch directory exists;
/// returns it, its scratch directory and its LOCKRUN_SLOT.
fn slot_holder(redis: &RedisServer, opts: &[&str]) -> (Running, Scratch, u32) {
    let s = Scratch::new();
    let cmd = lockrun_run(
        &redis.url(),
        "job",
        opts,
        &sh(r#"echo "$LOCKRUN_SLOT" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#),
    );
    let mut cmd = cmd;
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let lr = spawn(cmd);
    let slot = wait_line(&s.path("started"))
        .trim()
        .parse()
        .expect("a slot");
    (lr, s, slot)
}

#[test]
fn the_keys_of_slot_2_share_the_hash_tag_and_expire() {
    let redis = RedisServer::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let mut holders: Vec<_> = (0..3).map(|_| slot_holder(&redis, &opts)).collect();
    let slots: Vec<u32> = holders.iter().map(|h| h.2).collect();
    assert_eq!(slots, [0, 1, 2]);
    assert_eq!(slot_key("job", 2), "lockrun:{job}#2");
    for key in [slot_key("job", 0), slot_key("job", 2), limit_key("job")] {
        let pttl = redis.pttl(&key);
        assert!(pttl > 20_000 && pttl <= 30_000, "{key}: PTTL {pttl}");
    }
    let two = hgetall(&redis, &slot_key("job", 2));
    assert_eq!(
        (
            two["slot"].as_str(),
            two["slots"].as_str(),
            two["pid"].as_str()
        ),
        ("2", "3", holders[2].0.pid().to_string().as_str()),
        "{two:?}"
    );
    let limit: String = redis.query(redis::cmd("GET").arg(limit_key("job")));
    assert_eq!(limit, "3");
    // Every key of the name hashes as "job" in Redis Cluster: the text between the
    // first '{' and the next '}'.
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    assert_eq!(keys.len(), 5, "{keys:?}");
    for key in &keys {
        let tag = key
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(tag, _)| tag);
        assert_eq!(tag, Some("job"), "{key}");
        assert!(redis.pttl(key) > 0, "{key} does not expire");
    }
    // The holder of slot 2 ends: its key goes, the others' and the limit stay.
    holders[2].1.touch("go");
    holders[2].0.wait().assert_code(0);
    assert!(!redis.exists(&slot_key("job", 2)));
    assert!(redis.exists(&slot_key("job", 1)) && redis.exists(&limit_key("job")));
    // The last one to go takes the limit key with it.
    for h in &mut holders[..2] {
        h.1.touch("go");
        h.0.wait().assert_code(0);
    }
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    assert_eq!(keys, [fence_key("job")], "only the fencing counter stays");
}

#[test]
fn a_plain_lock_keeps_the_fields_it_had_before_semaphores() {
    let redis = RedisServer::start();
    let (mut lr, s, slot) = slot_holder(&redis, &["--ttl", "30s"]);
    assert_eq!(slot, 0);
    let mut fields: Vec<String> = hgetall(&redis, &lock_key("job")).into_keys().collect();
    fields.sort();
    assert_eq!(fields, ["fence", "host", "pid", "since_ms", "token"]);
    assert!(
        !redis.exists(&limit_key("job")),
        "a plain lock wrote the limit key"
    );
    s.touch("go");
    lr.wait().assert_code(0);
}

#[test]
fn a_plain_holder_refuses_a_semaphore_and_writes_nothing_for_it() {
    let redis = RedisServer::start();
    let (mut lr, s, _) = slot_holder(&redis, &["--ttl", "30s"]);
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--slots", "3"],
        &sh("true"),
    ));
    f.assert_failure(125);
    assert!(
        f.stderr.contains("a plain lock (--slots 1), not --slots 3"),
        "{}",
        f.stderr
    );
    // The script itself: {2, theirs}, and not a key written.
    let before: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    let v = acquire(&redis, 3, "other", "w1", "");
    assert_eq!(
        v,
        Value::Array(vec![Value::Int(2), Value::BulkString(b"1".to_vec())])
    );
    let after: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    assert_eq!(before, after);
    s.touch("go");
    lr.wait().assert_code(0);
}

#[test]
fn holders_beyond_a_smaller_n_are_seen_through_the_limit_key() {
    let redis = RedisServer::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let mut holders: Vec<_> = (0..3).map(|_| slot_holder(&redis, &opts)).collect();
    // Only slot 2 stays held: a plain lockrun or one of --slots 2 sees no holder in
    // its own slots, and must still be refused.
    for h in &mut holders[..2] {
        h.1.touch("go");
        h.0.wait().assert_code(0);
    }
    let marker = Scratch::new();
    for other in [&[][..], &["--slots", "2"]] {
        let mut cmd = lockrun_run(&redis.url(), "job", other, &sh(r#"touch "$MARKER""#));
        cmd.env("MARKER", marker.path("marker"));
        let f = run(cmd);
        f.assert_failure(125);
        assert!(
            f.stderr.contains("held with --slots 3"),
            "{other:?}: {}",
            f.stderr
        );
        let mut status = lockrun();
        status
            .args(["status", "--url", &redis.url()])
            .args(other)
            .arg("job");
        let f = run(status);
        f.assert_failure(125);
        assert!(f.stderr.contains("--slots 3"), "{other:?}: {}", f.stderr);
    }
    assert!(!marker.exists("marker"));
    let mut force = lockrun();
    force.args([
        "release",
        "--force",
        "--slots",
        "2",
        "--url",
        &redis.url(),
        "job",
    ]);
    run(force).assert_failure(125);
    assert!(
        redis.exists(&slot_key("job", 2)),
        "a refused force broke slot 2"
    );
    holders[2].1.touch("go");
    holders[2].0.wait().assert_code(0);
    // Gone with its last holder: any N may take the name again.
    run(lockrun_run(
        &redis.url(),
        "job",
        &["--slots", "2"],
        &sh("true"),
    ))
    .assert_code(0);
}

#[test]
fn a_wanted_slot_is_taken_or_its_holder_named() {
    let redis = RedisServer::start();
    let v = acquire(&redis, 3, "a", "", "2");
    assert_eq!(acquired(&v), (2, "111".to_owned()));
    // The lowest free one for the next, and the map says slot 2 was held.
    assert_eq!(
        acquired(&acquire(&redis, 3, "b", "", "")),
        (0, "110".to_owned())
    );
    // Slot 2 asked for again: busy, with its holder (slot 2 of 3), although 1 is free.
    let Value::Array(busy) = acquire(&redis, 3, "c", "", "2") else {
        panic!()
    };
    assert_eq!(busy[0], Value::Int(0));
    assert_eq!(&busy[6..], [Value::Int(2), Value::Int(3)]);
    for bad in ["3", "x", "-1", "1e0"] {
        let e = eval(
            &redis,
            "acquire",
            &acquire_keys(3),
            &["d", "60000", "h", "1", "", "6000", bad],
        )
        .expect_err(bad);
        assert!(e.contains("wanted slot must be"), "{bad}: {e}");
    }
    assert!(
        !redis.exists(&slot_key("job", 1)),
        "a refused acquire took slot 1"
    );
}

#[test]
fn a_release_finds_its_token_in_any_slot() {
    let redis = RedisServer::start();
    acquire(&redis, 3, "first", "", "");
    // An acquire whose answer was lost: its lockrun never learnt the slot (1).
    assert_eq!(acquired(&acquire(&redis, 3, "lost", "", "")).0, 1);
    let wake = "lockrun:{job}:wake:";
    let released = eval(&redis, "release", &release_keys(3), &["lost", "0", wake]);
    assert_eq!(released, Ok(Value::Int(1)));
    assert!(!redis.exists(&slot_key("job", 1)));
    assert!(redis.exists(&slot_key("job", 0)) && redis.exists(&limit_key("job")));
    let again = eval(&redis, "release", &release_keys(3), &["lost", "0", wake]);
    assert_eq!(again, Ok(Value::Int(0)), "released twice");
    // The renewal of an unknown slot looks everywhere too.
    let mut renew_keys = vec![limit_key("job")];
    renew_keys.extend((0..3).map(|i| slot_key("job", i)));
    let renewed = eval(&redis, "renew", &renew_keys, &["first", "90000"]);
    assert_eq!(renewed, Ok(Value::Int(1)));
    let limit = redis.pttl(&limit_key("job"));
    assert!(
        limit > 80_000,
        "the limit key does not cover the renewed lease: {limit}"
    );
    let released = eval(&redis, "release", &release_keys(3), &["first", "0", wake]);
    assert_eq!(released, Ok(Value::Int(1)));
    assert!(
        !redis.exists(&limit_key("job")),
        "the last holder left the limit key"
    );
}

#[test]
fn each_slot_freed_wakes_one_more_waiter() {
    let redis = RedisServer::start();
    let woken = |id: &str| {
        redis
            .hget(&waiter_key("job", "alive"), &format!("w:{id}"))
            .is_some()
    };
    acquire(&redis, 2, "a", "", "");
    acquire(&redis, 2, "b", "", "");
    for w in ["w1", "w2", "w3"] {
        let Value::Array(busy) = acquire(&redis, 2, "c", w, "") else {
            panic!()
        };
        assert_eq!(busy[0], Value::Int(0), "{w} was not told busy");
    }
    let wake = "lockrun:{job}:wake:";
    eval(&redis, "release", &release_keys(2), &["a", "0", wake]).unwrap();
    assert_eq!(
        [woken("w1"), woken("w2"), woken("w3")],
        [true, false, false]
    );
    // A second slot freed before w1 came back wakes w2, not w1 again.
    eval(&redis, "release", &release_keys(2), &["b", "0", wake]).unwrap();
    assert_eq!([woken("w1"), woken("w2"), woken("w3")], [true, true, false]);
    // w1 takes a slot and leaves the queue; w2 finds none left and waits again.
    acquired(&acquire(&redis, 2, "c1", "w1", ""));
    acquired(&acquire(&redis, 2, "c2", "w3", ""));
    let Value::Array(busy) = acquire(&redis, 2, "c3", "w2", "") else {
        panic!()
    };
    assert_eq!(busy[0], Value::Int(0));
    assert!(!woken("w1") && !woken("w2") && !woken("w3"));
    // release --force frees both slots: one wake-up for the one waiter left.
    let Value::Array(broken) = eval(&redis, "force", &release_keys(2), &[wake]).unwrap() else {
        panic!()
    };
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(woken("w2"));
    for i in 0..2 {
        assert!(!redis.exists(&slot_key("job", i)));
    }
}
