//! The record of a lock's last run on `file://` (README's "What ran where"): a file of
//! its own beside the lock file (`P@NAME` beside `P=NAME`), written by the release
//! before the lock is let go of, shown by `status` whether the lock is held or free;
//! made 0600, never through a symlink, refused by `status` when it is another user's
//! or others may use it (a run is never stopped by it, nor writes such a file).

use std::fs;
use std::os::unix::fs::{chown, symlink, PermissionsExt};

use serde_json::Value;

use super::admin;
use crate::support::*;

/// A user other than the tests' (root).
const NOBODY: u32 = 65534;

/// Runs `script` under lock `name` at `f` with `opts`; returns how it ended and the
/// fencing token its command saw.
fn run_recorded(f: &FileService, name: &str, opts: &[&str], script: &str) -> (Finished, u64) {
    let s = Scratch::new();
    let script = format!(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT"; {script}"#);
    let mut cmd = lockrun_run(&f.lock_url(), name, opts, &sh(&script));
    cmd.env("OUT", s.path("out"));
    let done = run(cmd);
    let token = s.read("out").trim().parse();
    (done, token.expect("the command wrote its token"))
}

/// `lockrun status --json NAME` at `f` with `opts`.
fn status_json(f: &FileService, name: &str, opts: &[&str]) -> Value {
    let args = [opts, &["--json", name]].concat();
    let done = run(admin(f, "status", &args));
    assert!(matches!(done.code, Some(0 | 1)), "{}", done.stderr);
    serde_json::from_str(done.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", done.stdout))
}

/// Checks `last_run` against what the run itself saw.
fn assert_last_run(v: &Value, token: u64, exit: u64, ended_by: &str) {
    let last = &v["last_run"];
    assert_eq!(last["fencing_token"], token, "{v}");
    assert_eq!(last["exit_status"], exit, "{v}");
    assert_eq!(last["ended_by"], ended_by, "{v}");
    let host = nix::unistd::gethostname().unwrap();
    assert_eq!(last["host"], host.to_string_lossy().as_ref(), "{v}");
    assert!(last["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
    let (started, ended) = (last["started_ms"].as_u64(), last["ended_ms"].as_u64());
    assert!(started.is_some_and(|s| s > 0) && started <= ended, "{v}");
    for key in ["started", "ended"] {
        let time = last[key].as_str();
        assert!(time.is_some_and(|t| t.ends_with('Z')), "{key}: {v}");
    }
}

/// The record file of `name` (default prefix) at `f`.
fn record_file(f: &FileService, name: &str) -> std::path::PathBuf {
    f.dir().join(format!("lockrun:@{}", name.replace('/', "+")))
}

#[test]
fn status_shows_how_the_last_run_ended_held_or_free() {
    let f = FileService::start();
    assert!(
        status_json(&f, "job", &[])["last_run"].is_null(),
        "no run yet"
    );
    let (done, token) = run_recorded(&f, "job", &[], "exit 0");
    done.assert_code(0);
    assert_last_run(&status_json(&f, "job", &[]), token, 0, "exited");
    let (done, token) = run_recorded(&f, "job", &[], "exit 3");
    done.assert_code(3);
    assert_last_run(&status_json(&f, "job", &[]), token, 3, "exited");
    let (done, token) = run_recorded(&f, "job", &["--max-runtime", "300ms"], "sleep 30");
    done.assert_code(124);
    let v = status_json(&f, "job", &[]);
    assert_last_run(&v, token, 124, "max_runtime");
    assert_eq!(v["held"], false);
    // Held: the holder, and the run that ended and keeps it (--hold-at-least).
    let (done, kept) = run_recorded(&f, "job", &["--hold-at-least", "30s"], "exit 0");
    done.assert_code(0);
    let v = status_json(&f, "job", &[]);
    assert_eq!(v["held"], true, "{v}");
    assert_last_run(&v, kept, 0, "exited");
    // A busy run, and one that gave up waiting, leave the record alone.
    run(lockrun_run(&f.lock_url(), "job", &[], &["true"])).assert_code(75);
    run(lockrun_run(
        &f.lock_url(),
        "job",
        &["--wait", "300ms"],
        &["true"],
    ))
    .assert_code(75);
    assert_last_run(&status_json(&f, "job", &[]), kept, 0, "exited");
    let done = run(admin(&f, "status", &["job"]));
    let line = done.stdout.lines().nth(1).unwrap_or_default().to_owned();
    assert!(
        line.starts_with("  last run: ") && line.ends_with("exit status 0 (exited)"),
        "{}",
        done.stdout
    );
    // A file of its own beside the lock file, private.
    let meta = fs::symlink_metadata(record_file(&f, "job")).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
}

/// The record is written before the lock is let go of: a waiter that takes the lock
/// at the release already finds the run before it recorded.
#[test]
fn the_next_holder_finds_the_record_of_the_run_before_it() {
    let f = FileService::start();
    let s = Scratch::new();
    let mut holder = lockrun_run(&f.lock_url(), "job", &[], &sh(&hold()));
    holder
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut holder = spawn(holder);
    let token: u64 = wait_line(&s.path("started")).trim().parse().unwrap();
    let status = format!(
        r#""$LOCKRUN" status --url "{}" --json job > "$SEEN""#,
        f.lock_url()
    );
    let mut next = lockrun_run(&f.lock_url(), "job", &["--wait", "60s"], &sh(&status));
    next.env("LOCKRUN", lockrun_binary())
        .env("SEEN", s.path("seen"));
    let mut next = spawn(next);
    std::thread::sleep(std::time::Duration::from_millis(300));
    s.touch("go");
    holder.wait().assert_code(0);
    next.wait().assert_code(0);
    let seen: Value = serde_json::from_str(s.read("seen").trim()).unwrap();
    assert_eq!(seen["held"], true, "{seen}");
    assert_last_run(&seen, token, 0, "exited");
}

#[test]
fn a_semaphore_keeps_the_run_that_ended_last_with_its_slot() {
    let f = FileService::start();
    let slots = ["--slots", "3"];
    let s = Scratch::new();
    let mut first = lockrun_run(&f.lock_url(), "job", &slots, &sh(&hold()));
    first
        .env("STARTED", s.path("started"))
        .env("GO", s.path("go"));
    let mut first = spawn(first);
    let first_token: u64 = wait_line(&s.path("started")).trim().parse().unwrap();
    let (done, token) = run_recorded(&f, "job", &slots, "exit 5");
    done.assert_code(5);
    let v = status_json(&f, "job", &slots);
    assert_last_run(&v, token, 5, "exited");
    assert_eq!(
        (v["last_run"]["slot"].clone(), v["held"].clone()),
        (1.into(), true.into())
    );
    s.touch("go");
    first.wait().assert_code(0);
    let v = status_json(&f, "job", &slots);
    assert_last_run(&v, first_token, 0, "exited");
    assert_eq!(v["last_run"]["slot"], 0, "{v}");
    let kept = [&slots[..], &["--hold-at-least", "30s"]].concat();
    let (done, token) = run_recorded(&f, "job", &kept, "exit 4");
    done.assert_code(4);
    let v = status_json(&f, "job", &slots);
    assert_last_run(&v, token, 4, "exited");
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(1), "{v}");
}

/// With the longest prefix and name, the lock file's name takes all 255 bytes of a
/// file name: the record's does too, and works.
#[test]
fn the_longest_lock_file_name_has_its_record() {
    let f = FileService::start();
    let (prefix, name) = ("p".repeat(54), "n".repeat(200));
    let opts = ["--key-prefix", prefix.as_str()];
    let (done, token) = run_recorded(&f, &name, &opts, "exit 7");
    done.assert_code(7);
    assert_last_run(&status_json(&f, &name, &opts), token, 7, "exited");
    let record = f.dir().join(format!("{prefix}@{name}"));
    assert_eq!(record.file_name().unwrap().len(), 255);
    assert!(record.is_file());
}

/// A record file that is a symlink, another user's, or one others may use: `status`
/// refuses it in one line (125) saying what to do; runs go on (exit as their command)
/// and leave it, and a symlink's target, as they are.
#[test]
fn an_unsafe_record_file_is_refused_by_status_and_left_alone_by_runs() {
    let f = FileService::start();
    run_recorded(&f, "job", &[], "exit 0").0.assert_code(0);
    let record = record_file(&f, "job");
    let before = fs::read_to_string(&record).unwrap();
    let refused = |says: &str| {
        let done = run(admin(&f, "status", &["job"]));
        done.assert_failure(125);
        let line = done.lockrun_line().unwrap_or_default();
        assert!(
            line.contains("run record file") && line.contains(says),
            "{line}"
        );
        run(lockrun_run(&f.lock_url(), "job", &[], &sh("exit 2"))).assert_code(2);
    };
    fs::set_permissions(&record, fs::Permissions::from_mode(0o644)).unwrap();
    refused("chmod 600");
    fs::set_permissions(&record, fs::Permissions::from_mode(0o600)).unwrap();
    chown(&record, Some(NOBODY), None).unwrap();
    refused("belongs to uid 65534");
    assert_eq!(fs::read_to_string(&record).unwrap(), before, "rewritten");
    fs::remove_file(&record).unwrap();
    let target = f.root().join("precious");
    fs::write(&target, "keep me\n").unwrap();
    symlink(&target, &record).unwrap();
    refused("symbolic link");
    assert_eq!(fs::read_to_string(&target).unwrap(), "keep me\n");
    // Gone: the next run writes it anew.
    fs::remove_file(&record).unwrap();
    let (done, token) = run_recorded(&f, "job", &[], "exit 0");
    done.assert_code(0);
    assert_last_run(&status_json(&f, "job", &[]), token, 0, "exited");
}

/// A command that writes its fencing token to `$STARTED`, then runs until `$GO`
/// exists.
fn hold() -> String {
    r#"echo "$LOCKRUN_FENCING_TOKEN" > "$STARTED"; while [ ! -e "$GO" ]; do sleep 0.02; done"#
        .to_owned()
}
