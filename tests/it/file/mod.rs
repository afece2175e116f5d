//! What only the file backend (`file:///DIR`) has, each test in a lock directory of its
//! own: a crashed holder's lock is free at once; the fencing counter is in the lock
//! file before the command starts and keeps growing across processes and a copy of
//! the directory; one file per (prefix, name); `--hold-at-least` and `release --force`
//! with a waiter; `status` never in the way of a run; no descriptor for the command.
//! The refusals of unsafe directories and files are in `refusals`; semaphores
//! (`--slots N`: slots in one file, holders of another N refused, a crashed holder's
//! slot free at once, waiters in order) in `slots`; the record of each name's last run
//! in `records`. The contract every backend keeps is tested in the conformance suite.

mod hold;
mod records;
mod refusals;
mod slots;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// The fencing counter the lock file of `name` holds.
fn counter(f: &FileService, name: &str) -> u128 {
    let text = fs::read_to_string(f.lock_file(name)).expect("read the lock file");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("fencing_token "))
        .unwrap_or_else(|| panic!("no fencing_token line in {text:?}"));
    parse_token(line)
}

/// `lockrun SUBCOMMAND --url FILE_URL ARGS...` (status, release).
fn admin(f: &FileService, subcommand: &str, args: &[&str]) -> Command {
    let mut cmd = lockrun();
    cmd.arg(subcommand)
        .arg("--url")
        .arg(f.lock_url())
        .args(args);
    cmd
}

/// Runs one command on "job" at `url` and returns its fencing token.
fn token_at(url: &str) -> u128 {
    let f = run(lockrun_run(
        url,
        "job",
        &[],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN""#),
    ));
    parse_token(f.assert_code(0).stdout.trim())
}

