//! The contract when things go wrong while a command holds the lock (docs/guarantees.md,
//! properties 2 and 5): a definite loss stops the command at once; the backend down
//! (connections refused), hung (a partition), killed or frozen gets the command's group
//! killed before the lease can have expired on the server, and once the fault is over
//! (the servers restarted, with or without their data) the lock works again and its
//! tokens still increase.

use std::thread;
use std::time::{Duration, Instant};

use super::{token_of, Start, TTL, TTL_ARG};
use crate::support::*;

/// A command that ignores SIGTERM (logging each one to `$LOG`), so only SIGKILL stops
/// it, and records its fencing token in `$TOKEN` and its pid in `$PIDFILE`.
const STUBBORN: &str = r#"trap 'echo TERM >> "$LOG"' TERM; echo "$LOCKRUN_FENCING_TOKEN" > "$TOKEN"; echo $$ > "$PIDFILE"; while :; do sleep 0.05; done"#;

/// A lockrun around [`STUBBORN`] with `opts`, once its command runs: the lockrun, the
/// command's pid and its fencing token.
fn stubborn(b: &Backend, s: &Scratch, reaper: &Reaper, opts: &[&str]) -> (Running, i32, u128) {
    let mut cmd = b.run("job", opts, &sh(STUBBORN));
    cmd.env("PIDFILE", s.path("pid"))
        .env("LOG", s.path("log"))
        .env("TOKEN", s.path("token"));
    let lr = spawn(cmd);
    let pid = wait_pid(&s.path("pid"));
    reaper.add(pid);
    (lr, pid, parse_token(&wait_line(&s.path("token"))))
}

pub(super) fn definite_loss_stops_the_command(start: Start) {
    let b = start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = [
        "--ttl",
        "30s",
        "--renew-every",
        "500ms",
        "--kill-after",
        "1s",
    ];
    let (mut lr, pid, _) = stubborn(&b, &s, &reaper, &opts);
    run(b.admin("release", &["--force", "job"])).assert_code(0);
    let fault = Instant::now();
    // Noticed at the next renewal (500 ms), SIGKILL after --kill-after (1 s).
    let deadline = fault + Duration::from_millis(500 + 1000 + 1500);
    assert_dead_by(pid, fault, deadline, "lock broken");
    lr.wait().assert_failure(124);
    assert!(
        s.read("log").contains("TERM"),
        "no --kill-signal before SIGKILL"
    );
}

pub(super) fn backend_down_kills_before_the_lease_expires(start: Start) {
    let down = |b: &mut Backend| {
        b.set_mode(Mode::Refuse);
        b.cut();
    };
    fault_while_held(start(), "backend down", down, |b| b.set_mode(Mode::Pass));
}

pub(super) fn backend_hung_kills_before_the_lease_expires(start: Start) {
    let hang = |b: &mut Backend| b.set_mode(Mode::Blackhole);
    fault_while_held(start(), "backend hung", hang, |b| b.set_mode(Mode::Pass));
}

pub(super) fn server_killed_kills_before_the_lease_expires(start: Start) {
    fault_while_held(start(), "server killed", Backend::kill, Backend::restart);
}

pub(super) fn server_frozen_kills_before_the_lease_expires(start: Start) {
    let freeze = |b: &mut Backend| b.pause();
    fault_while_held(start(), "server frozen", freeze, |b| b.resume());
}

/// Applies `fault` under a lockrun with a 2 s lease whose command ignores SIGTERM: the
/// command must be dead by the instant the fault began plus the TTL (after a TERM),
/// and lockrun must exit 124. Then `heal` undoes the fault, and the next holder gets
/// the lock with a larger token.
fn fault_while_held(
    mut b: Backend,
    what: &str,
    fault: impl FnOnce(&mut Backend),
    heal: impl FnOnce(&mut Backend),
) {
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = ["--ttl", TTL_ARG, "--kill-after", "30s"];
    let (mut lr, pid, before) = stubborn(&b, &s, &reaper, &opts);
    thread::sleep(Duration::from_millis(700)); // past a renewal or two
    assert!(is_alive(pid), "the command died before the fault");
    let at = Instant::now();
    fault(&mut b);
    // The last renewal lockrun could have had answered was sent before `at`: its lease
    // ends before at + TTL, and the command must be dead by then.
    let died = assert_dead_by(pid, at, at + TTL, what);
    let f = lr.wait();
    heal(&mut b);
    f.assert_failure(124);
    assert!(
        s.read("log").contains("TERM"),
        "{what}: the command got no --kill-signal (TERM) before SIGKILL (died {died:?} after \
         the fault)"
    );
    let after = token_of(&b, &["--wait", "30s"]);
    assert!(
        after > before,
        "{what}: the token after the fault ({after}) is not above the one before ({before})"
    );
}
