//! Taking a slot of a semaphore (`--slots N`, N > 1), and who holds which slot (for
//! `status`, `release --force` and a busy answer). Part of [`super`].
//!
//! An acquire opens the lock file (or, at the head of the line, uses the file it holds
//! the line's byte through: `line.rs`), takes the record's guard, checks that the file
//! is still the lock's, reads the record, and asks for the slots' bytes without
//! waiting, from slot 0 up: the first it gets whose slot no `--hold-at-least` keeps is
//! the lowest free slot. Still under the guard it refuses holders of another N
//! (`check_slots`), then writes the next fencing token (one counter per name, whatever
//! the slot) and itself into the record's list of holders. A waiter behind the head of
//! the line asks for no slot: it only reads who holds them.

use super::acquire::{check_slots, write_ours};
use super::dir::{LockDir, Open};
use super::hold::Now;
use super::line::Turn;
use super::lock::{is_locked, lock_record, try_lock, Byte, Kind};
use super::lockfile::LockFile;
use super::record::Record;
use super::{FileBackend, Held, TRIES};
use crate::backend::{Acquire, AcquireRequest, BackendError, Holder};

/// What one try at a slot gave.
enum Taken {
    /// The file was replaced meanwhile: start again.
    Replaced,
    /// A slot is ours.
    Slot { fencing_token: u64, held: Held },
    /// Every slot is busy: the holder whose lease ends first, and the file (for the
    /// line).
    Busy(Holder, LockFile),
}

/// Where the acquire stands in the line, with the file it tries with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Head,
    Behind,
    Out,
}

impl FileBackend {
    /// Acquires the lowest free slot of `name` (file `file_name` in `dir`).
    pub(super) async fn acquire_slot(
        &self,
        name: &str,
        file_name: &str,
        dir: &LockDir,
        req: &AcquireRequest,
    ) -> Result<Acquire, BackendError> {
        for _ in 0..TRIES {
            let Some((file, queue)) = self.open_in_turn(name, file_name, dir)? else {
                continue;
            };
            let taken = self
                .take_slot(dir, file_name, file, req, queue == Queue::Behind)
                .await?;
            let mut local = self.local();
            match taken {
                Taken::Replaced => {
                    if queue == Queue::Head {
                        local.lines.remove(name);
                    }
                }
                Taken::Slot {
                    fencing_token,
                    held,
                } => {
                    let slot = held.slot;
                    local.lines.remove(name);
                    local.held.insert(name.to_owned(), held);
                    return Ok(Acquire::Acquired {
                        fencing_token,
                        slot,
                    });
                }
                Taken::Busy(holder, file) => {
                    match queue {
                        Queue::Head => {
                            if let Some(line) = local.lines.get_mut(name) {
                                line.put_back(file);
                            }
                        }
                        Queue::Behind => {}
                        Queue::Out => {
                            local.busy.insert(name.to_owned(), file);
                        }
                    }
                    return Ok(Acquire::Busy(holder));
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "the lock file {} kept being replaced; try again",
            dir.show(file_name)
        )))
    }

    /// The lock file of `name` (`file_name` in `dir`), opened as our place in its line
    /// allows, and that place; `None` to try again.
    fn open_in_turn(
        &self,
        name: &str,
        file_name: &str,
        dir: &LockDir,
    ) -> Result<Option<(LockFile, Queue)>, BackendError> {
        Ok(match self.turn(name) {
            Turn::Head(file) => Some((file, Queue::Head)),
            // Read only: its close must not wake the head (it watches for closes
            // after writing).
            Turn::Behind => match dir.open_lock(file_name, Open::Read)? {
                Some(file) if self.line_is_on(name, &file) => Some((file, Queue::Behind)),
                // The file was replaced or removed: that line leads nowhere.
                _ => {
                    self.local().lines.remove(name);
                    None
                }
            },
            Turn::Out => dir
                .open_lock(file_name, Open::Create)?
                .map(|file| (file, Queue::Out)),
        })
    }

