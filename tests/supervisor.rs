//! The supervised command: signals sent to lockrun reach it, its whole process group is
//! stopped before the lock is released, it dies with lockrun (parent-death signal),
//! `--max-runtime` and `--hold-at-least`, inherited stdio, and lockrun as PID 1.

mod support;

use std::fs::File;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::*;

/// A perl command that handles signal `$ARGV[0]` by logging it to `$GOT` and exiting 3.
/// Perl installs the handler even if the signal was ignored when the test started.
const HANDLE: &str = r#"
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
    let mut cmd = lockrun_run(&redis.url(), "job", &[], &["perl", "-e", DEFAULT, name]);
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);

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
fn lockrun_sigkilled_takes_its_command_down_and_the_lock_frees_within_the_ttl() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--ttl", "2s"],
        &sh(r#"echo $$ > "$PIDFILE"; exec sleep 60"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);

    let killed = Instant::now();
    lr.signal(Signal::SIGKILL);
    lr.wait();
    let died = wait_until("the command died with lockrun", WAIT, || is_dead(pid));
    assert!(
        died < Duration::from_secs(1),
        "the command outlived SIGKILLed lockrun by {died:?} (parent-death signal)"
    );
    wait_until("the lock expired", WAIT, || !redis.lock_held("job"));
    let freed = killed.elapsed();
    assert!(
        freed <= Duration::from_millis(2000 + 250),
        "the lock freed {freed:?} after lockrun died (TTL 2s)"
    );
}

#[test]
fn lockrun_sigkilled_takes_its_command_down_after_renewals() {
    // The parent-death signal is tied to the thread that spawned the command: it must still
    // fire after lockrun has been running (and renewing) for a while.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--ttl", "1s"],
        &sh(r#"echo $$ > "$PIDFILE"; exec sleep 60"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        assert!(is_alive(pid), "the command died while lockrun ran");
        thread::sleep(Duration::from_millis(20));
    }
    lr.signal(Signal::SIGKILL);
    lr.wait();
    let died = wait_until("the command died with lockrun", WAIT, || is_dead(pid));
    assert!(
        died < Duration::from_secs(1),
        "the command outlived lockrun by {died:?}"
    );
}

#[test]
fn max_runtime_stops_the_command_with_124() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["--max-runtime", "1s"],
        &sh(r#"echo $$ > "$PIDFILE"; exec sleep 60"#),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);
    let f = lr.wait();
    f.assert_failure(124);
    assert!(is_dead(pid));
    assert!(
        f.elapsed >= Duration::from_secs(1),
        "stopped after {:?}, before --max-runtime 1s",
        f.elapsed
    );
    assert!(
        f.elapsed < Duration::from_secs(5),
        "stopped only after {:?} with --max-runtime 1s",
        f.elapsed
    );
    assert!(!redis.lock_held("job"));
}

#[test]
fn lock_is_free_at_once_after_a_normal_exit() {
    let redis = RedisServer::start();
    run(lockrun_run(&redis.url(), "job", &[], &["true"])).assert_code(0);
    assert!(
        !redis.lock_held("job"),
        "the lock is still held after a normal exit"
    );
}

#[test]
fn hold_at_least_keeps_the_lock_after_a_quick_command() {
    let redis = RedisServer::start();
    let before_spawn = Instant::now();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--hold-at-least", "3s"],
        &["true"],
    ));
    f.assert_code(0);
    assert!(
        f.elapsed < Duration::from_secs(2),
        "lockrun stayed {:?}: --hold-at-least must not keep a process alive",
        f.elapsed
    );
    let key = lock_key("job");
    let pttl = redis.pttl(&key);
    assert!(
        pttl > 0 && pttl <= 3000,
        "PTTL {pttl} right after a quick command with --hold-at-least 3s"
    );
    wait_until("the held lock expired", WAIT, || !redis.exists(&key));
    let freed = before_spawn.elapsed();
    // Acquisition happened after `before_spawn`, so the key must live at least until then
    // plus 3s (less a little for the server's and the test's clocks).
    assert!(
        freed >= Duration::from_millis(3000 - 100),
        "the key was gone {freed:?} after the start, before --hold-at-least 3s"
    );
    assert!(
        freed < f.elapsed + Duration::from_millis(3000 + 1000),
        "the key lived {freed:?}, longer than --hold-at-least 3s"
    );
}

