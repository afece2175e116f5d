//! The Prometheus rules and the Grafana dashboard of packaging/: `promtool check rules`
//! and `promtool test rules` pass on them (promtool comes with Debian's `prometheus`,
//! installed by scripts/test), and every metric their expressions read is one that
//! lockrun writes with `--metrics-file` (taken from a file a real run wrote, on the
//! `file://` backend) or one that the rule files record.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// The rule files, alerts first; the test file names both.
const RULE_FILES: [&str; 2] = ["lockrun-alerts.yml", "lockrun-periods.yml"];

fn packaging(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging")
        .join(rel)
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(packaging("prometheus"))
        .output()
        .unwrap_or_else(|e| panic!("run promtool (scripts/test installs it): {e}"));
    assert!(
        out.status.success(),
        "promtool {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_the_rules_and_passes_their_tests() {
    let mut check = vec!["check", "rules"];
    check.extend(RULE_FILES);
    promtool(&check);
    promtool(&["test", "rules", "lockrun-alerts.test.yml"]);
}

/// The metric names in a file lockrun wrote after a run.
fn written_metrics() -> BTreeSet<String> {
    let files = FileService::start();
    let s = Scratch::new();
    let file = s.path("lockrun.prom");
    run(lockrun_run(
        &files.lock_url(),
        "job",
        &["--metrics-file", file.to_str().unwrap()],
        &["true"],
    ))
    .assert_code(0);
    let text = std::fs::read_to_string(&file).unwrap();
    let names: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    assert!(names.len() >= 6, "too few metrics in {text}");
    names
}

/// The `expr:` of every rule of a rules file (inline, or a `|` block), and the names the
/// file's `record:` rules define.
fn rule_exprs(yaml: &str) -> (Vec<String>, Vec<String>) {
    let (mut exprs, mut records) = (Vec::new(), Vec::new());
    let lines: Vec<&str> = yaml.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        if let Some(name) = trimmed.strip_prefix("record:") {
            records.push(name.trim().to_string());
        } else if let Some(expr) = trimmed.strip_prefix("expr:") {
            let expr = expr.trim();
            if expr == "|" || expr == "|-" || expr == ">-" || expr == ">" {
                let indent = line.len() - line.trim_start().len();
                let mut block = String::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push_str(next);
                    block.push('\n');
                    i += 1;
                }
                exprs.push(block);
            } else {
                exprs.push(expr.to_string());
            }
        }
        i += 1;
    }
    (exprs, records)
}

/// The query strings of the dashboard: panel targets' `expr` and the template
/// variables' queries.
fn dashboard_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition" | "query", serde_json::Value::String(s))
                        if s != "prometheus" =>
                    {
                        out.push(s.clone())
                    }
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// The words of PromQL and the label names the expressions may use: every other
/// identifier in them is a metric name.
const PROMQL_WORDS: &[&str] = &[
    "and",
    "bool",
    "by",
    "changes",
    "group_left",
    "ignoring",
    "label_values",
    "max",
    "on",
    "or",
    "resets",
    "sum",
    "time",
    "topk",
    "unless",
    "vector",
    "lock",
    "outcome",
    "instance",
    "h",
    "m",
    "s",
    "d",
];

/// The identifiers of a PromQL expression outside its quoted strings and Grafana's
/// `$variables`.
fn identifiers(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    let mut word = String::new();
    let mut prev = ' ';
    while let Some(c) = chars.next() {
        if c == '"' || c == '\'' {
            // Skip the string (escapes included).
            while let Some(d) = chars.next() {
                if d == '\\' {
                    chars.next();
                } else if d == c {
                    break;
                }
            }
            prev = c;
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            let first = word.chars().next().unwrap();
            if !first.is_ascii_digit() && prev != '$' && word != ":" {
                out.push(word.trim_matches(':').to_string());
            }
            word.clear();
        }
        prev = c;
    }
    if !word.is_empty() && !word.starts_with(|c: char| c.is_ascii_digit()) && prev != '$' {
        out.push(word);
    }
    out
}

#[test]
fn rules_and_dashboard_read_only_metrics_lockrun_writes() {
    let written = written_metrics();
    let mut known = written.clone();
    let mut exprs = Vec::new();
    for f in RULE_FILES {
        let text = std::fs::read_to_string(packaging(&format!("prometheus/{f}"))).unwrap();
        let (e, records) = rule_exprs(&text);
        assert!(!e.is_empty(), "no expr in {f}");
        exprs.extend(e.into_iter().map(|e| (f.to_string(), e)));
        known.extend(records);
    }
    let dashboard = std::fs::read_to_string(packaging("grafana/lockrun-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard JSON");
    let mut queries = Vec::new();
    dashboard_exprs(&dashboard, &mut queries);
    assert!(
        queries.len() >= 6,
        "too few queries in the dashboard: {queries:?}"
    );
    exprs.extend(
        queries
            .into_iter()
            .map(|q| ("lockrun-dashboard.json".to_string(), q)),
    );

    let mut used = BTreeSet::new();
    for (file, expr) in &exprs {
        for id in identifiers(expr) {
            if PROMQL_WORDS.contains(&id.as_str()) {
                continue;
            }
            assert!(
                known.contains(&id),
                "{file}: {id:?} in {expr:?} is not a metric lockrun writes nor a recorded one \
                 (known: {known:?})"
            );
            used.insert(id);
        }
    }
    // The dashboard and the alerts between them read every gauge of the file.
    for name in &written {
        assert!(
            used.contains(name),
            "{name} is read by no rule and no panel"
        );
    }
}
