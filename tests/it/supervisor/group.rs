//! The command's process group: it runs in a group of its own, and whatever it leaves
//! running there (grandchildren, stopped or ignoring SIGTERM) is stopped before the lock
//! is released.

use std::thread;
use std::time::Duration;

use crate::support::*;

#[test]
fn grandchild_is_stopped_before_the_lock_is_released() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &[],
        &sh(r#"sleep 60 & echo $! > "$GC"; exit 5"#),
    );
    cmd.env("GC", s.path("gc"));
    let mut lr = spawn(cmd);
    let gc = wait_pid(&s.path("gc"));
    reaper.add(gc);

    let mut freed_while_alive = false;
    while lr.is_running() {
        if !redis.lock_held("job") && is_alive(gc) {
            freed_while_alive = true;
        }
        thread::sleep(Duration::from_millis(1));
    }
    let f = lr.wait();
    assert!(is_dead(gc), "the grandchild (pid {gc}) outlived lockrun");
    f.assert_code(5);
    assert!(
        !freed_while_alive,
        "the lock was free while the grandchild still ran"
    );
    assert!(
        !redis.lock_held("job"),
        "the lock is held after lockrun exited"
    );
    // The grandchild dies of the first signal: no need to wait for --kill-after (10s).
    assert!(
        f.elapsed < Duration::from_secs(5),
        "lockrun took {:?} to stop a grandchild that obeys SIGTERM; stderr:\n{}",
        f.elapsed,
        f.stderr
    );
}

#[test]
fn grandchild_ignoring_term_is_sigkilled_after_kill_after() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--kill-after", "1s"],
        // The command exits only once the grandchild ignores TERM and has said so.
        &sh(r#"
            sh -c 'trap "" TERM; echo $$ > "$GC"; exec sleep 60' &
            while [ ! -s "$GC" ]; do sleep 0.01; done
            exit 5
        "#),
    );
    cmd.env("GC", s.path("gc"));
    let mut lr = spawn(cmd);
    let gc = wait_pid(&s.path("gc"));
    reaper.add(gc);

    // The grandchild lives on for --kill-after; all that time the lock must stay held.
    let mut freed_while_alive = None;
    while lr.is_running() {
        if freed_while_alive.is_none() && !redis.lock_held("job") && is_alive(gc) {
            freed_while_alive = Some(lr.started().elapsed());
        }
        thread::sleep(Duration::from_millis(2));
    }
    let f = lr.wait();
    assert!(
        is_dead(gc),
        "the TERM-ignoring grandchild (pid {gc}) outlived lockrun"
    );
    f.assert_code(5);
    assert_eq!(
        freed_while_alive, None,
        "the lock was free while the grandchild still ran"
    );
    assert!(
        f.elapsed >= Duration::from_secs(1),
        "lockrun exited after {:?}: it did not give the group --kill-after 1s",
        f.elapsed
    );
    assert!(
        f.elapsed < Duration::from_secs(8),
        "lockrun took {:?} to kill the group with --kill-after 1s",
        f.elapsed
    );
}

#[test]
fn command_runs_in_its_own_process_group() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    // Field 5 of /proc/PID/stat is the process group.
    let script =
        r#"stat=$(cat /proc/$$/stat); rest=${stat##*) }; set -- $rest; echo "$$ $3" > "$OUT""#;
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(script));
    cmd.env("OUT", s.path("out"));
    let lr = spawn(cmd);
    let lockrun_pid = lr.pid();
    let mut lr = lr;
    lr.wait().assert_code(0);
    let line = wait_line(&s.path("out"));
    let (pid, pgrp) = line.split_once(' ').unwrap();
    assert_eq!(pid, pgrp, "the command does not lead its own process group");
    assert_ne!(pgrp, lockrun_pid.to_string());
    assert_ne!(
        pgrp,
        nix::unistd::getpgrp().as_raw().to_string(),
        "the command shares the test's (the caller's) process group"
    );
}

#[test]
fn a_stopped_leftover_is_woken_to_receive_the_kill_signal() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    // The grandchild stops itself; on SIGTERM it records it. Without a SIGCONT after
    // the kill signal it would sit stopped until SIGKILL after --kill-after (30 s).
    let script = r#"
        sh -c 'trap "echo term > \"$GOT\"; exit 0" TERM; echo $$ > "$GPID"; kill -STOP $$; while :; do sleep 0.05; done' &
        while [ ! -s "$GPID" ]; do sleep 0.01; done
        exit 0
    "#;
    let mut cmd = lockrun_run(&redis.url(), "job", &["--kill-after", "30s"], &sh(script));
    cmd.env("GPID", s.path("gpid")).env("GOT", s.path("got"));
    let f = spawn(cmd).wait_for(Duration::from_secs(20));
    f.assert_code(0);
    assert_eq!(
        s.read("got").trim(),
        "term",
        "the stopped leftover never saw SIGTERM"
    );
    assert!(
        f.elapsed < Duration::from_secs(10),
        "lockrun waited {:?}",
        f.elapsed
    );
}
