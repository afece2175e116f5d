//! lockrun's process tree as the containment tests look at it through `/proc`: a
//! process's name and children, lockrun's guard, the host pids of a PID namespace's
//! processes, and lockrun run by another program (`timeout`, `unshare`, `setpriv`).

use std::collections::HashMap;
use std::fs;
use std::process::Command;

use crate::support::{wait_until, WAIT};

/// The name of `pid` (`/proc/PID/comm`).
pub fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The children of `pid`, of all its threads.
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for t in tasks.flatten() {
        let path = t.path().join("children");
        let text = fs::read_to_string(path).unwrap_or_default();
        children.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    children
}

/// Waits until `pid` has a child and returns it (the process `timeout`, `unshare
/// --fork` or the like started).
pub fn only_child(pid: i32) -> i32 {
    let mut child = None;
    wait_until(&format!("process {pid} has a child"), WAIT, || {
        child = children_of(pid).first().copied();
        child.is_some()
    });
    child.unwrap()
}

/// lockrun's guard (its child named `lockrun-guard`), if it has one.
pub fn guard_of(lockrun: i32) -> Option<i32> {
    children_of(lockrun)
        .into_iter()
        .find(|&c| comm(c).as_deref() == Some("lockrun-guard"))
}

/// Waits for lockrun's guard and returns its pid.
pub fn wait_guard(lockrun: i32) -> i32 {
    let mut guard = None;
    wait_until(
        &format!("lockrun {lockrun} has a child named lockrun-guard"),
        WAIT,
        || {
            guard = guard_of(lockrun);
            guard.is_some()
        },
    );
    guard.unwrap()
}

/// The host pids of the processes in `init`'s PID namespace, by their pid in there
/// (the last pid of `NSpid` in `/proc/PID/status`).
pub fn pids_in_namespace_of(init: i32) -> HashMap<i32, i32> {
    let ns = |pid: i32| fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let want = ns(init).expect("the namespace's init runs");
    let mut found = HashMap::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if ns(pid).as_ref() != Some(&want) {
            continue;
        }
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let inner = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|p| p.parse().ok());
        if let Some(inner) = inner {
            found.insert(inner, pid);
        }
    }
    found
}

/// `cmd` run by `prefix` (`timeout -s KILL 3`, `unshare --pid --fork`, `setpriv ...`):
/// the same program, arguments and environment changes, stdin from /dev/null.
pub fn wrapped(prefix: &[&str], cmd: &Command) -> Command {
    let mut w = Command::new(prefix[0]);
    w.args(&prefix[1..])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => w.env(k, v),
            None => w.env_remove(k),
        };
    }
    w.stdin(std::process::Stdio::null());
    w
}

/// The directory of the cgroup (v2) `pid` is in, when lockrun made it for a job (its
/// name begins `lockrun-`).
pub fn job_cgroup_of(pid: i32) -> Option<std::path::PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let name = path.rsplit('/').next()?;
    if !name.starts_with("lockrun-") {
        return None;
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let root = left.split_whitespace().nth(3)?;
        let at = left.split_whitespace().nth(4)?;
        (right.starts_with("cgroup2 ") && root == "/").then(|| at.to_owned())
    })?;
    Some(std::path::PathBuf::from(format!("{mount}{path}")))
}
