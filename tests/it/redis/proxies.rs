//! Redis as it is often deployed: behind twemproxy (Debian's `nutcracker`: RESP2 only,
//! no `HELLO`, no pub/sub, each `EVAL` sent to the server of its first key), or a
//! server without `HELLO` (Redis 5, `rename-command HELLO ""`) or without
//! `SUBSCRIBE`. Every step works on each: a run, a busy run (75), a `--wait` hand-off,
//! `status`, `release --force`. Waiters hear releases wherever the server can publish
//! them to a RESP2 subscriber; where it cannot, they poll (saying so once at `-v`) and
//! still get the lock within the polling cap of the holder's end.

use std::thread;
use std::time::{Duration, Instant};

use lockrun::backend::MAX_WAIT_SLICE;

use crate::support::{
    hostname, lockrun, lockrun_run, parse_token, run, sh, spawn, start_holder, wait_line,
    wait_until, waiter_key, Nutcracker, RedisServer, Scratch, WAIT,
};

/// The start of the one `-v` line that says a waiter polls.
const POLLING: &str = "no release notifications from Redis at";

/// How a waiter on this set-up learns that the lock is free.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Waiter {
    /// A wake-up on its own channel: the hand-off takes well under a second.
    Notified,
    /// Asking again every [`MAX_WAIT_SLICE`] at most (plus jitter and a try).
    Polls,
}

#[test]
fn a_server_without_hello_serves_every_step_and_waiters_are_still_woken() {
    let redis = RedisServer::with_args(&rename_away(&["HELLO"]));
    assert_refused(&redis, redis::cmd("HELLO").arg(3));
    every_step(&redis.url(), &[&redis], Waiter::Notified);
}

#[test]
fn a_server_without_pub_sub_serves_every_step_and_waiters_poll() {
    let redis = RedisServer::with_args(&rename_away(&["HELLO", "SUBSCRIBE"]));
    assert_refused(&redis, redis::cmd("SUBSCRIBE").arg("c"));
    every_step(&redis.url(), &[&redis], Waiter::Polls);
}

#[test]
fn twemproxy_serves_every_step_and_waiters_poll() {
    // Two servers behind the proxy: the lock's keys must all land on one of them.
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let s = Scratch::new();
    let proxy = Nutcracker::start(&[&a, &b], &s.path(""));
    every_step(&proxy.url(), &[&a, &b], Waiter::Polls);
    let keys = |r: &RedisServer| -> Vec<String> { r.query(redis::cmd("KEYS").arg("lockrun:*")) };
    let (on_a, on_b) = (keys(&a), keys(&b));
    assert!(
        on_a.is_empty() != on_b.is_empty(),
        "the lock's keys are spread over both servers: {on_a:?} and {on_b:?}"
    );
    assert!(
        on_a.iter()
            .chain(&on_b)
            .all(|k| k.starts_with("lockrun:{job}")),
        "{on_a:?} {on_b:?}"
    );
}

/// `--rename-command NAME ""` for each of `commands`.
fn rename_away(commands: &[&str]) -> Vec<String> {
    commands
        .iter()
        .flat_map(|c| {
            [
                "--rename-command".to_owned(),
                (*c).to_owned(),
                String::new(),
            ]
        })
        .collect()
}

fn assert_refused(redis: &RedisServer, cmd: &redis::Cmd) {
    let e = redis
        .try_query::<redis::Value>(cmd)
        .expect_err("the command was renamed away");
    assert!(e.to_string().contains("unknown command"), "{e}");
}