    /// Every holder of `name` now, by slot (`status`): read under the record's shared
    /// guard, so never in a run's way.
    pub(super) async fn holders_now(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let file_name = self.file_name(name)?;
        let Some(dir) = self.dir(false)? else {
            return Ok(Vec::new());
        };
        let Some(file) = dir.open_lock(&file_name, Open::Read)? else {
            return Ok(Vec::new());
        };
        lock_record(file.file(), Kind::Read)
            .await
            .map_err(|e| file.io(&e.into()))?;
        let record = file.read()?;
        holders(&file, &record, self.slots, Now::get())
    }

    /// `release --force`: breaks every slot of `name` at once, keeping its counter (a new
    /// file renamed over the lock file); returns the holders broken.
    pub(super) async fn break_every_slot(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let file_name = self.file_name(name)?;
        let Some(dir) = self.dir(false)? else {
            return Ok(Vec::new());
        };
        for _ in 0..TRIES {
            let Some(file) = dir.open_lock(&file_name, Open::Write)? else {
                return Ok(Vec::new());
            };
            // Under the guard no acquirer is between its check of the file and its
            // counter's write: the counter read here is the last one handed out.
            lock_record(file.file(), Kind::Write)
                .await
                .map_err(|e| file.io(&e.into()))?;
            if !dir.is_current(&file_name, &file)? {
                continue;
            }
            let record = file.read()?;
            let broken = holders(&file, &record, self.slots, Now::get())?;
            if broken.is_empty() {
                return Ok(broken);
            }
            // Every slot at once: a new file, the same counter, no holder.
            let free = Record {
                holders: Vec::new(),
                ..record
            };
            dir.replace(&file_name, &free)?;
            return Ok(broken);
        }
        Err(BackendError::Unavailable(format!(
            "the lock file {} kept being replaced; try again",
            dir.show(&file_name)
        )))
    }

    /// Where this lockrun stands in the line of `name`; a line it is out of is left.
    fn turn(&self, name: &str) -> Turn {
        let mut local = self.local();
        let turn = local.lines.get_mut(name).map_or(Turn::Out, |l| l.turn());
        if matches!(turn, Turn::Out) {
            local.lines.remove(name);
        }
        turn
    }

    /// True if this lockrun's line of `name` is the line of `file`.
    fn line_is_on(&self, name: &str, file: &LockFile) -> bool {
        self.local()
            .lines
            .get(name)
            .is_some_and(|l| l.id() == file.id())
    }

    /// One try at the lowest free slot of `file` (see the module documentation);
    /// `behind`: in line behind the head, only read who holds the slots.
    async fn take_slot(
        &self,
        dir: &LockDir,
        file_name: &str,
        file: LockFile,
        req: &AcquireRequest,
        behind: bool,
    ) -> Result<Taken, BackendError> {
        let guard = if behind { Kind::Read } else { Kind::Write };
        lock_record(file.file(), guard)
            .await
            .map_err(|e| file.io(&e.into()))?;
        if !dir.is_current(file_name, &file)? {
            return Ok(Taken::Replaced);
        }
        let record = file.read()?;
        let now = Now::get();
        let n = self.slots;
        let (chosen, busy) = if behind {
            (None, holders(&file, &record, n, now)?)
        } else {
            lowest_free(&file, &record, n, now)?
        };
        check_slots(&file, &record, n, chosen, now)?;
        let Some(slot) = chosen else {
            let _ = try_lock(file.file(), Byte::Record, Kind::Unlock);
            return Ok(Taken::Busy(first_to_end(busy, n), file));
        };
        let (fencing_token, ours) = write_ours(dir, &file, &record, slot, n, req).await?;
        // At the head of the line, the line's byte was held through this file: the
        // next waiter's turn.
        let _ = try_lock(file.file(), Byte::Line, Kind::Unlock);
        let _ = try_lock(file.file(), Byte::Record, Kind::Unlock);
        Ok(Taken::Slot {
            fencing_token,
            held: Held {
                token: req.token.clone(),
                lock: file,
                record: ours,
                slot,
            },
        })
    }
}

