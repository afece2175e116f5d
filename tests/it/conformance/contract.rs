//! The contract on a healthy backend: the command runs with a token and its status is
//! passed on; mutual exclusion under contention (docs/guarantees.md, property 1) with
//! increasing tokens (property 5); busy, waiting and hand-off; a crashed holder's lock
//! expires (property 7); renewal; `--hold-at-least`; `status` and `release --force`;
//! ownership (property 4); two (prefix, name) pairs are two locks; no lease longer than a
//! day (property 8); failing closed (property 6).

use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{holder, token_of, Start, TTL, TTL_ARG};
use crate::support::*;

pub(super) fn command_gets_its_token_and_name_and_its_status(start: Start) {
    let b = start();
    let f = run(b.run(
        "team/job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_LOCK_NAME"; exit 3"#),
    ));
    f.assert_code(3);
    let (token, name) = f.stdout.trim().split_once(' ').expect("token and name");
    parse_token(token);
    assert_eq!(name, "team/job");
    assert!(!b.held("team/job"), "the lock is held after the run");
}

pub(super) fn exclusive_under_contention(start: Start) {
    const WORKERS: usize = 4;
    const ROUNDS: usize = 6;
    // Four lockruns starting one after another load the machine: run alone.
    alone();
    let b = start();
    let history = Sections::new(Duration::from_millis(10));
    thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let opts = ["--wait", "120s", "--ttl", TTL_ARG];
                    let mut cmd = b.run("job", &opts, &Sections::command());
                    history.env(&mut cmd);
                    spawn(cmd).wait_for(Duration::from_secs(150)).assert_code(0);
                }
            });
        }
    });
    history.assert_sequential(WORKERS * ROUNDS);
    assert!(!b.held("job"), "the lock is held after the last holder");
}

