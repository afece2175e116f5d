//! The job of a run as the containment tests see it (docs/guarantees.md, property 10,
//! issue 25): shapes of job that leave the command's process group the ways real jobs do,
//! each process recording its own pid (as process-wrap's `multiproc_helper` does: a
//! process proves it exists by printing its pid); the processes of a job, told apart from
//! a later process that got the same pid by their start time; watching them die; and the
//! next holder's check, a command run under the same lock that writes down which
//! processes of the earlier job are still alive as it starts.

mod next;
mod tree;

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

pub use next::*;
pub use tree::*;

use super::{sh, wait_until, Reaper, Scratch, WAIT};

/// How long after lockrun's death (or the guard's) the last process of its job may be
/// seen alive. docs/guarantees.md says 100 ms; the bound is for a loaded 2-core machine, and the
/// figure measured is in every failure message.
pub const CONTAINED_WITHIN: Duration = Duration::from_secs(1);

/// A process that records its pid in `$JOB_PIDS` and sleeps (a minute).
const SLEEPER: &str = r#"echo $$ >> "$JOB_PIDS"; exec sleep 60"#;

/// The same, ignoring SIGTERM (an ignored signal stays ignored across exec).
const IGNORER: &str = r#"trap '' TERM; echo $$ >> "$JOB_PIDS"; exec sleep 60"#;

/// How a job's processes get away from the command's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A background child, in the command's group.
    Background,
    /// A child that started a session of its own (`setsid`).
    Setsid,
    /// GNU `timeout` (a `setpgid` into a group of its own) and its child.
    Setpgid,
    /// An orphan of a double fork (`(sleep 60 &)`): re-parented to the subreaper.
    DoubleFork,
    /// The command and a child both ignoring SIGTERM.
    IgnoresTerm,
    /// A tree of 50 processes: the command, 7 children, 6 grandchildren each.
    Tree,
    /// All but the tree in one job: a background child, one in a session of its own,
    /// GNU `timeout` and its child, an orphan of a double fork, a TERM-ignoring child in
    /// a session of its own, and the command ignoring TERM once they run.
    All,
}

impl Shape {
    /// Every shape but [`Shape::All`], for tables of cases.
    pub const EVERY: [Shape; 6] = [
        Shape::Background,
        Shape::Setsid,
        Shape::Setpgid,
        Shape::DoubleFork,
        Shape::IgnoresTerm,
        Shape::Tree,
    ];

