//! The line of a semaphore's waiters (`--slots N`, N > 1, with `--wait`): first come
//! first served, and one waiter woken per freed slot. Part of [`super`].
//!
//! A waiter that found every slot busy joins the line: a thread of its own
//! ([`Waiter`]) asks for the line's byte ([`Byte::Line`]) with `F_OFD_SETLKW`. The
//! kernel grants that byte to one waiter at a time, in the order they asked (see
//! [`super::lock::lock_waiting`]); the waiter that has it is the head of the line. Only
//! the head takes a free slot: a waiter behind it answers busy without trying (it
//! would pass the head), and waits to be granted the line's byte. The head watches the
//! lock file with inotify and tries again each time a lockrun closes it after writing
//! (a holder releasing, or dying: the kernel closes a dead lockrun's files) or the file
//! is replaced or removed (`release --force`); it tries with the very file it holds the
//! line's byte through (an open and close of its own would wake it again). Once it
//! has a slot it lets go of the line's byte, and the kernel grants it to the next
//! waiter, which tries at once (two slots may have been freed together). So a freed
//! slot wakes the head only, never the whole line.
//!
//! Linux tells inotify of a close just before it drops the closing file's locks, so
//! after each event the head, if it still finds every slot busy, looks again after 2,
//! 10 and 50 ms before waiting for the next event. Without inotify (no `/proc`, or no
//! inotify instance left: `fs.inotify.max_user_instances`) the head tries again every
//! wait slice ([`crate::backend::wait_slice`]: at most 2 s).
//!
//! Not first come first served: a lockrun that is not in line (one without `--wait`,
//! or a waiter's first try) takes a free slot it finds even while waiters are in line;
//! the head, woken by the same release, then waits for the next one. A head that is
//! stopped (SIGSTOP) keeps its place, and the waiters behind it wait for it (or give up
//! when their `--wait` ends), as a stopped holder keeps its slot.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::unistd::{pipe2, read};
use tokio::sync::Notify;

use super::lock::Byte;
use super::lockfile::LockFile;
use super::waiter::{Found, Shared, Waiter};
use super::FileBackend;
use crate::backend::BackendError;

/// When the head looks again after an event, if every slot was still busy.
const LOOKS: [Duration; 3] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
];

/// This lockrun's place in the line of one lock file.
pub struct Line {
    id: (u64, u64),
    place: Place,
    watch: Option<Arc<Watch>>,
    /// How many of [`LOOKS`] were taken since the last event.
    looks: usize,
}

enum Place {
    /// Waiting for the line's byte.
    Behind(Waiter),
    /// The head: the line's byte is held through this file (`None` while an acquire
    /// tries with it).
    Head(Option<LockFile>),
    /// Not in line any more (the wait failed, or an acquire with the head's file was
    /// cut short and closed it).
    Out,
}

/// Where an acquire stands in the line.
pub enum Turn {
    /// At the head: try with this file (it holds the line's byte); give it back with
    /// [`Line::put_back`] if every slot is busy.
    Head(LockFile),
    /// Behind the head: do not take a slot.
    Behind,
    /// Not in line.
    Out,
}

/// What a waiting task waits on, outside the backend's table.
pub enum Wake {
    /// Behind: the line's byte granted (this lockrun became the head).
    Granted(Arc<Shared>),
    /// The head: an event on the lock file, or this long.
    Event(Arc<Watch>, Duration),
    /// The head without a watch: this long.
    Sleep(Duration),
}

impl Line {
    /// Joins the line of `file` (found with every slot busy).
    pub fn join(file: LockFile) -> Result<Line, BackendError> {
        Ok(Line {
            id: file.id(),
            place: Place::Behind(Waiter::start(file, Byte::Line)?),
            watch: None,
            looks: LOOKS.len(),
        })
    }

    /// Device and inode of the lock file whose line this is.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// Moves up if the line's byte was granted: this lockrun is the head, and watches
    /// the file from now on (before it tries again, so that no release is missed; and
    /// a release between its last try and the watch is caught by the first look).
    pub fn advance(&mut self) {
        if let Place::Behind(waiter) = &self.place {
            self.place = match waiter.take() {
                Found::Waiting => return,
                Found::Granted(file) => {
                    self.watch = Watch::on(file.file()).map(Arc::new);
                    // A slot freed before the watch began sent no event: look soon.
                    self.looks = 0;
                    Place::Head(Some(file))
                }
                Found::Failed => Place::Out,
            };
        }
    }

    /// Where an acquire stands (see [`Turn`]).
    pub fn turn(&mut self) -> Turn {
        self.advance();
        match &mut self.place {
            Place::Behind(_) => Turn::Behind,
            Place::Head(file) => match file.take() {
                Some(file) => Turn::Head(file),
                None => {
                    self.place = Place::Out;
                    Turn::Out
                }
            },
            Place::Out => Turn::Out,
        }
    }

    /// Gives the head's file back after an acquire found every slot busy.
    pub fn put_back(&mut self, file: LockFile) {
        if let Place::Head(kept @ None) = &mut self.place {
            *kept = Some(file);
        }
    }

