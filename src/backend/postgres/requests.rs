//! The lock's requests on the PostgreSQL backend ([`Backend`] for
//! [`PostgresBackend`]): acquisition, of a plain lock or of a semaphore's slot,
//! renewal, release, `status` and `release --force`, waiting (a semaphore's waiters in
//! their queue); and the reading of the statements' answer rows. The statements are in
//! `sql.rs` and `slots.rs`; part of [`super`].

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::keys::legacy_key;
use super::slots::{join_queue, leave_queue, limit_key, name_lock_id, queue_lock_id};
use super::slots::{slot_key, slot_keys, stored_token};
use super::sql::{millis, OnToken};
use super::{Missing, Params, PgConn, PostgresBackend};
use crate::backend::conn as slot;
use crate::backend::{
    slots_conflict, wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release,
};

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
    /// semaphore's also `$4` the limit key and `$5` every slot's key. Answers how many
    /// rows it changed (0: not ours).
    async fn on_token(
        &self,
        name: &str,
        token: &str,
        what: OnToken,
        arg: (&(dyn ToSql + Sync), Type),
    ) -> Result<usize, BackendError> {
        let (sql, locked) = self.sql.on_token(what, self.slots);
        let stored = stored_token(token, self.slots);
        let key = self.key(name);
        let rows = match self.slots {
            1 => {
                let params: &Params<'_> = &[(&key, Type::TEXT), (&stored, Type::TEXT), arg];
                self.query(sql, params, Missing::Create).await?
            }
            _ => {
                let (keys, limit, all) =
                    (self.keys_of(name, token), limit_key(&key), self.keys(name));
                let params: &Params<'_> = &[
                    (&keys, Type::TEXT_ARRAY),
                    (&stored, Type::TEXT),
                    arg,
                    (&limit, Type::TEXT),
                    (&all, Type::TEXT_ARRAY),
                ];
                let lock = locked.then(|| name_lock_id(&self.target.table, &key));
                self.query_locked(lock, sql, params, Missing::Create)
                    .await?
            }
        };
        Ok(rows.len())
    }

    /// An acquisition that, when busy for a caller that will wait, LISTENs for
    /// releases first.
    async fn acquire_listening(
        &self,
        name: &str,
        req: &AcquireRequest,
    ) -> Result<Acquire, BackendError> {
        let first = self.try_acquire(name, req).await?;
        if !self.waiting
            || matches!(first, Acquire::Acquired { .. })
            || slot::subscribed(&self.slot, PgConn::wakeups)
        {
            return Ok(first);
        }
        // Busy, and about to wait: LISTEN, then try once more, so a release between the
        // first try and the LISTEN is not missed. An uncontended run never pays for it.
        self.listen(name).await?;
        self.try_acquire(name, req).await
    }

    /// The queue lock of `name`'s waiters (see `slots::join_queue`).
    fn queue_id(&self, name: &str) -> i64 {
        queue_lock_id(&self.target.table, &self.key(name))
    }

    /// Whether this waiter is the head of its semaphore's queue (on the connection it
    /// has now).
    fn is_head(&self) -> bool {
        self.slot
            .current()
            .is_some_and(|(c, _)| c.queued.load(Ordering::Relaxed))
    }

    /// Waits, at most `max`, to be the head of the queue of `name`'s waiters: every
    /// waiter that came before it has a slot or has left. Then (or when the wait ran
    /// out) the caller tries again.
    async fn join_queue(&self, name: &str, max: Duration) -> Result<(), BackendError> {
        let c = self.conn().await?;
        let [begin, lock] = join_queue(self.queue_id(name), max);
        let (begun, locked, committed) = futures_util::future::join3(
            c.client.batch_execute(&begin),
            c.client.batch_execute(&lock),
            c.client.batch_execute("COMMIT"),
        )
        .await;
        match begun.and(locked).and(committed) {
            Ok(()) => {
                c.queued.store(true, Ordering::Relaxed);
                c.keep();
                Ok(())
            }
            Err(e)
                if [SqlState::LOCK_NOT_AVAILABLE, SqlState::QUERY_CANCELED]
                    .iter()
                    .any(|code| e.code() == Some(code)) =>
            {
                c.keep();
                Ok(())
            }
            Err(e) => c.settle(Err(self.error(&e))),
        }
    }

    /// Leaves the queue of `name`'s waiters if this session is its head: it has a slot.
    /// A failure drops the connection, and the session's end leaves the queue too.
    async fn leave_queue(&self, name: &str) {
        if !self.is_head() {
            return;
        }
        let Ok(c) = self.conn().await else { return };
        let left = c
            .client
            .batch_execute(&leave_queue(self.queue_id(name)))
            .await;
        if left.is_ok() {
            c.queued.store(false, Ordering::Relaxed);
        }
        let _ = c.settle(left);
    }

    /// One acquisition: the plain statement, or with `--slots` above 1 the semaphore's
    /// in its transaction. No answer row means the row (the slot) was taken by a
    /// transaction that committed after the statement's snapshot: visible to the next.
    async fn try_acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let key = self.key(name);
        let pid = i64::from(req.pid);
        let ttl = millis(req.ttl)?;
        let (keys, token) = (self.keys(name), stored_token(&req.token, self.slots));
        let (limit, legacy) = (limit_key(&key), legacy_key(&self.key_prefix, name));
        let (n, lock) = (
            i64::from(self.slots),
            name_lock_id(&self.target.table, &key),
        );
        for attempt in 0..3 {
            let rows = match self.slots {
                1 => {
                    let params: &Params<'_> = &[
                        (&key, Type::TEXT),
                        (&req.token, Type::TEXT),
                        (&req.host, Type::TEXT),
                        (&pid, Type::INT8),
                        (&ttl, Type::INT8),
                        (&limit, Type::TEXT),
                        (&legacy, Type::TEXT),
                    ];
                    self.query(&self.sql.acquire, params, Missing::Create)
                        .await?
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
                    ];
                    let sql = &self.sql.acquire_slot;
                    self.query_locked(Some(lock), sql, params, Missing::Create)
                        .await?
                }
            };
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

    /// Reads an acquisition's answer row: taken (its fencing token and slot), or the
    /// holder of a busy lock.
    fn answer(&self, row: &Row, token: &str) -> Result<Acquire, BackendError> {
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
        let answer = self.acquire_listening(name, req).await?;
        if matches!(answer, Acquire::Acquired { .. }) {
            self.leave_queue(name).await;
        }
        Ok(answer)
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let ttl = millis(ttl)?;
        match self
            .on_token(name, token, OnToken::Extend, (&ttl, Type::INT8))
            .await?
        {
            0 => Err(BackendError::NotOwner),
            _ => Ok(()),
        }
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        let released = match how {
            Release::Now => {
                let channel = self.channel(name);
                let arg = (&channel as &(dyn ToSql + Sync), Type::TEXT);
                self.on_token(name, token, OnToken::Release, arg).await?
            }
            Release::KeepFor(d) => {
                let keep = millis(d)?;
                self.on_token(name, token, OnToken::Keep, (&keep, Type::INT8))
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
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // A semaphore's waiter queues first; only the head waits for a release.
        if self.slots > 1 && self.waiting && !self.is_head() {
            return self.join_queue(name, max).await;
        }
        let slice = wait_slice(busy.ttl_left, max);
        // The connection's end (`None`) forgets it: the next call listens again.
        slot::wait_for_wakeup(&self.slot, PgConn::wakeups, slice, async |w| w.recv().await).await;
        Ok(())
    }

    async fn stop_waiting(&self, _name: &str) -> Result<(), BackendError> {
        // Nothing is queued on the server: a LISTEN ends with the connection. Giving up
        // on a busy lock ends a run, so the connection is closed (a release that may
        // follow, when abandoning, reconnects).
        self.close().await;
        Ok(())
    }
}
