//! The operations surface (docs/operations.md): the metrics file is valid Prometheus text
//! format after every outcome, JSON log lines carry the fields operators watch (wait time,
//! hold time, token, exit status, reason of a loss), and lockrun's lines never mix with the
//! command's own output.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::*;
use serde_json::Value;

/// The six gauges docs/operations.md names.
const GAUGES: [&str; 6] = [
    "lockrun_last_run_timestamp_seconds",
    "lockrun_last_success_timestamp_seconds",
    "lockrun_acquire_wait_seconds",
    "lockrun_hold_seconds",
    "lockrun_exit_code",
    "lockrun_outcome",
];

/// True for a well-formed metric or label name.
fn name_ok(n: &str) -> bool {
    n.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Checks `path` against the text exposition format, strictly: every line is a HELP, a
/// TYPE or a sample; every sample's family has HELP and TYPE gauge before it; names and
/// labels are well-formed; values parse. Then parses it with the prometheus-parse crate
/// and checks that it saw every sample as a gauge. Returns name{labels} → value.
fn check_exposition(path: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.ends_with('\n'),
        "the file must end with a newline:\n{text}"
    );
    let mut helped = BTreeSet::new();
    let mut typed = BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has a text");
            assert!(name_ok(name) && !help.is_empty(), "bad HELP line {line:?}");
            helped.insert(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
            assert_eq!(kind, "gauge", "{line:?}");
            assert!(helped.contains(name), "TYPE before HELP for {name}");
            assert!(typed.insert(name.to_owned()), "{name} typed twice");
        } else {
            let (series, value) = check_sample(line, &typed);
            assert!(
                samples.insert(series.to_owned(), value).is_none(),
                "duplicate series {series}"
            );
        }
    }
    let gauges: BTreeSet<String> = GAUGES.iter().map(|g| g.to_string()).collect();
    assert_eq!(typed, gauges);
    check_with_prometheus_parse(&text, samples.len());
    samples
}

/// Checks one sample line (its family already `typed`); returns its series and value.
fn check_sample<'a>(line: &'a str, typed: &BTreeSet<String>) -> (&'a str, f64) {
    let (series, value) = line
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("bad line {line:?}"));
    let value: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("bad value in {line:?}"));
    let (name, labels) = series
        .split_once('{')
        .unwrap_or_else(|| panic!("no labels in {line:?}"));
    assert!(name_ok(name), "bad metric name in {line:?}");
    assert!(typed.contains(name), "sample before its TYPE: {line:?}");
    let labels = labels
        .strip_suffix('}')
        .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
    for pair in labels.split(',') {
        let (k, v) = pair
            .split_once('=')
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        assert!(
            name_ok(k) && v.starts_with('"') && v.ends_with('"') && v.len() >= 2,
            "bad label {pair:?}"
        );
    }
    assert!(
        labels.starts_with("lock=\""),
        "every sample is labelled with the lock: {line:?}"
    );
    (series, value)
}

/// The prometheus-parse crate reads `text` as `samples` gauges, each with a lock label.
fn check_with_prometheus_parse(text: &str, samples: usize) {
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("prometheus-parse reads it");
    assert_eq!(
        scrape.samples.len(),
        samples,
        "prometheus-parse saw every sample"
    );
    for s in &scrape.samples {
        assert!(
            matches!(s.value, prometheus_parse::Value::Gauge(_)),
            "{} is not a gauge",
            s.metric
        );
        assert!(
            s.labels.get("lock").is_some(),
            "{} has no lock label",
            s.metric
        );
    }
}

fn outcome_of(samples: &BTreeMap<String, f64>, lock: &str) -> String {
    let ones: Vec<&String> = samples
        .iter()
        .filter(|(k, v)| k.starts_with(&format!("lockrun_outcome{{lock=\"{lock}\"")) && **v == 1.0)
        .map(|(k, _)| k)
        .collect();
    assert_eq!(ones.len(), 1, "exactly one outcome is 1: {samples:?}");
    ones[0]
        .rsplit("outcome=\"")
        .next()
        .unwrap()
        .trim_end_matches("\"}")
        .to_owned()
}

