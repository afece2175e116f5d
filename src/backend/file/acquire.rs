//! Taking a plain lock (`--slots 1`): byte 0 (from a waiter that was granted it, or
//! asked for without waiting), then, under the record's guard, the checks and the
//! durable write of the next fencing token. The checks and the write are shared with
//! a semaphore's slots (`slots.rs`). Part of [`super`].

use super::crashed;
use super::dir::LockDir;
use super::hold::{boot_id, Now};
use super::lock::{is_locked, lock_record, try_lock, Byte, Kind};
use super::lockfile::LockFile;
use super::record::{stored_host, HolderLine, Record};
use super::waiter::Found;
use super::{millis, now_ms, FileBackend, Held};
use crate::backend::{slots_conflict, Acquire, AcquireRequest, BackendError};

impl FileBackend {
    /// What asking for byte 0 of `file` (just opened at the lock's path) gives: the
    /// file a waiter of ours was granted (perhaps an older one: the caller checks),
    /// `file` itself if its byte 0 was free, or busy (`queued`: a waiter of ours waits
    /// on this very file already, so asking again would only conflict with it).
    pub(super) fn lock_or_busy(&self, name: &str, file: LockFile) -> Result<Attempt, BackendError> {
        let waiting = self.local().waiters.get(name).map(|w| (w.id(), w.take()));
        match waiting {
            Some((_, Found::Granted(granted))) => {
                self.local().waiters.remove(name);
                return Ok(Attempt::Locked(granted));
            }
            Some((id, Found::Waiting)) if id == file.id() => {
                return Ok(Attempt::Busy { file, queued: true })
            }
            // Queued on a file that is not the lock's any more, or failed.
            Some(_) => {
                self.local().waiters.remove(name);
            }
            None => {}
        }
        match try_lock(file.file(), Byte::Slot(0), Kind::Write) {
            Ok(true) => Ok(Attempt::Locked(file)),
            Ok(false) => Ok(Attempt::Busy {
                file,
                queued: false,
            }),
            Err(e) => Err(file.io(&e.into())),
        }
    }

    /// The busy answer: the holder as the record of `file` (locked by someone else)
    /// names it; a refusal if the holders were taken with another `--slots`.
    /// `remember`: keep `file` for a waiter to wait on.
    pub(super) async fn busy(
        &self,
        name: &str,
        file: LockFile,
        remember: bool,
    ) -> Result<Acquire, BackendError> {
        let record = read_guarded(&file).await?;
        let now = Now::get();
        check_slots(&file, &record, 1, None, now)?;
        let holder = record.holder(true, now).unwrap_or_default();
        if remember {
            self.local().busy.insert(name.to_owned(), file);
        }
        Ok(Acquire::Busy(holder))
    }

    /// With byte 0 of `file` ours: unless it was replaced meanwhile (`None`: start
    /// again), a hold still runs (busy) or the holders have another `--slots`
    /// (refused), writes the next fencing token and ourselves, durably.
    pub(super) async fn take(
        &self,
        dir: &LockDir,
        file_name: &str,
        file: LockFile,
        req: &AcquireRequest,
    ) -> Result<Option<(Acquire, Option<Held>)>, BackendError> {
        // The guard keeps `release --force` from replacing the file between our check
        // that it is the lock's and our counter's write.
        lock_record(file.file(), Kind::Write)
            .await
            .map_err(|e| file.io(&e.into()))?;
        if !dir.is_current(file_name, &file)? {
            return Ok(None);
        }
        let record = file.read()?;
        let now = Now::get();
        check_slots(&file, &record, 1, Some(0), now)?;
        if let Some(kept) = record.holder(false, now) {
            return Ok(Some((Acquire::Busy(kept), None)));
        }
        let (fencing_token, ours) = write_ours(dir, &file, &record, 0, 1, req).await?;
        let _ = try_lock(file.file(), Byte::Record, Kind::Unlock);
        let held = Held {
            token: req.token.clone(),
            lock: file,
            record: ours,
            slot: 0,
        };
        Ok(Some((
            Acquire::Acquired {
                fencing_token,
                slot: 0,
            },
            Some(held),
        )))
    }
}

