//! The lock's requests on the PostgreSQL backend ([`Backend`] for
//! [`PostgresBackend`]): acquisition, of a plain lock or of a semaphore's slot,
//! renewal, release, `status` and `release --force`, waiting (in the waiters' queue,
//! woken by NOTIFY or polling); and the reading of the statements' answer rows. The statements are in
//! `sql.rs` and `slots.rs`; part of [`super`].

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::keys::{legacy_key, name_of};
use super::records::{end_param, parse_row, record_key};
use super::slots::{limit_key, name_lock_id, queue_key, slot_key, slot_keys, stored_token};
use super::sql::{millis, OnToken};
use super::{Missing, Params, PgConn, PostgresBackend, Wake, WAITER_ALIVE};
use crate::backend::conn as slot;
use crate::backend::{
    slots_conflict, wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release,
    RunEnd, RunRecord, MAX_WAIT_SLICE,
};
use crate::log::{emit, Event, Level};

/// How long a waiter that polls sleeps between two tries, with `ahead` waiters before
/// it, for a lock whose lease ends in `expires_in`, and `max` of `--wait` left: the
/// first in the queue, the one that takes the lock next, tries every
/// [`crate::backend::MIN_WAIT_SLICE`] (the floor of every backend's waits, which keeps
/// a waiter from being a busy loop: one first waiter per contended lock asks about 8
/// times a second), so that it starts about 60 ms after a release on average; the
/// others every 250 ms per waiter ahead, at most [`MAX_WAIT_SLICE`] (enough to keep
/// their places, and to be polling fast by the time they are first). Never past the
/// lease's expiry, plus the usual jitter ([`wait_slice`]).
pub(super) fn poll_slice(ahead: u64, expires_in: Duration, max: Duration) -> Duration {
    let behind =
        Duration::from_millis(250).saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX));
    wait_slice(behind.min(MAX_WAIT_SLICE).min(expires_in), max)
}

impl PostgresBackend {
    /// The keys of every slot of `name` (`--slots`).
    fn keys(&self, name: &str) -> Vec<String> {
        slot_keys(&self.key(name), self.slots)
    }