#[test]
fn metrics_file_is_valid_exposition_format_after_every_outcome() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let file = s.path("job.prom");
    let metrics = ["--metrics-file", file.to_str().unwrap()];

    // ran
    run(lockrun_run(&redis.url(), "job", &metrics, &["true"])).assert_code(0);
    assert_eq!(outcome_of(&check_exposition(&file), "job"), "ran");

    // busy
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    run(lockrun_run(&redis.url(), "job", &metrics, &["true"])).assert_code(75);
    let m = check_exposition(&file);
    assert_eq!(outcome_of(&m, "job"), "busy");
    assert_eq!(m["lockrun_hold_seconds{lock=\"job\"}"], 0.0);
    s.touch("go");
    holder.wait().assert_code(0);

    // lost
    let mut lost = lockrun_run(
        &redis.url(),
        "job",
        &[&metrics[..], &["--ttl", "30s", "--renew-every", "300ms"]].concat(),
        &sh(SLEEPER),
    );
    lost.env("PIDFILE", s.path("pid"));
    let mut lost = spawn(lost);
    wait_pid(&s.path("pid"));
    redis.flushall();
    lost.wait().assert_failure(124);
    let m = check_exposition(&file);
    assert_eq!(outcome_of(&m, "job"), "lost");
    assert_eq!(m["lockrun_exit_code{lock=\"job\"}"], 124.0);
    assert!(m["lockrun_hold_seconds{lock=\"job\"}"] > 0.0);

    // error (unreachable backend)
    let closed = format!("redis://127.0.0.1:{}", closed_port());
    run(lockrun_run(&closed, "job", &metrics, &["true"])).assert_failure(125);
    let m = check_exposition(&file);
    assert_eq!(outcome_of(&m, "job"), "error");
    assert_eq!(m["lockrun_exit_code{lock=\"job\"}"], 125.0);
    assert!(
        m["lockrun_last_success_timestamp_seconds{lock=\"job\"}"] > 0.0,
        "carried over"
    );
}

/// Parses every stderr line as one JSON object with the keys every line must have.
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            for key in ["ts", "level", "event", "lock", "msg"] {
                assert!(v.get(key).is_some(), "no {key:?} in {l}");
            }
            v
        })
        .collect()
}

fn event<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|v| v["event"] == name)
        .unwrap_or_else(|| panic!("no {name:?} event in {lines:#?}"))
}

#[test]
fn json_logs_of_a_normal_run_carry_token_wait_hold_and_exit_status() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--log-format", "json", "-v"],
        &sh("sleep 0.3; exit 3"),
    ));
    f.assert_code(3);
    let lines = json_lines(&f.stderr);
    let acquired = event(&lines, "acquired");
    assert!(acquired["fencing_token"].as_u64().unwrap() > 0);
    assert!(acquired["wait_ms"].is_u64());
    assert_eq!(acquired["lock"], "job");
    assert_eq!(event(&lines, "exited")["exit_code"], 3);
    let hold = event(&lines, "released")["hold_ms"].as_u64().unwrap();
    assert!(hold >= 300, "hold_ms {hold} covers the 300 ms command");
    let order: Vec<&str> = lines.iter().map(|v| v["event"].as_str().unwrap()).collect();
    let pos = |e: &str| order.iter().position(|x| *x == e).unwrap();
    assert!(
        pos("acquired") < pos("exited") && pos("exited") < pos("released"),
        "{order:?}"
    );
}

#[test]
fn json_logs_of_a_busy_run_name_the_holder_and_the_wait() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let (mut holder, _) = start_holder(&redis.url(), "job", &s, &[]);
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["--log-format", "json", "--wait", "300ms"],
        &["true"],
    ));
    f.assert_code(75);
    let lines = json_lines(&f.stderr);
    let busy = event(&lines, "busy");
    assert_eq!(busy["level"], "warn");
    assert_eq!(busy["holder_pid"].as_u64().unwrap(), holder.pid() as u64);
    assert!(busy["wait_ms"].as_u64().unwrap() >= 300, "{busy}");
    assert!(busy["fencing_token"].as_u64().unwrap() > 0);
    s.touch("go");
    holder.wait().assert_code(0);
}

