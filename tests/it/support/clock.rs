//! Clocks: `CLOCK_BOOTTIME`, the one clock every process of the machine shares with
//! lockrun's lease, and a wall clock that a test can jump for the servers it starts
//! (libfaketime).

use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tempfile::TempDir;

/// Time since boot on `CLOCK_BOOTTIME`, the clock lockrun measures leases with. It is one
/// clock for every process of the machine, so instants taken by different processes (the
/// test, a command's `perl -MTime::HiRes`) can be compared.
pub fn boottime() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("clock_gettime(CLOCK_BOOTTIME)");
    Duration::from(ts)
}

/// A wall clock that a test can jump, for the servers it starts (PostgreSQL; the soak's
/// Redis jumps its keys' expiry instead, `RedisServer::jump_clock`): Debian's libfaketime
/// (package `faketime`) preloaded with a timestamp file that is read on every clock call
/// (`FAKETIME_NO_CACHE=1`), so the offset of a running server changes the moment the file
/// does. Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`): key expiry and
/// `TIME` follow it, as they would follow an NTP step.
///
/// Redis links jemalloc, which calls `clock_gettime` while libfaketime is still
/// initialising (libfaketime issue #130: the server dies at start). glibc's
/// `libc_malloc_debug.so.0`, preloaded first, makes the server use glibc's malloc.
pub struct FakeClock {
    dir: TempDir,
    offset: Mutex<Duration>,
    preload: String,
}

impl FakeClock {
    /// A clock at offset zero; panics, naming the package, if libfaketime is missing.
    pub fn new() -> Self {
        let find = |names: &[&str]| -> Option<String> {
            let dirs = [
                "/usr/lib/x86_64-linux-gnu",
                "/lib/x86_64-linux-gnu",
                "/usr/lib64",
            ];
            let mut all: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
            // Other architectures: /usr/lib/<triplet>/.
            if let Ok(rd) = fs::read_dir("/usr/lib") {
                all.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            all.push(PathBuf::from("/usr/lib"));
            all.iter()
                .flat_map(|d| names.iter().map(move |n| d.join(n)))
                .find(|p| p.exists())
                .map(|p| p.to_string_lossy().into_owned())
        };
        let faketime = find(&["faketime/libfaketime.so.1"])
            .expect("libfaketime not found: install Debian's package `faketime`");
        let malloc = find(&["libc_malloc_debug.so.0"])
            .expect("glibc's libc_malloc_debug.so.0 not found (glibc 2.34 or later)");
        let dir = tempfile::Builder::new()
            .prefix("lockrun-faketime-")
            .tempdir()
            .expect("create faketime dir");
        let clock = FakeClock {
            dir,
            offset: Mutex::new(Duration::ZERO),
            preload: format!("{malloc}:{faketime}"),
        };
        clock.write(Duration::ZERO);
        clock
    }

    /// The environment that puts a process on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.preload.clone()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file().to_string_lossy().into_owned(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Moves the clock forward by `by` (at once, for every process on it); returns the
    /// new offset from the real time.
    pub fn jump_forward(&self, by: Duration) -> Duration {
        let mut offset = self.offset.lock().unwrap();
        *offset += by;
        self.write(*offset);
        *offset
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("timestamp")
    }

    fn write(&self, offset: Duration) {
        // Written to a temporary file and renamed, so a reader never sees half a line.
        let tmp = self.dir.path().join("timestamp.tmp");
        fs::write(&tmp, format!("+{:.6}\n", offset.as_secs_f64())).expect("write timestamp");
        fs::rename(&tmp, self.file()).expect("rename timestamp");
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}
