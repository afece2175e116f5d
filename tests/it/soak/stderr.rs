//! A lockrun's stderr in the soak: a pipe that a thread of its own drains into memory,
//! and that the nemesis can block (issue 25, case 3): the reader stays alive but stops
//! reading, and the pipe is filled to the brim, so every line lockrun writes would
//! block. lockrun may then lose lines, never a deadline.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// One lockrun's stderr.
pub(super) struct StderrPipe {
    /// The read end, non-blocking (an open file description of the test's own: lockrun
    /// has the write end).
    read: OwnedFd,
    /// What was read so far.
    text: Mutex<Vec<u8>>,
    /// True while the nemesis blocks it.
    blocked: AtomicBool,
    /// True once every write end is closed and all was read.
    eof: AtomicBool,
}

impl StderrPipe {
    /// A new pipe, drained from now on; returns it and the write end for lockrun.
    pub(super) fn start() -> (Arc<StderrPipe>, OwnedFd) {
        // O_CLOEXEC: lockruns other workers start meanwhile must not inherit either end.
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe2");
        fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).expect("F_SETFL");
        let pipe = Arc::new(StderrPipe {
            read,
            text: Mutex::default(),
            blocked: AtomicBool::new(false),
            eof: AtomicBool::new(false),
        });
        let drained = pipe.clone();
        thread::spawn(move || drained.drain());
        (pipe, write)
    }

    fn drain(&self) {
        let mut chunk = [0u8; 4096];
        loop {
            if self.blocked.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            match nix::unistd::read(&self.read, &mut chunk) {
                Ok(0) => break,
                Ok(n) => self.text.lock().unwrap().extend_from_slice(&chunk[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
        self.eof.store(true, Ordering::SeqCst);
    }

    /// True once lockrun wrote its `acquired` line (and the drain read it).
    pub(super) fn logged_acquiring(&self) -> bool {
        let text = self.text.lock().unwrap();
        String::from_utf8_lossy(&text).contains(r#""event":"acquired""#)
    }

    /// Stops reading and fills the pipe (with empty lines, which the log leaves out).
    pub(super) fn block(&self) {
        self.blocked.store(true, Ordering::SeqCst);
        thread::sleep(Duration::from_millis(10)); // a read under way ends
        self.fill();
    }

    /// Fills the pipe up again (lockrun's lost lines are not waited for, but a line it
    /// wrote made room for nothing else).
    pub(super) fn fill(&self) {
        // A write end of the test's own, non-blocking, through /proc: lockrun's stays
        // blocking, as a pipe normally is.
        let path = format!("/proc/self/fd/{}", self.read.as_raw_fd());
        let Ok(mut w) = OpenOptions::new()
            .write(true)
            .custom_flags(libc_nonblock())
            .open(path)
        else {
            return;
        };
        let lines = [b'\n'; 4096];
        while w.write(&lines).is_ok_and(|n| n > 0) {}
        while w.write(b"\n").is_ok_and(|n| n > 0) {}
    }

    /// Reads again.
    pub(super) fn unblock(&self) {
        self.blocked.store(false, Ordering::SeqCst);
    }

    /// Everything read, once lockrun ended: waits (a little) for the last of its job to
    /// close the pipe, and leaves the empty lines out.
    pub(super) fn finish(&self) -> String {
        self.unblock();
        let start = Instant::now();
        while !self.eof.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_millis(5));
        }
        let text = self.text.lock().unwrap();
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

/// `O_NONBLOCK` as `open(2)` takes it.
fn libc_nonblock() -> i32 {
    OFlag::O_NONBLOCK.bits()
}
