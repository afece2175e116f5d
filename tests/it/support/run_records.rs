//! The record of a lock's last run as the tests see it: a run whose command writes its
//! fencing token, `lockrun status` (text and `--json`), and the check of `last_run`
//! against what the run itself saw.

use std::process::Command;

use serde_json::Value;

use super::{hostname, lockrun, run, Finished, Scratch};

/// Runs `cmd`, a `lockrun run ... -- sh -c SCRIPT` made with [`recording`], to its end;
/// how it ended and the fencing token its command saw.
pub fn run_recorded(mut cmd: Command, s: &Scratch) -> (Finished, u64) {
    cmd.env("OUT", s.path("out"));
    let f = run(cmd);
    let token = s
        .read("out")
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("the command wrote no token ({e}): {}", f.stderr));
    (f, token)
}

/// The script for [`run_recorded`]: writes the fencing token to `$OUT`, then `script`.
pub fn recording(script: &str) -> String {
    format!(r#"echo "$LOCKRUN_FENCING_TOKEN" > "$OUT"; {script}"#)
}

/// `lockrun status ARGS` (the URL and options, then the name), as it printed it; it
/// must exit 0 (held) or 1 (free).
fn status(args: &[&str]) -> Finished {
    let mut cmd = lockrun();
    cmd.arg("status").args(args);
    let f = run(cmd);
    assert!(matches!(f.code, Some(0 | 1)), "status failed: {}", f.stderr);
    f
}

/// `lockrun status --json ARGS`, parsed.
pub fn status_json(args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend(args);
    let f = status(&all);
    serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", f.stdout))
}

/// The `  last run: ...` line of `lockrun status ARGS` (empty when there is none).
pub fn last_run_line(args: &[&str]) -> String {
    let f = status(args);
    let line = f.stdout.lines().find(|l| l.starts_with("  last run: "));
    line.unwrap_or_default().to_owned()
}

/// Checks `last_run` of status JSON `v` against a run of this host that held fencing
/// token `token` and ended with `exit` for reason `ended_by`.
pub fn assert_last_run(v: &Value, token: u64, exit: u64, ended_by: &str) {
    let last = &v["last_run"];
    assert_eq!(last["fencing_token"], token, "{v}");
    assert_eq!(last["exit_status"], exit, "{v}");
    assert_eq!(last["ended_by"], ended_by, "{v}");
    assert_eq!(last["host"], hostname(), "{v}");
    assert!(last["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
    let (started, ended) = (last["started_ms"].as_u64(), last["ended_ms"].as_u64());
    assert!(
        started.is_some_and(|s| s > 0) && started <= ended,
        "start and end: {v}"
    );
    for key in ["started", "ended"] {
        assert!(
            last[key].as_str().is_some_and(|t| t.ends_with('Z')),
            "{key}: {v}"
        );
    }
}
