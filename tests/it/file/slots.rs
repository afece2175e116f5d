//! The file backend's semaphores (`--slots N`): slot `i` of a name is a byte of its one
//! lock file and its holders are listed in that file's record, with one fencing
//! counter. Each test in a lock directory of its own.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{admin, record_line};
use crate::support::*;

/// A holder's command: writes `SLOT TOKEN` to `$STARTED`, then runs until `$GO` exists.
const SLOT_HOLD: &str = r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#;

/// A lockrun holding a slot of `name` (with `opts`, `--slots` among them) until `go`
/// exists in `s`.
struct SlotHolder {
    lockrun: Running,
    slot: u32,
    token: u128,
    s: Scratch,
}

impl SlotHolder {
    /// Starts one and waits until its command runs.
    fn start(f: &FileService, name: &str, opts: &[&str]) -> SlotHolder {
        let s = Scratch::new();
        let mut cmd = lockrun_run(&f.lock_url(), name, opts, &sh(SLOT_HOLD));
        cmd.env("STARTED", s.path("started"))
            .env("GO", s.path("go"));
        let lockrun = spawn(cmd);
        let (slot, token) = slot_and_token(&wait_line(&s.path("started")));
        SlotHolder {
            lockrun,
            slot,
            token,
            s,
        }
    }

    /// Lets its command end and checks that it ran to the end.
    fn finish(mut self) {
        self.s.touch("go");
        self.lockrun.wait().assert_code(0);
    }
}

/// `SLOT TOKEN` as the command wrote it.
fn slot_and_token(line: &str) -> (u32, u128) {
    let (slot, token) = line
        .trim()
        .split_once(' ')
        .unwrap_or_else(|| panic!("no slot and token in {line:?}"));
    (slot.parse().expect("a slot"), parse_token(token))
}

/// `lockrun status --slots N --json NAME`: its exit status and object.
fn status(f: &FileService, name: &str, slots: &str) -> (Option<i32>, serde_json::Value) {
    let out = run(admin(f, "status", &["--slots", slots, "--json", name]));
    let v = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json: {e}: {:?}", out.stdout));
    (out.code, v)
}

/// The slots `status --json` lists as held.
fn held_slots(v: &serde_json::Value) -> Vec<u64> {
    v["holders"]
        .as_array()
        .expect("a list of holders")
        .iter()
        .map(|h| h["slot"].as_u64().expect("a slot"))
        .collect()
}

