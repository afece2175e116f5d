//! `--metrics-file`: Prometheus text-format gauges for node_exporter's textfile
//! collector, rewritten atomically after every run, whatever its outcome, so the
//! collector never reads half a file. The last success is carried over from the
//! previous file when this run did not succeed. How the file is read and replaced in a
//! directory that someone else may write (no symlink followed, no FIFO waited on, no
//! more than 64 KiB read, an unpredictable temporary name) is in `file`. Depends on
//! [`crate::outcome`], [`crate::log`] (the one warning about an unusable previous
//! file) and [`crate::token`] (the temporary name).

mod file;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::log;
use crate::outcome::Outcome;

/// What one run reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunReport {
    /// How the run ended.
    pub outcome: Outcome,
    /// Time spent acquiring (waiting included).
    pub waited: Duration,
    /// Time the lock was held (zero if it was not acquired).
    pub held: Duration,
}

/// The outcomes, in the order they are written.
const OUTCOMES: [&str; 4] = ["ran", "busy", "lost", "error"];

const LAST_SUCCESS: &str = "lockrun_last_success_timestamp_seconds";

/// Escapes a label value for the text format.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The value of `lockrun_last_success_timestamp_seconds{lock="..."}` in `previous`.
fn previous_success(previous: &str, lock: &str) -> Option<f64> {
    let series = format!("{LAST_SUCCESS}{{lock=\"{}\"}}", escape(lock));
    previous
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Renders the file for lock `lock` after `report`, at time `now`, given the
/// previous file's text (empty if none). A run succeeded if the command ran and
/// exited 0.
pub fn render(lock: &str, report: &RunReport, now: SystemTime, previous: &str) -> String {
    let label = format!("lock=\"{}\"", escape(lock));
    let now_s = seconds(now);
    let success = matches!(report.outcome, Outcome::Exited(0));
    let last_success = if success {
        now_s
    } else {
        previous_success(previous, lock).unwrap_or(0.0)
    };
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, samples: &[(String, String)]| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (labels, value) in samples {
            out.push_str(&format!("{name}{{{labels}}} {value}\n"));
        }
    };
    let one = |v: String| vec![(label.clone(), v)];
    gauge(
        "lockrun_last_run_timestamp_seconds",
        "Unix time at which the last run ended.",
        &one(format!("{now_s:.3}")),
    );
    gauge(
        LAST_SUCCESS,
        "Unix time at which the command last ran and exited 0 (0: never).",
        &one(format!("{last_success:.3}")),
    );
    gauge(
        "lockrun_acquire_wait_seconds",
        "Time the last run spent acquiring the lock, waiting included.",
        &one(format!("{:.6}", report.waited.as_secs_f64())),
    );
    gauge(
        "lockrun_hold_seconds",
        "Time the last run held the lock (0 if it did not get it).",
        &one(format!("{:.6}", report.held.as_secs_f64())),
    );
    gauge(
        "lockrun_exit_code",
        "Exit status of the last run of lockrun.",
        &one(report.outcome.exit_code().to_string()),
    );
    let kind = report.outcome.kind();
    let samples: Vec<(String, String)> = OUTCOMES
        .iter()
        .map(|o| {
            (
                format!("{label},outcome=\"{o}\""),
                u8::from(*o == kind).to_string(),
            )
        })
        .collect();
    gauge(
        "lockrun_outcome",
        "1 for the outcome of the last run (ran, busy, lost, error), 0 for the others.",
        &samples,
    );
    out
}

/// Rewrites `path` atomically with the metrics of `report`. A previous file that
/// cannot be used (a symlink, a FIFO, over 64 KiB, ...) is replaced all the same,
/// after one warning; a directory at `path` is an error.
pub fn write(path: &Path, lock: &str, report: &RunReport) -> std::io::Result<()> {
    let previous = match file::read_previous(path) {
        file::Previous::Text(text) => text,
        file::Previous::Directory => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::IsADirectory,
                "it is a directory; give --metrics-file a file's path",
            ))
        }
        file::Previous::Unusable(why) => {
            let msg = format!(
                "the metrics file {} {why}: not read, so the last success starts \
                 afresh; it is replaced by a regular file",
                path.display()
            );
            log::emit(log::Level::Warn, log::Event::MetricsFailed, &msg, &[]);
            String::new()
        }
    };
    let text = render(lock, report, SystemTime::now(), &previous);
    file::replace(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcome: Outcome) -> RunReport {
        RunReport {
            outcome,
            waited: Duration::from_millis(1500),
            held: Duration::from_millis(2250),
        }
    }

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_successful_run_sets_every_gauge() {
        let text = render("job", &report(Outcome::Exited(0)), at(1000), "");
        assert!(text.contains("lockrun_last_run_timestamp_seconds{lock=\"job\"} 1000.000\n"));
        assert!(text.contains("lockrun_last_success_timestamp_seconds{lock=\"job\"} 1000.000\n"));
        assert!(text.contains("lockrun_acquire_wait_seconds{lock=\"job\"} 1.500000\n"));
        assert!(text.contains("lockrun_hold_seconds{lock=\"job\"} 2.250000\n"));
        assert!(text.contains("lockrun_exit_code{lock=\"job\"} 0\n"));
        assert!(text.contains("lockrun_outcome{lock=\"job\",outcome=\"ran\"} 1\n"));
        assert!(text.contains("lockrun_outcome{lock=\"job\",outcome=\"busy\"} 0\n"));
        assert_eq!(text.matches("# TYPE").count(), 6);
    }

    #[test]
    fn a_failed_run_carries_the_last_success_over() {
        let first = render("job", &report(Outcome::Exited(0)), at(1000), "");
        let second = render("job", &report(Outcome::Busy(75)), at(2000), &first);
        assert!(second.contains("lockrun_last_success_timestamp_seconds{lock=\"job\"} 1000.000\n"));
        assert!(second.contains("lockrun_last_run_timestamp_seconds{lock=\"job\"} 2000.000\n"));
        assert!(second.contains("lockrun_outcome{lock=\"job\",outcome=\"busy\"} 1\n"));
        assert!(second.contains("lockrun_exit_code{lock=\"job\"} 75\n"));
        let third = render("job", &report(Outcome::Exited(3)), at(3000), &second);
        assert!(third.contains("lockrun_last_success_timestamp_seconds{lock=\"job\"} 1000.000\n"));
        assert!(third.contains("lockrun_outcome{lock=\"job\",outcome=\"ran\"} 1\n"));
    }

    #[test]
    fn never_succeeded_is_zero() {
        let text = render("job", &report(Outcome::Failed), at(5), "garbage\n");
        assert!(text.contains("lockrun_last_success_timestamp_seconds{lock=\"job\"} 0.000\n"));
        assert!(text.contains("lockrun_outcome{lock=\"job\",outcome=\"error\"} 1\n"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn write_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockrun_job.prom");
        write(&path, "job", &report(Outcome::Exited(0))).unwrap();
        write(&path, "job", &report(Outcome::LockLost)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("outcome=\"lost\"} 1"));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    /// Two lockruns in one directory with the same pid (PID 1 in two pods sharing a
    /// volume) write at the same time: neither fails and the file is always whole.
    #[test]
    fn concurrent_writers_with_one_pid_never_share_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.prom");
        let whole = render("job", &report(Outcome::Exited(0)), at(1), "").len();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        write(&path, "job", &report(Outcome::Exited(0))).unwrap();
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("# TYPE").count(), 6, "{text}");
        assert!(text.len() >= whole, "{text}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