/// A lockrun waiting (up to a minute) for "job", touching "marker" in `s` when it runs.
fn waiter(f: &FileService, s: &Scratch) -> Running {
    let mut w = lockrun_run(
        &f.lock_url(),
        "job",
        &["--wait", "60s"],
        &sh(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$MARKER""#),
    );
    w.env("MARKER", s.path("marker"));
    let mut w = spawn(w);
    thread::sleep(Duration::from_millis(500));
    assert!(w.is_running(), "the waiter gave up: {:?}", w.try_finish());
    assert!(
        !s.exists("marker"),
        "the waiter ran while the lock was held"
    );
    w
}

#[test]
fn a_crashed_holders_lock_is_free_at_once_and_its_waiter_runs() {
    let f = FileService::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    // A 30 s TTL: only the kernel freeing the lock explains a hand-off within a second.
    let cmd = lockrun_run(&f.lock_url(), "job", &["--ttl", "30s"], &sh(SLEEPER));
    let (mut h, pid) = spawn_recording_pid(cmd, &s, &reaper);
    // The waiter's command first takes a snapshot of the crashed holder's command.
    let mut w = lockrun_run(
        &f.lock_url(),
        "job",
        &["--wait", "60s"],
        &sh(r#"cat /proc/$OLD/stat /proc/$OLD/status > "$SNAP" 2>/dev/null; touch "$MARKER""#),
    );
    w.env("OLD", pid.to_string())
        .env("SNAP", s.path("snap"))
        .env("MARKER", s.path("marker"));
    let mut w = spawn(w);
    thread::sleep(Duration::from_millis(500));
    assert!(
        w.is_running() && !s.exists("marker"),
        "the waiter did not wait"
    );
    let killed = Instant::now();
    h.signal(Signal::SIGKILL);
    wait_until("the waiter ran", WAIT, || s.exists("marker"));
    let took = killed.elapsed();
    h.wait();
    w.wait().assert_code(0);
    assert!(
        took < Duration::from_secs(1),
        "the waiter ran {took:?} after the holder was killed"
    );
    let snap = s.read("snap");
    assert!(
        !could_run(&snap),
        "the waiter's command started while the crashed holder's command could still run:\n{snap}"
    );
}

/// True if `snapshot` (`/proc/PID/stat`, then `/proc/PID/status`, as `cat` wrote them)
/// shows a process that may still run code of its own: not gone, not a zombie, not
/// exiting (`PF_EXITING`), without SIGKILL pending.
fn could_run(snapshot: &str) -> bool {
    let Some(stat) = snapshot.lines().next().filter(|l| !l.is_empty()) else {
        return false;
    };
    // After "pid (comm)": state (field 3), ..., flags (field 9).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let exiting = fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0)
        & 0x4
        != 0;
    let kill_pending = snapshot
        .lines()
        .filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .any(|mask| u64::from_str_radix(mask, 16).unwrap_or(0) & (1 << 8) != 0);
    !matches!(fields.first(), Some(&"Z") | Some(&"X")) && !exiting && !kill_pending
}

#[test]
fn after_a_crash_the_lock_is_free_at_once_without_a_waiter() {
    let f = FileService::start();
    let s = Scratch::new();
    let reaper = Reaper::default();
    let cmd = lockrun_run(&f.lock_url(), "job", &["--ttl", "30s"], &sh(SLEEPER));
    let (mut h, pid) = spawn_recording_pid(cmd, &s, &reaper);
    // The command's parent: lockrun's guard, which keeps the lock file open until the
    // whole job is dead.
    let guard = parent_of(pid);
    h.signal(Signal::SIGKILL);
    h.wait();
    wait_until("the command died with its lockrun", WAIT, || is_dead(pid));
    wait_until("the guard ended after the job", WAIT, || is_dead(guard));
    run(admin(&f, "status", &["job"])).assert_code(1);
    run(lockrun_run(&f.lock_url(), "job", &[], &["true"])).assert_code(0);
}

/// The parent process of `pid`, from /proc/PID/stat (the field after the name).
fn parent_of(pid: i32) -> i32 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the command's stat");
    let after_name = stat.rsplit_once(')').expect("a name in parentheses").1;
    after_name
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("a parent pid")
}

#[test]
fn the_counter_is_in_the_lock_file_before_the_command_starts() {
    let f = FileService::start();
    let s = Scratch::new();
    let (mut h, token) = start_holder(&f.lock_url(), "job", &s, &["--ttl", "30s"]);
    // Read while the command runs: the counter handed out is in the file already.
    assert_eq!(counter(&f, "job"), token);
    let text = fs::read_to_string(f.lock_file("job")).unwrap();
    assert!(
        text.contains(&format!("\npid {}\n", h.pid())),
        "the record does not name the holder: {text:?}"
    );
    s.touch("go");
    h.wait().assert_code(0);
    assert_eq!(counter(&f, "job"), token, "the release changed the counter");
}

#[test]
fn tokens_keep_increasing_across_processes_and_a_copy_of_the_directory() {
    let f = FileService::start();
    let first = token_at(&f.lock_url());
    let second = token_at(&f.lock_url());
    assert!(second > first, "{second} after {first}");
    // What a reboot keeps: the disk. A copy of the directory carries the counter on.
    let copy = f.root().join("copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(f.dir())
        .arg(&copy)
        .status()
        .expect("run cp");
    assert!(cp.success());
    let third = token_at(&format!("file://{}", copy.display()));
    assert!(
        third > second,
        "{third} after {second} in a copy of the directory"
    );
    assert!(token_at(&f.lock_url()) > second);
}

/// A line `KEY VALUE` of the lock file of `name`.
fn record_line(f: &FileService, name: &str, key: &str) -> String {
    let text = fs::read_to_string(f.lock_file(name)).expect("read the lock file");
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ').map(str::to_owned))
        .unwrap_or_else(|| panic!("no {key} line in {text:?}"))
}

/// What a crash and a reboot do to the lock file: the disk keeps the last fsynced
/// record (the reservation), the tokens written after it without an fsync are lost, and
/// the new boot has another boot id. The next token must still be larger than every
/// token handed out before, and one token a run needs no fsync within a boot.
#[test]
fn after_a_reboot_tokens_start_above_the_durable_reservation() {
    let f = FileService::start();
    let first = token_at(&f.lock_url());
    let reserved: u128 = parse_token(&record_line(&f, "job", "reserved_through"));
    assert!(
        reserved > first,
        "the first token reserved no block: {reserved}"
    );
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(record_line(&f, "job", "boot_id"), boot.trim());
    let mut given = vec![first];
    for _ in 0..3 {
        given.push(token_at(&f.lock_url()));
    }
    assert!(given.windows(2).all(|w| w[0] < w[1]), "{given:?}");
    assert_eq!(
        parse_token(&record_line(&f, "job", "reserved_through")),
        reserved,
        "runs within the block reserved again"
    );
    // The crash: the disk has the first run's record; the reboot: another boot id.
    let text = fs::read_to_string(f.lock_file("job")).unwrap();
    let lost = text
        .replace(
            &format!("fencing_token {}\n", given[3]),
            &format!("fencing_token {first}\n"),
        )
        .replace(boot.trim(), "00000000-0000-4000-8000-000000000000");
    assert_ne!(lost, text);
    fs::write(f.lock_file("job"), lost).unwrap();
    let after = token_at(&f.lock_url());
    assert!(
        after > reserved,
        "token {after} after the reboot; up to {reserved} may have been handed out"
    );
}

#[test]
fn names_differing_only_in_slash_colon_or_underscore_are_different_locks() {
    let f = FileService::start();
    let names = ["a/b", "a:b", "a_b"];
    let scratches: Vec<Scratch> = names.iter().map(|_| Scratch::new()).collect();
    // All held at once: three locks.
    let mut holders: Vec<(Running, u128)> = names
        .iter()
        .zip(&scratches)
        .map(|(name, s)| start_holder(&f.lock_url(), name, s, &["--ttl", "30s"]))
        .collect();
    for (_, token) in &holders {
        assert_eq!(*token, 1, "each name has its own counter");
    }
    let files = fs::read_dir(f.dir()).unwrap().count();
    assert_eq!(files, 3, "three names, {files} lock files");
    for ((h, _), s) in holders.iter_mut().zip(&scratches) {
        s.touch("go");
        h.wait().assert_code(0);
    }
}

#[test]
fn key_prefixes_are_part_of_the_file_name_and_never_merge_two_locks() {
    let f = FileService::start();
    let (s1, s2) = (Scratch::new(), Scratch::new());
    // "a:" + "b" and "a" + ":b" would be the same key if just concatenated.
    let (mut h1, _) = start_holder(&f.lock_url(), "b", &s1, &["--key-prefix", "a:"]);
    let (mut h2, _) = start_holder(&f.lock_url(), ":b", &s2, &["--key-prefix", "a"]);
    assert!(f.dir().join("a:=b").exists() && f.dir().join("a=:b").exists());
    s1.touch("go");
    s2.touch("go");
    h1.wait().assert_code(0);
    h2.wait().assert_code(0);
}

#[test]
fn a_waiter_runs_when_hold_at_least_ends_not_before() {
    let f = FileService::start();
    let s = Scratch::new();
    // Made before the clock starts: the first `lockrun_run` joins the tests that run
    // side by side, which waits while one that runs alone ends.
    let first = lockrun_run(&f.lock_url(), "job", &["--hold-at-least", "2s"], &["true"]);
    let started = Instant::now();
    let first = run(first);
    first.assert_code(0);
    let mut w = lockrun_run(
        &f.lock_url(),
        "job",
        &["--wait", "30s"],
        &sh(r#"touch "$MARKER""#),
    );
    w.env("MARKER", s.path("marker"));
    let mut w = spawn(w);
    wait_until("the waiter ran", WAIT, || s.exists("marker"));
    let at = started.elapsed();
    w.wait().assert_code(0);
    assert!(
        at >= Duration::from_secs(2),
        "the waiter ran {at:?} into a 2s hold"
    );
    // The hold ended 2 s after the first acquisition, before `first.elapsed`.
    let late = at.saturating_sub(first.elapsed + Duration::from_secs(2));
    assert!(
        late < Duration::from_secs(1),
        "the waiter ran {late:?} after the hold"
    );
}

#[test]
fn a_forced_release_lets_a_waiter_in_before_the_old_holder_notices() {
    let f = FileService::start();
    let (s, ws) = (Scratch::new(), Scratch::new());
    // Renewals every 10 s: the holder notices the loss long after the waiter runs.
    let (mut h, first) = start_holder(&f.lock_url(), "job", &s, &["--ttl", "30s"]);
    let mut w = waiter(&f, &ws);
    let forced = Instant::now();
    run(admin(&f, "release", &["--force", "job"])).assert_code(0);
    let second = parse_token(&wait_line(&ws.path("marker")));
    let took = forced.elapsed();
    w.wait().assert_code(0);
    assert!(
        took < Duration::from_secs(5),
        "the waiter ran {took:?} after the break"
    );
    assert!(second > first, "token {second} after {first}");
    // The old holder finds its file replaced at its next renewal.
    h.wait_for(Duration::from_secs(30)).assert_failure(124);
}

#[test]
fn status_never_makes_a_run_find_the_lock_busy() {
    const LOOKERS: usize = 3;
    const RUNS: usize = 50;
    // Many processes at once: run alone, so that the others' timing stays theirs.
    alone();
    let f = FileService::start();
    let stop = AtomicBool::new(false);
    let looks = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..LOOKERS {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let out = run(admin(&f, "status", &["job"]));
                    assert!(matches!(out.code, Some(0 | 1)), "status: {}", out.stderr);
                    looks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let runs: Vec<Finished> = (0..RUNS)
            .map(|_| run(lockrun_run(&f.lock_url(), "job", &[], &["true"])))
            .collect();
        stop.store(true, Ordering::Relaxed);
        for r in runs {
            r.assert_code(0);
        }
    });
    assert!(
        looks.load(Ordering::Relaxed) >= 20,
        "status ran too rarely to tell"
    );
}

#[test]
fn the_command_inherits_no_lock_file_descriptor() {
    let f = FileService::start();
    let out = run(lockrun_run(
        &f.lock_url(),
        "job",
        &[],
        &sh("ls -l /proc/$$/fd/"),
    ));
    out.assert_code(0);
    let dir = f.dir().display().to_string();
    assert!(
        !out.stdout.contains(&dir),
        "the command has a descriptor in {dir}:\n{}",
        out.stdout
    );
}

#[test]
fn the_directory_and_its_parents_are_made_private_and_lock_files_0600() {
    let f = FileService::start();
    let deep = f.root().join("a/b/locks");
    run(lockrun_run(
        &format!("file://{}", deep.display()),
        "job",
        &[],
        &["true"],
    ))
    .assert_code(0);
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for dir in ["a", "a/b", "a/b/locks"] {
        assert_eq!(mode(&f.root().join(dir)), 0o700, "{dir}");
    }
    assert_eq!(mode(&deep.join("lockrun:=job")), 0o600);
}

#[test]
fn status_and_release_of_a_missing_directory_create_nothing() {
    let f = FileService::start();
    let status = run(admin(&f, "status", &["job"]));
    status.assert_code(1);
    run(admin(&f, "release", &["--force", "job"])).assert_code(0);
    assert!(
        !f.dir().exists(),
        "status or release made the lock directory"
    );
}
