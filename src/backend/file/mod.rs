//! The file backend (`file:///ABSOLUTE/DIR`): locks for one host, with no server. A
//! lock is a kernel lock on a lock file in DIR, held by the holder's lockrun while its
//! command runs.
//!
//! **What it is for**: one host (a single server, a laptop, a quick start): `flock(1)`
//! with lockrun's kill on loss, `--max-runtime`, metrics, `--hold-at-least`, `status`
//! and fencing tokens. Not a lock between hosts: a directory shared over NFS is not
//! supported. It is chosen only by its URL; the default stays Redis.
//!
//! **Files**: lock `NAME` under `--key-prefix P` is the file `DIR/ENC(P)=ENC(NAME)`
//! (`name.rs`: one file per pair, never hidden, never a path), holding a small text
//! record (`record.rs`): the fencing counter and the holders (token, host, pid, start,
//! TTL, `--hold-at-least` end, and for a semaphore slot and fencing token). DIR is
//! created if missing (0700); DIR and the files in it are refused unless they are safe
//! from other users (`dir.rs`). Each lock file stays once made: one small file per name
//! ever used, semaphore or not. Beside it, `DIR/ENC(P)@ENC(NAME)` keeps the record of
//! the name's last run (`last.rs`), written by each release before it lets go of the
//! lock, checked as a lock file is.
//!
//! **The lock** is an open-file-description lock on byte 0 of the file (`lock.rs`): the
//! kernel frees it when the holder's lockrun closes the file or dies, even by SIGKILL
//! (its command is then killed by the parent-death signal), so a crashed holder's lock
//! is free at once, not after the TTL. The lease lockrun counts still runs: each
//! renewal checks, without any write, that DIR and the file at the lock's path are
//! still the ones locked (`release --force` or a person may have replaced or removed
//! it) and that it still holds our token; if not, that is a definite loss (124). A
//! lockrun that is frozen keeps its lock (the kernel's lock has no expiry).
//!
//! **Acquire**: open (or create) the file, lock byte 0 without waiting (busy: read
//! the record for the holder), then take the record's guard (byte 1), check that the
//! file opened is still the one at the path (else it was replaced between the open
//! and the lock: start again on the new one), read the record (a file that is not
//! lockrun's is refused, its counter never reset), answer busy if `--hold-at-least` of
//! the last holder still runs, else write the next token and ourselves and only then
//! answer `Acquired`. The token increases across runs and reboots without an fsync per
//! run (`Record::next_token`): a block of 1024 tokens is reserved durably
//! (`fdatasync`, and fsync DIR if the file is new) before any of them is handed out,
//! and the record names the boot (Linux's boot id) that wrote it. Within that boot
//! every process sees the last token written, fsynced or not (the page cache); a
//! record from another boot (after a crash or a restart, or a directory from
//! elsewhere) may have lost its unsynced tokens, so the next token starts above its
//! reservation. Tokens jump by up to 1024 at a reboot; they never repeat.
//!
//! The kernel drops a dead lockrun's lock as it closes its files, a moment *before*
//! the exiting lockrun sends its command the parent-death SIGKILL. So a lock found
//! with its last holder still named in the record (it never released: it crashed) on
//! this host is taken only once that lockrun is gone or a zombie, its command killed
//! (`crashed.rs`; at most 200 ms, in case the pid is not one of ours).
//!
//! **Release** writes the record without a holder (or, for `--hold-at-least`, with the
//! hold's end, fsynced) and closes the file. **`release --force`** never loses the
//! counter: under the record's guard it writes a new file with the same counter and no
//! holder and renames it over the lock file; the old holder's next renewal finds
//! another file (124), new holders lock the new one. **`status`** only asks the
//! kernel whether byte 0 is locked (`F_OFD_GETLK`) and reads the record under a shared
//! guard, so it never makes a run find the lock busy. A held lock shows its holder's
//! TTL as left (the holder renews continuously); a lock kept by `--hold-at-least`, the
//! hold left (by the wall clock).
//!
//! **`--wait`** (`waiter.rs`): a thread blocks in `F_OFD_SETLKW` on the busy file and
//! keeps the lock once the kernel grants it, for the next acquire to take: a release or
//! a crash wakes a waiter at once, without polling. The kernel serves the waiters of a
//! byte first come first served; a lockrun that does not wait may still take the lock
//! between a release and the first waiter's grant. Every wait slice ([`wait_slice`]: at
//! most 2 s) the waiter checks that the file it waits on is still the lock's, and waits
//! for a `--hold-at-least` by sleeping.
//!
//! **Semaphores** (`--slots N`, N > 1; `slots.rs`): still one file per name, one record
//! and one fencing counter, so tokens increase over every slot. Slot 0 is byte 0, the
//! very lock of a plain lock; slot `i` >= 1 is byte `2 + i` (`lock.rs`). The record
//! (format 2 while a semaphore has holders) lists the holders by slot, each with its
//! own token, and the N they were taken with: under the record's guard an acquire
//! takes the lowest slot whose byte is free and that no hold keeps, and refuses (125)
//! live holders of another N (a plain lock's holder, or an old record, has N = 1, and
//! an older lockrun refuses a format 2 record). A crashed holder's slot is free at once,
//! as a plain lock is. Holders renew, release and keep (`--hold-at-least`) their own
//! slot, rewriting only their own line; a holder that does not find its line where a
//! read beside another's write may have torn the record looks again under the guard.
//! `status` and `release --force` cover every slot (a forced release replaces the file:
//! every holder finds out at its next renewal). Waiters stand in a line (`line.rs`):
//! first come first served, the head alone woken (by inotify) when a slot frees.

