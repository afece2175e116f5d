//! A frozen process, as a paused virtual machine or `docker pause` leaves it: a freezer
//! cgroup of the test's own that one process alone is moved into and frozen (cgroup
//! v1's freezer where the machine has it, else cgroup v2's `cgroup.freeze`). Unlike
//! SIGSTOP, which the kernel undoes with a SIGCONT (and lockrun sets one for its lease
//! deadline), nothing but a thaw makes a frozen process run again.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{wait_until, WAIT};

/// A freezer cgroup holding one process.
pub struct Frozen {
    dir: PathBuf,
    /// Where the process goes back to.
    home: PathBuf,
    v2: bool,
    pid: i32,
}

/// The test's own cgroup in the v1 freezer hierarchy, or else in the v2 one (the
/// `0::` line, under the cgroup2 mount); and whether it is v2.
fn own_cgroup() -> (PathBuf, bool) {
    let own = fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    if let Some(p) = own
        .lines()
        .find_map(|l| l.split_once(":freezer:").map(|(_, p)| p))
    {
        let dir = format!("/sys/fs/cgroup/freezer{}", p.trim_end_matches('/'));
        return (PathBuf::from(dir), false);
    }
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("the test runs in a cgroup v1 freezer or a cgroup v2");
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let mount = mounts
        .lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|t| t.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split_whitespace().nth(4))
        .expect("a cgroup2 mount");
    (
        PathBuf::from(format!("{mount}{}", path.trim_end_matches('/'))),
        true,
    )
}

/// A number for each cgroup made by this test binary.
static FREEZERS: AtomicU32 = AtomicU32::new(0);

impl Frozen {
    /// Moves `pid` (alone: its children stay where they are) into a new freezer cgroup
    /// and freezes it; returns once the kernel says it is frozen.
    pub fn freeze(pid: i32) -> Frozen {
        let n = FREEZERS.fetch_add(1, Ordering::SeqCst);
        let (home, v2) = own_cgroup();
        let dir = home.join(format!("lockrun-test-freeze-{}-{n}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let f = Frozen { dir, home, v2, pid };
        f.write("cgroup.procs", &pid.to_string());
        f.set(true);
        wait_until(&format!("process {pid} frozen"), WAIT, || f.is_frozen());
        f
    }

    /// Thaws it (it stays in the cgroup until dropped).
    pub fn thaw(&self) {
        self.set(false);
    }

    fn set(&self, frozen: bool) {
        match (self.v2, frozen) {
            (false, true) => self.write("freezer.state", "FROZEN"),
            (false, false) => self.write("freezer.state", "THAWED"),
            (true, true) => self.write("cgroup.freeze", "1"),
            (true, false) => self.write("cgroup.freeze", "0"),
        }
    }

    fn is_frozen(&self) -> bool {
        if self.v2 {
            let events = fs::read_to_string(self.dir.join("cgroup.events")).unwrap_or_default();
            return events.lines().any(|l| l == "frozen 1");
        }
        fs::read_to_string(self.dir.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            == "FROZEN"
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let file = if self.v2 {
            "cgroup.freeze"
        } else {
            "freezer.state"
        };
        let _ = fs::write(self.dir.join(file), if self.v2 { "0" } else { "THAWED" });
        // Back to the test's own cgroup (if it still runs), then the cgroup goes.
        let _ = fs::write(self.home.join("cgroup.procs"), self.pid.to_string());
        for _ in 0..200 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