pub(super) fn busy_lock_exits_75_without_running_the_command(start: Start) {
    let b = start();
    let s = Scratch::new();
    let (mut h, _) = holder(&b, "job", &s, &["--ttl", "30s"]);
    let mut cmd = b.run("job", &[], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"), "the busy run started its command");
    assert!(f.elapsed < TTL, "a busy answer took {:?}", f.elapsed);
    assert!(
        f.stderr.contains(&hostname()) && f.stderr.contains(&h.pid().to_string()),
        "the busy line does not name the holder: {}",
        f.stderr
    );
    assert!(b.held("job"), "the busy run disturbed the holder's lock");
    s.touch("go");
    h.wait().assert_code(0);
}

pub(super) fn wait_that_runs_out_exits_75(start: Start) {
    let b = start();
    let s = Scratch::new();
    let (mut h, _) = holder(&b, "job", &s, &["--ttl", "30s"]);
    let mut cmd = b.run("job", &["--wait", "1s"], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(
        !s.exists("marker"),
        "the command ran although the lock was held"
    );
    assert!(
        f.elapsed >= Duration::from_secs(1) && f.elapsed < Duration::from_secs(5),
        "--wait 1s gave up after {:?}",
        f.elapsed
    );
    s.touch("go");
    h.wait().assert_code(0);
}

pub(super) fn waiter_starts_soon_after_release(start: Start) {
    let b = start();
    let s = Scratch::new();
    // The holder's lease has 30 s left: only the release can let the waiter in soon.
    let (mut h, first) = holder(&b, "job", &s, &["--ttl", "30s"]);
    let mut w = b.run(
        "job",
        &["--wait", "60s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    w.env("OUT", s.path("second"));
    let mut w = spawn(w);
    // Let the waiter find the lock busy and settle into waiting.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(1000) {
        assert!(
            !s.exists("second"),
            "the waiter ran while the lock was held"
        );
        assert!(w.is_running(), "the waiter gave up: {:?}", w.try_finish());
        thread::sleep(Duration::from_millis(20));
    }
    let go = Instant::now();
    s.touch("go");
    let second = parse_token(&wait_line(&s.path("second")));
    let handoff = go.elapsed();
    h.wait().assert_code(0);
    w.wait().assert_code(0);
    assert!(
        handoff < Duration::from_secs(1),
        "the waiter ran {handoff:?} after the holder was told to finish"
    );
    assert!(second > first, "token {second} after {first}");
}

pub(super) fn waiter_takes_over_a_crashed_holders_lock(start: Start) {
    let b = start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = b.run("job", &["--ttl", TTL_ARG], &sh(SLEEPER));
    let (mut h, pid) = spawn_recording_pid(cmd, &s, &reaper);
    let mut w = b.run("job", &["--wait", "20s"], &sh(r#"touch "$MARKER""#));
    w.env("MARKER", s.path("marker"));
    let mut w = spawn(w);
    thread::sleep(Duration::from_millis(500));
    // The holder dies without releasing: nobody tells the waiter, the lease just ends.
    let killed = Instant::now();
    h.signal(Signal::SIGKILL);
    h.wait();
    wait_until("the command died with its lockrun", WAIT, || is_dead(pid));
    // Where the lock dies with its holder (the file backend) the waiter may run already.
    assert!(
        b.frees_crashed_locks_at_once() || !s.exists("marker"),
        "the waiter ran while the lease was valid"
    );
    w.wait().assert_code(0);
    // The lease ended at most TTL after the kill; the backend's own expiry rhythm adds a
    // little, but the waiter must not sit out a whole extra wait.
    assert!(
        killed.elapsed() < TTL + Duration::from_secs(3),
        "the waiter ran {:?} after the holder was killed (TTL {TTL:?})",
        killed.elapsed()
    );
}

pub(super) fn renewal_keeps_a_long_command_alive(start: Start) {
    let b = start();
    let f = run(b.run("job", &["--ttl", TTL_ARG], &sh("sleep 5; exit 7")));
    f.assert_code(7);
    assert!(f.elapsed >= Duration::from_secs(5));
    assert!(
        !f.stderr.contains("renew_failed") && !f.stderr.contains("could not renew"),
        "a renewal failed on a healthy backend: {}",
        f.stderr
    );
}

pub(super) fn hold_at_least_keeps_the_lock_then_lets_it_go(start: Start) {
    let b = start();
    let f = run(b.run("job", &["--hold-at-least", "3s"], &["true"]));
    f.assert_code(0);
    let ran = f.ended;
    assert!(
        f.elapsed < Duration::from_secs(2),
        "lockrun stayed {:?}: --hold-at-least must not keep a process alive",
        f.elapsed
    );
    run(b.run("job", &[], &["true"])).assert_failure(75);
    thread::sleep(Duration::from_millis(2000).saturating_sub(ran.elapsed()));
    assert!(b.held("job"), "the lock went before --hold-at-least");
    wait_until("the held lock expired", Duration::from_secs(8), || {
        !b.held("job")
    });
}

pub(super) fn fencing_tokens_increase(start: Start) {
    let b = start();
    let tokens: Vec<u128> = (0..3).map(|_| token_of(&b, &[])).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase: {tokens:?}"
    );
}

pub(super) fn status_and_forced_release(start: Start) {
    let b = start();
    let s = Scratch::new();
    let (mut h, token) = holder(
        &b,
        "team/job",
        &s,
        &["--ttl", "30s", "--renew-every", "500ms"],
    );
    let (code, v) = status_of(&b, "team/job");
    assert_eq!(code, Some(0), "status --json of a held lock: {v}");
    assert_eq!((&v["name"], &v["held"]), (&"team/job".into(), &true.into()));
    assert_eq!(v["host"], hostname().as_str());
    assert_eq!(v["pid"].as_u64(), Some(h.pid() as u64), "pid: {v}");
    let fence = match &v["fencing_token"] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    assert_eq!(parse_token(&fence), token);
    let ttl = v["ttl_ms"].as_u64().expect("ttl_ms is a number");
    assert!(ttl > 0 && ttl <= 30_000, "ttl_ms {ttl}");
    let f = run(b.admin("status", &["team/job"]));
    f.assert_code(0);
    assert!(
        f.stdout.contains("held by") && f.stdout.contains(&hostname()),
        "status does not show the holder:\n{}",
        f.stdout
    );

    let f = run(b.admin("release", &["--force", "team/job"]));
    f.assert_code(0);
    assert!(
        f.stderr.contains(&hostname()) && f.stderr.contains(&h.pid().to_string()),
        "release --force did not say whose lock it broke: {}",
        f.stderr
    );
    let (code, v) = status_of(&b, "team/job");
    assert_eq!((code, &v["held"]), (Some(1), &false.into()), "{v}");
    assert_eq!(v["name"], "team/job");
    // The broken holder finds out at its next renewal.
    h.wait_for(Duration::from_secs(10)).assert_failure(124);
    // Nothing to break now: not an error.
    run(b.admin("release", &["--force", "team/job"])).assert_code(0);
}

/// `lockrun status --json NAME`: its exit code and the parsed object.
fn status_of(b: &Backend, name: &str) -> (Option<i32>, serde_json::Value) {
    status_with(b, &[], name)
}

/// `lockrun status --json OPTS NAME`: its exit code and the parsed object.
fn status_with(b: &Backend, opts: &[&str], name: &str) -> (Option<i32>, serde_json::Value) {
    let args: Vec<&str> = opts.iter().copied().chain(["--json", name]).collect();
    let f = run(b.admin("status", &args));
    let v = serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "status --json printed no JSON object ({e}): stdout {:?}, stderr {:?}",
            f.stdout, f.stderr
        )
    });
    (f.code, v)
}

pub(super) fn release_never_removes_another_owners_lock(start: Start) {
    let b = start();
    let s = Scratch::new();
    // The first holder renews only every 10 s: it will not notice what happens next.
    let (mut first, _) = holder(&b, "job", &s, &["--ttl", "30s"]);
    run(b.admin("release", &["--force", "job"])).assert_code(0);
    let s2 = Scratch::new();
    let (mut second, token) = holder(&b, "job", &s2, &["--ttl", "30s"]);
    // The first one ends and releases: its release must leave the second's lock alone.
    s.touch("go");
    first.wait();
    let (code, v) = status_of(&b, "job");
    assert_eq!(
        code,
        Some(0),
        "the first holder removed the second's lock: {v}"
    );
    assert_eq!(v["pid"].as_u64(), Some(second.pid() as u64), "{v}");
    assert_eq!(
        v["fencing_token"].to_string().trim_matches('"'),
        token.to_string()
    );
    s2.touch("go");
    second.wait().assert_code(0);
}

/// `--key-prefix lockrun:teamA:` with `job`, and the default prefix `lockrun:` with
/// `teamA:job`, spell the same `PREFIX + NAME`: they must still be two locks
/// (docs/backends.md, "Keys": two different pairs never share a key). Both are held at
/// once, each `status` shows its own holder only, and `release --force` of one leaves the
/// other holding: its command keeps running through renewals and its status is unchanged.
pub(super) fn two_prefix_and_name_pairs_that_spell_alike_are_two_locks(start: Start) {
    let b = start();
    const TEAM: [&str; 2] = ["--key-prefix", "lockrun:teamA:"];
    let renew = ["--ttl", "30s", "--renew-every", "500ms"];
    let (s1, s2) = (Scratch::new(), Scratch::new());
    let opts: Vec<&str> = TEAM.iter().chain(&renew).copied().collect();
    let (mut team, team_token) = holder(&b, "job", &s1, &opts);
    // Held by the first one, yet the second one takes its lock at once.
    let (mut plain, plain_token) = holder(&b, "teamA:job", &s2, &renew);
    assert!(team.is_running(), "{:?}", team.try_finish());
    for (opts, name, who, token) in [
        (&TEAM[..], "job", &team, team_token),
        (&[][..], "teamA:job", &plain, plain_token),
    ] {
        let (code, v) = status_with(&b, opts, name);
        assert_eq!(code, Some(0), "status {opts:?} {name}: {v}");
        assert_eq!(
            v["pid"].as_u64(),
            Some(who.pid() as u64),
            "{opts:?} {name}: {v}"
        );
        assert_eq!(
            v["fencing_token"].to_string().trim_matches('"'),
            token.to_string()
        );
    }
    let f = run(b.admin("release", &[TEAM[0], TEAM[1], "--force", "job"]));
    f.assert_code(0);
    assert!(
        f.stderr.contains(&team.pid().to_string()) && !f.stderr.contains(&plain.pid().to_string()),
        "release --force broke another holder than the one of its pair: {}",
        f.stderr
    );
    // The broken holder finds out at its next renewal (every 500 ms); the other one
    // renews as often and must go on for a while after that.
    team.wait_for(Duration::from_secs(10)).assert_failure(124);
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(1500) {
        assert!(
            plain.is_running(),
            "breaking the other pair's lock ended this one: {:?}",
            plain.try_finish()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let (code, v) = status_with(&b, &TEAM, "job");
    assert_eq!((code, &v["held"]), (Some(1), &false.into()), "{v}");
    let (code, v) = status_of(&b, "teamA:job");
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["pid"].as_u64(), Some(plain.pid() as u64), "{v}");
    assert_eq!(
        v["fencing_token"].to_string().trim_matches('"'),
        plain_token.to_string()
    );
    s2.touch("go");
    plain.wait().assert_code(0);
    assert!(
        !b.held("teamA:job"),
        "the lock is held after its holder ended"
    );
}

/// docs/guarantees.md, property 8, whatever the argument parser lets through: a lease
/// longer than any backend keeps (24 h) is refused before anything is written, so no lock
/// is left held for longer (or for ever, with a lease the server cannot take).
pub(super) fn a_lease_longer_than_a_day_is_refused_and_leaves_no_lock(start: Start) {
    let b = start();
    let s = Scratch::new();
    for ttl in ["25h", "100y", "18446744073709551615s"] {
        let mut cmd = b.run("job", &["--ttl", ttl], &sh(r#"touch "$MARKER""#));
        cmd.env("MARKER", s.path("marker"));
        run(cmd).assert_failure(125);
        assert!(!s.exists("marker"), "--ttl {ttl}: the command ran");
        assert!(!b.held("job"), "--ttl {ttl} left the lock held");
    }
    // The refusals left nothing in the way.
    token_of(&b, &[]);
}

pub(super) fn unreachable_backend_fails_closed(start: Start) {
    let b = start();
    b.set_mode(Mode::Refuse);
    let s = Scratch::new();
    let mut cmd = b.run("job", &["--ttl", TTL_ARG], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(125);
    assert!(!s.exists("marker"), "the command ran without the lock");
    assert!(f.elapsed < Duration::from_secs(5), "took {:?}", f.elapsed);
    run(b.admin("status", &["job"])).assert_failure(125);
}
