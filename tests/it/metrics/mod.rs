//! `--metrics-file`: after every run (ran, busy, lost, error) the file is replaced with
//! Prometheus text-format gauges labelled with the lock, for node_exporter's textfile
//! collector; the last success is carried over from the previous file. What a hostile
//! directory can put in the way (symlinks, a FIFO, a huge file) is in `hostile`.

mod hostile;
mod packaging;

use std::collections::HashMap;
use std::path::Path;

use crate::support::*;

/// The samples of a text-format file: "name{sorted labels}" → value.
fn samples(path: &Path) -> HashMap<String, f64> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read metrics file {}: {e}", path.display()));
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let key = match series.split_once('{') {
            Some((name, labels)) => {
                let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                labels.sort();
                format!("{name}{{{}}}", labels.join(","))
            }
            None => series.to_string(),
        };
        out.insert(key, value);
    }
    out
}

fn get(samples: &HashMap<String, f64>, key: &str) -> f64 {
    *samples
        .get(key)
        .unwrap_or_else(|| panic!("no sample {key} among {:?}", samples.keys()))
}

fn outcome(samples: &HashMap<String, f64>, which: &str) -> f64 {
    get(
        samples,
        &format!("lockrun_outcome{{lock=\"job\",outcome=\"{which}\"}}"),
    )
}

#[test]
fn metrics_file_after_a_successful_run() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("lockrun.prom");
    run(lockrun_run(
        &redis.url(),
        "job",
        &["--metrics-file", file.to_str().unwrap()],
        &["true"],
    ))
    .assert_code(0);
    let m = samples(&file);
    assert_eq!(outcome(&m, "ran"), 1.0);
    for other in ["busy", "lost", "error"] {
        assert_eq!(outcome(&m, other), 0.0, "outcome {other}");
    }
    assert_eq!(get(&m, "lockrun_exit_code{lock=\"job\"}"), 0.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for g in [
        "lockrun_last_run_timestamp_seconds",
        "lockrun_last_success_timestamp_seconds",
    ] {
        let t = get(&m, &format!("{g}{{lock=\"job\"}}"));
        assert!((now - t).abs() < 60.0, "{g} is {t}, now is {now}");
    }
    get(&m, "lockrun_acquire_wait_seconds{lock=\"job\"}");
    get(&m, "lockrun_hold_seconds{lock=\"job\"}");
    // Only the file itself is left in the directory (the temporary file was renamed).
    let names: Vec<_> = std::fs::read_dir(s.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("lockrun.prom")]);
}

#[test]
fn metrics_file_after_a_busy_run_keeps_the_last_success() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("lockrun.prom");
    let file_arg = file.to_str().unwrap().to_string();
    run(lockrun_run(
        &redis.url(),
        "job",
        &["--metrics-file", &file_arg],
        &["true"],
    ))
    .assert_code(0);
    let first = samples(&file);
    let success = get(
        &first,
        "lockrun_last_success_timestamp_seconds{lock=\"job\"}",
    );

    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    run(lockrun_run(
        &redis.url(),
        "job",
        &["--metrics-file", &file_arg],
        &["true"],
    ))
    .assert_code(75);
    s.touch("go");
    holder.wait().assert_code(0);

    let m = samples(&file);
    assert_eq!(outcome(&m, "busy"), 1.0);
    assert_eq!(outcome(&m, "ran"), 0.0);
    assert_eq!(get(&m, "lockrun_exit_code{lock=\"job\"}"), 75.0);
    assert_eq!(
        get(&m, "lockrun_last_success_timestamp_seconds{lock=\"job\"}"),
        success,
        "the last success was not carried over"
    );
}

#[test]
fn metrics_file_after_a_failed_command_and_an_error() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("lockrun.prom");
    let file_arg = file.to_str().unwrap().to_string();
    run(lockrun_run(
        &redis.url(),
        "job",
        &["--metrics-file", &file_arg],
        &sh("exit 3"),
    ))
    .assert_code(3);
    let m = samples(&file);
    assert_eq!(outcome(&m, "ran"), 1.0);
    assert_eq!(get(&m, "lockrun_exit_code{lock=\"job\"}"), 3.0);

    let closed = format!("redis://127.0.0.1:{}", closed_port());
    run(lockrun_run(
        &closed,
        "job",
        &["--metrics-file", &file_arg],
        &["true"],
    ))
    .assert_failure(125);
    let m = samples(&file);
    assert_eq!(outcome(&m, "error"), 1.0);
    assert_eq!(get(&m, "lockrun_exit_code{lock=\"job\"}"), 125.0);
}

#[test]
fn metrics_file_after_a_lost_lock() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("lockrun.prom");
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &[
            "--metrics-file",
            file.to_str().unwrap(),
            "--ttl",
            "30s",
            "--renew-every",
            "300ms",
        ],
        &sh(r#"touch "$STARTED"; exec sleep 60"#),
    );
    cmd.env("STARTED", s.path("started"));
    let mut lr = spawn(cmd);
    wait_until("the command started", WAIT, || s.exists("started"));
    redis.flushall();
    lr.wait().assert_failure(124);
    let m = samples(&file);
    assert_eq!(outcome(&m, "lost"), 1.0);
    assert_eq!(get(&m, "lockrun_exit_code{lock=\"job\"}"), 124.0);
}
