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

/// The keys of the force script for semaphore "job" of `n` slots.
fn force_keys(n: u32) -> Vec<String> {
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
    eval(redis, "acquire", &acquire_keys("job", n), &args).expect("the acquire script ran")
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
    let mut keys: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    keys.sort();
    assert_eq!(
        keys,
        [fence_key("job"), format!("{}:last", lock_key("job"))],
        "only the fencing counter and the last run's record stay"
    );
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
            &acquire_keys("job", 3),
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
    let released = eval(
        &redis,
        "release",
        &release_keys("job", 3),
        &["lost", "0", wake],
    );
    assert_eq!(released, Ok(Value::Int(1)));
    assert!(!redis.exists(&slot_key("job", 1)));
    assert!(redis.exists(&slot_key("job", 0)) && redis.exists(&limit_key("job")));
    let again = eval(
        &redis,
        "release",
        &release_keys("job", 3),
        &["lost", "0", wake],
    );
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
    let released = eval(
        &redis,
        "release",
        &release_keys("job", 3),
        &["first", "0", wake],
    );
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
    eval(
        &redis,
        "release",
        &release_keys("job", 2),
        &["a", "0", wake],
    )
    .unwrap();
    assert_eq!(
        [woken("w1"), woken("w2"), woken("w3")],
        [true, false, false]
    );
    // A second slot freed before w1 came back wakes w2, not w1 again.
    eval(
        &redis,
        "release",
        &release_keys("job", 2),
        &["b", "0", wake],
    )
    .unwrap();
    assert_eq!([woken("w1"), woken("w2"), woken("w3")], [true, true, false]);
    // w1 takes a slot and leaves the queue; the other is kept for w2, woken for it:
    // w3 is told busy (and stays queued); w2 takes it.
    acquired(&acquire(&redis, 2, "c1", "w1", ""));
    assert_eq!(
        busy_answer(&acquire(&redis, 2, "c3", "w3", ""))[0],
        Value::Int(0)
    );
    acquired(&acquire(&redis, 2, "c2", "w2", ""));
    assert!(!woken("w1") && !woken("w2") && !woken("w3"));
    // Both held: release --force below wakes w3.
    // release --force frees both slots: one wake-up for the one waiter left.
    let Value::Array(broken) = eval(&redis, "force", &force_keys(2), &[wake]).unwrap() else {
        panic!()
    };
    assert_eq!(broken.len(), 3, "{broken:?}");
    assert!(woken("w3"));
    for i in 0..2 {
        assert!(!redis.exists(&slot_key("job", i)));
    }
}

/// The fields of a busy answer `{0, host, pid, since_ms, fence, pttl, slot, slots}`, or
/// a panic naming the answer.
fn busy_answer(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) if a.len() == 8 && a[0] == Value::Int(0) => a.clone(),
        _ => panic!("not busy: {v:?}"),
    }
}

/// The pttl of a busy answer, in ms.
fn busy_pttl(v: &Value) -> i64 {
    match busy_answer(v)[5] {
        Value::Int(ms) => ms,
        ref other => panic!("pttl {other:?} in {v:?}"),
    }
}

/// The server's clock, in ms.
fn server_ms(redis: &RedisServer) -> u64 {
    let t: Vec<u64> = redis.query(&redis::cmd("TIME"));
    t[0] * 1000 + t[1] / 1000
}

/// Waiter `id`'s wake mark (`w:ID` in the alive hash), if it has one.
fn wake_mark(redis: &RedisServer, id: &str) -> Option<String> {
    redis.hget(&waiter_key("job", "alive"), &format!("w:{id}"))
}

/// Sets waiter `id`'s wake mark by hand (a mark an older lockrun wrote, or an old one).
fn set_wake_mark(redis: &RedisServer, id: &str, mark: &str) {
    let () = redis.query(
        redis::cmd("HSET")
            .arg(waiter_key("job", "alive"))
            .arg(format!("w:{id}"))
            .arg(mark),
    );
}