#[test]
fn json_logs_of_a_lost_lock_give_the_reason() {
    let redis = RedisServer::start();
    let s = Scratch::new();
    let mut cmd = lockrun_run(
        &redis.url(),
        "job",
        &[
            "--log-format",
            "json",
            "--ttl",
            "30s",
            "--renew-every",
            "300ms",
            "--kill-after",
            "5s",
        ],
        &sh(SLEEPER),
    );
    cmd.env("PIDFILE", s.path("pid"));
    let mut lr = spawn(cmd);
    wait_pid(&s.path("pid"));
    redis.flushall();
    let f = lr.wait();
    f.assert_code(124);
    let lines = json_lines(&f.stderr);
    let killing = event(&lines, "killing");
    assert_eq!(killing["signal"], "SIGTERM");
    assert_eq!(killing["reason"], "lease_lost");
    let lost = event(&lines, "lost");
    assert_eq!(lost["level"], "error");
    assert_eq!(lost["reason"], "lease_lost");
}

#[test]
fn text_logs_stay_on_their_own_lines_beside_the_command_output() {
    let redis = RedisServer::start();
    let f = run(lockrun_run(
        &redis.url(),
        "job",
        &["-vv", "--ttl", "600ms"],
        &sh("for i in 1 2 3 4 5 6 7 8 9 10; do echo \"cmd-err $i\" >&2; echo \"cmd-out $i\"; sleep 0.05; done"),
    ));
    f.assert_code(0);
    for line in f.stderr.lines() {
        assert!(
            line.starts_with("lockrun: ") || (line.starts_with("cmd-err ") && line.len() <= 10),
            "a line mixes lockrun's output with the command's: {line:?}\n{}",
            f.stderr
        );
    }
    assert_eq!(
        f.stderr
            .lines()
            .filter(|l| l.starts_with("cmd-err "))
            .count(),
        10
    );
    assert!(
        f.stderr.contains("lockrun: lease renewed"),
        "-vv shows renewals:\n{}",
        f.stderr
    );
    assert_eq!(
        f.stdout.lines().count(),
        10,
        "stdout is the command's alone"
    );
}

/// docs/operations.md, "Waiting": an unreachable backend is retried with capped
/// exponential backoff and full jitter for the whole `--wait`, warned about once (then at
/// most once a minute), and given up with one summary line: not a "retrying" line every
/// few hundred milliseconds.
#[test]
fn an_unreachable_backend_is_retried_with_backoff_and_one_warning() {
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let s = Scratch::new();
    let opts = ["--wait", "6s", "-vv", "--log-format", "json"];
    let mut cmd = lockrun_run(&url, "job", &opts, &sh(r#"touch "$MARK""#));
    cmd.env("MARK", s.path("marker"));
    let f = run(cmd);
    f.assert_code(125);
    assert!(!s.exists("marker"), "the command ran without the lock");
    let lines = json_lines(&f.stderr);
    let failed = |v: &&Value| v["event"] == "acquire_failed";
    // Every failed attempt but the last is one acquire_failed line (debug when not warned).
    let attempts = lines.iter().filter(failed).count() + 1;
    // With jitter of 100 to 500 ms there would be about 20; with backoff about 8.
    assert!(
        (3..=14).contains(&attempts),
        "{attempts} attempts in 6s:\n{}",
        f.stderr
    );
    let shown: Vec<&Value> = lines
        .iter()
        .filter(|v| v["level"] == "warn" || v["level"] == "error")
        .collect();
    assert!(
        shown.len() <= 3 && shown.iter().filter(|v| v["level"] == "warn").count() <= 2,
        "more than two warnings and the final line at the default level:\n{shown:#?}"
    );
    let last = shown.last().expect("a final line");
    assert_eq!(last["level"], "error");
    let msg = last["msg"].as_str().unwrap();
    assert!(
        msg.contains(&format!("{attempts} attempts")) && msg.contains("refused"),
        "the final line says how many attempts and the last error: {msg}"
    );
    assert!(
        f.elapsed >= std::time::Duration::from_millis(5500)
            && f.elapsed < std::time::Duration::from_secs(10),
        "gave up after {:?}, not when --wait 6s ran out",
        f.elapsed
    );
}