/// Refuses ([`slots_conflict`]) a record whose holders were taken with another N than
/// `ours` if one of them is still a holder: its slot's byte locked by another open
/// file, or kept by `--hold-at-least`. `mine`: the slot `file` holds (its last holder
/// is gone, unless a hold keeps it). Under the record's guard, so that two lockruns of
/// different N cannot both pass: the second sees the first's record.
pub(super) fn check_slots(
    file: &LockFile,
    record: &Record,
    ours: u32,
    mine: Option<u32>,
    now: Now,
) -> Result<(), BackendError> {
    if record.slots == ours {
        return Ok(());
    }
    for h in &record.holders {
        let kept = !h.hold_left(now).is_zero();
        let locked = || is_locked(file.file(), Byte::Slot(h.slot)).map_err(|e| file.io(&e.into()));
        if kept || (mine != Some(h.slot) && locked()?) {
            return Err(slots_conflict(record.slots, ours));
        }
    }
    Ok(())
}

/// With `slot` of `file` ours and the record's guard held (the record read is
/// `record`): once the slot's last holder (if it crashed on this host) is gone, writes
/// the next fencing token and ourselves as the holder of `slot` of `slots`, durably
/// when a new block of tokens is reserved. The other holders stay (those of the same
/// N: any other is gone, [`check_slots`]). Returns the token and the record written.
pub(super) async fn write_ours(
    dir: &LockDir,
    file: &LockFile,
    record: &Record,
    slot: u32,
    slots: u32,
    req: &AcquireRequest,
) -> Result<(u64, Record), BackendError> {
    if let Some(left) = record.entry(slot) {
        let ours = left.host == stored_host(&req.host) && left.pid != req.pid;
        if left.hold_until_ms == 0 && ours {
            crashed::wait_for_exit(left.pid).await;
        }
    }
    let boot = boot_id();
    let (fencing_token, reserved, durable) = record.next_token(boot).ok_or_else(|| {
        BackendError::Refused(format!(
            "the fencing counter of {} is exhausted",
            file.shown()
        ))
    })?;
    let same_n = record.slots == slots && slots > 1;
    let others = record.holders.iter().filter(|h| same_n && h.slot != slot);
    let mut holders: Vec<HolderLine> = others.cloned().collect();
    holders.push(HolderLine {
        slot,
        fencing: fencing_token,
        token: req.token.clone(),
        host: stored_host(&req.host),
        pid: req.pid,
        since_ms: now_ms(),
        ttl_ms: millis(req.ttl),
        hold_until_ms: 0,
        hold_clock: None,
    });
    holders.sort_by_key(|h| h.slot);
    let ours = Record {
        fencing: fencing_token,
        reserved,
        boot: boot.unwrap_or_default().to_owned(),
        slots,
        holders,
    };
    file.write(&ours)?;
    if durable {
        file.sync()?;
        // A new entry (or one whose creator died before writing it) must survive
        // a crash too, or the counter would start again from nothing.
        if file.created() || record.reserved == 0 {
            dir.sync()?;
        }
    }
    Ok((fencing_token, ours))
}

/// What locking byte 0 gave.
pub(super) enum Attempt {
    Locked(LockFile),
    Busy { file: LockFile, queued: bool },
}

/// The record of `file`, read under the record's shared guard.
pub(super) async fn read_guarded(file: &LockFile) -> Result<Record, BackendError> {
    lock_record(file.file(), Kind::Read)
        .await
        .map_err(|e| file.io(&e.into()))?;
    let record = file.read();
    let _ = try_lock(file.file(), Byte::Record, Kind::Unlock);
    record
}
