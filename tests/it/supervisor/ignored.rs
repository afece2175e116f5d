//! Signals the caller ignores (`nohup` ignores SIGHUP, `trap '' INT` ignores SIGINT)
//! stay ignored: lockrun neither dies of them nor forwards them, and the command
//! inherits them ignored. Signals the caller does not ignore are still forwarded (the
//! tests beside this file).

use std::process::Command;
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::*;

/// A command that records its pid, then runs until `$GO` exists and exits 0.
const UNTIL_GO: &str = r#"echo $$ > "$PIDFILE"; while [ ! -e "$GO" ]; do sleep 0.02; done; exit 0"#;

/// `cmd` started through `sh` with `sig` (a trap name: `HUP`, `INT`) ignored, as
/// `nohup` or `trap '' SIG; exec ...` would start it. Its environment changes are kept.
fn ignoring(sig: &str, cmd: &Command) -> Command {
    let mut wrapped = Command::new("sh");
    wrapped
        .arg("-c")
        .arg(format!(r#"trap '' {sig}; exec "$0" "$@""#))
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(std::process::Stdio::null());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => wrapped.env(key, v),
            None => wrapped.env_remove(key),
        };
    }
    wrapped
}

/// True if `pid`'s signal disposition for `sig` is "ignore" (`SigIgn` in its status).
fn ignores(pid: i32, sig: Signal) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .expect("SigIgn in /proc/PID/status");
    mask & (1 << (sig as i32 - 1)) != 0
}

/// Starts lockrun with `sig` ignored, sends `sig` to lockrun and to its command: both
/// must live on, and the run end normally (exit 0, lock released).
fn assert_stays_ignored(sig: Signal, name: &str) {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let mut cmd = lockrun_run(&redis.url(), "job", &["-v"], &sh(UNTIL_GO));
    cmd.env("GO", s.path("go"));
    let cmd = ignoring(name, &cmd);
    let (mut lr, pid) = spawn_recording_pid(cmd, &s, &reaper);
    assert!(
        ignores(lr.pid(), sig),
        "lockrun handles {name} although it started with {name} ignored"
    );
    assert!(
        ignores(pid, sig),
        "the command does not inherit {name} ignored"
    );

    lr.signal(sig);
    signal_pid(pid, sig);
    thread::sleep(Duration::from_millis(300));
    assert!(
        lr.is_running(),
        "lockrun died of an ignored {name}: {:?}",
        lr.try_finish()
    );
    assert!(is_alive(pid), "the command died of an ignored {name}");
    assert!(redis.lock_held("job"));

    s.touch("go");
    let f = lr.wait();
    f.assert_code(0);
    assert!(
        !f.stderr.contains("forwarding"),
        "an ignored {name} was forwarded:\n{}",
        f.stderr
    );
    assert!(!redis.lock_held("job"));
}

#[test]
fn sighup_ignored_at_start_stays_ignored_by_lockrun_and_the_command() {
    assert_stays_ignored(Signal::SIGHUP, "HUP");
}

#[test]
fn sigint_ignored_at_start_stays_ignored_by_lockrun_and_the_command() {
    assert_stays_ignored(Signal::SIGINT, "INT");
}

#[test]
fn a_signal_ignored_at_start_does_not_stop_forwarding_the_others() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&redis.url(), "job", &[], &sh(SLEEPER));
    let (mut lr, pid) = spawn_recording_pid(ignoring("HUP", &cmd), &s, &reaper);
    assert!(!ignores(pid, Signal::SIGTERM));

    lr.signal(Signal::SIGTERM);
    let f = lr.wait();
    f.assert_code(128 + Signal::SIGTERM as i32);
    assert!(is_dead(pid));
    assert!(!redis.lock_held("job"));
}
