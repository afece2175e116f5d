//! Several lockruns on one name, against Redis: the busy status chosen by option or
//! environment, a signal while waiting, and exclusion of commands that live on renewals.
//! (Exclusion under contention, busy, waiting and hand-off for every backend are in the
//! conformance suite.)

use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

/// Runs a command while the lock is held, with `opts` and the extra environment `env`:
/// it must exit `code` without running the command.
fn busy_run_exits(code: i32, opts: &[&str], env: &[(&str, &str)]) {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    let mut cmd = lockrun_run(&redis.url(), "job", opts, &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker")).envs(env.iter().copied());
    run(cmd).assert_failure(code);
    assert!(!s.exists("marker"), "the busy run started its command");
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn conflict_exit_code_option_sets_the_busy_status() {
    busy_run_exits(3, &["--conflict-exit-code", "3"], &[]);
}

#[test]
fn conflict_exit_code_environment_sets_the_busy_status() {
    busy_run_exits(4, &[], &[("LOCKRUN_CONFLICT_EXIT_CODE", "4")]);
}

#[test]
fn signal_while_waiting_gives_up_without_running_the_command() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);

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