mod acquire;
mod crashed;
mod dir;
mod hold;
mod last;
mod line;
mod lock;
mod lockfile;
mod name;
mod record;
mod slots;
mod target;
mod waiter;
mod walk;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::url::BackendConfig;
use crate::backend::{
    wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release, RunEnd, RunRecord,
    MAX_LEASE,
};
use acquire::{read_guarded, Attempt};
use dir::{LockDir, Open};
use line::Line;
use lock::{lock_record, try_lock, Byte, Kind};
use lockfile::LockFile;
use record::{storable_token, Record};
pub use target::KIND;
use waiter::Waiter;

/// How many times an acquire or `release --force` starts again on a lock file that was
/// replaced under it before giving up (each time means another `release --force`).
const TRIES: usize = 8;

/// A lock backend on a local directory.
pub struct FileBackend {
    path: PathBuf,
    key_prefix: String,
    /// `--slots`: 1 for a plain lock.
    slots: u32,
    /// The directory, once opened and checked.
    dir: Mutex<Option<Arc<LockDir>>>,
    local: Mutex<Local>,
}

/// What this lockrun has, per lock name; never locked across an await.
#[derive(Default)]
struct Local {
    held: HashMap<String, Held>,
    /// The file the last busy answer found locked, for a waiter to wait on.
    busy: HashMap<String, LockFile>,
    /// A plain lock's waiters (byte 0).
    waiters: HashMap<String, Waiter>,
    /// A semaphore's waiters (the line's byte).
    lines: HashMap<String, Line>,
}

/// A lock we hold: the open file whose slot byte is ours.
struct Held {
    token: String,
    lock: LockFile,
    /// The record we wrote (a plain lock's: nobody else writes it while we hold it).
    record: Record,
    slot: u32,
}

impl FileBackend {
    /// A backend on the directory `path`.
    pub fn new(path: PathBuf, config: &BackendConfig) -> FileBackend {
        FileBackend {
            path,
            key_prefix: config.key_prefix.clone(),
            slots: config.slots.max(1),
            dir: Mutex::new(None),
            local: Mutex::new(Local::default()),
        }
    }

    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock file's name in the directory.
    fn file_name(&self, name: &str) -> Result<String, BackendError> {
        name::file_name(&self.key_prefix, name).ok_or_else(|| {
            BackendError::Refused(
                name::check_prefix(&self.key_prefix)
                    .err()
                    .unwrap_or_else(|| "the lock name is too long for a file name".into()),
            )
        })
    }

    /// The directory, opened and checked once; created if missing when `create`, else
    /// `None` when missing.
    fn dir(&self, create: bool) -> Result<Option<Arc<LockDir>>, BackendError> {
        let mut cached = self.dir.lock().unwrap_or_else(PoisonError::into_inner);
        if cached.is_none() {
            *cached = LockDir::open(&self.path, create)?.map(Arc::new);
        }
        Ok(cached.clone())
    }

    /// The directory for an acquire: created if missing.
    fn dir_for_lock(&self) -> Result<Arc<LockDir>, BackendError> {
        self.dir(true)?.ok_or_else(|| {
            BackendError::Unavailable(format!(
                "the lock directory {} vanished as it was created",
                self.path.display()
            ))
        })
    }

