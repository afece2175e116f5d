//! `--once-per D` (property 11 of docs/guarantees.md) on Redis, PostgreSQL, MySQL
//! (MariaDB) and `file://`: a run of a name that succeeded less than D before is not repeated (the
//! conflict status, event `skipped`, the command not started, the last success kept);
//! a failed run does not count; after D it runs again; with `--slots`, `--wait` and
//! `--hold-at-least`; judged by the backend's clock, so lockruns whose clocks are
//! minutes ahead or behind decide alike (libfaketime); on every backend (etcd by its
//! leases' clock).

use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// A backend under test: the arguments that name it (`--url`, `--pg-table`), and the
/// server kept alive while the test runs.
struct At {
    args: Vec<String>,
    _server: Box<dyn std::any::Any>,
}

impl At {
    fn redis() -> At {
        let r = RedisServer::start();
        At {
            args: vec!["--url".into(), r.url()],
            _server: Box::new(r),
        }
    }

    fn postgres() -> At {
        let t = Table::private();
        At {
            args: vec![
                "--url".into(),
                t.url.clone(),
                "--pg-table".into(),
                t.name.clone(),
            ],
            _server: Box::new(t),
        }
    }

    fn etcd() -> At {
        let e = EtcdServer::start();
        At {
            args: vec!["--url".into(), e.url()],
            _server: Box::new(e),
        }
    }

    fn zookeeper() -> At {
        let z = ZkServer::start();
        At {
            args: vec!["--url".into(), z.url()],
            _server: Box::new(z),
        }
    }

    fn mysql() -> At {
        let m = PrivateMysql::start();
        At {
            args: vec!["--url".into(), m.url()],
            _server: Box::new(m),
        }
    }

    fn file() -> At {
        let f = FileService::start();
        At {
            args: vec!["--url".into(), f.lock_url()],
            _server: Box::new(f),
        }
    }

    /// `lockrun ARGS --log-format json OPTS NAME -- sh -c SCRIPT`, with `$M` a file of
    /// `s` the script may touch to show it ran.
    fn cmd(&self, name: &str, opts: &[&str], script: &str, s: &Scratch) -> std::process::Command {
        let mut cmd = lockrun();
        cmd.args(&self.args)
            .args(["--log-format", "json"])
            .args(opts);
        cmd.arg(name).arg("--").args(sh(script));
        cmd.env("M", s.path("m"));
        cmd
    }

