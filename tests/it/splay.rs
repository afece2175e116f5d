//! `--splay`: a uniformly random pause before the first attempt, holding nothing; a
//! signal ends it and the run without starting the command; `--wait` counts after it.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// How long a test waits for a lockrun to say how long it pauses.
const SAY: Duration = Duration::from_secs(20);

/// Spawns `cmd` (a run with `-v --log-format json` added by the caller) and returns it
/// with the pause its `splay` line announces, once that line is out.
fn pausing(cmd: std::process::Command) -> (Running, Duration) {
    let mut lr = spawn(cmd);
    let mut pause = None;
    wait_until("lockrun says how long it pauses", SAY, || {
        pause = splay_ms(&lr.stderr_so_far()).map(Duration::from_millis);
        pause.is_some()
    });
    (lr, pause.unwrap())
}

/// The `splay_ms` of the `splay` line in a JSON log.
fn splay_ms(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "splay")
        .map(|v| v["splay_ms"].as_u64().expect("splay_ms is a number"))
}

/// Runs with `--splay` pause for a uniformly random time within it: never longer, the
/// command only after the pause, and spread over the range (24 runs all in one half
/// of it: one chance in 8 million).
#[test]
fn pauses_are_within_the_splay_and_spread_over_it() {
    let f = FileService::start();
    let runs: Vec<_> = (0..24)
        .map(|i| {
            let opts = ["--splay", "2s", "-v", "--log-format", "json"];
            spawn(lockrun_run(
                &f.lock_url(),
                &format!("job{i}"),
                &opts,
                &["true"],
            ))
        })
        .collect();
    let mut pauses = Vec::new();
    for mut r in runs {
        let done = r.wait_for(Duration::from_secs(60));
        done.assert_code(0);
        let pause = Duration::from_millis(splay_ms(&done.stderr).expect("a splay line"));
        assert!(
            pause <= Duration::from_secs(2),
            "paused {pause:?} for --splay 2s"
        );
        assert!(
            done.elapsed >= pause,
            "the run ended {:?} after it started, within its {pause:?} pause",
            done.elapsed
        );
        pauses.push(pause);
    }
    let half = Duration::from_secs(1);
    assert!(
        pauses.iter().any(|&p| p < half) && pauses.iter().any(|&p| p >= half),
        "24 pauses all in one half of --splay 2s: {pauses:?}"
    );
}

/// While one run pauses, the lock is free: another takes it, runs and ends; the
/// pausing run takes it after its pause. On a file lock and on Redis.
#[test]
fn nothing_is_held_during_the_pause() {
    for b in [
        Backend::new(FileService::start()),
        Backend::new(RedisServer::start()),
    ] {
        let s = Scratch::new();
        let opts = ["--splay", "8s", "-v", "--log-format", "json"];
        // A pause of at least 3 s, to look at the lock during it (each try has 5
        // chances in 8).
        let (mut first, pause) = (0..20)
            .map(|_| pausing(b.run("job", &opts, &["true"])))
            .find(|(_, pause)| *pause >= Duration::from_secs(3))
            .expect("a pause of 3 s or more in 20 tries");
        let seen = Instant::now();
        assert!(!b.held("job"), "the lock is held during the pause");
        let mut other = b.run("job", &[], &sh(r#"touch "$MARKER""#));
        other.env("MARKER", s.path("other"));
        run(other).assert_code(0);
        assert!(
            seen.elapsed() < pause,
            "the check took longer than the pause: it proves nothing"
        );
        assert!(s.exists("other"), "the other run's command did not run");
        first.wait_for(Duration::from_secs(60)).assert_code(0);
    }
}

/// A forwarded signal during the pause ends lockrun at once with 128+N, one line
/// saying so, and the command never started.
#[test]
fn term_during_the_pause_ends_the_run_without_the_command() {
    let f = FileService::start();
    let s = Scratch::new();
    let opts = ["--splay", "24h", "-v", "--log-format", "json"];
    let mut cmd = lockrun_run(&f.lock_url(), "job", &opts, &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let (mut lr, pause) = pausing(cmd);
    assert!(
        pause > Duration::from_secs(60),
        "paused only {pause:?} of 24h"
    );
    lr.signal(Signal::SIGTERM);
    let sent = Instant::now();
    let done = lr.wait_for(Duration::from_secs(30));
    done.assert_code(128 + 15);
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "lockrun ended {:?} after SIGTERM",
        sent.elapsed()
    );
    assert!(
        done.stderr
            .contains("while pausing before the first attempt"),
        "no line says why: {}",
        done.stderr
    );
    assert!(!s.exists("marker"), "the command ran");
}

/// `--wait` counts from the end of the pause: against a lock held throughout, a run
/// with `--splay 2s --wait 1s` gives up no sooner than its pause plus 1 s.
#[test]
fn wait_counts_after_the_pause() {
    let f = FileService::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&f.lock_url(), "job", &s, &[]);
    let opts = [
        "--splay",
        "2s",
        "--wait",
        "1s",
        "-v",
        "--log-format",
        "json",
    ];
    let busy = run(lockrun_run(&f.lock_url(), "job", &opts, &["true"]));
    busy.assert_code(75);
    let pause = Duration::from_millis(splay_ms(&busy.stderr).expect("a splay line"));
    assert!(
        busy.elapsed >= pause + Duration::from_secs(1),
        "gave up {:?} after it started, with a {pause:?} pause and --wait 1s",
        busy.elapsed
    );
    s.touch("go");
    holder.wait_for(Duration::from_secs(30)).assert_code(0);
}