    /// Checks that `lock` (held with `token` on `slot`) is still the lock: the
    /// directory and the file at its path are the ones we locked, and the record
    /// (`read`) holds our token. Anything else is a definite loss
    /// ([`BackendError::NotOwner`]); an I/O error may pass.
    fn check_ours(
        &self,
        file_name: &str,
        lock: &LockFile,
        (token, slot): (&str, u32),
        read: impl FnOnce() -> Result<Record, BackendError>,
    ) -> Result<(), BackendError> {
        let dir = self.dir(false)?.ok_or(BackendError::NotOwner)?;
        if !dir.still_at_path()? || !dir.is_current(file_name, lock)? {
            return Err(BackendError::NotOwner);
        }
        match read() {
            Ok(r) if r.entry(slot).is_some_and(|h| h.token == token) => Ok(()),
            Ok(_) | Err(BackendError::Refused(_) | BackendError::SlotsConflict { .. }) => {
                Err(BackendError::NotOwner)
            }
            Err(BackendError::NotOwner) => Err(BackendError::NotOwner),
            Err(e @ BackendError::Unavailable(_)) => Err(e),
        }
    }

    /// [`Self::check_ours`] of `lock`, read without the record's guard: a plain
    /// lock's record is written by its holder only. A semaphore's is written by the
    /// other holders too, and a read beside their write may find it torn; that can
    /// hide our line, never make one up (nobody else writes our token, and a checksum
    /// guards the list), so only a record without our token is read again, under
    /// the guard (which a lockrun stopped while it had it could keep for long).
    async fn check_held(
        &self,
        file_name: &str,
        lock: &LockFile,
        ours: (&str, u32),
    ) -> Result<(), BackendError> {
        match self.check_ours(file_name, lock, ours, || lock.read()) {
            Err(BackendError::NotOwner) if self.slots > 1 => {
                let record = read_guarded(lock).await;
                self.check_ours(file_name, lock, ours, || record)
            }
            other => other,
        }
    }

    /// Our held lock of `name` with `token`, taken out of the table.
    fn take_held(&self, name: &str, token: &str) -> Result<Held, BackendError> {
        let mut local = self.local();
        match local.held.remove(name) {
            Some(h) if h.token == token => Ok(h),
            Some(h) => {
                local.held.insert(name.to_owned(), h);
                Err(BackendError::NotOwner)
            }
            None => Err(BackendError::NotOwner),
        }
    }
}

