//! A `--wait`er's place in the kernel's queue: a thread blocked in `F_OFD_SETLKW` on
//! one byte of the lock file found busy (a plain lock's byte 0; for a semaphore, the
//! line's byte, see `line.rs`). The kernel grants it the moment the lockrun that had
//! it lets go (a release, or its death: a SIGKILLed lockrun's locks are freed at
//! once), the thread keeps what it was granted and wakes the waiting task, and the
//! next acquire takes it from the thread (and checks the lock as any other). Part of
//! [`super`].
//!
//! The kernel serves the waiters of one byte first come first served (see
//! [`lock_waiting`]), but a lockrun that does not wait may take the byte between a
//! release and the first waiter's grant. A waiter that is dropped (it gave up, or took
//! the lock another way) lets go of a lock granted to it; a thread still blocked stays
//! until its grant (which it lets go of at once) or the process's exit.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use super::lock::{lock_waiting, Byte};
use super::lockfile::LockFile;
use crate::backend::BackendError;

/// A waiting thread for one byte of one lock file.
pub struct Waiter {
    id: (u64, u64),
    shared: Arc<Shared>,
}

/// What the thread and the backend share.
pub struct Shared {
    state: Mutex<State>,
    granted: Notify,
}

enum State {
    Waiting,
    Granted(LockFile),
    Failed,
    /// Nobody wants the lock any more: the thread lets go of it when granted.
    Abandoned,
}

/// What a waiter has for its lockrun.
pub enum Found {
    /// Still queued.
    Waiting,
    /// The lock, granted.
    Granted(LockFile),
    /// The wait failed; the next acquire tries on its own.
    Failed,
}

impl Waiter {
    /// Starts a thread waiting for `byte` of `lock`.
    pub fn start(lock: LockFile, byte: Byte) -> Result<Waiter, BackendError> {
        let id = lock.id();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::Waiting),
            granted: Notify::new(),
        });
        let theirs = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("lockrun-wait".into())
            .stack_size(64 * 1024)
            .spawn(move || wait(lock, byte, &theirs))
            .map_err(|e| BackendError::Unavailable(format!("cannot start a waiter thread: {e}")))?;
        Ok(Waiter { id, shared })
    }

    /// Device and inode of the file waited on.
    pub fn id(&self) -> (u64, u64) {
        self.id
    }

    /// What the waiter has; a granted lock is handed over (once).
    pub fn take(&self) -> Found {
        let mut state = self.shared.state();
        match std::mem::replace(&mut *state, State::Abandoned) {
            State::Waiting => {
                *state = State::Waiting;
                Found::Waiting
            }
            State::Granted(lock) => Found::Granted(lock),
            State::Failed | State::Abandoned => Found::Failed,
        }
    }

    /// The half shared with the thread, to wait on without holding the backend's
    /// state.
    pub fn signal(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once the thread's wait is over (at once if it is over already).
    pub async fn over(&self) {
        self.granted.notified().await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // A lock granted and not taken is let go of here; one granted later, by the
        // thread.
        let old = std::mem::replace(&mut *self.shared.state(), State::Abandoned);
        drop(old);
    }
}

/// The thread: blocks until granted, then hands the lock over (or lets go of it if
/// the waiter was dropped meanwhile) and wakes the waiting task.
fn wait(lock: LockFile, byte: Byte, shared: &Shared) {
    let result = lock_waiting(lock.file(), byte);
    {
        let mut state = shared.state();
        if matches!(*state, State::Waiting) {
            *state = match result {
                Ok(()) => State::Granted(lock),
                Err(_) => State::Failed,
            };
        }
        // Else abandoned: `lock` is dropped below, letting go of the grant.
    }
    shared.granted.notify_one();
}
