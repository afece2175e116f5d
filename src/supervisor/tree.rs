//! The job as a process tree: every process descended from a root pid, found through
//! `/proc`, and signals sent to each of them. Part of [`super`]; depends on `nix` only.
//!
//! Why a tree and not the process group: a job may leave its group (GNU `timeout` calls
//! `setpgid`, daemons call `setsid`) or double-fork. None of that takes a process out
//! of the tree under a child subreaper: an orphan is re-parented to the nearest living
//! subreaper above it, so while the guard (or lockrun, when the guard is gone) lives,
//! the processes below it are exactly the job.
//!
//! The tree is read from each process's `/proc/PID/task/TID/children` (the kernel's own
//! list, `CONFIG_PROC_CHILDREN`, on in Debian's and Ubuntu's kernels), or, where that
//! file does not exist, from a scan of every `/proc/PID/stat`. Neither is a snapshot:
//! a process forked while the tree is read may be missed, so whoever must see the job
//! gone (SIGKILL) reads it again until it is empty.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// One process of the tree, as `/proc/PID/stat` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// Its pid.
    pub pid: i32,
    /// Its parent's pid.
    pub ppid: i32,
    /// Its process group.
    pub pgid: i32,
    /// Dead and waiting to be reaped (it can neither run nor fork again).
    pub zombie: bool,
    /// Stopped (`T`: SIGSTOP and the like) or held by a tracer (`t`).
    pub stopped: bool,
}

/// Reads one process's `/proc/PID/stat`; `None` if it is gone.
pub fn stat(pid: i32) -> Option<Proc> {
    let text = fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses a `/proc/PID/stat` line. The command name may hold spaces and parentheses,
/// so the fields are read after the *last* `)`.
fn parse_stat(pid: i32, text: &[u8]) -> Option<Proc> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgid,
        zombie: matches!(state, 'Z' | 'X' | 'x'),
        stopped: matches!(state, 'T' | 't'),
    })
}

/// True if this kernel has `/proc/PID/task/TID/children`.
fn children_files() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| fs::metadata("/proc/thread-self/children").is_ok())
}

/// The children of `pid` from the kernel's per-thread lists.
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = fs::read_to_string(task.path().join("children")) {
            out.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}

/// Every process's parent, from a scan of `/proc` (where there are no children files).
fn parents() -> HashMap<i32, Vec<Proc>> {
    let mut by_parent: HashMap<i32, Vec<Proc>> = HashMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return by_parent;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(p) = stat(pid) {
            by_parent.entry(p.ppid).or_default().push(p);
        }
    }
    by_parent
}

/// Every process below `root` (not `root` itself), zombies included, parents before
/// their children.
pub fn descendants(root: i32) -> Vec<Proc> {
    let mut out = Vec::new();
    walk(root, |p| out.push(*p));
    out
}

/// Calls `each` on every process below `root` as the walk finds it, a parent before its
/// children (and before its children are read).
fn walk(root: i32, mut each: impl FnMut(&Proc)) {
    let mut queue = VecDeque::from([root]);
    if children_files() {
        while let Some(parent) = queue.pop_front() {
            for child in children(parent) {
                if let Some(p) = stat(child).filter(|p| p.ppid == parent) {
                    each(&p);
                    queue.push_back(p.pid);
                }
            }
        }
    } else {
        let mut by_parent = parents();
        while let Some(parent) = queue.pop_front() {
            for p in by_parent.remove(&parent).unwrap_or_default() {
                each(&p);
                queue.push_back(p.pid);
            }
        }
    }
}

/// The processes below `root` that still run (zombies left out).
pub fn live_descendants(root: i32) -> Vec<Proc> {
    let mut all = descendants(root);
    all.retain(|p| !p.zombie);
    all
}

/// Sends `sig` to every live process below `root`, except those in process group
/// `skip_group` (the caller signals that group at once with `killpg`, which reaches a
/// process forking at that moment too, and a second copy of the signal would be
/// delivered twice to a process that handles it). Returns how many were signalled.
pub fn signal(root: i32, sig: Signal, skip_group: Option<i32>) -> usize {
    let mut sent = 0;
    for p in live_descendants(root) {
        if Some(p.pgid) == skip_group {
            continue;
        }
        match kill(Pid::from_raw(p.pid), sig) {
            Ok(()) => sent += 1,
            // Gone between the read and the signal.
            Err(Errno::ESRCH) => {}
            Err(_) => {}
        }
    }
    sent
}

/// SIGKILLs every live process below `root`, again until a pass finds none (a process
/// may fork while the tree is read) or `until` has passed; `each_pass` runs before each
/// pass (to kill a cgroup at once, say). True when none is left.
pub fn kill_all(root: i32, until: Option<Instant>, mut each_pass: impl FnMut()) -> bool {
    let mut pause = Duration::from_micros(200);
    loop {
        each_pass();
        // Each live process is killed as soon as the walk finds it, before its children
        // are read: a job forking as fast as it can (a fork storm of thousands) stops
        // growing at once, and dies while the rest of it is read, rather than after.
        let mut live = 0;
        walk(root, |p| {
            if !p.zombie {
                live += 1;
                let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
            }
        });
        if live == 0 {
            return true;
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_last_parenthesis() {
        let line = b"4242 (sh (weird) name) S 17 4242 4242 0 -1 4194560 100";
        assert_eq!(
            parse_stat(4242, line),
            Some(Proc {
                pid: 4242,
                ppid: 17,
                pgid: 4242,
                zombie: false,
                stopped: false,
            })
        );
        assert!(parse_stat(7, b"7 (g) T 1 7 7 0").unwrap().stopped);
        assert!(parse_stat(7, b"7 (g) t 1 7 7 0").unwrap().stopped);
        let zombie = b"9 (x) Z 1 9 9 0";
        assert!(parse_stat(9, zombie).unwrap().zombie);
        assert_eq!(parse_stat(1, b"garbage"), None);
    }

    #[test]
    fn this_process_is_found_below_its_parent() {
        let me = std::process::id() as i32;
        let parent = stat(me).expect("own stat").ppid;
        assert!(descendants(parent).iter().any(|p| p.pid == me));
    }

    #[test]
    fn a_child_and_its_grandchild_are_descendants() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let me = std::process::id() as i32;
        let found: Vec<i32> = live_descendants(me).iter().map(|p| p.pid).collect();
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
        assert!(found.contains(&grandchild), "{found:?}");
        let _ = kill(Pid::from_raw(grandchild), Signal::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
    }
}
