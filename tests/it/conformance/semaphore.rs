//! The semaphore contract (`--slots N`, docs/guarantees.md, property 9) on every backend:
//! never more than N inside under contention and never two on one slot, with tokens that
//! only increase (a history checker, as for the plain lock); busy when every slot is
//! held; `status` (text and JSON) and `release --force` over every slot; a holder taken
//! with another N refused (125) by runs, `status` and `release`; a crashed holder's slot
//! freed when its lease ends, not before; waiters served in the order they came.

use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;

use super::{Start, TTL, TTL_ARG};
use crate::support::*;

/// The command of a slot holder: records its fencing token, slot and start (wall
/// clock, ns) in `$STARTED`, and its pid in `$PIDFILE`, then holds until `$GO` exists.
const SLOT_HOLD: &str = r#"echo $$ > "$PIDFILE"; echo "$LOCKRUN_FENCING_TOKEN $LOCKRUN_SLOT $(date +%s%N)" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A holder of one slot of "job": its lockrun, its scratch directory ("go" ends it),
/// its fencing token, its slot and its command's pid.
struct SlotHolder {
    lockrun: Running,
    scratch: Scratch,
    token: u128,
    slot: u32,
    pid: i32,
}

/// Starts a lockrun on "job" with `opts` running [`SLOT_HOLD`], once its command runs.
fn slot_holder(b: &Backend, opts: &[&str]) -> SlotHolder {
    let s = Scratch::new();
    let mut cmd = b.run("job", opts, &sh(SLOT_HOLD));
    cmd.env("STARTED", s.path("started"))
        .env("GO", s.path("go"))
        .env("PIDFILE", s.path("pid"));
    let lockrun = spawn(cmd);
    let (token, slot, _) = started(&s);
    let pid = s.read("pid").trim().parse().expect("a pid");
    SlotHolder {
        lockrun,
        scratch: s,
        token,
        slot,
        pid,
    }
}

/// The fencing token, slot and start (wall clock) a [`SLOT_HOLD`] command recorded.
fn started(s: &Scratch) -> (u128, u32, Duration) {
    let line = wait_line(&s.path("started"));
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 3, "bad start line {line:?}");
    let slot = f[1].parse().expect("LOCKRUN_SLOT is a number");
    let at = Duration::from_nanos(f[2].parse().expect("a time in ns"));
    (parse_token(f[0]), slot, at)
}

/// The wall clock now, as the commands' `date +%s%N` reads it.
fn wall() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
}

/// `lockrun status --json [ARGS] job`: its exit code and its object.
fn status_json(b: &Backend, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    all.push("job");
    let f = run(b.admin("status", &all));
    let v = serde_json::from_str(f.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json printed {:?} ({e}): {}", f.stdout, f.stderr));
    (f.code, v)
}

pub(super) fn semaphore_admits_at_most_n_on_distinct_slots(start: Start) {
    const SLOTS: u32 = 3;
    const WORKERS: usize = 8;
    const ROUNDS: usize = 4;
    // Eight lockruns at once load the machine: run alone.
    alone();
    let b = start();
    let history = SlotSections::new(Duration::from_millis(300));
    thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    // A lease of several seconds: eight lockruns and the servers share
                    // two cores here, and a renewal that cannot get through in time
                    // (ZooKeeper's 800 ms reads, at TTL 2 s) is a lost lock (124), not a
                    // flaw in the semaphore.
                    let opts = ["--slots", "3", "--wait", "120s", "--ttl", "6s"];
                    let mut cmd = b.run("job", &opts, &SlotSections::command());
                    history.env(&mut cmd);
                    spawn(cmd).wait_for(Duration::from_secs(150)).assert_code(0);
                }
            });
        }
    });
    let most = history.assert_within(SLOTS, WORKERS * ROUNDS);
    // A semaphore that let only one in at a time would pass the checks above.
    assert!(
        most >= 2,
        "never more than {most} inside at once with 3 slots"
    );
    let (code, v) = status_json(&b, &["--slots", "3"]);
    assert_eq!((code, &v["held"]), (Some(1), &false.into()), "{v}");
}

