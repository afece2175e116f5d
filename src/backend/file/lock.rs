//! Linux open-file-description locks (`F_OFD_SETLK`, `F_OFD_SETLKW`, `F_OFD_GETLK`) on
//! bytes of a lock file. Part of [`super`]; depends on `nix` only.
//!
//! OFD locks belong to the open file, not to the process: two opens conflict even in
//! one process (a waiter thread and the acquiring code stay apart), they never pass to
//! the command (the files are opened `O_CLOEXEC`, and a lock is not inherited anyway),
//! and the kernel drops them when the last descriptor of the open file closes, so a
//! lockrun killed by SIGKILL frees its lock at once. They may lie beyond the end of
//! the file; the bytes need not exist.
//!
//! - [`Byte::Slot`] is the lock itself, held by the holder's lockrun while its command
//!   runs: slot 0 (a plain lock) is byte 0, as it always was; slot `i` >= 1 of a
//!   semaphore (`--slots N`, at most [`crate::backend::MAX_SLOTS`]) is byte `2 + i`.
//!   `status` only asks who has them (`F_OFD_GETLK`), so it never takes one from a run.
//! - [`Byte::Record`] (byte 1) guards the record for a moment: a writer (the holder
//!   writing its record, `release --force` replacing the file) takes it exclusively,
//!   a reader shared, so no reader sees half a record and no counter update can slip
//!   between `release --force`'s read of the counter and its replacement of the file.
//!   It is only ever held for a read or a write and an fsync, and asked for without
//!   blocking, again after a short sleep (so a stopped process holding it cannot hang
//!   a lockrun: the caller's timeout still runs).
//! - [`Byte::Line`] (byte 2) is the head of the line of a semaphore's waiters: each
//!   waiter asks for it with `F_OFD_SETLKW` in a thread of its own, and the kernel
//!   grants it to one at a time, in the order they asked (see `line.rs`).

use std::fs::File;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;

/// Which byte of the lock file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Byte {
    /// The lock a holder of this slot keeps while its command runs: byte 0 for slot 0
    /// (a plain lock), byte `2 + i` for slot `i` >= 1.
    Slot(u32),
    /// Byte 1: the record's guard, held for a read or a write.
    Record,
    /// Byte 2: the head of the line of a semaphore's waiters.
    Line,
}

impl Byte {
    /// The byte's offset in the file.
    pub fn offset(self) -> i64 {
        match self {
            Byte::Slot(0) => 0,
            Byte::Record => 1,
            Byte::Line => 2,
            Byte::Slot(i) => 2 + i64::from(i),
        }
    }
}

/// The kind of lock asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exclusive.
    Write,
    /// Shared.
    Read,
    /// Let go.
    Unlock,
}

fn request(byte: Byte, kind: Kind) -> libc::flock {
    let l_type = match kind {
        Kind::Write => libc::F_WRLCK,
        Kind::Read => libc::F_RDLCK,
        Kind::Unlock => libc::F_UNLCK,
    };
    libc::flock {
        l_type: l_type as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: byte.offset(),
        l_len: 1,
        // Must be 0 for OFD locks.
        l_pid: 0,
    }
}