    /// Runs `script` under `name` with `opts`; whether the command started.
    fn run(&self, name: &str, opts: &[&str], script: &str) -> (Finished, bool) {
        let s = Scratch::new();
        let f = run(self.cmd(name, opts, &format!(r#"touch "$M"; {script}"#), &s));
        (f, s.exists("m"))
    }

    /// `status --json NAME`'s `last_run`.
    fn last_run(&self, name: &str) -> Value {
        let mut cmd = lockrun();
        cmd.arg("status").args(&self.args).args(["--json", name]);
        let f = run(cmd);
        assert!(matches!(f.code, Some(0 | 1)), "{}", f.stderr);
        let v: Value =
            serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", f.stdout));
        v["last_run"].clone()
    }
}

/// This machine's host name, as lockrun stores it.
fn host() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The one `skipped` event of `f`'s JSON log lines.
fn skipped_event(f: &Finished) -> Value {
    let events: Vec<Value> = f
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "skipped")
        .collect();
    assert_eq!(events.len(), 1, "one skipped event:\n{}", f.stderr);
    events[0].clone()
}

/// Asserts `f` was skipped with status `code`, the command not started, naming the
/// success that started at `ok_started_ms` on this host.
fn assert_skipped(f: &Finished, started: bool, code: i32, ok_started_ms: &Value) {
    f.assert_code(code);
    assert!(!started, "the command ran although skipped:\n{}", f.stderr);
    let e = skipped_event(f);
    assert_eq!(e["level"], "warn", "{e}");
    assert_eq!(e["host"], host().as_str(), "{e}");
    assert_eq!(&e["started_ms"], ok_started_ms, "{e}");
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("last succeeded at ") && msg.contains("the command was not started"),
        "{e}"
    );
}

/// A success, then runs within D: each skipped (75, or --conflict-exit-code, also
/// after waiting out a --hold-at-least), the command not started, the record and its
/// last success unchanged; a failed run then a retry that runs; after D, a run again.
fn skips_within_the_period_and_runs_after_it(at: &At) {
    let (f, started) = at.run(
        "job",
        &["--once-per", "1h", "--hold-at-least", "1s"],
        "exit 0",
    );
    f.assert_code(0);
    assert!(started);
    let before = at.last_run("job");
    let ok = before["last_ok"].clone();
    assert_eq!(ok["host"], host().as_str(), "{before}");
    assert_eq!(
        ok["started_ms"], before["started_ms"],
        "the success is this run: {before}"
    );
    // Waits out the hold, then judges: skipped.
    let (f, started) = at.run("job", &["--once-per", "1h", "--wait", "60s"], "exit 0");
    assert_skipped(&f, started, 75, &ok["started_ms"]);
    let (f, started) = at.run(
        "job",
        &["--once-per", "1h", "--conflict-exit-code", "9"],
        "exit 0",
    );
    assert_skipped(&f, started, 9, &ok["started_ms"]);
    assert_eq!(at.last_run("job"), before, "a skipped run leaves no record");
    // Without --once-per it runs (and fails): the last success stays.
    at.run("job", &[], "exit 3").0.assert_code(3);
    let after_failure = at.last_run("job");
    assert_eq!(after_failure["exit_status"], 3, "{after_failure}");
    assert_eq!(
        after_failure["last_ok"], ok,
        "a failed run keeps the last success"
    );
    let (f, started) = at.run("job", &["--once-per", "1h"], "exit 0");
    assert_skipped(&f, started, 75, &ok["started_ms"]);

    // A failed run does not count: the next one runs, then its success does.
    let (f, started) = at.run("retry", &["--once-per", "1h"], "exit 3");
    f.assert_code(3);
    assert!(started);
    assert!(at.last_run("retry")["last_ok"].is_null());
    let (f, started) = at.run("retry", &["--once-per", "1h"], "exit 0");
    f.assert_code(0);
    assert!(
        started,
        "a failed run must not block the retry:\n{}",
        f.stderr
    );
    let ok = at.last_run("retry")["last_ok"]["started_ms"].clone();
    let (f, started) = at.run("retry", &["--once-per", "1h"], "exit 0");
    assert_skipped(&f, started, 75, &ok);

    // After D, it runs again.
    at.run("period", &["--once-per", "2s"], "exit 0")
        .0
        .assert_code(0);
    let (f, started) = at.run("period", &["--once-per", "1h"], "exit 0");
    f.assert_code(75);
    assert!(!started);
    std::thread::sleep(Duration::from_millis(2200));
    let (f, started) = at.run("period", &["--once-per", "2s"], "exit 0");
    f.assert_code(0);
    assert!(
        started,
        "2 s after the success, --once-per 2s runs:\n{}",
        f.stderr
    );
}

#[test]
fn redis_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::redis());
}

#[test]
fn postgres_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::postgres());
}

#[test]
fn mysql_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::mysql());
}

#[test]
fn file_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::file());
}

#[test]
fn etcd_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::etcd());
}

#[test]
fn zookeeper_skips_within_the_period_and_runs_after_it() {
    skips_within_the_period_and_runs_after_it(&At::zookeeper());
}

/// `lockrun` on a wall clock `offset` seconds from the real one (libfaketime; its own
/// timestamp file, as [`FakeClock`] writes one, but behind as well as ahead).
fn skewed(
    mut cmd: std::process::Command,
    clock: &FakeClock,
    offset: i64,
    s: &Scratch,
) -> std::process::Command {
    let file = s.path("timestamp");
    std::fs::write(&file, format!("{offset:+}.000000\n")).unwrap();
    for (k, v) in clock.env() {
        cmd.env(k, v);
    }
    cmd.env("FAKETIME_TIMESTAMP_FILE", file);
    cmd
}

