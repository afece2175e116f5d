//! Several lockruns on one name, against Redis: the busy status chosen by option or
//! environment, a signal while waiting, and exclusion of commands that live on renewals.
//! (Exclusion under contention, busy, waiting and hand-off for every backend are in the
//! conformance suite.)

use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// A command that records it started, then runs until `$GO` exists.
const HOLD: &str = r#"touch "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// Starts a lockrun holding `name` until the scratch file "go" exists; returns once its
/// command runs.
fn start_holder(url: &str, name: &str, s: &Scratch, opts: &[&str]) -> Running {
    let mut cmd = lockrun_run(url, name, opts, &sh(HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let holder = spawn(cmd);
    wait_until("the holder's command started", WAIT, || s.exists("started"));
    holder
}

#[test]
fn conflict_exit_code_option_sets_the_busy_status() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--conflict-exit-code", "3"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    run(cmd).assert_failure(3);
    assert!(!s.exists("marker"));

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn conflict_exit_code_environment_sets_the_busy_status() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker"))
        .env("LOCKRUN_CONFLICT_EXIT_CODE", "4");
    run(cmd).assert_failure(4);
    assert!(!s.exists("marker"));

    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn signal_while_waiting_gives_up_without_running_the_command() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut holder = start_holder(&redis.url(), "job", &s, &[]);

    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--wait", "60s"],
        &sh(r#"touch "$MARK""#),
    );
    cmd.env("MARK", s.path("marker"));
    let mut waiter = spawn(cmd);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(500) {
        assert!(
            waiter.is_running(),
            "the waiter gave up: {:?}",
            waiter.try_finish()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    waiter.signal(nix::sys::signal::Signal::SIGTERM);
    let f = waiter.wait();
    assert!(
        f.ended - sent < Duration::from_secs(2),
        "the waiter took {:?} to give up after SIGTERM",
        f.ended - sent
    );
    assert_ne!(f.code, Some(0), "a waiter stopped by SIGTERM exited 0");
    f.assert_explained();
    assert!(
        !s.exists("marker"),
        "the command ran after the waiter was told to stop"
    );
    // The holder's lock is untouched.
    assert!(redis.lock_held("job"));
    s.touch("go");
    holder.wait().assert_code(0);
    assert!(!s.exists("marker"));
}

#[test]
fn commands_longer_than_the_ttl_never_overlap() {
    // Every critical section outlives the TTL, so each holder keeps the lock only by
    // renewing it; the waiters must still never get in.
    const WORKERS: usize = 3;
    const ROUNDS: usize = 3;
    alone();
    let redis = RedisServer::start();
    let history = Sections::new(Duration::from_millis(800));
    thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let opts = ["--wait", "60s", "--ttl", "500ms"];
                    let mut cmd = lockrun_run(&redis.url(), "job", &opts, &Sections::command());
                    history.env(&mut cmd);
                    spawn(cmd).wait_for(Duration::from_secs(90)).assert_code(0);
                }
            });
        }
    });
    history.assert_sequential(WORKERS * ROUNDS);
}
