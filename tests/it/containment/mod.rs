//! Containment (docs/guarantees.md, property 10, issue 25): when lockrun ends, however it
//! ends, every process descended from its command is gone, and no next holder of the lock
//! starts its command while one of them runs.
//!
//! - `kill_paths`: lockrun SIGKILLed, killed by `timeout -s KILL`, killed as the init
//!   of a PID namespace, OOM-killed, and its guard killed instead, each against every
//!   job shape of `support::job` (a background child, `setsid`, `setpgid` as GNU
//!   `timeout` does, a double fork, a process that ignores TERM, a tree of 50), on
//!   `file://` and on Redis: the job is dead soon after, and a next holder waiting on
//!   the lock finds none of it alive when its command starts;
//! - `end_paths`: the job is every descendant when lockrun itself stops it: lock loss,
//!   `--max-runtime`, the escalation after a forwarded signal (also as PID 1), and the
//!   clean-up after the command exits;
//! - `stderr`: the kill path waits on nothing: with stderr a full pipe nobody reads, a
//!   failing renewal still kills the job before the lease can have expired, and lockrun
//!   still exits;
//! - `stopped`: a stopped process never stretches the job past the lease: the guard
//!   stopped then lockrun SIGKILLed (under a subreaper parent in the same session, in and
//!   out of a PID namespace), lockrun stopped then its guard SIGKILLed, the job stopping
//!   its own guard, once or again and again, and a tracer holding the guard;
//! - `storm`: lockrun SIGKILLed during a fork storm (issue 39, case 3): no next holder
//!   beside a process of it, and none left after a generous wait;
//! - `boundary`: which boundary a run has (a cgroup of its own, or the process tree
//!   when lockrun runs unprivileged), said at `-v`.
//!
//! Waits are generous; what is about safety (no process left, no next holder beside
//! one) is strict, and the figures measured are in the failure messages.

mod boundary;
mod end_paths;
mod kill_paths;
mod stderr;
mod stopped;
mod storm;

use std::thread;

/// Runs `case` for every shape of `shapes` at once, each on its own thread, and panics
/// with every failure (not just the first) if any case failed; returns the cases'
/// figures otherwise.
fn each_shape<T: Send>(
    shapes: &[crate::support::Shape],
    case: impl Fn(crate::support::Shape, usize) -> T + Sync,
) -> Vec<T> {
    // The test's own thread joins the tests running side by side before its cases'
    // threads start lockruns (threads a test starts do not join on their own).
    drop(crate::support::lockrun());
    let results: Vec<thread::Result<T>> = thread::scope(|scope| {
        let case = &case;
        let handles: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, &shape)| scope.spawn(move || case(shape, i)))
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut figures = Vec::new();
    let mut failures = Vec::new();
    for (shape, r) in shapes.iter().zip(results) {
        match r {
            Ok(f) => figures.push(f),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "(no message)".into());
                failures.push(format!("{}: {msg}", shape.name()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} job shapes failed:\n- {}",
        failures.len(),
        shapes.len(),
        failures.join("\n- ")
    );
    figures
}