/// Takes (or lets go of) `byte` without waiting: `Ok(false)` if another open file
/// holds a conflicting lock.
pub fn try_lock(file: &File, byte: Byte, kind: Kind) -> Result<bool, Errno> {
    match fcntl(file, FcntlArg::F_OFD_SETLK(&request(byte, kind))) {
        Ok(_) => Ok(true),
        Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes `byte` exclusively, waiting as long as it takes (a waiter's own thread). The
/// kernel serves the waiters of one byte in the order they asked: a new request that
/// conflicts with one already waiting waits behind it, and a release wakes only the
/// first (`__locks_insert_block` in Linux's `fs/locks.c`, since Linux 5.0); only an
/// `F_OFD_SETLK` that comes between the release and the woken waiter's retry can pass
/// it.
pub fn lock_waiting(file: &File, byte: Byte) -> Result<(), Errno> {
    loop {
        match fcntl(file, FcntlArg::F_OFD_SETLKW(&request(byte, Kind::Write))) {
            Err(Errno::EINTR) => continue,
            other => return other.map(drop),
        }
    }
}

/// True if another open file holds `byte` (a lock that would conflict with a write
/// lock); takes nothing.
pub fn is_locked(file: &File, byte: Byte) -> Result<bool, Errno> {
    let mut probe = request(byte, Kind::Write);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
    Ok(probe.l_type != libc::F_UNLCK as libc::c_short)
}

/// The first pause between two asks for a busy [`Byte::Record`]; each next one is
/// twice as long, up to [`RECORD_PAUSE_MAX`].
const RECORD_PAUSE: Duration = Duration::from_millis(1);
const RECORD_PAUSE_MAX: Duration = Duration::from_millis(16);

/// Takes [`Byte::Record`] (`kind` Write or Read), asking again after short sleeps while
/// another open file has it. The caller bounds the whole with its timeout.
pub async fn lock_record(file: &File, kind: Kind) -> Result<(), Errno> {
    let mut pause = RECORD_PAUSE;
    while !try_lock(file, Byte::Record, kind)? {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECORD_PAUSE_MAX);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap()
    }

    /// True once no other open file holds `byte`, asked again for up to 10 s. A lock
    /// goes when the last descriptor of its open file closes; a test beside this one
    /// that forks (to spawn a process) gives its child a copy of every descriptor of
    /// this process until the child's exec, so a close here may free the lock a moment
    /// late. (lockrun opens its lock files `O_CLOEXEC` before it forks anything.)
    fn freed(probe: &File, byte: Byte) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while is_locked(probe, byte).unwrap() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        true
    }

    #[test]
    fn two_opens_conflict_even_in_one_process_and_closing_frees() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let (a, b) = (open(&path), open(&path));
        assert!(try_lock(&a, Byte::Slot(0), Kind::Write).unwrap());
        assert!(is_locked(&b, Byte::Slot(0)).unwrap());
        assert!(!try_lock(&b, Byte::Slot(0), Kind::Write).unwrap());
        // The two bytes are independent.
        assert!(!is_locked(&b, Byte::Record).unwrap());
        assert!(try_lock(&b, Byte::Record, Kind::Read).unwrap());
        assert!(!try_lock(&a, Byte::Record, Kind::Write).unwrap());
        assert!(try_lock(&b, Byte::Record, Kind::Unlock).unwrap());
        drop(a);
        assert!(freed(&b, Byte::Slot(0)));
        assert!(try_lock(&b, Byte::Slot(0), Kind::Write).unwrap());
    }

    #[test]
    fn every_slot_has_a_byte_of_its_own_and_slot_0_is_byte_0() {
        let offsets: Vec<i64> = [
            Byte::Slot(0),
            Byte::Record,
            Byte::Line,
            Byte::Slot(1),
            Byte::Slot(999),
        ]
        .iter()
        .map(|b| b.offset())
        .collect();
        assert_eq!(offsets, [0, 1, 2, 3, 1001]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let (a, b) = (open(&path), open(&path));
        assert!(try_lock(&a, Byte::Slot(1), Kind::Write).unwrap());
        assert!(is_locked(&b, Byte::Slot(1)).unwrap());
        for other in [Byte::Slot(0), Byte::Record, Byte::Line, Byte::Slot(2)] {
            assert!(!is_locked(&b, other).unwrap(), "{other:?}");
        }
    }

    #[test]
    fn a_waiting_lock_is_granted_when_the_holder_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let a = open(&path);
        assert!(try_lock(&a, Byte::Slot(0), Kind::Write).unwrap());
        let b = open(&path);
        let waiter = std::thread::spawn(move || {
            lock_waiting(&b, Byte::Slot(0)).unwrap();
            b
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "granted while held");
        drop(a);
        let b = waiter.join().unwrap();
        let c = open(&path);
        assert!(is_locked(&c, Byte::Slot(0)).unwrap());
        drop(b);
        assert!(freed(&c, Byte::Slot(0)));
    }
}
