//! Fencing tokens (docs/guarantees.md, property 5) and what lockrun stores in Redis: the
//! token and the lock name reach the command, tokens strictly increase across
//! acquisitions, also after the server restarted with no data or was flushed, and the
//! lock hash records the holder.

use crate::support::*;

/// Records "TOKEN NAME" in `$OUT`.
const RECORD: &str = r#"echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_LOCK_NAME" > "$OUT""#;

/// Runs one locked command on `url` and returns the fencing token it was given.
fn token_of_one_run(url: &str, name: &str) -> u128 {
    let s = Scratch::new();
    let mut cmd = lockrun_run(url, name, &[], &sh(RECORD));
    cmd.env("OUT", s.path("out"));
    run(cmd).assert_code(0);
    let line = wait_line(&s.path("out"));
    let (token, got_name) = line.split_once(' ').expect("token and name");
    assert_eq!(got_name, name, "LOCKRUN_LOCK_NAME");
    parse_token(token)
}

#[test]
fn fencing_token_and_lock_name_reach_the_command() {
    let redis = RedisServer::start();
    let name = "team/nightly:backup.v1_x-Y9";
    let token = token_of_one_run(&redis.url(), name);
    assert!(token > 0);
}

#[test]
fn tokens_of_different_names_are_independent_locks() {
    // Two names can be held at the same time.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "first", &s, &[]);
    token_of_one_run(&redis.url(), "second");
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn token_still_increases_after_redis_restart_with_no_data() {
    let mut redis = RedisServer::start();
    let before = token_of_one_run(&redis.url(), "job");
    let before2 = token_of_one_run(&redis.url(), "job");
    assert!(before2 > before);
    redis.restart();
    assert!(
        !redis.exists(&fence_key("job")),
        "the restarted server still has data"
    );
    let after = token_of_one_run(&redis.url(), "job");
    assert!(
        after > before2,
        "token after a restart with no data ({after}) is not larger than before ({before2})"
    );
}

#[test]
fn token_still_increases_after_flushall() {
    let redis = RedisServer::start();
    let before = token_of_one_run(&redis.url(), "job");
    redis.flushall();
    let after = token_of_one_run(&redis.url(), "job");
    assert!(
        after > before,
        "token after FLUSHALL ({after}) is not larger than before ({before})"
    );
}

#[test]
fn token_still_increases_after_a_counter_far_ahead_of_the_clock() {
    // A counter that ran ahead of the server clock (e.g. many acquisitions, or a clock that
    // was ahead) must still be respected: never go below the last stored token + 1.
    let redis = RedisServer::start();
    let first = token_of_one_run(&redis.url(), "job");
    // About eleven days of microseconds ahead, well within exact double precision (Lua).
    let far: u128 = first + 1_000_000_000_000;
    let _: () = redis.query(redis::cmd("SET").arg(fence_key("job")).arg(far.to_string()));
    let after = token_of_one_run(&redis.url(), "job");
    assert!(
        after > far,
        "token {after} is not above the stored counter {far}"
    );
}

#[test]
fn lock_hash_records_token_fence_holder_and_ttl() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, token) = start_holder(&redis.url(), "job", &s, &["--ttl", "20s"]);
    let key = lock_key("job");

    let pttl = redis.pttl(&key);
    assert!(
        pttl > 0 && pttl <= 20_000,
        "lock key PTTL {pttl} is not within (0, 20000]"
    );
    let fence = redis.hget(&key, "fence").expect("field fence");
    assert_eq!(
        parse_token(&fence),
        token,
        "stored fence vs the command's token"
    );
    let owner = redis.hget(&key, "token").expect("field token");
    assert!(
        owner.len() >= 16,
        "the owner token {owner:?} is too short for 128 random bits"
    );
    assert_eq!(
        redis.hget(&key, "host").as_deref(),
        Some(hostname().as_str())
    );
    assert_eq!(
        redis.hget(&key, "pid"),
        Some(holder.pid().to_string()),
        "field pid should be lockrun's pid"
    );
    let since: u128 = redis
        .hget(&key, "since_ms")
        .expect("field since_ms")
        .parse()
        .expect("since_ms is a number");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    assert!(
        since <= now_ms + 1_000 && since + 60_000 >= now_ms,
        "since_ms {since} is not close to now ({now_ms})"
    );
    let counter: Option<String> = redis.query(redis::cmd("GET").arg(fence_key("job")));
    let counter = parse_token(&counter.expect("fencing counter key"));
    assert!(
        counter >= token,
        "counter {counter} is below the handed-out token {token}"
    );

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn owner_tokens_differ_between_runs() {
    let redis = RedisServer::start();
    let mut owners = Vec::new();
    for _ in 0..2 {
        let s = Scratch::new();
        let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
        owners.push(redis.hget(&lock_key("job"), "token").expect("token field"));
        s.touch("go");
        holder.wait().assert_code(0);
    }
    assert_ne!(
        owners[0], owners[1],
        "two acquisitions used the same random token"
    );
}

#[test]
fn key_prefix_option_namespaces_the_keys() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &["--key-prefix", "other:"]);
    assert!(redis.exists("other:{job}"), "no key other:{{job}}");
    assert!(!redis.lock_held("job"), "the default-prefix key was used");
    // The same name under the default prefix is another lock.
    token_of_one_run(&redis.url(), "job");
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!redis.exists("other:{job}"));
}
