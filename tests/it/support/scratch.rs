//! A per-test temporary directory for the files commands leave for the test to read
//! (markers, pids, tokens, histories), and waiting for such a file to be written.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::{wait_until, WAIT};

/// A per-test temporary directory for marker, pid and history files.
pub struct Scratch {
    dir: TempDir,
}

impl Scratch {
    /// A new empty directory.
    pub fn new() -> Self {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("lockrun-test-")
                .tempdir()
                .expect("create temp dir"),
        }
    }

    /// The path of `name` inside the directory (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The contents of `name`, or "" when it does not exist.
    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// True when `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// Creates `name` (empty), e.g. a "go" file a command waits for.
    pub fn touch(&self, name: &str) {
        File::create(self.path(name)).expect("create file");
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// Waits until `path` holds one complete line (written by `echo ... > path`) and returns it.
pub fn wait_line(path: &Path) -> String {
    let mut line = String::new();
    wait_until(
        &format!("{} holds a line", path.display()),
        WAIT,
        || match fs::read_to_string(path) {
            Ok(s) if s.ends_with('\n') => {
                line = s.trim().to_string();
                true
            }
            _ => false,
        },
    );
    line
}

/// Waits until `path` holds a pid (written by `echo $$ > path`) and returns it.
pub fn wait_pid(path: &Path) -> i32 {
    let line = wait_line(path);
    line.parse()
        .unwrap_or_else(|_| panic!("{} holds {line:?}, not a pid", path.display()))
}
