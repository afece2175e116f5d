//! Every key lockrun writes in Redis expires (docs/guarantees.md, property 8), and a name
//! no longer used leaves nothing behind for good (issue 14, findings 3 and 9): the
//! scripts refuse an expiry the server cannot take before they write anything; a lock
//! found without an expiry gets the longest lease and its waiters wait rather than spin;
//! the fencing counter expires, and tokens still increase once it is gone.
//!
//! The scripts are called directly (EVAL, with the arguments a test chooses) where the
//! point is what the server side does whatever lockrun's own checks let through.

use redis::Value;

use crate::support::*;

/// The longest lease, in ms: what a lock without an expiry is given.
const MAX_MS: i64 = 86_400_000;

/// What `--ttl 18446744073709551615s` made lockrun send: more ms than PEXPIRE takes.
const HUGE_MS: &str = "18446744073709551615000";

/// Millisecond arguments no script may accept, each for its own reason.
const BAD_MS: [&str; 7] = [HUGE_MS, "86400001", "0", "-5", "1e3", "0x10", " 5"];

/// Runs the acquire script on "job" with lease `ttl_ms`, as waiter `waiter` ('' for
/// none), with a heartbeat of `alive_ms`.
fn acquire(
    redis: &RedisServer,
    ttl_ms: &str,
    waiter: &str,
    alive_ms: &str,
) -> Result<Value, String> {
    let keys = acquire_keys("job", 1);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let args = ["owner-token", ttl_ms, "host1", "42", waiter, alive_ms];
    redis
        .eval_lockrun_script("acquire", &keys, &args)
        .map_err(|e| e.to_string())
}

/// Writes lock "job" the way an older lockrun (or an operator) could: without expiry.
fn lock_without_expiry(redis: &RedisServer) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(lock_key("job")).arg(&[
        "token",
        "old-owner",
        "fence",
        "7",
        "host",
        "oldhost",
        "pid",
        "4242",
        "since_ms",
        "1",
    ]);
    let _: i64 = redis.query(&cmd);
    assert_eq!(redis.pttl(&lock_key("job")), -1);
}

/// Asserts that no key of lock "job" exists without an expiry.
fn assert_every_key_expires(redis: &RedisServer, after: &str) {
    for key in acquire_keys("job", 1) {
        assert_ne!(redis.pttl(&key), -1, "{key} has no expiry after {after}");
    }
}

#[test]
fn an_acquire_with_a_lease_the_server_cannot_take_writes_nothing() {
    let redis = RedisServer::start();
    for bad in BAD_MS {
        let e = acquire(&redis, bad, "", "6000").expect_err(bad);
        assert!(e.contains("ttl_ms must be"), "{bad:?}: {e}");
        for key in acquire_keys("job", 1) {
            assert!(!redis.exists(&key), "ttl_ms {bad:?} left {key} behind");
        }
    }
    // A waiter's heartbeat is checked as well, before it joins the queue.
    lock_without_expiry(&redis);
    for bad in BAD_MS {
        let e = acquire(&redis, "30000", "waiter1", bad).expect_err(bad);
        assert!(e.contains("alive_ms must be"), "{bad:?}: {e}");
        assert!(!redis.exists(&waiter_key("job", "waiters")), "{bad:?}");
        assert!(!redis.exists(&waiter_key("job", "alive")), "{bad:?}");
    }
    assert_eq!(redis.pttl(&lock_key("job")), -1, "an error still wrote");
}

#[test]
fn the_longest_lease_is_taken_and_every_key_of_a_waiter_expires() {
    let redis = RedisServer::start();
    acquire(&redis, &MAX_MS.to_string(), "", "6000").expect("24 h is a valid lease");
    let pttl = redis.pttl(&lock_key("job"));
    assert!(pttl > MAX_MS - 60_000 && pttl <= MAX_MS, "{pttl}");
    // A second contender waits: its queue entry and heartbeat expire too.
    let busy = acquire(&redis, "30000", "waiter1", "6000").expect("a busy answer");
    assert!(
        matches!(&busy, Value::Array(a) if a.first() == Some(&Value::Int(0))),
        "{busy:?}"
    );
    assert!(redis.exists(&waiter_key("job", "waiters")));
    assert_every_key_expires(&redis, "a waiter joined");
}