/// Under the record's guard: takes the byte of the lowest of `slots` slots that is
/// free and that no `--hold-at-least` keeps; else `None`. Also returns the holders of
/// the slots below it.
fn lowest_free(
    file: &LockFile,
    record: &Record,
    slots: u32,
    now: Now,
) -> Result<(Option<u32>, Vec<Holder>), BackendError> {
    let mut busy = Vec::new();
    for slot in 0..slots {
        let got =
            try_lock(file.file(), Byte::Slot(slot), Kind::Write).map_err(|e| file.io(&e.into()))?;
        if !got {
            busy.extend(record.holder_of(slot, true, now, slots));
            continue;
        }
        match record
            .entry(slot)
            .and_then(|h| h.shown(record.slots, false, now))
        {
            Some(kept) => {
                let _ = try_lock(file.file(), Byte::Slot(slot), Kind::Unlock);
                busy.push(kept);
            }
            None => return Ok((Some(slot), busy)),
        }
    }
    Ok((None, busy))
}

/// Every holder of `file` whose record is `record` (read under its guard): of the
/// slots 0 to N-1, N the larger of `slots` and the record's, by slot.
pub(super) fn holders(
    file: &LockFile,
    record: &Record,
    slots: u32,
    now: Now,
) -> Result<Vec<Holder>, BackendError> {
    let mut all = Vec::new();
    for slot in 0..slots.max(record.slots) {
        let locked = is_locked(file.file(), Byte::Slot(slot)).map_err(|e| file.io(&e.into()))?;
        all.extend(record.holder_of(slot, locked, now, slots));
    }
    Ok(all)
}

/// The holder a busy answer names: the one whose lease ends first (the one a waiter
/// waits for).
fn first_to_end(busy: Vec<Holder>, slots: u32) -> Holder {
    busy.into_iter()
        .min_by_key(|h| h.ttl_left)
        .unwrap_or(Holder {
            slots,
            ..Holder::default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::file::record::HolderLine;

    use crate::backend::file::lockfile::open_for_test as open;

    fn holder(slot: u32, hold_until_ms: u64) -> HolderLine {
        HolderLine {
            slot,
            fencing: 7,
            token: "abc".into(),
            host: "h".into(),
            pid: 1,
            since_ms: 0,
            ttl_ms: 30_000,
            hold_until_ms,
            hold_clock: None,
        }
    }

    #[test]
    fn the_lowest_slot_neither_locked_nor_kept_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let now = Now::wall(1_000_000);
        // Slot 0 locked by another lockrun, slot 1 kept by a hold, slot 2 left by a
        // crashed holder (its byte free, no hold): slot 2 is the lowest free.
        let other = open(&path);
        assert!(try_lock(other.file(), Byte::Slot(0), Kind::Write).unwrap());
        let record = Record {
            fencing: 7,
            slots: 4,
            holders: vec![holder(0, 0), holder(1, 1_005_000), holder(2, 0)],
            ..Record::default()
        };
        let ours = open(&path);
        let (chosen, busy) = lowest_free(&ours, &record, 4, now).unwrap();
        assert_eq!(chosen, Some(2));
        let slots: Vec<u32> = busy.iter().map(|h| h.slot).collect();
        assert_eq!(slots, [0, 1]);
        assert!(is_locked(other.file(), Byte::Slot(2)).unwrap());
        assert!(
            !is_locked(other.file(), Byte::Slot(1)).unwrap(),
            "kept slot left locked"
        );
        // The holder a busy answer names: the hold ends first.
        let first = first_to_end(busy, 4);
        assert_eq!((first.slot, first.ttl_left.as_millis()), (1, 5000));
        // Now slot 3; then none: all four are busy.
        let third = open(&path);
        assert_eq!(lowest_free(&third, &record, 4, now).unwrap().0, Some(3));
        let fourth = open(&path);
        let (none, busy) = lowest_free(&fourth, &record, 4, now).unwrap();
        assert_eq!(none, None);
        assert_eq!(busy.len(), 4);
        // Every holder, by slot: the crashed one's slot shows who holds it now.
        let all = holders(&fourth, &record, 4, now).unwrap();
        let slots: Vec<(u32, u32)> = all.iter().map(|h| (h.slot, h.pid)).collect();
        assert_eq!(slots, [(0, 1), (1, 1), (2, 1), (3, 0)]);
        drop(ours);
        assert_eq!(lowest_free(&fourth, &record, 4, now).unwrap().0, Some(2));
    }
}