#[test]
fn three_holders_get_slots_0_1_2_in_one_file_and_a_fourth_is_busy() {
    let f = FileService::start();
    let opts = ["--slots", "3", "--ttl", "30s"];
    let holders: Vec<SlotHolder> = (0..3)
        .map(|_| SlotHolder::start(&f, "job", &opts))
        .collect();
    let slots: Vec<u32> = holders.iter().map(|h| h.slot).collect();
    assert_eq!(slots, [0, 1, 2], "each takes the lowest free slot");
    let tokens: Vec<u128> = holders.iter().map(|h| h.token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // One lock file: one counter (the last token handed out) and the three holders.
    let files: Vec<_> = fs::read_dir(f.dir()).unwrap().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = fs::read_to_string(f.lock_file("job")).unwrap();
    assert!(text.starts_with("lockrun lock file 2\n"), "{text}");
    assert_eq!(record_line(&f, "job", "slots"), "3");
    assert_eq!(
        parse_token(&record_line(&f, "job", "fencing_token")),
        tokens[2]
    );
    for h in &holders {
        let line = format!("holder slot={} fencing_token={} token=", h.slot, h.token);
        assert!(text.contains(&line), "no {line:?} in {text}");
        assert!(
            text.contains(&format!(" pid={} ", h.lockrun.pid())),
            "{text}"
        );
    }
    // A fourth finds every slot held: busy, its command not run.
    let fourth = run(lockrun_run(&f.lock_url(), "job", &opts, &sh("echo ran")));
    fourth.assert_failure(75);
    assert!(!fourth.stdout.contains("ran"));
    assert!(fourth.stderr.contains("all 3 slots"), "{}", fourth.stderr);
    let (code, v) = status(&f, "job", "3");
    assert_eq!(code, Some(0));
    assert_eq!(held_slots(&v), [0, 1, 2]);
    let pids: Vec<i64> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["pid"].as_i64().unwrap())
        .collect();
    let expected: Vec<i64> = holders.iter().map(|h| i64::from(h.lockrun.pid())).collect();
    assert_eq!(pids, expected);
    // Slot 1 frees: the next run takes it, with a larger token.
    let mut holders = holders.into_iter();
    let (first, second, third) = (
        holders.next().unwrap(),
        holders.next().unwrap(),
        holders.next().unwrap(),
    );
    second.finish();
    let out = run(lockrun_run(
        &f.lock_url(),
        "job",
        &opts,
        &sh(r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN""#),
    ));
    let (slot, token) = slot_and_token(&out.assert_code(0).stdout);
    assert_eq!(slot, 1);
    assert!(token > tokens[2], "token {token} after {}", tokens[2]);
    first.finish();
    third.finish();
    // Every holder gone: a plain record again, the counter kept.
    let text = fs::read_to_string(f.lock_file("job")).unwrap();
    assert!(text.starts_with("lockrun lock file 1\n"), "{text}");
    assert_eq!(parse_token(&record_line(&f, "job", "fencing_token")), token);
    let (code, v) = status(&f, "job", "3");
    assert_eq!((code, held_slots(&v).len()), (Some(1), 0));
}

#[test]
fn holders_of_another_slots_are_refused_with_125() {
    let f = FileService::start();
    let held = SlotHolder::start(&f, "job", &["--slots", "3", "--ttl", "30s"]);
    for other in [&["--slots", "2"][..], &["--slots", "4"], &[]] {
        let out = run(lockrun_run(&f.lock_url(), "job", other, &sh("echo ran")));
        out.assert_failure(125);
        assert!(!out.stdout.contains("ran"), "{other:?}");
        assert!(
            out.stderr.contains("--slots 3") && out.stderr.contains("the same --slots"),
            "{other:?}: {}",
            out.stderr
        );
    }
    held.finish();
    // The other way round: a plain lock's holder refuses a semaphore.
    let plain = SlotHolder::start(&f, "job", &["--ttl", "30s"]);
    assert_eq!(plain.slot, 0);
    let out = run(lockrun_run(
        &f.lock_url(),
        "job",
        &["--slots", "3"],
        &["true"],
    ));
    out.assert_failure(125);
    assert!(
        out.stderr.contains("a plain lock (--slots 1)"),
        "{}",
        out.stderr
    );
    plain.finish();
    // Nobody holds it: any N may take it now.
    run(lockrun_run(
        &f.lock_url(),
        "job",
        &["--slots", "2"],
        &["true"],
    ))
    .assert_code(0);
}

#[test]
fn a_crashed_holders_slot_is_free_at_once_for_a_run_and_for_a_waiter() {
    let f = FileService::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let cmd = lockrun_run(&f.lock_url(), "job", &opts, &sh(SLEEPER));
    let (mut crashed, pid) = spawn_recording_pid(cmd, &s, &reaper);
    let other = SlotHolder::start(&f, "job", &opts);
    assert_eq!(other.slot, 1);
    // A waiter: both slots are held.
    let ws = Scratch::new();
    let mut w = lockrun_run(
        &f.lock_url(),
        "job",
        &["--slots", "2", "--wait", "60s"],
        &sh(r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN" > "$OUT""#),
    );
    w.env("OUT", ws.path("out"));
    let mut w = spawn(w);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(500) {
        assert!(
            !ws.exists("out"),
            "the waiter ran while both slots were held"
        );
        assert!(w.is_running(), "the waiter gave up: {:?}", w.try_finish());
        std::thread::sleep(Duration::from_millis(20));
    }
    // A 30 s TTL: only the kernel freeing the slot explains a hand-off within a second.
    let killed = Instant::now();
    crashed.signal(Signal::SIGKILL);
    let (slot, token) = slot_and_token(&wait_line(&ws.path("out")));
    let took = killed.elapsed();
    crashed.wait();
    w.wait().assert_code(0);
    assert!(
        took < Duration::from_secs(1),
        "the waiter ran {took:?} after the crash"
    );
    assert_eq!(slot, 0);
    assert!(token > other.token);
    wait_until("the command died with its lockrun", WAIT, || is_dead(pid));
    // Without a waiter too: the next run takes slot 0 at once.
    let out = run(lockrun_run(
        &f.lock_url(),
        "job",
        &opts,
        &sh(r#"echo "$LOCKRUN_SLOT $LOCKRUN_FENCING_TOKEN""#),
    ));
    let (slot, next) = slot_and_token(&out.assert_code(0).stdout);
    assert_eq!(slot, 0);
    assert!(next > token);
    other.finish();
}

/// Waits for the command of the waiter whose scratch is `s` to run, at most 500 ms from
/// `freed` (when a slot was freed: the head of the line is woken by the release, its
/// wait slices are 2 s long); returns its slot.
fn runs_soon(s: &Scratch, freed: Instant, which: &str) -> u32 {
    let (slot, _) = slot_and_token(&wait_line(&s.path("started")));
    let took = freed.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "the {which} waiter ran {took:?} after the slot was freed"
    );
    slot
}

#[test]
fn waiters_are_served_in_the_order_they_came_one_per_freed_slot() {
    let f = FileService::start();
    let opts = ["--slots", "2", "--ttl", "30s"];
    let a = SlotHolder::start(&f, "job", &opts);
    let b = SlotHolder::start(&f, "job", &opts);
    // Three waiters, each settled in line before the next comes.
    let mut waiters: Vec<(Running, Scratch)> = (0..3)
        .map(|_| {
            let s = Scratch::new();
            let mut cmd = lockrun_run(
                &f.lock_url(),
                "job",
                &["--slots", "2", "--ttl", "30s", "--wait", "60s"],
                &sh(SLOT_HOLD),
            );
            cmd.env("STARTED", s.path("started"))
                .env("GO", s.path("go"));
            let mut w = spawn(cmd);
            std::thread::sleep(Duration::from_millis(400));
            assert!(w.is_running(), "a waiter gave up: {:?}", w.try_finish());
            (w, s)
        })
        .collect();
    let ran = |waiters: &[(Running, Scratch)], i: usize| waiters[i].1.exists("started");
    assert!(
        !(0..3).any(|i| ran(&waiters, i)),
        "a waiter ran while both slots were held"
    );
    // Each freed slot lets in the first waiter still in line, and only it.
    a.finish();
    assert_eq!(runs_soon(&waiters[0].1, Instant::now(), "first"), 0);
    assert!(
        !ran(&waiters, 1) && !ran(&waiters, 2),
        "a later waiter ran before the first"
    );
    b.finish();
    assert_eq!(runs_soon(&waiters[1].1, Instant::now(), "second"), 1);
    assert!(!ran(&waiters, 2), "the third waiter ran with the second");
    waiters[0].1.touch("go");
    waiters[0].0.wait().assert_code(0);
    assert_eq!(runs_soon(&waiters[2].1, Instant::now(), "third"), 0);
    for (mut w, s) in waiters.into_iter().skip(1) {
        s.touch("go");
        w.wait().assert_code(0);
    }
}

#[test]
fn a_forced_release_breaks_every_slot_and_keeps_the_counter() {
    let f = FileService::start();
    let opts = ["--slots", "2", "--ttl", "3s"];
    let mut a = SlotHolder::start(&f, "job", &opts);
    let mut b = SlotHolder::start(&f, "job", &opts);
    let out = run(admin(&f, "release", &["--slots", "2", "--force", "job"]));
    out.assert_code(0);
    assert!(
        out.stderr.contains("slot 0") && out.stderr.contains("slot 1"),
        "{}",
        out.stderr
    );
    let (code, v) = status(&f, "job", "2");
    assert_eq!((code, held_slots(&v).len()), (Some(1), 0));
    // Both holders find their lock broken at their next renewal.
    a.lockrun
        .wait_for(Duration::from_secs(30))
        .assert_failure(124);
    b.lockrun
        .wait_for(Duration::from_secs(30))
        .assert_failure(124);
    let next = SlotHolder::start(&f, "job", &opts);
    assert_eq!(next.slot, 0);
    assert!(
        next.token > b.token,
        "token {} after {}",
        next.token,
        b.token
    );
    next.finish();
}

#[test]
fn the_record_stays_private_and_the_command_inherits_no_descriptor() {
    let f = FileService::start();
    let held = SlotHolder::start(&f, "job", &["--slots", "2", "--ttl", "30s"]);
    let out = run(lockrun_run(
        &f.lock_url(),
        "job",
        &["--slots", "2"],
        &sh("ls -l /proc/$$/fd/"),
    ));
    out.assert_code(0);
    let dir = f.dir().display().to_string();
    assert!(
        !out.stdout.contains(&dir),
        "the command has a descriptor in {dir}:\n{}",
        out.stdout
    );
    held.finish();
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&f.dir()), 0o700);
    assert_eq!(mode(&f.lock_file("job")), 0o600);
    let mut names: Vec<String> = fs::read_dir(f.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["lockrun:=job", "lockrun:@job"],
        "a semaphore keeps one lock file per name, and its last run's record beside it"
    );
    assert_eq!(mode(&f.dir().join("lockrun:@job")), 0o600);
}
