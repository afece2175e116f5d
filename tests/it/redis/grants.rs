//! Grants (`scripts/grant.lua`): a holder's release gives the lock to the waiter it
//! would wake, when that waiter listens and was heard from lately, and the waiter's
//! command starts without another acquire; a waiter whose grant message is lost takes
//! the lock at its next attempt; a waiter that does not listen, or has not been heard
//! from for half its heartbeat, is woken as before, not granted. The scripts are
//! called directly where the point is the server side.

use std::time::Duration;

use redis::Value;

use crate::support::*;

const TOKEN_H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const TOKEN_W: &str = "0123456789abcdef0123456789abcdef";

fn eval(redis: &RedisServer, name: &str, keys: &[String], args: &[&str]) -> Value {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    redis
        .eval_lockrun_script(name, &keys, args)
        .unwrap_or_else(|e| panic!("the {name} script failed: {e}"))
}

/// The acquire script for `token`, as waiter `waiter` asking for grants.
fn acquire(redis: &RedisServer, token: &str, waiter: &str) -> Value {
    let args = [
        token, "30000", "host-w", "4242", waiter, "6000", "", "", "", "1",
    ];
    eval(redis, "acquire", &acquire_keys("job", 1), &args)
}

/// `{1, fence, ...}` → the fence; `None` for any other answer.
fn fence_of(v: &Value) -> Option<u64> {
    match v {
        Value::Array(a) => match a.as_slice() {
            [Value::Int(1), Value::BulkString(f), ..] => std::str::from_utf8(f).ok()?.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// The holder H takes the lock; waiter W finds it busy and queues asking for grants.
fn held_with_waiter(redis: &RedisServer) -> u64 {
    let h = fence_of(&acquire(redis, TOKEN_H, "")).expect("the holder took the lock");
    assert_eq!(
        fence_of(&acquire(redis, TOKEN_W, "W")),
        None,
        "the lock is busy"
    );
    let spec = redis.hget(&waiter_key("job", "alive"), "g:W");
    assert!(
        spec.is_some_and(|s| s.contains(TOKEN_W)),
        "the waiter's grant fields"
    );
    h
}

fn release(redis: &RedisServer) {
    let args = [TOKEN_H, "0", "lockrun:{job}:wake:", "", "", "0", "exited"];
    assert_eq!(
        eval(redis, "release", &release_keys("job", 1), &args),
        Value::Int(1)
    );
}

#[test]
fn a_release_grants_the_lock_to_a_listening_waiter_and_tells_it() {
    let redis = RedisServer::start();
    let holder_fence = held_with_waiter(&redis);
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let mut sub = con.as_pubsub();
    sub.subscribe("lockrun:{job}:wake:W").unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    release(&redis);
    let msg: String = sub.get_message().expect("a message").get_payload().unwrap();
    let words: Vec<&str> = msg.split(' ').collect();
    assert_eq!(words.len(), 4, "{msg}");
    assert_eq!(
        (words[0], words[2], words[3]),
        ("granted", "0", &TOKEN_W[..16])
    );
    let fence: u64 = words[1].parse().unwrap();
    assert!(fence > holder_fence, "{fence} after {holder_fence}");
    let key = lock_key("job");
    assert_eq!(redis.hget(&key, "token").as_deref(), Some(TOKEN_W));
    assert_eq!(redis.hget(&key, "fence"), Some(fence.to_string()));
    assert_eq!(redis.hget(&key, "host").as_deref(), Some("host-w"));
    assert_eq!(redis.hget(&key, "pid").as_deref(), Some("4242"));
    let pttl = redis.pttl(&key);
    assert!(pttl > 25_000 && pttl <= 30_000, "the waiter's TTL: {pttl}");
    assert!(
        !redis.exists(&waiter_key("job", "waiters")),
        "the waiter left the queue"
    );
    // Another run is told busy; the waiter, should its message be lost, takes the lock
    // at its next attempt, with the grant's fencing token and a fresh lease.
    assert_eq!(
        fence_of(&acquire(&redis, "ffffffffffffffffffffffffffffffff", "X")),
        None
    );
    redis.query::<()>(redis::cmd("PEXPIRE").arg(&key).arg(10_000));
    assert_eq!(fence_of(&acquire(&redis, TOKEN_W, "W")), Some(fence));
    assert!(redis.pttl(&key) > 25_000, "the lease was not renewed");
    assert_eq!(redis.hget(&waiter_key("job", "alive"), "g:W"), None);
}

#[test]
fn a_waiter_not_listening_or_not_heard_from_lately_is_woken_not_granted() {
    let redis = RedisServer::start();
    held_with_waiter(&redis);
    release(&redis);
    assert!(
        !redis.exists(&lock_key("job")),
        "granted to a waiter nobody hears"
    );
    let alive = waiter_key("job", "alive");
    assert!(
        redis.hget(&alive, "w:W").is_some(),
        "woken as before grants"
    );

    let redis = RedisServer::start();
    held_with_waiter(&redis);
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let mut sub = con.as_pubsub();
    sub.subscribe("lockrun:{job}:wake:W").unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Heard from 4 s ago: its heartbeat (6 s) has less than half left.
    let t: Vec<String> = redis.query(&redis::cmd("TIME"));
    let now_ms = t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000;
    redis.query::<()>(redis::cmd("HSET").arg(&alive).arg("W").arg(now_ms + 2_000));
    release(&redis);
    let msg: String = sub.get_message().expect("a message").get_payload().unwrap();
    assert_eq!(msg, "released");
    assert!(
        !redis.exists(&lock_key("job")),
        "granted to a waiter not heard from"
    );
}

#[test]
fn a_waiting_run_starts_on_the_holders_release_without_asking_again() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    redis.query::<()>(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0),
    );
    redis.query::<()>(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(10_000),
    );
    let go = s.path("go");
    let mut holder = lockrun();
    holder
        .args(["--url", &redis.url(), "job", "--", "sh", "-c"])
        .arg(format!(
            "echo $LOCKRUN_FENCING_TOKEN > {}; until [ -e {} ]; do sleep 0.02; done",
            s.path("h").display(),
            go.display()
        ));
    let holder = holder.spawn().unwrap();
    wait_until("the holder runs", Duration::from_secs(30), || {
        s.path("h").exists()
    });
    let mut waiter = lockrun();
    waiter.args([
        "--url",
        &redis.url(),
        "--wait",
        "60s",
        "job",
        "--",
        "sh",
        "-c",
    ]);
    waiter.arg(format!(
        "echo $LOCKRUN_FENCING_TOKEN > {}",
        s.path("w").display()
    ));
    redis.query::<()>(redis::cmd("SLOWLOG").arg("RESET"));
    let waiter = waiter.spawn().unwrap();
    // Queued, subscribed and asked once more: its next try is 2 s away, so nothing
    // but the release can give it the lock in between.
    wait_until("the waiter asks twice", Duration::from_secs(30), || {
        script_calls(&redis).iter().filter(|c| c.2 == "5").count() >= 2
    });
    let alive = waiter_key("job", "alive");
    let fields: Vec<String> = redis.query(redis::cmd("HKEYS").arg(&alive));
    assert!(fields.iter().any(|f| f.starts_with("g:")), "{fields:?}");
    std::fs::write(&go, "").unwrap();
    assert!(holder.wait_with_output().unwrap().status.success());
    assert!(waiter.wait_with_output().unwrap().status.success());
    let read = |f: &str| -> u64 { s.read(f).trim().parse().unwrap() };
    assert!(read("w") > read("h"), "fencing tokens increase");
    // What the server ran from the holder's release on: releases only (6 keys; the
    // holder's, by digest and again by source on a server that lacks it, then the
    // waiter's), no acquire (5 keys).
    let calls = script_calls(&redis);
    let first = calls.iter().position(|c| c.2 == "6").expect("a release");
    let keys: Vec<&str> = calls[first..].iter().map(|(_, _, k)| k.as_str()).collect();
    assert!(
        keys.len() >= 2 && keys.iter().all(|k| *k == "6"),
        "the release, then the waiter's: {calls:?}"
    );
}

/// The script calls in the slow log (every command is logged: see the test), oldest
/// first: (id, eval or evalsha, number of keys).
fn script_calls(redis: &RedisServer) -> Vec<(i64, String, String)> {
    let log: Vec<Value> = redis.query(redis::cmd("SLOWLOG").arg("GET").arg(-1));
    let mut calls: Vec<(i64, String, String)> = log
        .iter()
        .filter_map(|e| match e {
            Value::Array(f) => match (&f[0], &f[3]) {
                (Value::Int(id), Value::Array(args)) if args.len() > 2 => {
                    let text = |v: &Value| match v {
                        Value::BulkString(b) => String::from_utf8_lossy(b).to_lowercase(),
                        _ => String::new(),
                    };
                    Some((*id, text(&args[0]), text(&args[2])))
                }
                _ => None,
            },
            _ => None,
        })
        .filter(|(_, cmd, _)| cmd == "eval" || cmd == "evalsha")
        .collect();
    calls.sort();
    calls
}
