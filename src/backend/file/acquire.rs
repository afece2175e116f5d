//! Taking a lock file: byte 0 (from a waiter that was granted it, or asked for without
//! waiting), then, under the record's guard, the checks and the durable write of the
//! next fencing token. Part of [`super`].

use std::sync::OnceLock;

use super::crashed;
use super::dir::LockDir;
use super::lock::{lock_record, try_lock, Byte, Kind};
use super::lockfile::LockFile;
use super::record::{is_boot_id, stored_host, HolderLine, Record};
use super::waiter::Found;
use super::{millis, now_ms, FileBackend, Held};
use crate::backend::{Acquire, AcquireRequest, BackendError};

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
        match try_lock(file.file(), Byte::Holder, Kind::Write) {
            Ok(true) => Ok(Attempt::Locked(file)),
            Ok(false) => Ok(Attempt::Busy {
                file,
                queued: false,
            }),
            Err(e) => Err(file.io(&e.into())),
        }
    }

    /// The busy answer: the holder as the record of `file` (locked by someone else)
    /// names it. `remember`: keep `file` for a waiter to wait on.
    pub(super) async fn busy(
        &self,
        name: &str,
        file: LockFile,
        remember: bool,
    ) -> Result<Acquire, BackendError> {
        let record = read_guarded(&file).await?;
        let holder = record.holder(true, now_ms()).unwrap_or_default();
        if remember {
            self.local().busy.insert(name.to_owned(), file);
        }
        Ok(Acquire::Busy(holder))
    }

    /// With byte 0 of `file` ours: unless it was replaced meanwhile (`None`: start
    /// again) or a hold still runs (busy), writes the next fencing token and ourselves,
    /// durably.
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
        let now = now_ms();
        if let Some(kept) = record.holder(false, now) {
            return Ok(Some((Acquire::Busy(kept), None)));
        }
        if let Some(left) = &record.holder {
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
        let ours = Record {
            fencing: fencing_token,
            reserved,
            boot: boot.unwrap_or_default().to_owned(),
            holder: Some(HolderLine {
                token: req.token.clone(),
                host: stored_host(&req.host),
                pid: req.pid,
                since_ms: now,
                ttl_ms: millis(req.ttl),
                hold_until_ms: 0,
            }),
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
        let _ = try_lock(file.file(), Byte::Record, Kind::Unlock);
        let held = Held {
            token: req.token.clone(),
            lock: file,
            record: ours,
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

/// This boot's id (Linux's `/proc/sys/kernel/random/boot_id`), read once; `None` if
/// it cannot be read, and then every token is fsynced.
fn boot_id() -> Option<&'static str> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    BOOT.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        is_boot_id(id).then(|| id.to_owned())
    })
    .as_deref()
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
