//! The least-privilege ACL rule the README states (`lockrun::backend::redis::acl`):
//! a user made with exactly that `ACL SETUSER` line can run, wait and be handed the
//! lock, see `status`, break a lock with `release --force`, and do all of it for a
//! `--slots 3` semaphore, without one denial in the server's `ACL LOG`; and a user
//! missing one permission of the rule gets a line naming it and the `ACL SETUSER`
//! that grants it.

use std::time::Duration;

use lockrun::backend::redis::acl;

use crate::support::*;

const PASSWORD: &str = "acl-Pw-41c9";

/// Runs `line` (an `ACL SETUSER ...` line as the README states it, `>PASSWORD` made
/// [`PASSWORD`]) on `redis`.
fn setuser(redis: &RedisServer, line: &str) {
    let line = line.replace(">PASSWORD", &format!(">{PASSWORD}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..2], ["ACL", "SETUSER"], "{line}");
    let _: String = redis.query(redis::cmd("ACL").arg(&words[1..]));
}

/// `redis://USER:PASSWORD@127.0.0.1:PORT`
fn url_of(redis: &RedisServer, user: &str) -> String {
    format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", redis.port())
}

/// `lockrun ADMIN --url URL ARGS...` (`status`, `release`).
fn admin(url: &str, what: &str, args: &[&str]) -> Finished {
    let mut cmd = lockrun();
    cmd.arg(what).arg("--url").arg(url).args(args);
    run(cmd)
}

/// The server's ACL log: every denial since it started.
fn acl_log(redis: &RedisServer) -> Vec<redis::Value> {
    redis.query(redis::cmd("ACL").arg("LOG"))
}

/// How many calls of `command` the server has seen (INFO commandstats).
fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info: String = redis.query(redis::cmd("INFO").arg("commandstats"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a number of calls"))
}

/// A lockrun waiting (`--wait`) for `name` on `url` with `opts`, whose command touches
/// `s`'s "ran" file; returned once it has queued.
fn queued_waiter(
    redis: &RedisServer,
    url: &str,
    name: &str,
    opts: &[&str],
    s: &Scratch,
) -> Running {
    let waiters = waiter_key(name, "waiters");
    let before: i64 = redis.query(redis::cmd("ZCARD").arg(&waiters));
    let mut all = vec!["--wait", "30s"];
    all.extend_from_slice(opts);
    let mut cmd = lockrun_run(url, name, &all, &sh(r#"touch "$RAN""#));
    cmd.env("RAN", s.path("ran"));
    let waiter = spawn(cmd);
    wait_until("the waiter queues", WAIT, || {
        let now: i64 = redis.query(redis::cmd("ZCARD").arg(&waiters));
        now > before
    });
    waiter
}

#[test]
fn the_documented_rule_is_enough_for_every_operation() {
    let redis = RedisServer::start();
    setuser(&redis, &acl::setuser_line("locker", "lockrun:"));
    let url = url_of(&redis, "locker");

    // A plain run, and its command's status.
    run(lockrun_run(&url, "job", &[], &sh("exit 6"))).assert_code(6);

    // Held: status sees it; a waiter is handed the lock by its wake-up at the release.
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &[]);
    admin(&url, "status", &["job"]).assert_code(0);
    let w = Scratch::new();
    let mut waiter = queued_waiter(&redis, &url, "job", &[], &w);
    wait_until("the waiter subscribes", WAIT, || {
        calls(&redis, "subscribe") >= 1
    });
    s.touch("go");
    holder.wait().assert_code(0);
    waiter.wait().assert_code(0);
    assert!(w.exists("ran"));
    // The release woke it (PUBLISH inside the release script), rather than a poll.
    assert!(calls(&redis, "publish") >= 1, "no wake-up was published");

    // release --force breaks a holder's lock; the holder learns it at its renewal.
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &["--renew-every", "300ms"]);
    admin(&url, "release", &["--force", "job"]).assert_code(0);
    admin(&url, "status", &["job"]).assert_code(1);
    holder.wait_for(Duration::from_secs(10)).assert_failure(124);

    // A semaphore of 3: three holders, status, a waiter woken by a release, and a
    // forced release of every slot.
    let opts = ["--slots", "3"];
    let holders: Vec<(Scratch, Running)> = (0..3)
        .map(|_| {
            let s = Scratch::new();
            let (h, _) = start_holder(&url, "sem", &s, &["--slots", "3", "--renew-every", "300ms"]);
            (s, h)
        })
        .collect();
    admin(&url, "status", &["--slots", "3", "sem"]).assert_code(0);
    let w = Scratch::new();
    let mut waiter = queued_waiter(&redis, &url, "sem", &opts, &w);
    let mut holders = holders.into_iter();
    let (s0, mut h0) = holders.next().unwrap();
    s0.touch("go");
    h0.wait().assert_code(0);
    waiter.wait().assert_code(0);
    let f = admin(&url, "release", &["--force", "--slots", "3", "sem"]);
    f.assert_code(0);
    for (_, mut h) in holders {
        h.wait_for(Duration::from_secs(10)).assert_failure(124);
    }
    admin(&url, "status", &["--slots", "3", "sem"]).assert_code(1);

    // The same under another key prefix, with the rule made for it.
    setuser(&redis, &acl::setuser_line("jobs", "jobs:"));
    let url = url_of(&redis, "jobs");
    let prefix = ["--key-prefix", "jobs:"];
    run(lockrun_run(&url, "job", &prefix, &["true"])).assert_code(0);
    admin(&url, "status", &["--key-prefix", "jobs:", "job"]).assert_code(1);

    let log = acl_log(&redis);
    assert!(log.is_empty(), "the server denied something: {log:?}");
    // The acquire script went by digest once the server had it.
    assert!(calls(&redis, "evalsha") > 0, "no EVALSHA ran");
}

/// A user made with the rule of a release before EVALSHA (`+eval` only) still locks,
/// waits and is handed the lock: lockrun sends the scripts by source then.
#[test]
fn the_rule_without_evalsha_still_locks() {
    let redis = RedisServer::start();
    setuser(&redis, &rule_without("+evalsha"));
    let url = url_of(&redis, "locker");
    run(lockrun_run(&url, "job", &[], &sh("exit 6"))).assert_code(6);
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&url, "job", &s, &[]);
    let w = Scratch::new();
    let mut waiter = queued_waiter(&redis, &url, "job", &[], &w);
    s.touch("go");
    holder.wait().assert_code(0);
    waiter.wait().assert_code(0);
    assert!(w.exists("ran"));
    assert_eq!(calls(&redis, "evalsha"), 0, "the server ran an EVALSHA");
    assert!(calls(&redis, "eval") >= 4);
}

/// The rule for the default prefix without `what` (a `+command` or a pattern).
fn rule_without(what: &str) -> String {
    let line = acl::setuser_line("locker", "lockrun:");
    let words: Vec<&str> = line.split_whitespace().filter(|w| *w != what).collect();
    assert_eq!(
        words.len() + 1,
        line.split_whitespace().count(),
        "{what} not in {line}"
    );
    words.join(" ")
}

/// Asserts that `f` failed (125) in one line that says `wanted` (each of them), without
/// running its command (which would have touched `s`'s "ran") or showing the password.
fn assert_named(f: &Finished, s: &Scratch, wanted: &[&str]) {
    f.assert_failure(125);
    assert_eq!(f.stderr.lines().count(), 1, "one line:\n{}", f.stderr);
    for w in wanted {
        assert!(f.stderr.contains(w), "{w:?} in:\n{}", f.stderr);
    }
    assert!(!f.stderr.contains(PASSWORD), "{}", f.stderr);
    assert!(!s.exists("ran"), "the command ran");
}

/// `lockrun --url URL OPTS job -- touch $RAN`, run.
fn try_run(url: &str, opts: &[&str], s: &Scratch) -> Finished {
    let mut cmd = lockrun_run(url, "job", opts, &sh(r#"touch "$RAN""#));
    cmd.env("RAN", s.path("ran"));
    run(cmd)
}

#[test]
fn a_command_missing_from_the_rule_is_named_with_its_grant() {
    let redis = RedisServer::start();
    let url = url_of(&redis, "locker");
    // Each is called by the acquire script of a free lock, or sent by lockrun itself.
    for command in ["pttl", "time", "hset", "set", "get", "pexpire", "eval"] {
        let mut rule = rule_without(&format!("+{command}"));
        if command == "eval" {
            // Neither way to run a script (EVALSHA alone runs those the server has).
            rule = rule.replace(" +evalsha", "");
        }
        setuser(&redis, &rule);
        let s = Scratch::new();
        let f = try_run(&url, &[], &s);
        let upper = command.to_ascii_uppercase();
        let run_it = format!("does not let user \"locker\" run {upper}");
        let grant = format!("ACL SETUSER locker +{command} ");
        let mut wanted = vec![run_it.as_str(), grant.as_str(), "Redis keys"];
        if command != "eval" {
            wanted.push("inside lockrun's acquire script");
        }
        assert_named(&f, &s, &wanted);
        assert_every_key_expires(&redis);
    }
    // A status of a held lock runs the inspect script: HMGET.
    redis.write_holder(&lock_key("job"), "other", 1, 60_000);
    setuser(&redis, &rule_without("+hmget"));
    let f = admin(&url, "status", &["job"]);
    f.assert_failure(125);
    assert!(
        f.stderr
            .contains("run HMGET (inside lockrun's inspect script)")
            && f.stderr.contains("ACL SETUSER locker +hmget "),
        "{}",
        f.stderr
    );
    assert_every_key_expires(&redis);
}

/// Asserts that no key on `redis` lacks an expiry: a denial half-way through a script
/// must not leave one behind.
fn assert_every_key_expires(redis: &RedisServer) {
    let keys: Vec<String> = redis.query(redis::cmd("KEYS").arg("*"));
    for key in keys {
        assert_ne!(redis.pttl(&key), -1, "{key} has no expiry");
    }
}

#[test]
fn a_waiter_denied_a_command_leaves_no_key_without_an_expiry() {
    let redis = RedisServer::start();
    let url = url_of(&redis, "locker");
    redis.write_holder(&lock_key("job"), "other", 1, 60_000);
    // The waiter's part of the acquire script writes the queue and the heartbeats.
    for command in ["zadd", "hdel", "hset", "pexpire"] {
        setuser(&redis, &rule_without(&format!("+{command}")));
        let s = Scratch::new();
        let f = try_run(&url, &["--wait", "3s"], &s);
        let grant = format!("ACL SETUSER locker +{command} ");
        assert_named(&f, &s, &[grant.as_str(), "inside lockrun's acquire script"]);
        assert_every_key_expires(&redis);
    }
}

#[test]
fn a_key_or_channel_pattern_missing_from_the_rule_is_named_with_its_grant() {
    let redis = RedisServer::start();
    let url = url_of(&redis, "locker");
    setuser(&redis, &rule_without("~lockrun:*"));
    let s = Scratch::new();
    let f = try_run(&url, &[], &s);
    assert_named(
        &f,
        &s,
        &[
            "use lockrun's keys (under \"lockrun:\")",
            "ACL SETUSER locker ~lockrun:* ",
        ],
    );

    // The wake-up channels: a waiter cannot subscribe to its own. (Whether a waiter
    // then gives up or polls, the line names the grant.)
    redis.write_holder(&lock_key("job"), "other", 1, 60_000);
    setuser(&redis, &rule_without("&lockrun:*"));
    let s = Scratch::new();
    let f = try_run(&url, &["--wait", "3s", "-v"], &s);
    assert!(
        f.stderr
            .contains("use lockrun's wake-up channels (under \"lockrun:\")")
            && f.stderr.contains("ACL SETUSER locker &lockrun:* "),
        "{}",
        f.stderr
    );
    setuser(&redis, &rule_without("+subscribe"));
    let f = try_run(&url, &["--wait", "3s", "-v"], &s);
    assert!(
        f.stderr.contains("run SUBSCRIBE, needed by --wait")
            && f.stderr.contains("ACL SETUSER locker +subscribe "),
        "{}",
        f.stderr
    );
    assert!(!s.exists("ran"), "the command ran beside the holder");
}

/// `lockrun list` needs `+scan` beyond the rule (docs/backends.md): with it, the names
/// are listed (a user without `+cluster|slots` on a plain server lists that server);
/// without it, one line names the permission to grant.
#[test]
fn list_needs_scan_and_says_so() {
    let redis = RedisServer::start();
    setuser(&redis, &acl::setuser_line("locker", "lockrun:"));
    let url = url_of(&redis, "locker");
    run(lockrun_run(&url, "job", &[], &["true"])).assert_code(0);
    let refused = admin(&url, "list", &[]);
    refused.assert_code(125);
    assert!(
        refused.stderr.to_lowercase().contains("scan"),
        "the line does not name SCAN: {}",
        refused.stderr
    );
    setuser(&redis, "ACL SETUSER locker +scan");
    let listed = admin(&url, "list", &[]);
    listed.assert_code(0);
    assert!(
        listed.stdout.starts_with("job: free; last run: "),
        "{}",
        listed.stdout
    );
}