/// The wall clock, ms since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, millis)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Backend for FileBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        if req.ttl > MAX_LEASE {
            return Err(BackendError::Refused(format!(
                "a lease of {} is longer than the 24 h a lock may last: use a shorter --ttl",
                humantime::format_duration(req.ttl)
            )));
        }
        if !storable_token(&req.token) {
            return Err(BackendError::Refused(
                "the lock token cannot be stored".into(),
            ));
        }
        let file_name = self.file_name(name)?;
        let dir = self.dir_for_lock()?;
        if self.slots > 1 {
            return self.acquire_slot(name, &file_name, &dir, req).await;
        }
        for _ in 0..TRIES {
            let Some(file) = dir.open_lock(&file_name, Open::Create)? else {
                continue;
            };
            let file = match self.lock_or_busy(name, file)? {
                Attempt::Locked(file) => file,
                Attempt::Busy { file, queued } => return self.busy(name, file, !queued).await,
            };
            match self.take(&dir, &file_name, file, req).await? {
                Some((answer, Some(held))) => {
                    self.local().held.insert(name.to_owned(), held);
                    return Ok(answer);
                }
                // Kept by `--hold-at-least`: our lock on it goes with the file.
                Some((answer, None)) => return Ok(answer),
                None => continue,
            }
        }
        Err(BackendError::Unavailable(format!(
            "the lock file {} kept being replaced; try again",
            dir.show(&file_name)
        )))
    }

    async fn renew(&self, name: &str, token: &str, _ttl: Duration) -> Result<(), BackendError> {
        // Nothing to extend: the kernel's lock lasts while we hold the file open. The
        // check is what renewing means here.
        let file_name = self.file_name(name)?;
        let (lock, slot) = {
            let local = self.local();
            let Some(held) = local.held.get(name).filter(|h| h.token == token) else {
                return Err(BackendError::NotOwner);
            };
            let lock = &held.lock;
            match self.check_ours(&file_name, lock, (token, held.slot), || lock.read()) {
                // As in `check_held`, through another descriptor: ours stays in the
                // table (a renewal cut short by its timeout must not close it).
                Err(BackendError::NotOwner) if self.slots > 1 => (lock.dup()?, held.slot),
                other => return other,
            }
        };
        let record = read_guarded(&lock).await;
        self.check_ours(&file_name, &lock, (token, slot), || record)
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let file_name = self.file_name(name)?;
        // The token names the slot: a lockrun holds one slot of a name at most, and
        // only through a file it keeps open (an acquire cut short closes it, letting
        // go of whatever it took), so no other slot can hold this token.
        let held = self.take_held(name, token)?;
        // Closing `held` (at the end, whatever happens) lets go of the kernel's lock.
        let checked = self
            .check_held(&file_name, &held.lock, (token, held.slot))
            .await;
        match (how, checked) {
            (_, Err(BackendError::NotOwner)) => Err(BackendError::NotOwner),
            (Release::Now, _) => {
                // Not needed for the lock (closing frees it), so best effort: `status`
                // and the next holder see a record without us.
                if lock_record(held.lock.file(), Kind::Write).await.is_ok() {
                    if let Ok(mut free) = self.current_record(&held) {
                        self.record_run(name, &held, &free, end);
                        free.holders.retain(|h| h.slot != held.slot);
                        let _ = held.lock.write(&free);
                    }
                    // The slot's byte before the file: a head of the line woken by
                    // the close finds the slot free.
                    let _ = try_lock(held.lock.file(), Byte::Slot(held.slot), Kind::Unlock);
                }
                Ok(())
            }
            (Release::KeepFor(_), Err(e)) => Err(e),
            (Release::KeepFor(keep), Ok(())) => {
                lock_record(held.lock.file(), Kind::Write)
                    .await
                    .map_err(|e| held.lock.io(&e.into()))?;
                let mut kept = self.current_record(&held)?;
                self.record_run(name, &held, &kept, end);
                let (until, clock) = hold::Now::get().hold_end(keep);
                for h in kept.holders.iter_mut().filter(|h| h.slot == held.slot) {
                    h.hold_until_ms = until;
                    h.hold_clock.clone_from(&clock);
                }
                held.lock.write(&kept)?;
                held.lock.sync()
            }
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        self.holders_now(name).await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        self.read_last_run(name).await
    }

    fn lock_fds(&self, name: &str) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.local()
            .held
            .get(name)
            .map(|h| vec![h.lock.file().as_raw_fd()])
            .unwrap_or_default()
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        let Some(dir) = self.dir(false)? else {
            return Ok(Vec::new());
        };
        let files = dir.entries()?;
        Ok(files
            .iter()
            .filter_map(|f| name::name_of(&self.key_prefix, f))
            .collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        self.break_every_slot(name).await
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        let slice = wait_slice(busy.ttl_left, max);
        if self.slots > 1 {
            self.wait_in_line(name, slice).await;
            return Ok(());
        }
        let signal = {
            let mut local = self.local();
            if let Some(file) = local.busy.remove(name) {
                let queued = local.waiters.get(name).is_some_and(|w| w.id() == file.id());
                if !queued {
                    // No thread (a process limit): the slices below still re-check.
                    if let Ok(waiter) = Waiter::start(file, Byte::Slot(0)) {
                        local.waiters.insert(name.to_owned(), waiter);
                    }
                }
            }
            local.waiters.get(name).map(Waiter::signal)
        };
        match signal {
            // Granted (a release, or the holder's death) or the slice is over: either
            // way the caller tries again.
            Some(signal) => {
                let _ = tokio::time::timeout(slice, signal.over()).await;
            }
            // Kept by `--hold-at-least` (nothing to be woken by), or no thread.
            None => tokio::time::sleep(slice).await,
        }
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        let mut local = self.local();
        local.busy.remove(name);
        // Dropping the waiter lets go of a lock granted to it, and of our place in a
        // semaphore's line.
        local.waiters.remove(name);
        local.lines.remove(name);
        Ok(())
    }
}

impl FileBackend {
    /// The record `held`'s file has now, for its holder to write back without itself
    /// (or with its hold): a plain lock's is the one it wrote (nobody else writes it
    /// while it holds the lock); a semaphore's is read (the other holders write it).
    /// The caller holds the record's guard.
    fn current_record(&self, held: &Held) -> Result<Record, BackendError> {
        if self.slots == 1 {
            Ok(held.record.clone())
        } else {
            held.lock.read()
        }
    }
}
