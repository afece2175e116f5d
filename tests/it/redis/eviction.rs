//! Redis servers that may evict the lock (issue 12, item 2): with `maxmemory` set and a
//! `maxmemory-policy` other than `noeviction`, a run is refused (125, one line naming
//! the policy and both ways out) before anything is written or run, unless
//! `--allow-eviction` or `LOCKRUN_ALLOW_EVICTION`; `maxmemory 0` and `noeviction` are
//! fine; the server is checked as it is at each run (`CONFIG SET`); a user without
//! INFO still runs, and `-v` says the check was not made; one Redlock node that may
//! evict refuses the quorum, and so does a Sentinel master. `status` and
//! `release --force` are not refused.

use std::time::Duration;

use crate::support::*;

/// A server with `maxmemory` `max` and `maxmemory-policy` `policy`.
fn server(max: &str, policy: &str) -> RedisServer {
    RedisServer::with_args(&[
        "--maxmemory".to_owned(),
        max.to_owned(),
        "--maxmemory-policy".to_owned(),
        policy.to_owned(),
    ])
}

fn dbsize(redis: &RedisServer) -> i64 {
    redis.query(&redis::cmd("DBSIZE"))
}

fn config_set(redis: &RedisServer, what: &str, value: &str) {
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg(what).arg(value));
}

/// Runs `touch $MARKER` under lock "job" on `url` with `opts` and `env`; the result and
/// whether the command ran.
fn marker_run(url: &str, opts: &[&str], env: &[(&str, &str)]) -> (Finished, bool) {
    let s = Scratch::new();
    let mut cmd = lockrun_run(url, "job", opts, &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"))
        .envs(env.iter().copied());
    let f = run(cmd);
    let ran = s.exists("marker");
    (f, ran)
}

/// Asserts a refusal of `redis` for `policy`: 125, one line naming the server, the
/// policy and both ways out, the command not run, nothing written.
fn assert_refused(redis: &RedisServer, policy: &str, opts: &[&str], env: &[(&str, &str)]) {
    let (f, ran) = marker_run(&redis.url(), opts, env);
    f.assert_failure(125);
    assert!(
        !ran,
        "{policy}: the command ran on a server that may evict the lock"
    );
    let lines: Vec<&str> = f.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{policy}: not one line:\n{}", f.stderr);
    let line = lines[0];
    for part in [
        &format!("127.0.0.1:{}", redis.port()),
        &format!("maxmemory-policy {policy}"),
        "noeviction",
        "--allow-eviction",
        "LOCKRUN_ALLOW_EVICTION=1",
    ] {
        assert!(line.contains(part), "{policy}: {part} missing from {line}");
    }
    assert_eq!(dbsize(redis), 0, "{policy}: a refused run wrote a key");
}

/// Asserts that a run on `url` took the lock and ran its command.
fn assert_ran(url: &str, opts: &[&str], env: &[(&str, &str)], what: &str) -> Finished {
    let (f, ran) = marker_run(url, opts, env);
    f.assert_code(0);
    assert!(ran, "{what}: the command did not run:\n{}", f.stderr);
    f
}

#[test]
fn allkeys_lru_with_maxmemory_is_refused_before_anything_is_written() {
    let redis = server("10mb", "allkeys-lru");
    assert_refused(&redis, "allkeys-lru", &[], &[]);
    // A waiter is refused at once too, and does not join the queue.
    let (f, ran) = marker_run(&redis.url(), &["--wait", "30s"], &[]);
    f.assert_failure(125);
    assert!(
        !ran && f.elapsed < Duration::from_secs(10),
        "{:?}",
        f.elapsed
    );
    assert_eq!(dbsize(&redis), 0);
    // A semaphore is refused alike.
    assert_refused(&redis, "allkeys-lru", &["--slots", "3"], &[]);
    // An explicit "no" is no, and so is an empty variable.
    for no in ["0", "false", "no", "off", ""] {
        let env = [("LOCKRUN_ALLOW_EVICTION", no)];
        assert_refused(&redis, "allkeys-lru", &[], &env);
    }
}

#[test]
fn volatile_lru_is_refused_too_the_lock_has_an_expiry() {
    let redis = server("10mb", "volatile-lru");
    assert_refused(&redis, "volatile-lru", &[], &[]);
}

#[test]
fn allow_eviction_takes_the_lock_by_option_or_environment() {
    let redis = server("10mb", "allkeys-lru");
    let url = redis.url();
    assert_ran(&url, &["--allow-eviction"], &[], "--allow-eviction");
    for yes in ["1", "true", "yes", "on", "TRUE"] {
        let env = [("LOCKRUN_ALLOW_EVICTION", yes)];
        assert_ran(&url, &[], &env, &format!("LOCKRUN_ALLOW_EVICTION={yes}"));
    }
    // A value that is neither yes nor no is a usage error (125), not a yes.
    let (f, ran) = marker_run(&url, &[], &[("LOCKRUN_ALLOW_EVICTION", "maybe")]);
    f.assert_failure(125);
    assert!(
        !ran && f.stderr.contains("--allow-eviction"),
        "{}",
        f.stderr
    );
    // The lock taken is an ordinary one: a second run while it is held is busy.
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &["--allow-eviction"]);
    let (busy, ran) = marker_run(&url, &["--allow-eviction"], &[]);
    busy.assert_code(75);
    assert!(!ran);
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn no_maxmemory_or_noeviction_is_accepted_whatever_else_is_set() {
    for policy in ["allkeys-lru", "volatile-ttl", "noeviction"] {
        let redis = server("0", policy);
        assert_ran(&redis.url(), &[], &[], &format!("maxmemory 0, {policy}"));
    }
    let redis = server("10mb", "noeviction");
    assert_ran(&redis.url(), &[], &[], "maxmemory 10mb, noeviction");
    assert_ran(
        &redis.url(),
        &["--slots", "2"],
        &[],
        "a semaphore on noeviction",
    );
}

#[test]
fn config_set_is_seen_by_the_next_run() {
    let redis = server("10mb", "noeviction");
    let url = redis.url();
    assert_ran(&url, &[], &[], "noeviction");
    redis.flushall();
    for policy in [
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-lfu",
        "volatile-random",
        "volatile-ttl",
    ] {
        config_set(&redis, "maxmemory-policy", policy);
        assert_refused(&redis, policy, &[], &[]);
    }
    config_set(&redis, "maxmemory", "0");
    assert_ran(&url, &[], &[], "maxmemory 0 after CONFIG SET");
    config_set(&redis, "maxmemory", "20mb");
    redis.flushall();
    assert_refused(&redis, "volatile-ttl", &[], &[]);
    config_set(&redis, "maxmemory-policy", "noeviction");
    assert_ran(&url, &[], &[], "noeviction after CONFIG SET");
}

#[test]
fn a_user_without_info_still_runs_and_v_says_the_check_was_not_made() {
    // A server that would be refused: only the check tells, and this user cannot make it.
    let redis = server("10mb", "allkeys-lru");
    redis.acl_user(
        "noinfo",
        &["on", ">pw", "~lockrun:*", "&lockrun:*", "+@all", "-info"],
    );
    let url = format!("redis://noinfo:pw@127.0.0.1:{}", redis.port());
    let said = |f: &Finished| {
        f.stderr
            .matches("run INFO in lockrun's acquire script")
            .count()
    };
    let f = assert_ran(&url, &["-v"], &[], "a user without INFO, -v");
    assert_eq!(said(&f), 1, "{}", f.stderr);
    let line = f
        .stderr
        .lines()
        .find(|l| l.contains("run INFO"))
        .unwrap_or_default();
    assert!(
        line.contains(&format!("127.0.0.1:{}", redis.port()))
            && line.contains("ACL SETUSER noinfo +info "),
        "{line}"
    );
    assert!(!line.contains(":pw@"), "{line}");
    // Said once a run, also when the lock is tried more than once (busy, then free).
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &[]);
    let mut waiter = spawn(lockrun_run(
        &url,
        "job",
        &["-v", "--wait", "20s"],
        &["true"],
    ));
    wait_until("the waiter queued", WAIT, || {
        redis.exists(&waiter_key("job", "waiters"))
    });
    s.touch("go");
    holder.wait().assert_code(0);
    let w = waiter.wait_for(Duration::from_secs(20));
    w.assert_code(0);
    assert_eq!(said(&w), 1, "{}", w.stderr);
    // Without -v, nothing is said at all.
    let f = assert_ran(&url, &[], &[], "a user without INFO");
    assert_eq!(f.stderr, "", "{}", f.stderr);
    // The default user, who may read INFO, is refused on the same server.
    redis.flushall();
    assert_refused(&redis, "allkeys-lru", &[], &[]);
}