/// The waiters queued for "job", first come first.
fn queued(redis: &RedisServer) -> Vec<String> {
    redis.query(
        redis::cmd("ZRANGE")
            .arg(waiter_key("job", "waiters"))
            .arg(0)
            .arg(-1),
    )
}

// What the old acquire script did wrong: any caller took a free slot, so a waiter whose
// poll timer fired (or a run without --wait) between a release and the woken waiter's
// acquire took the slot freed for the woken one (on Redlock the gap is a majority of
// round trips, and the conformance test `semaphore_waiters_are_served_in_order` failed
// about once in five runs under load).
#[test]
fn a_woken_waiter_has_priority_for_the_slot_freed_for_it() {
    let redis = RedisServer::start();
    let wake = "lockrun:{job}:wake:";
    let release = |token: &str| {
        let done = eval(
            &redis,
            "release",
            &release_keys("job", 1),
            &[token, "0", wake],
        );
        assert_eq!(done, Ok(Value::Int(1)), "release of {token}");
    };
    // A holder; A then B join the queue.
    acquired(&acquire(&redis, 1, "h", "", ""));
    for w in ["A", "B"] {
        busy_answer(&acquire(&redis, 1, "t", w, ""));
    }
    assert_eq!(queued(&redis), ["A", "B"]);
    let before = server_ms(&redis);
    release("h");
    // A is woken, its mark the server's time in ms.
    let mark: u64 = wake_mark(&redis, "A")
        .expect("A woken")
        .parse()
        .expect("a wake mark in ms");
    assert!(mark >= before && mark <= server_ms(&redis), "mark {mark}");
    assert_eq!(wake_mark(&redis, "B"), None);
    // B (its poll timer fired) and a run without --wait are told busy: no holder to
    // name, and to ask again within the grace, not after a lease.
    for (token, waiter) in [("b", "B"), ("x", "")] {
        let v = acquire(&redis, 1, token, waiter, "");
        let busy = busy_answer(&v);
        assert_eq!(
            &busy[1..5],
            [b"".as_slice(), b"0", b"0", b"0"].map(|f| Value::BulkString(f.to_vec())),
            "{v:?}"
        );
        assert_eq!(&busy[6..], [Value::Int(0), Value::Int(1)], "{v:?}");
        let pttl = busy_pttl(&v);
        assert!(pttl > 0 && pttl <= 2000, "pttl {pttl}");
    }
    assert!(!redis.exists(&lock_key("job")), "the kept slot was taken");
    assert_eq!(queued(&redis), ["A", "B"], "B stays queued behind A");
    // A comes: it gets the slot, and leaves the queue.
    acquired(&acquire(&redis, 1, "a", "A", ""));
    assert_eq!(queued(&redis), ["B"]);
    assert_eq!(wake_mark(&redis, "A"), None);

    // A's release wakes B. A mark written by an older lockrun ('1'), one past the
    // grace, one from the future (a clock stepped back) or that of a waiter whose
    // heartbeat ended give no priority: anyone takes the slot, as before.
    for case in ["older lockrun", "old", "future", "dead"] {
        busy_answer(&acquire(&redis, 1, "c", "C", ""));
        release("a");
        let now = server_ms(&redis);
        let mark = match case {
            "older lockrun" => "1".to_owned(),
            "old" => (now - 2001).to_string(),
            "future" => (now + 60_000).to_string(),
            _ => {
                let heartbeat = (now - 1).to_string();
                let () = redis.query(
                    redis::cmd("HSET")
                        .arg(waiter_key("job", "alive"))
                        .arg(&queued(&redis)[0])
                        .arg(heartbeat),
                );
                wake_mark(&redis, &queued(&redis)[0]).expect("woken")
            }
        };
        let first = queued(&redis)[0].clone();
        set_wake_mark(&redis, &first, &mark);
        acquired(&acquire(&redis, 1, "a", "", ""));
        // Leave the queue clean for the next case.
        for w in queued(&redis) {
            eval(
                &redis,
                "leave",
                &[waiter_key("job", "waiters"), waiter_key("job", "alive")],
                &[&w],
            )
            .unwrap();
        }
    }
    release("a");

    // The priority lapses after the grace (2 s) by itself: D is woken and never comes;
    // E polls until it gets the slot, not before the grace has passed.
    acquired(&acquire(&redis, 1, "h", "", ""));
    busy_answer(&acquire(&redis, 1, "d", "D", ""));
    busy_answer(&acquire(&redis, 1, "e", "E", ""));
    let released_at = std::time::Instant::now();
    release("h");
    let woken_at: u64 = wake_mark(&redis, "D").expect("D woken").parse().unwrap();
    let mut tries = 0;
    let got = loop {
        let v = acquire(&redis, 1, "e", "E", "");
        if matches!(&v, Value::Array(a) if a.first() == Some(&Value::Int(1))) {
            break server_ms(&redis);
        }
        let pttl = busy_pttl(&v);
        assert!(pttl > 0 && pttl <= 2000, "pttl {pttl}");
        tries += 1;
        assert!(released_at.elapsed() < WAIT, "E never got the slot");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(tries > 0, "E got the slot kept for D at once");
    assert!(
        got >= woken_at + 2000,
        "E got it {} ms after D was woken",
        got - woken_at
    );
}

#[test]
fn free_slots_are_kept_for_as_many_woken_waiters() {
    let redis = RedisServer::start();
    let wake = "lockrun:{job}:wake:";
    let release = |token: &str| {
        let done = eval(
            &redis,
            "release",
            &release_keys("job", 2),
            &[token, "0", wake],
        );
        assert_eq!(done, Ok(Value::Int(1)), "release of {token}");
    };
    acquired(&acquire(&redis, 2, "a", "", ""));
    acquired(&acquire(&redis, 2, "b", "", ""));
    for w in ["w1", "w2", "w3"] {
        busy_answer(&acquire(&redis, 2, "t", w, ""));
    }
    // One slot freed, one woken (w1): the free slot is kept for it; w3 and a run
    // without --wait are told of the holder whose lease ends first (slot 1), to ask
    // again within the grace.
    release("a");
    for (token, waiter) in [("x", "w3"), ("y", "")] {
        let v = acquire(&redis, 2, token, waiter, "");
        assert_eq!(
            &busy_answer(&v)[6..],
            [Value::Int(1), Value::Int(2)],
            "{v:?}"
        );
        assert!(busy_pttl(&v) <= 2000, "{v:?}");
    }
    // The second slot freed wakes w2: two free, two woken (w1, w2), none for w3 (no
    // holder to name: the first free slot).
    release("b");
    assert!(wake_mark(&redis, "w1").is_some() && wake_mark(&redis, "w2").is_some());
    for (token, waiter) in [("x", "w3"), ("y", "")] {
        let v = acquire(&redis, 2, token, waiter, "");
        assert_eq!(&busy_answer(&v)[1..2], [Value::BulkString(vec![])], "{v:?}");
        assert_eq!(
            &busy_answer(&v)[6..],
            [Value::Int(0), Value::Int(2)],
            "{v:?}"
        );
    }
    // Redlock's second round (a wanted slot) is not held back: it moves a slot the
    // caller took on this server a moment ago, which passed the check then.
    let (slot, _) = acquired(&acquire(&redis, 2, "r", "", "1"));
    assert_eq!(slot, 1);
    release("r");
    // The woken ones take theirs, in any order.
    acquired(&acquire(&redis, 2, "c2", "w2", ""));
    acquired(&acquire(&redis, 2, "c1", "w1", ""));
    assert_eq!(queued(&redis), ["w3"]);
}

// Without this, a woken waiter whose Redlock acquisition reached a server before the
// release had reached the others took the slot there, gave it back (no majority), and
// so lost its place and woke the next waiter, who got the slot: the rarer failure of
// `semaphore_waiters_are_served_in_order` left once woken waiters had priority.
#[test]
fn a_slot_given_back_goes_back_to_the_woken_waiter_that_took_it() {
    let redis = RedisServer::start();
    let wake = "lockrun:{job}:wake:";
    let release = |token: &str, give_back: bool| {
        let args = match give_back {
            true => vec![token, "0", wake, "1", "6000"],
            false => vec![token, "0", wake],
        };
        let done = eval(&redis, "release", &release_keys("job", 1), &args);
        assert_eq!(done, Ok(Value::Int(1)), "release of {token}");
    };
    acquired(&acquire(&redis, 1, "h", "", ""));
    for w in ["A", "B"] {
        busy_answer(&acquire(&redis, 1, "t", w, ""));
    }
    release("h", false);
    let mark = wake_mark(&redis, "A").expect("A woken");
    // A takes it: the slot records who took it and when it was woken.
    acquired(&acquire(&redis, 1, "a", "A", ""));
    assert_eq!(redis.hget(&lock_key("job"), "waiter").as_deref(), Some("A"));
    assert_eq!(redis.hget(&lock_key("job"), "woken"), Some(mark.clone()));
    assert_eq!(queued(&redis), ["B"]);
    // Given back (no majority elsewhere): A is back first, alive, with its mark; B is
    // not woken, and is still told busy; A takes it again.
    release("a", true);
    assert!(!redis.exists(&lock_key("job")));
    assert_eq!(queued(&redis), ["A", "B"]);
    assert_eq!(wake_mark(&redis, "A"), Some(mark.clone()));
    assert_eq!(wake_mark(&redis, "B"), None);
    let heartbeat: u64 = redis
        .hget(&waiter_key("job", "alive"), "A")
        .expect("A alive")
        .parse()
        .unwrap();
    assert!(
        heartbeat > server_ms(&redis),
        "A's heartbeat {heartbeat} has ended"
    );
    busy_answer(&acquire(&redis, 1, "b", "B", ""));
    acquired(&acquire(&redis, 1, "a", "A", ""));
    // Its priority has ended when the slot is given back: A keeps its place, and the
    // slot goes to the next waiter, woken for it (B).
    let old = (server_ms(&redis) - 2001).to_string();
    let () = redis.query(
        redis::cmd("HSET")
            .arg(lock_key("job"))
            .arg("woken")
            .arg(&old),
    );
    release("a", true);
    assert_eq!(queued(&redis), ["A", "B"]);
    assert!(wake_mark(&redis, "B").is_some(), "B not woken");
    acquired(&acquire(&redis, 1, "b", "B", ""));
    // A holder's own release (not a give-back) wakes the next waiter, as before: A's
    // mark goes when it tries again, and it is woken.
    busy_answer(&acquire(&redis, 1, "a", "A", ""));
    assert_eq!(wake_mark(&redis, "A"), None);
    release("b", false);
    assert!(wake_mark(&redis, "A").is_some(), "A not woken");
    assert_eq!(queued(&redis), ["A"]);
    // And a holder that was no woken waiter gives back as any release: the next
    // waiter is woken. (x asks for slot 0 as Redlock's second round does, which the
    // priority of C, woken by A's release, does not hold back.)
    acquired(&acquire(&redis, 1, "a", "A", ""));
    busy_answer(&acquire(&redis, 1, "c", "C", ""));
    release("a", false);
    assert!(wake_mark(&redis, "C").is_some(), "C not woken");
    acquired(&acquire(&redis, 1, "x", "", "0"));
    assert_eq!(redis.hget(&lock_key("job"), "waiter"), None);
    busy_answer(&acquire(&redis, 1, "d", "D", ""));
    release("x", true);
    assert_eq!(queued(&redis), ["C", "D"]);
    assert!(wake_mark(&redis, "D").is_some(), "D not woken");
}