/// A lockrun whose clock is 10 minutes ahead still skips within `--once-per 5m`; one
/// 10 minutes behind still runs once `--once-per 2s` has passed: the period is the
/// backend's clock's.
fn a_skewed_clock_decides_alike(at: &At) {
    let clock = FakeClock::new();
    // With --once-per, as etcd measures the period by the lease such a run grants.
    at.run("ahead", &["--once-per", "1s"], "exit 0")
        .0
        .assert_code(0);
    let ok = at.last_run("ahead")["last_ok"]["started_ms"].clone();
    let s = Scratch::new();
    let cmd = at.cmd("ahead", &["--once-per", "5m"], r#"touch "$M""#, &s);
    let f = run(skewed(cmd, &clock, 600, &s));
    assert_skipped(&f, s.exists("m"), 75, &ok);

    at.run("behind", &["--once-per", "1s"], "exit 0")
        .0
        .assert_code(0);
    std::thread::sleep(Duration::from_millis(2200));
    let s = Scratch::new();
    let cmd = at.cmd("behind", &["--once-per", "2s"], r#"touch "$M""#, &s);
    let f = run(skewed(cmd, &clock, -600, &s));
    f.assert_code(0);
    assert!(
        s.exists("m"),
        "a clock 10 minutes behind must not skip:\n{}",
        f.stderr
    );
}

#[test]
fn redis_a_skewed_clock_decides_alike() {
    a_skewed_clock_decides_alike(&At::redis());
}

#[test]
fn mysql_a_skewed_clock_decides_alike() {
    a_skewed_clock_decides_alike(&At::mysql());
}

#[test]
fn postgres_a_skewed_clock_decides_alike() {
    a_skewed_clock_decides_alike(&At::postgres());
}

#[test]
fn etcd_a_skewed_clock_decides_alike() {
    a_skewed_clock_decides_alike(&At::etcd());
}

#[test]
fn zookeeper_a_skewed_clock_decides_alike() {
    a_skewed_clock_decides_alike(&At::zookeeper());
}

/// With `--slots 2`: a run that holds a slot since before ours, within D, may still
/// succeed: ours is skipped; once it has failed, the next one runs.
#[test]
fn with_slots_a_run_still_holding_a_slot_counts_until_it_fails() {
    let f = FileService::start();
    let s = Scratch::new();
    let opts = ["--slots", "2", "--once-per", "1h"];
    let (mut first, _) = start_holder(&f.lock_url(), "job", &s, &opts);
    let at = At {
        args: vec!["--url".into(), f.lock_url()],
        _server: Box::new(()),
    };
    let (busy, started) = at.run("job", &opts, "exit 0");
    busy.assert_code(75);
    assert!(!started);
    let e = skipped_event(&busy);
    assert!(
        e["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("still holding a slot"),
        "{e}"
    );
    assert_eq!(e["running"], true, "{e}");
    // The first ends failing (TERM, forwarded to its command: 143): the next run goes
    // ahead.
    first.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(first.wait().code, Some(143));
    let (ran, started) = at.run("job", &opts, "exit 0");
    ran.assert_code(0);
    assert!(started, "{}", ran.stderr);
}

/// A run that waits (`--wait`) while another holds the lock judges once it holds it:
/// the other's success, which came while it waited, skips it; its failure would not.
fn judged_after_the_wait(at: &At, url: &str) {
    for (exit, code, runs) in [("0", 75, false), ("3", 0, true)] {
        let name = format!("wait{exit}");
        let s = Scratch::new();
        let script = format!(r#"{HOLD}; exit {exit}"#);
        let opts = ["--once-per", "1h"];
        let (mut first, _) = hold(lockrun_run(url, &name, &opts, &sh(&script)), &s);
        let w = Scratch::new();
        let mut waiter = spawn(at.cmd(
            &name,
            &["--once-per", "1h", "--wait", "60s", "-v"],
            r#"touch "$M""#,
            &w,
        ));
        // The waiter has found the lock busy before the first run ends.
        while !waiter.stderr_so_far().contains("\"event\":\"waiting\"") {
            assert!(waiter.is_running(), "the waiter ended before waiting");
            std::thread::sleep(Duration::from_millis(20));
        }
        s.touch("go");
        first.wait().assert_code(exit.parse().unwrap());
        let f = waiter.wait();
        f.assert_code(code);
        assert_eq!(w.exists("m"), runs, "after exit {exit}:\n{}", f.stderr);
    }
}

#[test]
fn redis_judges_after_the_wait() {
    let r = RedisServer::start();
    let url = r.url();
    let at = At {
        args: vec!["--url".into(), url.clone()],
        _server: Box::new(r),
    };
    judged_after_the_wait(&at, &url);
}

#[test]
fn etcd_judges_after_the_wait() {
    let at = At::etcd();
    let url = at.args[1].clone();
    judged_after_the_wait(&at, &url);
}

#[test]
fn zookeeper_judges_after_the_wait() {
    let at = At::zookeeper();
    let url = at.args[1].clone();
    judged_after_the_wait(&at, &url);
}

#[test]
fn file_judges_after_the_wait() {
    let f = FileService::start();
    let url = f.lock_url();
    let at = At {
        args: vec!["--url".into(), url.clone()],
        _server: Box::new(f),
    };
    judged_after_the_wait(&at, &url);
}