#[test]
fn command_inherits_stdin_stdout_and_stderr() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    std::fs::write(s.path("in"), "from-stdin\n").unwrap();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &["-q"],
        &sh(
            r#"fds=$(readlink /proc/$$/fd/0 /proc/$$/fd/1); echo "$fds" > "$FDS"; cat; echo to-stdout; echo to-stderr >&2"#,
        ),
    );
    cmd.env("FDS", s.path("fds"));
    cmd.stdin(File::open(s.path("in")).unwrap());
    cmd.stdout(File::create(s.path("out")).unwrap());
    cmd.stderr(File::create(s.path("err")).unwrap());
    let mut child = cmd.spawn().expect("spawn lockrun");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lockrun did not finish");
        }
        thread::sleep(POLL);
    };
    assert_eq!(status.code(), Some(0));
    assert_eq!(s.read("out"), "from-stdin\nto-stdout\n");
    assert!(s.read("err").contains("to-stderr\n"));
    // Not piped through lockrun: the command's fds are the very files given to lockrun.
    let fds = s.read("fds");
    let lines: Vec<&str> = fds.lines().collect();
    assert_eq!(
        lines,
        vec![
            s.path("in").to_str().unwrap(),
            s.path("out").to_str().unwrap()
        ],
        "the command's stdin/stdout are not lockrun's own"
    );
}

#[test]
fn as_pid_1_lockrun_reaps_orphans_and_exits_with_the_command_status() {
    // A new PID namespace makes lockrun PID 1, as in a container. The command leaves an
    // orphan that exits while the command still runs; PID 1 must reap it (no zombie) and
    // still report the command's own status.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let script = r#"
        (sleep 0.2 &)
        sleep 1
        for f in /proc/[0-9]*/stat; do
            read -r line < "$f" 2>/dev/null || continue
            case "${line##*) }" in Z*) echo "$line" >> "$ZOMBIES";; esac
        done
        echo $$ > "$PIDFILE"
        exit 4
    "#;
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", &lockrun_binary()])
        .args(["--url", &redis.url(), "job", "--", "sh", "-c", script])
        .env("ZOMBIES", s.path("zombies"))
        .env("PIDFILE", s.path("pid"))
        .stdin(std::process::Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("LOCKRUN_") {
            cmd.env_remove(k);
        }
    }
    let f = run(cmd);
    f.assert_code(4);
    wait_line(&s.path("pid"));
    assert_eq!(s.read("zombies"), "", "PID 1 left zombies unreaped");
    assert!(!redis.lock_held("job"));
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
fn hold_at_least_shorter_than_the_run_releases_at_once() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--hold-at-least", "500ms"],
        &sh("sleep 1"),
    ));
    f.assert_code(0);
    assert!(
        !redis.lock_held("job"),
        "the lock is still held after a run longer than --hold-at-least"
    );
}

#[test]
fn forwarded_signal_the_command_ignores_does_not_end_the_run() {
    // Forwarding is not stopping: if the command shrugs SIGTERM off, lockrun keeps the lock
    // (renewing it past its TTL) until the command ends, and reports its status.
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

/// The pid of the only child of `pid` (e.g. the process `unshare --fork` started).
fn only_child(pid: i32) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn as_pid_1_lockrun_forwards_sigterm() {
    // In a container lockrun is PID 1, which the kernel protects from signals it has no
    // handler for; the kubelet's SIGTERM must still reach the command.
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", &lockrun_binary()])
        .args([
            "--url",
            &redis.url(),
            "job",
            "--",
            "perl",
            "-e",
            HANDLE,
            "TERM",
        ])
        .env("PIDFILE", s.path("pid"))
        .env("GOT", s.path("got"));
    for (k, _) in std::env::vars() {
        if k.starts_with("LOCKRUN_") {
            cmd.env_remove(k);
        }
    }
    let mut un = spawn(cmd);
    wait_pid(&s.path("pid")); // a pid inside the namespace: only proves the command runs
    let lockrun_pid = only_child(un.pid()).expect("unshare's child (lockrun as PID 1)");
    reaper.add(lockrun_pid);
    signal_pid(lockrun_pid, Signal::SIGTERM);
    let f = un.wait();
    assert_eq!(s.read("got"), "TERM\n", "signals the command received");
    f.assert_code(3);
    assert!(!redis.lock_held("job"));
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