    /// Its name in failure messages.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Background => "background child",
            Shape::Setsid => "setsid",
            Shape::Setpgid => "setpgid (GNU timeout)",
            Shape::DoubleFork => "double fork",
            Shape::IgnoresTerm => "ignores TERM",
            Shape::Tree => "tree of 50",
            Shape::All => "all shapes",
        }
    }

    /// What the command starts (in sh, after recording its own pid), and how many
    /// processes record a pid, the command included.
    fn body(self) -> (&'static str, usize) {
        match self {
            Shape::Background => (r#"sh -c "$JOB_SLEEPER" &"#, 2),
            Shape::Setsid => (r#"setsid sh -c "$JOB_SLEEPER" &"#, 2),
            Shape::Setpgid => (
                r#"sh -c 'echo $$ >> "$JOB_PIDS"; exec timeout 60 sh -c "$JOB_SLEEPER"' &"#,
                3,
            ),
            Shape::DoubleFork => (r#"(sh -c "$JOB_SLEEPER" &)"#, 2),
            Shape::IgnoresTerm => (r#"trap '' TERM; sh -c "$JOB_IGNORER" &"#, 2),
            Shape::Tree => (
                r#"for i in 1 2 3 4 5 6 7; do
                     sh -c 'echo $$ >> "$JOB_PIDS"
                            for j in 1 2 3 4 5 6; do sh -c "$JOB_SLEEPER" & done
                            exec sleep 60' &
                   done"#,
                50,
            ),
            Shape::All => (
                r#"sh -c "$JOB_SLEEPER" &
                   setsid sh -c "$JOB_SLEEPER" &
                   sh -c 'echo $$ >> "$JOB_PIDS"; exec timeout 60 sh -c "$JOB_SLEEPER"' &
                   (sh -c "$JOB_SLEEPER" &)
                   setsid sh -c "$JOB_IGNORER" &
                   trap '' TERM"#,
                7,
            ),
        }
    }
}

/// A job of some shape for one lockrun: its command, and the file its processes
/// record their pids in.
pub struct Job {
    /// The shape.
    pub shape: Shape,
    pids: PathBuf,
    script: String,
}

impl Job {
    /// A job of `shape` whose command, once every process recorded its pid, sleeps a
    /// minute (it ends only when killed); pids go to a file in `s` named after `tag`.
    pub fn new(shape: Shape, s: &Scratch, tag: &str) -> Job {
        Job::ending(shape, s, tag, "exec sleep 60")
    }

    /// The same, with the command ending by `end` (`exit 5`, say) instead of sleeping.
    pub fn ending(shape: Shape, s: &Scratch, tag: &str, end: &str) -> Job {
        let (body, n) = shape.body();
        let script = format!(
            "echo $$ >> \"$JOB_PIDS\"\n{body}\nwhile [ \"$(wc -l < \"$JOB_PIDS\")\" -lt {n} ]; \
             do sleep 0.01; done\n{end}\n"
        );
        Job {
            shape,
            pids: s.path(&format!("{tag}.pids")),
            script,
        }
    }

    /// How many processes of the job record a pid.
    pub fn processes(&self) -> usize {
        self.shape.body().1
    }

    /// The command: `sh -c SCRIPT`.
    pub fn command(&self) -> Vec<&str> {
        sh(&self.script)
    }

    /// Gives `cmd` (lockrun, or what wraps it) the variables the job needs.
    pub fn env(&self, cmd: &mut Command) {
        cmd.env("JOB_PIDS", &self.pids)
            .env("JOB_SLEEPER", SLEEPER)
            .env("JOB_IGNORER", IGNORER);
    }

    /// The pids recorded so far (as the job sees them: inside a PID namespace, its own).
    pub fn recorded(&self) -> Vec<i32> {
        let text = fs::read_to_string(&self.pids).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    }

    /// Waits until every process of the job recorded its pid, and returns the pids.
    pub fn wait_recorded(&self) -> Vec<i32> {
        let n = self.processes();
        wait_until(
            &format!(
                "the {} job's {n} processes recorded their pids",
                self.shape.name()
            ),
            WAIT,
            || self.recorded().len() >= n,
        );
        self.recorded()
    }

    /// Waits until every process of the job runs, and returns them, registered with
    /// `reaper` (and the groups they lead) in case they outlive the test.
    pub fn wait_started(&self, reaper: &Reaper) -> Vec<Proc> {
        let procs = procs_of(&self.wait_recorded())
            .unwrap_or_else(|pid| panic!("process {pid} of the job died before the test"));
        for p in &procs {
            reaper.add(p.pid);
        }
        procs
    }
}

/// One process of a job: its pid and its start time (field 22 of `/proc/PID/stat`), so
/// that a later process given the same pid is not taken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// Its pid (in the test's PID namespace).
    pub pid: i32,
    /// Its start time, in clock ticks after boot.
    pub start: u64,
}

impl Proc {
    /// True while it exists and is not a zombie.
    pub fn alive(&self) -> bool {
        matches!(stat_of(self.pid), Some((state, start)) if start == self.start
            && !matches!(state, 'Z' | 'X'))
    }
}

/// The state letter and the start time of `pid`.
fn stat_of(pid: i32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(19)?.parse().ok()?))
}

/// The processes of `pids`, or the first of them that is no longer alive.
pub fn procs_of(pids: &[i32]) -> Result<Vec<Proc>, i32> {
    pids.iter()
        .map(|&pid| match stat_of(pid) {
            Some((state, start)) if !matches!(state, 'Z' | 'X') => Ok(Proc { pid, start }),
            _ => Err(pid),
        })
        .collect()
}

/// How the processes of a job died, watched from an instant the test observed.
#[derive(Debug)]
pub struct Deaths {
    /// From that instant to the moment the last of them was seen dead (zero if all
    /// were dead at the first look).
    pub last: Duration,
    /// Those still alive when the watch gave up.
    pub alive: Vec<i32>,
}

impl Deaths {
    /// Panics unless every process died, the last within `bound` of the instant;
    /// `what` names the case.
    pub fn assert_within(&self, bound: Duration, what: &str) {
        assert!(
            self.alive.is_empty(),
            "{what}: processes of the job still alive {:?} later: {:?}",
            self.last,
            self.alive
        );
        assert!(
            self.last < bound,
            "{what}: the last process of the job died {:?} after the instant observed \
             (bound {bound:?})",
            self.last
        );
    }
}

/// Watches `procs` from `since` until all are dead or `timeout` has passed.
pub fn watch_deaths(procs: &[Proc], since: Instant, timeout: Duration) -> Deaths {
    let mut alive: Vec<Proc> = procs.to_vec();
    let mut last = Duration::ZERO;
    loop {
        alive.retain(|p| p.alive());
        let now = Instant::now();
        if alive.is_empty() {
            return Deaths {
                last,
                alive: Vec::new(),
            };
        }
        last = now.saturating_duration_since(since);
        if last > timeout {
            return Deaths {
                last,
                alive: alive.iter().map(|p| p.pid).collect(),
            };
        }
        thread::sleep(Duration::from_millis(1));
    }
}