    /// The keys where a semaphore's holder with `token` may be: the slot our
    /// acquisition took, or, for a token we do not know (its answer was lost), every
    /// slot.
    fn keys_of(&self, name: &str, token: &str) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        match held.as_ref() {
            Some((t, slot)) if t == token => vec![slot_key(&self.key(name), *slot)],
            _ => self.keys(name),
        }
    }

    /// Runs `what` on the row held with `token`: `$1` its key (a semaphore's: the keys
    /// of [`PostgresBackend::keys_of`]), `$2` the token as stored, `$3` `arg`; a
    /// semaphore's also `$4` the limit key and `$5` every slot's key; then, for the end
    /// of a run (a release, a hold), the record's key and `end` (`records::end_param`).
    /// Answers how many rows it changed (0: not ours).
    async fn on_token(
        &self,
        name: &str,
        token: &str,
        what: OnToken,
        arg: (&(dyn ToSql + Sync), Type),
        end: Option<RunEnd>,
    ) -> Result<usize, BackendError> {
        let (sql, locked) = self.sql.on_token(what, self.slots);
        let stored = stored_token(token, self.slots);
        let key = self.key(name);
        let (record, end) = (record_key(&key), end_param(end));
        let (keys, limit, all) = (self.keys_of(name, token), limit_key(&key), self.keys(name));
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = match self.slots {
            1 => vec![(&key, Type::TEXT), (&stored, Type::TEXT), arg],
            _ => vec![
                (&keys, Type::TEXT_ARRAY),
                (&stored, Type::TEXT),
                arg,
                (&limit, Type::TEXT),
                (&all, Type::TEXT_ARRAY),
            ],
        };
        if what != OnToken::Extend {
            params.extend([
                (&record as &(dyn ToSql + Sync), Type::TEXT),
                (&end, Type::TEXT),
            ]);
        }
        let lock = locked.then(|| name_lock_id(&self.target.table, &key));
        let rows = self
            .query_locked(lock, sql, &params, Missing::Create)
            .await?;
        Ok(rows.len())
    }

    /// An acquisition; a caller that will wait and finds the lock busy is in the
    /// queue of waiters then (the statement put it there). The first time, it finds
    /// out how it will be woken ([`PostgresBackend::notifications`]); where NOTIFY
    /// works, it LISTENs (once per connection) and tries once more, so a release
    /// between the first try and the LISTEN is not missed. An uncontended run never
    /// pays for it.
    async fn acquire_waiting(
        &self,
        name: &str,
        req: &AcquireRequest,
    ) -> Result<Acquire, BackendError> {
        let first = self.try_acquire(name, req).await?;
        if !self.waiting
            || matches!(first, Acquire::Acquired { .. })
            || !self.notifications(name).await?
            || slot::subscribed(&self.slot, PgConn::wakeups)
        {
            return Ok(first);
        }
        self.listen(name).await?;
        self.try_acquire(name, req).await
    }

    /// True if this waiter can be woken by NOTIFY: its connection is a session of the
    /// server's own, not a pooler's (the cancel key's process id is the server
    /// process's). Found out once a run; polling is said once at `-v`.
    async fn notifications(&self, name: &str) -> Result<bool, BackendError> {
        match self.wake() {
            Wake::Notified => return Ok(true),
            Wake::Polling => return Ok(false),
            Wake::Unknown => {}
        }
        let c = self.conn().await?;
        let answer = c.client.simple_query("SELECT pg_backend_pid()").await;
        let key_pid = c.key_pid;
        let rows = c.settle(answer.map_err(|e| self.error(&e)))?;
        let pid = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse::<i32>().ok(),
            _ => None,
        });
        let direct = pid.is_some() && pid == key_pid;
        let wake = if direct {
            Wake::Notified
        } else {
            Wake::Polling
        };
        self.wake.store(wake as u8, Ordering::Relaxed);
        if !direct {
            let msg = format!(
                "no release notifications from PostgreSQL at {}: a connection pooler \
                 (PgBouncer?) answers for the server, and LISTEN needs a session of the \
                 server's own; waiting for lock {name:?} polls instead (every {} ms when \
                 first in the queue)",
                self.display,
                crate::backend::MIN_WAIT_SLICE.as_millis()
            );
            emit(Level::Info, Event::Waiting, &msg, &[]);
        }
        Ok(direct)
    }

    /// Leaves the queue of `name`'s waiters (giving up); best effort: a place not
    /// given back lapses within [`WAITER_ALIVE`].
    async fn leave_queue(&self, name: &str) {
        if self.waiter.is_empty() {
            return;
        }
        let key = queue_key(&self.key(name));
        let params: &Params<'_> = &[(&key, Type::TEXT), (&self.waiter, Type::TEXT)];
        let _ = self.query(&self.sql.leave, params, Missing::NoRows).await;
    }

    /// One acquisition: the plain statement, or with `--slots` above 1 the semaphore's
    /// in its transaction. No answer row means the row (the slot) was taken by a
    /// transaction that committed after the statement's snapshot: visible to the next.
    async fn try_acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        for attempt in 0..3 {
            let rows = self.acquire_rows(name, req).await?;
            if let Some(row) = rows.first() {
                return self.answer(row, &req.token);
            }
            // A semaphore may have another slot free: ask again before settling for
            // whoever holds one.
            if self.slots == 1 || attempt == 2 {
                let first = self
                    .inspect(name)
                    .await?
                    .into_iter()
                    .min_by_key(|h| h.ttl_left);
                if let Some(holder) = first {
                    return self.busy(holder);
                }
            }
        }
        Ok(Acquire::Busy(Holder::default()))
    }

    /// The answer rows of one acquisition statement (none: see [`Self::try_acquire`]).
    async fn acquire_rows(
        &self,
        name: &str,
        req: &AcquireRequest,
    ) -> Result<Vec<Row>, BackendError> {
        let key = self.key(name);
        let pid = i64::from(req.pid);
        let ttl = millis(req.ttl)?;
        let (keys, token) = (self.keys(name), stored_token(&req.token, self.slots));
        let (limit, queue) = (limit_key(&key), queue_key(&key));
        let legacy = legacy_key(&self.key_prefix, name);
        let alive = millis(WAITER_ALIVE)?;
        let (n, lock) = (
            i64::from(self.slots),
            name_lock_id(&self.target.table, &key),
        );
        match self.slots {
            1 => {
                let params: &Params<'_> = &[
                    (&key, Type::TEXT),
                    (&req.token, Type::TEXT),
                    (&req.host, Type::TEXT),
                    (&pid, Type::INT8),
                    (&ttl, Type::INT8),
                    (&limit, Type::TEXT),
                    (&queue, Type::TEXT),
                    (&self.waiter, Type::TEXT),
                    (&alive, Type::INT8),
                    (&legacy, Type::TEXT),
                ];
                self.query(&self.sql.acquire, params, Missing::Create).await
            }
            _ => {
                let params: &Params<'_> = &[
                    (&keys, Type::TEXT_ARRAY),
                    (&token, Type::TEXT),
                    (&req.host, Type::TEXT),
                    (&pid, Type::INT8),
                    (&ttl, Type::INT8),
                    (&n, Type::INT8),
                    (&limit, Type::TEXT),
                    (&queue, Type::TEXT),
                    (&self.waiter, Type::TEXT),
                    (&alive, Type::INT8),
                ];
                let sql = &self.sql.acquire_slot;
                self.query_locked(Some(lock), sql, params, Missing::Create)
                    .await
            }
        }
    }

    /// Reads an acquisition's answer row: taken (its fencing token and slot), or the
    /// holder of a busy lock; and how many waiters are ahead (column 8).
    fn answer(&self, row: &Row, token: &str) -> Result<Acquire, BackendError> {
        self.ahead.store(self.number(row, 8)?, Ordering::Relaxed);
        match row.try_get::<_, bool>(0) {
            Ok(true) => {
                let slot = u32::try_from(self.number(row, 6)?)
                    .ok()
                    .filter(|&s| s < self.slots)
                    .ok_or_else(|| self.unexpected())?;
                // A sequence starts at 1: a token of 0 is not our table's.
                let fencing_token = match self.number(row, 1)? {
                    0 => return Err(self.unexpected()),
                    t => t,
                };
                let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
                *held = Some((token.to_owned(), slot));
                Ok(Acquire::Acquired {
                    fencing_token,
                    slot,
                })
            }
            Ok(false) => self.busy(self.holder(row, 1)?),
            Err(_) => Err(self.unexpected()),
        }
    }

    /// Busy with `holder`; refused when it is live and was taken with another
    /// `--slots` (an acquisition of a semaphore takes nothing then).
    fn busy(&self, holder: Holder) -> Result<Acquire, BackendError> {
        if holder.slots != self.slots && !holder.ttl_left.is_zero() {
            return Err(slots_conflict(holder.slots, self.slots));
        }
        Ok(Acquire::Busy(holder))
    }

    fn unexpected(&self) -> BackendError {
        BackendError::Refused(format!(
            "PostgreSQL at {} gave an unexpected answer: is {} a lockrun table?",
            self.display, self.target.table
        ))
    }

    fn number(&self, row: &Row, i: usize) -> Result<u64, BackendError> {
        let n: i64 = row.try_get(i).map_err(|_| self.unexpected())?;
        u64::try_from(n).map_err(|_| self.unexpected())
    }

    /// Parses `fence, host, pid, since_ms, ttl_ms, slot, slots` from column `at` on.
    fn holder(&self, row: &Row, at: usize) -> Result<Holder, BackendError> {
        let small = |i: usize| -> Result<Option<u32>, BackendError> {
            Ok(u32::try_from(self.number(row, i)?).ok())
        };
        Ok(Holder {
            fencing_token: self.number(row, at)?,
            host: row.try_get(at + 1).map_err(|_| self.unexpected())?,
            pid: small(at + 2)?.unwrap_or(0),
            since_ms: self.number(row, at + 3)?,
            ttl_left: Duration::from_millis(self.number(row, at + 4)?),
            slot: small(at + 5)?.unwrap_or(0),
            slots: small(at + 6)?.filter(|&n| n >= 1).unwrap_or(1),
        })
    }
}

