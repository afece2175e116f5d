//! How long the command lives and what it inherits: it dies with lockrun (parent-death
//! signal), `--max-runtime` stops it, `--hold-at-least` keeps the lock without a
//! process, stdio is its own, and lockrun as PID 1 reaps orphans and forwards signals.

use std::fs::File;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::HANDLE;
use crate::support::*;

#[test]
fn lockrun_sigkilled_takes_its_command_down_and_the_lock_frees_within_the_ttl() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &["--ttl", "2s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);

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
    let cmd = lockrun_run(&redis.url(), "job", &["--ttl", "1s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);
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
    let cmd = lockrun_run(&redis.url(), "job", &["--max-runtime", "1s"], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);
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