#[test]
fn status_and_release_force_are_not_refused() {
    let redis = server("10mb", "allkeys-lru");
    let mut cmd = lockrun();
    cmd.args(["status", "--url", &redis.url(), "job"]);
    run(cmd).assert_code(1);
    redis.write_holder(&lock_key("job"), "someone", 1, 30_000);
    let mut cmd = lockrun();
    cmd.args(["release", "--force", "--url", &redis.url(), "job"]);
    run(cmd).assert_code(0);
    assert!(!redis.lock_held("job"));
}

#[test]
fn one_redlock_node_that_may_evict_refuses_the_quorum() {
    let nodes = [
        RedisServer::start(),
        server("10mb", "allkeys-lru"),
        RedisServer::start(),
    ];
    let quorum = |opts: &[&str]| {
        let s = Scratch::new();
        let mut cmd = lockrun();
        for n in &nodes {
            cmd.arg("--url").arg(n.url());
        }
        cmd.args(opts)
            .arg("job")
            .arg("--")
            .args(sh(r#"touch "$MARKER""#))
            .env("MARKER", s.path("marker"));
        let f = run(cmd);
        (f, s.exists("marker"))
    };
    let (f, ran) = quorum(&[]);
    f.assert_failure(125);
    assert!(!ran, "the command ran");
    let line = f.lockrun_line().unwrap_or_default();
    assert!(
        line.contains(&format!("127.0.0.1:{}", nodes[1].port()))
            && line.contains("allkeys-lru")
            && line.contains("--allow-eviction"),
        "{line}"
    );
    for n in &nodes {
        assert!(!n.lock_held("job"), "a node kept the lock");
    }
    assert_eq!(dbsize(&nodes[1]), 0, "the refusing node wrote a key");
    let (f, ran) = quorum(&["--allow-eviction"]);
    f.assert_code(0);
    assert!(ran);
}

#[test]
fn a_sentinel_master_that_may_evict_is_refused() {
    let cluster = Sentinel::start(Duration::from_secs(5));
    config_set(cluster.master(), "maxmemory", "10mb");
    config_set(cluster.master(), "maxmemory-policy", "volatile-lfu");
    let (f, ran) = marker_run(&cluster.url(), &[], &[]);
    f.assert_failure(125);
    assert!(!ran, "the command ran");
    let line = f.lockrun_line().unwrap_or_default();
    assert!(
        line.contains("volatile-lfu") && line.contains("--allow-eviction"),
        "{line}"
    );
    assert_eq!(dbsize(cluster.master()), 0);
    assert_ran(
        &cluster.url(),
        &["--allow-eviction"],
        &[],
        "Sentinel, allowed",
    );
}
