//! A frozen process, as a paused virtual machine or `docker pause` leaves it: a freezer
//! cgroup (v1, the one this machine has) of the test's own, that one process alone is
//! moved into and frozen. Unlike SIGSTOP, which the kernel undoes with a SIGCONT (and
//! lockrun sets one for its lease deadline), nothing but a thaw makes a frozen process
//! run again.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{wait_until, WAIT};

/// A freezer cgroup holding one process.
pub struct Frozen {
    dir: PathBuf,
    pid: i32,
}

/// The test's own freezer cgroup, where the frozen process goes back.
fn own_freezer() -> PathBuf {
    let own = fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let own = own
        .lines()
        .find_map(|l| l.split_once(":freezer:").map(|(_, p)| p.to_owned()))
        .expect("the test runs in a freezer cgroup (v1)");
    PathBuf::from(format!(
        "/sys/fs/cgroup/freezer{}",
        own.trim_end_matches('/')
    ))
}

/// A number for each cgroup made by this test binary.
static FREEZERS: AtomicU32 = AtomicU32::new(0);

impl Frozen {
    /// Moves `pid` (alone: its children stay where they are) into a new freezer cgroup
    /// and freezes it; returns once the kernel says it is frozen.
    pub fn freeze(pid: i32) -> Frozen {
        let n = FREEZERS.fetch_add(1, Ordering::SeqCst);
        let dir = own_freezer().join(format!("lockrun-test-freeze-{}-{n}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let f = Frozen { dir, pid };
        f.write("cgroup.procs", &pid.to_string());
        f.write("freezer.state", "FROZEN");
        wait_until(&format!("process {pid} frozen"), WAIT, || {
            f.read_state() == "FROZEN"
        });
        f
    }

    /// Thaws it (it stays in the cgroup until dropped).
    pub fn thaw(&self) {
        self.write("freezer.state", "THAWED");
    }

    fn read_state(&self) -> String {
        fs::read_to_string(self.dir.join("freezer.state"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        fs::write(&path, value).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("freezer.state"), "THAWED");
        // Back to the root freezer cgroup (if it still runs), then the cgroup goes.
        let _ = fs::write(own_freezer().join("cgroup.procs"), self.pid.to_string());
        for _ in 0..200 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