    /// What to wait on for at most `slice`: see [`Wake`]. The head's first waits after
    /// an event are short (see [`LOOKS`]).
    pub fn wake(&mut self, slice: Duration) -> Wake {
        self.advance();
        match (&self.place, &self.watch) {
            (Place::Behind(waiter), _) => Wake::Granted(waiter.signal()),
            (Place::Head(Some(_)), Some(watch)) => {
                let wait = LOOKS.get(self.looks).map_or(slice, |l| slice.min(*l));
                self.looks = (self.looks + 1).min(LOOKS.len());
                Wake::Event(Arc::clone(watch), wait)
            }
            (Place::Head(_) | Place::Out, _) => Wake::Sleep(slice),
        }
    }

    /// Notes an event: the next waits are [`LOOKS`] again.
    pub fn saw_event(&mut self) {
        self.looks = 0;
    }
}

impl FileBackend {
    /// Waits for a semaphore's slot at most `slice`: joins the line of the file found
    /// busy (unless already in it), then waits as its place says (`line.rs`).
    pub(super) async fn wait_in_line(&self, name: &str, slice: Duration) {
        let wake = {
            let mut local = self.local();
            if let Some(file) = local.busy.remove(name) {
                let queued = local.lines.get(name).is_some_and(|l| l.id() == file.id());
                if !queued {
                    // No thread (a process limit): the slices below still re-check.
                    if let Ok(line) = Line::join(file) {
                        local.lines.insert(name.to_owned(), line);
                    }
                }
            }
            local.lines.get_mut(name).map(|l| l.wake(slice))
        };
        match wake {
            Some(Wake::Granted(signal)) => {
                let _ = tokio::time::timeout(slice, signal.over()).await;
                // The head now watches the file, before it tries.
                if let Some(line) = self.local().lines.get_mut(name) {
                    line.advance();
                }
            }
            Some(Wake::Event(watch, wait)) => {
                if tokio::time::timeout(wait, watch.changed()).await.is_ok() {
                    if let Some(line) = self.local().lines.get_mut(name) {
                        line.saw_event();
                    }
                }
            }
            Some(Wake::Sleep(wait)) => tokio::time::sleep(wait).await,
            None => tokio::time::sleep(slice).await,
        }
    }
}

/// An inotify watch on one lock file, for the head of its line. A thread of its own
/// blocks in `poll` on the inotify descriptor and on a pipe whose other end is the
/// watch's: dropping the watch closes it, and the thread ends.
pub struct Watch {
    event: Arc<Notify>,
    _stop: OwnedFd,
}

impl Watch {
    /// Watches the file `file` is open on (through `/proc/self/fd`, so the very file,
    /// whatever its path names now); `None` if inotify, `/proc` or a thread cannot be
    /// had.
    fn on(file: &File) -> Option<Watch> {
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).ok()?;
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let events = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF;
        inotify.add_watch(path.as_str(), events).ok()?;
        let (stopped, stop) = pipe2(OFlag::O_CLOEXEC).ok()?;
        let event = Arc::new(Notify::new());
        let theirs = Arc::clone(&event);
        std::thread::Builder::new()
            .name("lockrun-watch".into())
            .stack_size(64 * 1024)
            .spawn(move || watch(&inotify, &stopped, &theirs))
            .ok()?;
        Some(Watch { event, _stop: stop })
    }

    /// Returns once an event came since the last call (at once if one did).
    pub async fn changed(&self) {
        self.event.notified().await;
    }
}

/// The watch's thread: reads events until `stopped` (the pipe) closes, waking the
/// waiting task after each batch.
fn watch(inotify: &Inotify, stopped: &OwnedFd, event: &Notify) {
    // Events on a file carry no name: 16 bytes each.
    let mut buf = [0u8; 1024];
    loop {
        let mut fds = [
            PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stopped.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
        if fds[1].any() != Some(false) {
            return;
        }
        if fds[0].any() == Some(true) {
            match read(inotify.as_fd(), &mut buf) {
                Ok(n) if n > 0 => event.notify_one(),
                Err(Errno::EINTR) => {}
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::file::lock::{is_locked, try_lock, Kind};

    use crate::backend::file::lockfile::open_for_test as open;

    /// Waits (up to 10 s) until `line` is at the head.
    fn head(line: &mut Line) -> LockFile {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match line.turn() {
                Turn::Head(file) => return file,
                Turn::Behind => {
                    assert!(std::time::Instant::now() < deadline, "never the head");
                    std::thread::sleep(Duration::from_millis(5));
                }
                Turn::Out => panic!("out of line"),
            }
        }
    }

    #[tokio::test]
    async fn the_line_is_served_in_order_and_the_head_sees_a_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let mut first = Line::join(open(&path)).unwrap();
        let file = head(&mut first);
        first.put_back(file);
        // Two more, in this order: each behind the one before.
        let mut second = Line::join(open(&path)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut third = Line::join(open(&path)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(second.turn(), Turn::Behind));
        assert!(matches!(third.turn(), Turn::Behind));
        // The head is woken by a writer's close.
        let Wake::Event(watch, _) = first.wake(Duration::from_secs(10)) else {
            panic!("the head has no watch");
        };
        let holder = open(&path);
        assert!(try_lock(holder.file(), Byte::Slot(1), Kind::Write).unwrap());
        drop(holder);
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("no event for the close");
        // The head leaves: the second, not the third, is next.
        drop(first);
        let file = head(&mut second);
        assert!(matches!(third.turn(), Turn::Behind));
        assert!(is_locked(open(&path).file(), Byte::Line).unwrap());
        drop(file);
        drop(second);
        drop(head(&mut third));
    }
}