/// Every step of lockrun at `url`, whose data lives on `servers`.
fn every_step(url: &str, servers: &[&RedisServer], waiter: Waiter) {
    // Uncontended, --wait needs nothing more than a run: no second connection, no
    // line about polling, even at -v.
    let f = run(lockrun_run(url, "job", &["--wait", "10s", "-v"], &["true"]));
    f.assert_code(0);
    assert!(!f.stderr.contains(POLLING), "{}", f.stderr);

    let s = Scratch::new();
    // A lease far longer than the test: only the release can let the waiter in.
    let (mut holder, first) = start_holder(url, "job", &s, &["--ttl", "30s"]);
    run(lockrun_run(url, "job", &[], &["true"])).assert_failure(75);

    let mut cmd = lockrun();
    cmd.args(["status", "--json", "--url", url, "job"]);
    let f = run(cmd);
    f.assert_code(0);
    let v: serde_json::Value = serde_json::from_str(f.stdout.trim()).expect("status JSON");
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(
        v["fencing_token"].as_u64().map(u128::from),
        Some(first),
        "{v}"
    );
    assert_eq!(v["host"], hostname().as_str(), "{v}");

    let mut w = lockrun_run(
        url,
        "job",
        &["--wait", "60s", "-v"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    w.env("OUT", s.path("second"));
    let mut w = spawn(w);
    settle(&mut w, servers, waiter);
    assert!(
        !s.exists("second"),
        "the waiter ran while the lock was held"
    );

    s.touch("go");
    let ended = holder.wait().assert_code(0).ended;
    let second = parse_token(&wait_line(&s.path("second")));
    let handoff = ended.elapsed();
    let f = w.wait();
    f.assert_code(0);
    assert!(second > first, "token {second} after {first}");
    let bound = match waiter {
        Waiter::Notified => Duration::from_secs(1),
        // The cap, its 50 ms of jitter, one try, and a loaded machine's slack.
        Waiter::Polls => MAX_WAIT_SLICE + Duration::from_secs(1),
    };
    assert!(
        handoff < bound,
        "{waiter:?}: the waiter ran {handoff:?} after the holder ended"
    );
    let said = f.stderr.matches(POLLING).count();
    let expected = usize::from(waiter == Waiter::Polls);
    assert_eq!(said, expected, "lines about polling:\n{}", f.stderr);

    // release --force breaks a holder, and status then finds the lock free.
    let s = Scratch::new();
    let (_holder, token) = start_holder(url, "job", &s, &["--ttl", "30s"]);
    let mut cmd = lockrun();
    cmd.args(["release", "--force", "--url", url, "job"]);
    let f = run(cmd);
    f.assert_code(0);
    assert!(f.stderr.contains(&token.to_string()), "{}", f.stderr);
    let mut cmd = lockrun();
    cmd.args(["status", "--url", url, "job"]);
    run(cmd).assert_code(1);
}

/// Waits until the waiter `w` is settled in its wait: subscribed to its wake-up
/// channel (`Notified`), or polling, out of the queue, at no more than a few EVALs
/// over a cap's length (`Polls`).
fn settle(w: &mut crate::support::Running, servers: &[&RedisServer], waiter: Waiter) {
    let channels = || -> usize {
        servers
            .iter()
            .map(|r| {
                let c: Vec<String> = r.query(
                    redis::cmd("PUBSUB")
                        .arg("CHANNELS")
                        .arg("lockrun:{job}:wake:*"),
                );
                c.len()
            })
            .sum()
    };
    match waiter {
        Waiter::Notified => {
            wait_until("the waiter subscribed", WAIT, || channels() == 1);
            // It asks once more after subscribing: let that answer come back.
            thread::sleep(Duration::from_millis(300));
        }
        Waiter::Polls => {
            wait_until("the waiter said it polls", WAIT, || {
                w.stderr_so_far().contains(POLLING)
            });
            let queued = || -> i64 {
                servers
                    .iter()
                    .map(|r| r.query::<i64>(redis::cmd("ZCARD").arg(waiter_key("job", "waiters"))))
                    .sum()
            };
            wait_until("the polling waiter left the queue", WAIT, || queued() == 0);
            let evals = || servers.iter().map(|r| r.evals()).sum::<u64>();
            let (before, since) = (evals(), Instant::now());
            thread::sleep(MAX_WAIT_SLICE + Duration::from_millis(500));
            let asked = evals() - before;
            // One try per cap (2 s): two at most in 2.5 s, and one to spare.
            assert!(
                asked <= 3,
                "{asked} EVALs in {:?} of polling",
                since.elapsed()
            );
            assert_eq!(channels(), 0, "a polling waiter has no subscription");
        }
    }
    assert!(w.is_running(), "the waiter gave up: {:?}", w.try_finish());
}