#[test]
fn renew_and_release_refuse_a_lease_the_server_cannot_take() {
    let redis = RedisServer::start();
    acquire(&redis, "60000", "", "6000").expect("acquired");
    let key = lock_key("job");
    let wake = "lockrun:{job}:wake:";
    let limit = limit_key("job");
    let release_keys = release_keys("job", 1);
    let release_keys: Vec<&str> = release_keys.iter().map(String::as_str).collect();
    for bad in BAD_MS {
        let e = redis.eval_lockrun_script("renew", &[&limit, &key], &["owner-token", bad]);
        assert!(
            e.is_err_and(|e| e.to_string().contains("ttl_ms must be")),
            "{bad:?}"
        );
        if bad != "0" {
            // keep_ms 0 is a plain release; the rest must be refused, lock untouched.
            let e =
                redis.eval_lockrun_script("release", &release_keys, &["owner-token", bad, wake]);
            assert!(
                e.is_err_and(|e| e.to_string().contains("keep_ms must be")),
                "{bad:?}"
            );
        }
        let pttl = redis.pttl(&key);
        assert!(
            pttl > 50_000 && pttl <= 60_000,
            "{bad:?} changed the lease: {pttl}"
        );
    }
    let e = redis.eval_lockrun_script("fence_floor", &[&fence_key("job"), &key], &["1e99", "x"]);
    assert!(e.is_err(), "a fencing token that is not a number was taken");
    assert_every_key_expires(&redis, "refused renewals and releases");
}

#[test]
fn a_lock_without_expiry_is_shown_with_the_longest_lease_and_given_it() {
    let redis = RedisServer::start();
    lock_without_expiry(&redis);
    let mut cmd = lockrun();
    cmd.args(["status", "--json", "--url", &redis.url(), "job"]);
    let f = run(cmd);
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status JSON");
    let ttl = v["ttl_ms"].as_i64().expect("ttl_ms");
    assert!(
        ttl > MAX_MS - 60_000 && ttl <= MAX_MS,
        "status shows {ttl} ms left"
    );
    let pttl = redis.pttl(&lock_key("job"));
    assert!(
        pttl > MAX_MS - 60_000 && pttl <= MAX_MS,
        "PTTL after status: {pttl}"
    );
}

#[test]
fn a_busy_answer_gives_a_lock_without_expiry_the_longest_lease() {
    let redis = RedisServer::start();
    lock_without_expiry(&redis);
    let f = run(lockrun_run(&redis.url(), "job", &[], &["true"]));
    f.assert_failure(75);
    let pttl = redis.pttl(&lock_key("job"));
    assert!(
        pttl > MAX_MS - 60_000 && pttl <= MAX_MS,
        "PTTL after a busy try: {pttl}"
    );
    assert_eq!(
        redis.hget(&lock_key("job"), "token").as_deref(),
        Some("old-owner")
    );
}

#[test]
fn a_waiter_on_a_lock_without_expiry_does_not_spin() {
    let redis = RedisServer::start();
    lock_without_expiry(&redis);
    let before = redis.evals();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "4s"],
        &["true"],
    ));
    f.assert_failure(75);
    let evals = redis.evals() - before;
    // The lock says a day is left: the waiter re-checks every couple of seconds (and
    // once around subscribing), not 40 times a second.
    assert!(evals <= 8, "{evals} EVALs in a 4 s wait");
    assert_every_key_expires(&redis, "a wait");
}

#[test]
fn the_fencing_counter_expires_and_tokens_still_increase_without_it() {
    let redis = RedisServer::start();
    let token = || {
        let f = run(lockrun_run(
            &redis.url(),
            "job",
            &[],
            &sh("echo $LOCKRUN_FENCING_TOKEN"),
        ));
        parse_token(f.assert_code(0).stdout.trim())
    };
    let first = token();
    let week_ms = 7 * 24 * 3600 * 1000;
    let pttl = redis.pttl(&fence_key("job"));
    assert!(
        pttl > week_ms - 60_000 && pttl <= week_ms,
        "counter PTTL {pttl}"
    );
    // Gone, as after a week unused: the clock floor keeps the next token larger.
    let _: i64 = redis.query(redis::cmd("DEL").arg(fence_key("job")));
    let second = token();
    assert!(
        second > first,
        "{second} after {first} once the counter was gone"
    );
    // A counter an older lockrun left without expiry gets one at the next run, and a
    // counter ahead of the clock is still honoured.
    let ahead = second + 1_000_000_000;
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(fence_key("job"))
            .arg(ahead.to_string()),
    );
    let third = token();
    assert!(third > ahead, "{third} below the stored counter {ahead}");
    assert!(
        redis.pttl(&fence_key("job")) > 0,
        "the old counter kept no expiry"
    );
    assert!(
        !redis.exists(&lock_key("job")),
        "the lock is held after the runs"
    );
}

#[test]
fn redlock_counters_expire_on_every_server() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut cmd = lockrun();
    for s in &servers {
        cmd.args(["--url", &s.url()]);
    }
    cmd.args(["job", "--", "true"]);
    run(cmd).assert_code(0);
    let week_ms = 7 * 24 * 3600 * 1000;
    for s in &servers {
        let pttl = s.pttl(&fence_key("job"));
        assert!(
            pttl > week_ms - 60_000 && pttl <= week_ms,
            "counter PTTL {pttl}"
        );
    }
}
