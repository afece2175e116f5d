//! The supervised command: signals sent to lockrun reach it (here), its whole process
//! group is stopped before the lock is released (`group`), it dies with lockrun,
//! `--max-runtime` and `--hold-at-least`, inherited stdio, and lockrun as PID 1
//! (`lifetime`), the command's CPU affinity is lockrun's (`affinity`), signals ignored
//! when lockrun starts stay ignored (`ignored`), and a long hold gives back the
//! program's code pages (`memory`).

mod affinity;
mod group;
mod ignored;
mod lifetime;
mod memory;

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// A perl command that handles signal `$ARGV[0]` by logging it to `$GOT` and exiting 3.
/// Perl installs the handler even if the signal was ignored when the test started.
pub(super) const HANDLE: &str = r#"
    my $sig = $ARGV[0];
    $SIG{$sig} = sub { open(my $f, ">>", $ENV{GOT}); print $f "$sig\n"; close $f; exit 3 };
    open(my $p, ">", $ENV{PIDFILE}); print $p "$$\n"; close $p;
    sleep 1 for 1..60;
    exit 9;
"#;

/// A perl command that restores the default action of `$ARGV[0]` and sleeps.
const DEFAULT: &str = r#"
    $SIG{$ARGV[0]} = "DEFAULT";
    open(my $p, ">", $ENV{PIDFILE}); print $p "$$\n"; close $p;
    sleep 1 for 1..60;
    exit 9;
"#;

/// Sends `sig` to lockrun whose command handles it; expects exit 3 and a free lock.
fn assert_forwarded_and_handled(sig: Signal, name: &str) {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &["perl", "-e", HANDLE, name]);
    cmd.env("PIDFILE", s.path("pid")).env("GOT", s.path("got"));
    let mut lr = spawn(cmd);
    reaper.add(wait_pid(&s.path("pid")));

    lr.signal(sig);
    let f = lr.wait();
    assert!(
        !redis.lock_held("job"),
        "the lock is held after lockrun exited"
    );
    f.assert_code(3);
    assert_eq!(
        s.read("got"),
        format!("{name}\n"),
        "signals the command received"
    );
}

/// Sends `sig` to lockrun whose command dies of it; expects exit 128+N and a free lock.
fn assert_forwarded_and_fatal(sig: Signal, name: &str) {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &[], &["perl", "-e", DEFAULT, name]);
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

    lr.signal(sig);
    let f = lr.wait();
    assert!(
        !redis.lock_held("job"),
        "the lock is held after lockrun exited"
    );
    f.assert_code(128 + sig as i32);
    assert!(is_dead(pid));
}

#[test]
fn sigterm_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGTERM, "TERM");
}

#[test]
fn sigint_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGINT, "INT");
}

#[test]
fn sighup_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGHUP, "HUP");
}

#[test]
fn sigquit_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGQUIT, "QUIT");
}

#[test]
fn sigusr1_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGUSR1, "USR1");
}

#[test]
fn sigusr2_is_forwarded_to_the_command() {
    assert_forwarded_and_handled(Signal::SIGUSR2, "USR2");
}

#[test]
fn command_killed_by_forwarded_sigterm_gives_143() {
    assert_forwarded_and_fatal(Signal::SIGTERM, "TERM");
}

#[test]
fn command_killed_by_forwarded_sigint_gives_130() {
    assert_forwarded_and_fatal(Signal::SIGINT, "INT");
}

#[test]
fn command_killed_by_forwarded_sighup_gives_129() {
    assert_forwarded_and_fatal(Signal::SIGHUP, "HUP");
}

#[test]
fn forwarded_signal_reaches_the_whole_group() {
    // The command's child (same group) gets the signal too, not just the command.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let script = r#"
        perl -e '$SIG{USR1} = sub { open(my $f, ">>", $ENV{GOT}); print $f "child\n"; close $f; exit 0 };
                 open(my $p, ">", $ENV{CHILD}); print $p "$$\n"; close $p; sleep 1 for 1..60' &
        trap 'echo parent >> "$GOT"' USR1
        echo $$ > "$PIDFILE"
        wait; wait
    "#;
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &sh(script));
    cmd.env("PIDFILE", s.path("pid"))
        .env("CHILD", s.path("child"))
        .env("GOT", s.path("got"));
    let mut lr = spawn(cmd);
    reaper.add(wait_pid(&s.path("pid")));
    reaper.add(wait_pid(&s.path("child")));

    lr.signal(Signal::SIGUSR1);
    lr.wait().assert_code(0);
    let got = s.read("got");
    assert!(
        got.contains("child"),
        "the command's child got no USR1: {got:?}"
    );
    assert!(got.contains("parent"), "the command got no USR1: {got:?}");
}

#[test]
fn forwarded_signal_the_command_ignores_does_not_end_the_run() {
    // Forwarding is not stopping at once: if the command shrugs SIGTERM off, lockrun keeps
    // the lock (renewing it past its TTL) until the command ends or `--kill-after` (10 s
    // by default) has passed, and reports its status.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--ttl", "1s"],
        &sh(
            r#"trap 'echo TERM >> "$GOT"' TERM; echo $$ > "$PIDFILE"; while [ ! -e "$GO" ]; do sleep 0.02; done; exit 5"#,
        ),
    );
    cmd.env("PIDFILE", s.path("pid"))
        .env("GOT", s.path("got"))
        .env("GO", s.path("go"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);

    lr.signal(Signal::SIGTERM);
    wait_until("the command got the forwarded TERM", WAIT, || {
        s.read("got").contains("TERM")
    });
    let got = Instant::now();
    while got.elapsed() < Duration::from_millis(1500) {
        assert!(
            is_alive(pid),
            "the command was stopped after a forwarded signal"
        );
        assert!(lr.is_running(), "lockrun ended: {:?}", lr.try_finish());
        assert!(
            redis.lock_held("job"),
            "the lock lapsed while the command ran"
        );
        thread::sleep(Duration::from_millis(20));
    }
    s.touch("go");
    lr.wait().assert_code(5);
    assert!(!redis.lock_held("job"));
}