pub(super) fn semaphore_busy_status_and_forced_release(start: Start) {
    let b = start();
    let opts = ["--slots", "3", "--ttl", "30s", "--renew-every", "500ms"];
    let mut holders: Vec<SlotHolder> = (0..3).map(|_| slot_holder(&b, &opts)).collect();
    let slots: Vec<u32> = holders.iter().map(|h| h.slot).collect();
    assert_eq!(slots, [0, 1, 2], "each holder takes the lowest free slot");
    let tokens: Vec<u128> = holders.iter().map(|h| h.token).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens do not increase over the slots: {tokens:?}"
    );

    // Every slot held: a fourth is busy and does not run.
    let s = Scratch::new();
    let mut cmd = b.run("job", &["--slots", "3"], &sh(r#"touch "$MARKER""#));
    cmd.env("MARKER", s.path("marker"));
    let f = run(cmd);
    f.assert_failure(75);
    assert!(!s.exists("marker"), "a fourth holder ran with 3 slots");
    assert!(f.stderr.contains("all 3 slots"), "busy line: {}", f.stderr);

    // status lists every holder, with its slot.
    let (code, v) = status_json(&b, &["--slots", "3"]);
    assert_eq!(
        (code, &v["held"], &v["slots"]),
        (Some(0), &true.into(), &3.into()),
        "{v}"
    );
    let listed = v["holders"].as_array().expect("holders is a list");
    assert_eq!(listed.len(), 3, "{v}");
    for (h, l) in holders.iter().zip(listed) {
        assert_eq!(l["slot"], h.slot, "{v}");
        assert_eq!(l["pid"].as_u64(), Some(h.lockrun.pid() as u64), "{v}");
        assert_eq!(l["host"], hostname().as_str(), "{v}");
        let fence = match &l["fencing_token"] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        assert_eq!(parse_token(&fence), h.token, "{v}");
        let ttl = l["ttl_ms"].as_u64().expect("ttl_ms is a number");
        assert!(ttl > 0 && ttl <= 30_000, "ttl_ms {ttl}");
    }
    let f = run(b.admin("status", &["--slots", "3", "job"]));
    f.assert_code(0);
    assert!(
        f.stdout.starts_with("job: 3 of 3 slots held"),
        "{}",
        f.stdout
    );
    for h in &holders {
        let line = format!(
            "slot {}: held by {} pid {}",
            h.slot,
            hostname(),
            h.lockrun.pid()
        );
        assert!(f.stdout.contains(&line), "no {line:?} in:\n{}", f.stdout);
    }

    // The holder of slot 1 ends: the next run gets slot 1, the lowest free one.
    holders[1].scratch.touch("go");
    holders[1].lockrun.wait().assert_code(0);
    let next = slot_holder(&b, &opts);
    assert_eq!(next.slot, 1, "the freed slot was not taken");
    assert!(
        next.token > holders[2].token,
        "a later holder got a smaller token"
    );
    holders[1] = next;

    // release --force breaks every slot and names each holder.
    let f = run(b.admin("release", &["--force", "--slots", "3", "job"]));
    f.assert_code(0);
    for h in &holders {
        assert!(
            f.stderr.contains(&format!("slot {}", h.slot))
                && f.stderr.contains(&h.lockrun.pid().to_string()),
            "release --force did not name slot {} and pid {}: {}",
            h.slot,
            h.lockrun.pid(),
            f.stderr
        );
    }
    let (code, v) = status_json(&b, &["--slots", "3"]);
    assert_eq!((code, &v["held"]), (Some(1), &false.into()), "{v}");
    assert_eq!(v["holders"], serde_json::json!([]), "{v}");
    // Each broken holder finds out at its next renewal.
    for h in &mut holders {
        h.lockrun
            .wait_for(Duration::from_secs(10))
            .assert_failure(124);
    }
}

pub(super) fn semaphore_refuses_a_different_slot_count(start: Start) {
    let b = start();
    let mut h = slot_holder(&b, &["--slots", "3", "--ttl", "30s"]);
    let s = Scratch::new();
    for other in [&["--slots", "2"][..], &[], &["--slots", "4"]] {
        let mut cmd = b.run("job", other, &sh(r#"touch "$MARKER""#));
        cmd.env("MARKER", s.path("marker"));
        let f = run(cmd);
        f.assert_failure(125);
        assert!(
            !s.exists("marker"),
            "a run with {other:?} started beside --slots 3"
        );
        assert!(
            f.stderr.contains("--slots 3") && f.stderr.contains("same --slots"),
            "the refusal of {other:?} does not name the holders' --slots: {}",
            f.stderr
        );
    }
    // status and release --force with another N refuse too, and break nothing.
    let f = run(b.admin("status", &["job"]));
    f.assert_failure(125);
    assert!(f.stderr.contains("--slots 3"), "{}", f.stderr);
    let f = run(b.admin("release", &["--force", "--slots", "2", "job"]));
    f.assert_failure(125);
    assert!(f.stderr.contains("nothing was broken"), "{}", f.stderr);
    let (code, v) = status_json(&b, &["--slots", "3"]);
    assert_eq!(code, Some(0), "the refused release broke the lock: {v}");
    h.scratch.touch("go");
    h.lockrun.wait().assert_code(0);

    // A holder of slot 2 alone is seen by runs that would never look at slot 2 (a
    // plain run looks at slot 0): they are refused too.
    let mut three: Vec<SlotHolder> = (0..3)
        .map(|_| slot_holder(&b, &["--slots", "3", "--ttl", "30s"]))
        .collect();
    for h in &mut three[..2] {
        h.scratch.touch("go");
        h.lockrun.wait().assert_code(0);
    }
    assert_eq!(three[2].slot, 2);
    for other in [&["--slots", "2"][..], &[]] {
        let mut cmd = b.run("job", other, &sh(r#"touch "$MARKER""#));
        cmd.env("MARKER", s.path("marker"));
        let f = run(cmd);
        f.assert_failure(125);
        assert!(
            !s.exists("marker") && f.stderr.contains("--slots 3"),
            "a run with {other:?} started beside a --slots 3 holder of slot 2: {}",
            f.stderr
        );
    }
    three[2].scratch.touch("go");
    three[2].lockrun.wait().assert_code(0);

    // A plain holder refuses a semaphore in the same way.
    let mut plain = slot_holder(&b, &["--ttl", "30s"]);
    assert_eq!(plain.slot, 0, "a plain lock gets LOCKRUN_SLOT 0");
    let f = run(b.run("job", &["--slots", "2"], &sh("true")));
    f.assert_failure(125);
    assert!(f.stderr.contains("a plain lock"), "{}", f.stderr);
    plain.scratch.touch("go");
    plain.lockrun.wait().assert_code(0);
}

pub(super) fn semaphore_crashed_holders_slot_frees_when_its_lease_ends(start: Start) {
    let b = start();
    let reaper = Reaper::default();
    let opts = ["--slots", "2", "--ttl", TTL_ARG, "--renew-every", "500ms"];
    let mut crashed = slot_holder(&b, &opts);
    reaper.add(crashed.pid);
    let mut other = slot_holder(&b, &opts);
    assert_eq!((crashed.slot, other.slot), (0, 1));
    let w = Scratch::new();
    let mut waiter = b.run("job", &["--slots", "2", "--wait", "20s"], &sh(SLOT_HOLD));
    waiter
        .env("STARTED", w.path("started"))
        .env("GO", w.path("go"))
        .env("PIDFILE", w.path("pid"));
    w.touch("go");
    let mut waiter = spawn(waiter);
    thread::sleep(Duration::from_millis(500));
    assert!(!w.exists("started"), "a third holder ran with 2 slots");
    // The holder of slot 0 dies without releasing: its lease just ends. It was renewed
    // at most 500 ms (plus a request) before the kill, so it ends at least TTL - 500 ms
    // after it; 300 ms more are allowed for the request and clock reading.
    let killed_wall = wall();
    let killed = Instant::now();
    crashed.lockrun.signal(Signal::SIGKILL);
    crashed.lockrun.wait();
    wait_until("the command died with its lockrun", WAIT, || {
        is_dead(crashed.pid)
    });
    waiter.wait().assert_code(0);
    let (_, slot, started_at) = started(&w);
    assert_eq!(slot, 0, "the waiter did not get the crashed holder's slot");
    if !b.frees_crashed_locks_at_once() {
        let earliest = killed_wall + TTL - Duration::from_millis(800);
        assert!(
            started_at >= earliest,
            "the waiter ran {:?} after the kill, before the crashed lease could end (TTL {TTL:?})",
            started_at.saturating_sub(killed_wall)
        );
    }
    assert!(
        killed.elapsed() < TTL + Duration::from_secs(3),
        "the waiter ran {:?} after the holder was killed (TTL {TTL:?})",
        killed.elapsed()
    );
    other.scratch.touch("go");
    other.lockrun.wait().assert_code(0);
}

pub(super) fn semaphore_waiters_are_served_in_order(start: Start) {
    const WAITERS: usize = 3;
    let b = start();
    let opts = ["--slots", "2", "--ttl", "30s", "--renew-every", "1s"];
    let mut holders: Vec<SlotHolder> = (0..2).map(|_| slot_holder(&b, &opts)).collect();
    // Waiters come one after the other: each has said it waits before the next starts.
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let s = Scratch::new();
        let wait_opts = ["-v", "--slots", "2", "--wait", "60s", "--ttl", "30s"];
        let mut cmd = b.run("job", &wait_opts, &sh(SLOT_HOLD));
        cmd.env("STARTED", s.path("started"))
            .env("GO", s.path("go"))
            .env("PIDFILE", s.path("pid"));
        let mut lockrun = spawn(cmd);
        wait_until("the waiter says it waits", WAIT, || {
            lockrun.stderr_so_far().contains("waiting up to")
        });
        waiters.push((lockrun, s));
    }
    // Each freed slot goes to the waiter that came first of those left.
    for i in 0..WAITERS {
        let h = &mut holders[i % 2];
        h.scratch.touch("go");
        h.lockrun.wait().assert_code(0);
        let freed = h.slot;
        wait_until("a waiter runs", WAIT, || {
            waiters.iter().any(|(_, s)| s.exists("started"))
        });
        let first = waiters.iter().position(|(_, s)| s.exists("started"));
        assert_eq!(
            first,
            Some(0),
            "waiter {i} was not served first of those left"
        );
        let (lockrun, scratch) = waiters.remove(0);
        let (token, slot, _) = started(&scratch);
        assert_eq!(slot, freed, "waiter {i} did not get the slot just freed");
        let pid = scratch.read("pid").trim().parse().expect("a pid");
        holders[i % 2] = SlotHolder {
            lockrun,
            scratch,
            token,
            slot,
            pid,
        };
    }
    for h in &mut holders {
        h.scratch.touch("go");
        h.lockrun.wait().assert_code(0);
    }
}