impl Backend for PostgresBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        self.acquire_waiting(name, req).await
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let ttl = millis(ttl)?;
        match self
            .on_token(name, token, OnToken::Extend, (&ttl, Type::INT8), None)
            .await?
        {
            0 => Err(BackendError::NotOwner),
            _ => Ok(()),
        }
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        // The run's record is left by the same statement.
        let released = match how {
            Release::Now => {
                let channel = self.channel(name);
                let arg = (&channel as &(dyn ToSql + Sync), Type::TEXT);
                self.on_token(name, token, OnToken::Release, arg, end)
                    .await?
            }
            Release::KeepFor(d) => {
                let keep = millis(d)?;
                self.on_token(name, token, OnToken::Keep, (&keep, Type::INT8), end)
                    .await?
            }
        };
        // Releasing ends a run: nothing more to ask.
        self.close().await;
        match released {
            0 => Err(BackendError::NotOwner),
            _ => Ok(()),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let (keys, limit, n) = (
            self.keys(name),
            limit_key(&self.key(name)),
            i64::from(self.slots),
        );
        let params: &Params<'_> = &[
            (&keys, Type::TEXT_ARRAY),
            (&limit, Type::TEXT),
            (&n, Type::INT8),
        ];
        let rows = self
            .query(&self.sql.inspect, params, Missing::NoRows)
            .await?;
        rows.iter().map(|r| self.holder(r, 0)).collect()
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        let under = format!("{}{{", self.key_prefix);
        let params: &Params<'_> = &[(&under, Type::TEXT)];
        let rows = self.query(&self.sql.names, params, Missing::NoRows).await?;
        let prefix = &self.key_prefix;
        Ok(rows
            .iter()
            .filter_map(|r| r.try_get::<_, String>(0).ok())
            .filter_map(|key| name_of(prefix, &key))
            .collect())
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        let record = record_key(&self.key(name));
        let params: &Params<'_> = &[(&record, Type::TEXT)];
        let rows = self
            .query(&self.sql.last_run, params, Missing::NoRows)
            .await?;
        match rows.first() {
            None => Ok(None),
            Some(row) => parse_row(row).map(Some).ok_or_else(|| {
                BackendError::Refused(format!(
                    "PostgreSQL at {} holds a record of lock {name:?}'s last run that \
                     lockrun did not write (row {record:?} of {}): delete that row; the \
                     next run writes it anew",
                    self.display, self.target.table
                ))
            }),
        }
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let key = self.key(name);
        let (keys, channel, limit) = (self.keys(name), self.channel(name), limit_key(&key));
        let params: &Params<'_> = &[
            (&keys, Type::TEXT_ARRAY),
            (&channel, Type::TEXT),
            (&limit, Type::TEXT),
        ];
        let lock = Some(name_lock_id(&self.target.table, &key));
        let rows = self
            .query_locked(lock, &self.sql.force, params, Missing::NoRows)
            .await?;
        rows.iter().map(|r| self.holder(r, 0)).collect()
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // Polling: the first waiter promptly, the others as far back as they are.
        if self.wake() != Wake::Notified {
            let ahead = self.ahead.load(Ordering::Relaxed);
            tokio::time::sleep(poll_slice(ahead, busy.ttl_left, max)).await;
            return Ok(());
        }
        let slice = wait_slice(busy.ttl_left, max);
        // The connection's end (`None`) forgets it: the next call listens again.
        slot::wait_for_wakeup(&self.slot, PgConn::wakeups, slice, async |w| w.recv().await).await;
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        // Our place in the queue is given back (it would lapse anyway); a LISTEN ends
        // with the connection. Giving up on a busy lock ends a run, so the connection
        // is closed (a release that may follow, when abandoning, reconnects).
        self.leave_queue(name).await;
        self.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MIN_WAIT_SLICE;

    #[test]
    fn the_first_waiter_polls_promptly_and_the_others_by_their_place() {
        let (ms, long) = (Duration::from_millis, Duration::from_secs(60));
        for _ in 0..100 {
            let first = poll_slice(0, long, long);
            assert!(first >= MIN_WAIT_SLICE && first < ms(150), "{first:?}");
            let third = poll_slice(2, long, long);
            assert!(third >= ms(500) && third < ms(550), "{third:?}");
            let far = poll_slice(1000, long, long);
            assert!(
                far >= MAX_WAIT_SLICE && far < MAX_WAIT_SLICE + ms(50),
                "{far:?}"
            );
            // Never past the lease's end (but not faster than the floor), nor the wait left.
            let ending = poll_slice(5, ms(300), long);
            assert!(ending >= ms(300) && ending < ms(350), "{ending:?}");
            assert_eq!(poll_slice(5, long, ms(20)), ms(20));
        }
    }

    #[test]
    fn a_waiters_place_outlasts_three_of_its_longest_sleeps() {
        assert_eq!(WAITER_ALIVE, MAX_WAIT_SLICE * 3);
    }
}
