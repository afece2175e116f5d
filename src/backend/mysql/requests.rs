//! The lock's requests on MySQL: each a transaction of [`MysqlBackend::transaction`]
//! that takes the name's row lock, reads the name's rows ([`Name`]) and writes what
//! they say. Part of [`super`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Transaction;
use serde_json::{json, Value};

use super::errors::unexpected;
use super::sql::{slot_key, waiter_key, Name, Row};
use super::{Fail, MysqlBackend, WAITER_ALIVE};
use crate::backend::{
    slots_conflict, wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, LastOk,
    Release, RunEnd, RunRecord, MAX_LEASE, MAX_WAIT_SLICE,
};

/// How long a run's record lasts after its run ended (as on the other backends).
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a waiter sleeps between two tries, with `ahead` waiters before it, for a
/// lock whose lease ends in `expires_in`, and `max` of `--wait` left: the first of the
/// queue every [`crate::backend::MIN_WAIT_SLICE`], the others 250 ms later per waiter
/// ahead, at most [`MAX_WAIT_SLICE`]; never past the lease's expiry ([`wait_slice`]).
pub(super) fn poll_slice(ahead: u64, expires_in: Duration, max: Duration) -> Duration {
    let behind =
        Duration::from_millis(250).saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX));
    wait_slice(behind.min(MAX_WAIT_SLICE).min(expires_in), max)
}

/// `d` in milliseconds; a lease over [`MAX_LEASE`] is refused before anything is written.
fn millis(d: Duration) -> Result<u64, BackendError> {
    if d > MAX_LEASE {
        return Err(BackendError::Refused(format!(
            "a lease of {} is longer than lockrun's longest, {}",
            humantime::format_duration(d),
            humantime::format_duration(MAX_LEASE)
        )));
    }
    Ok(d.as_millis() as u64)
}

/// At most 255 bytes of `host`, cut at a character's boundary.
fn short(host: &str) -> &str {
    let mut end = host.len().min(255);
    while !host.is_char_boundary(end) {
        end -= 1;
    }
    &host[..end]
}

impl MysqlBackend {
    /// Every row of the lock whose key is `key`, locked, with the database's clock.
    async fn read(&self, tx: &mut Transaction<'_>, key: &str) -> Result<Name, Fail> {
        let (from, to) = (format!("{key}#"), format!("{key}$"));
        let rows: Vec<mysql_async::Row> = tx.exec(&self.sql.rows, (key, from, to)).await?;
        let mut now = 0;
        let mut read = Vec::with_capacity(rows.len());
        for r in rows {
            let (row, clock) = self.row(r).ok_or_else(|| Fail::Lock(unexpected(self)))?;
            now = clock;
            read.push(row);
        }
        Ok(Name::new(key, read, now))
    }

    /// One row of [`super::sql::Sql::rows`], and the clock.
    fn row(&self, mut r: mysql_async::Row) -> Option<(Row, u64)> {
        let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
        let row = Row {
            key: r.take_opt(0)?.ok()?,
            token: text(r.take_opt(1)?.ok()?),
            fence: r.take_opt(2)?.ok()?,
            host: text(r.take_opt(3)?.ok()?),
            pid: r.take_opt(4)?.ok()?,
            since_ms: r.take_opt(5)?.ok()?,
            expires_ms: r.take_opt(6)?.ok()?,
            slots: r.take_opt(7)?.ok()?,
            record: r.take_opt::<Option<Vec<u8>>, _>(8)?.ok()?.map(text),
            record_ms: r.take_opt(9)?.ok()?,
        };
        Some((row, r.take_opt(10)?.ok()?))
    }

    /// The next fencing token.
    async fn next_fence(&self, tx: &mut Transaction<'_>) -> Result<u64, Fail> {
        tx.exec_drop(&self.sql.next_fence, ()).await?;
        tx.last_insert_id()
            .filter(|&f| f > 0)
            .ok_or_else(|| Fail::Lock(unexpected(self)))
    }

    /// Property 8: an acquisition that added a row (a name without one) deletes a few
    /// rows of other names unused for a day, so the table holds about a day's worth of
    /// names; rows another step has locked are skipped, never waited for.
    async fn sweep(&self, tx: &mut Transaction<'_>, key: &str, name: &Name) -> Result<(), Fail> {
        // A row just made: the name was never taken (or its row was swept).
        if !name
            .head
            .as_ref()
            .is_some_and(|h| h.fence == 0 && h.record_ms == 0)
        {
            return Ok(());
        }
        let (from, to) = (format!("{key}#"), format!("{key}$"));
        let unused: Vec<Vec<u8>> = tx.exec(&self.sql.unused, (key, from, to)).await?;
        for key in unused {
            tx.exec_drop(&self.sql.delete, (key,)).await?;
        }
        Ok(())
    }

    /// One try at taking a slot of `key` (see [`super`]).
    async fn try_acquire(
        &self,
        tx: &mut Transaction<'_>,
        key: &str,
        req: &AcquireRequest,
        ttl: u64,
    ) -> Result<Acquire, Fail> {
        tx.exec_drop(&self.sql.lock_name, (key,)).await?;
        let name = self.read(tx, key).await?;
        self.sweep(tx, key, &name).await?;
        if let Some(theirs) = name.conflict(self.slots) {
            return Err(Fail::Lock(slots_conflict(theirs, self.slots)));
        }
        for id in &name.lapsed {
            tx.exec_drop(&self.sql.delete, (waiter_key(key, id),))
                .await?;
        }
        self.ahead
            .store(name.ahead(&self.waiter), Ordering::Relaxed);
        let Some(slot) = name.free_slot(self.slots, &self.waiter) else {
            if !self.waiter.is_empty() {
                let ticket = match name.ticket(&self.waiter) {
                    Some(t) => t,
                    None => self.next_fence(tx).await?,
                };
                let alive = name.now + WAITER_ALIVE.as_millis() as u64;
                let wkey = waiter_key(key, &self.waiter);
                tx.exec_drop(&self.sql.queue, (wkey, ticket, alive, alive))
                    .await?;
            }
            return Ok(Acquire::Busy(name.first_to_end()));
        };
        let skey = slot_key(key, slot);
        if slot != 0 {
            tx.exec_drop(&self.sql.lock_name, (&skey,)).await?;
        }
        let fencing_token = self.next_fence(tx).await?;
        let params = (
            &req.token,
            fencing_token,
            short(&req.host),
            req.pid,
            ttl,
            self.slots,
            &skey,
        );
        tx.exec_drop(&self.sql.take, params).await?;
        if name.ticket(&self.waiter).is_some() {
            tx.exec_drop(&self.sql.delete, (waiter_key(key, &self.waiter),))
                .await?;
        }
        Ok(Acquire::Acquired {
            fencing_token,
            slot,
        })
    }

    /// Gives up our slot of `key` (see [`Backend::release`]).
    async fn give_back(
        &self,
        tx: &mut Transaction<'_>,
        key: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), Fail> {
        tx.exec_drop(&self.sql.lock_name, (key,)).await?;
        let name = self.read(tx, key).await?;
        let Some((slot, row)) = name.find(token) else {
            return Err(Fail::Lock(BackendError::NotOwner));
        };
        let skey = slot_key(key, slot);
        match how {
            Release::Now => tx.exec_drop(&self.sql.end, (0u64, "", &skey)).await?,
            Release::KeepFor(d) => {
                let until = name.now + millis(d).map_err(Fail::Lock)?;
                tx.exec_drop(&self.sql.end, (until, token, &skey)).await?
            }
        }
        if let Some(end) = end {
            let record = self.record(&name, slot, row, end);
            let kept = name.now + KEEP.as_millis() as u64;
            tx.exec_drop(&self.sql.record, (record, kept, key)).await?;
        }
        Ok(())
    }

    /// The record of the run that held `row` (slot `slot`) and ended with `end`, with
    /// the last success: this run's if it exited 0, else the one the record kept.
    fn record(&self, name: &Name, slot: u32, row: &Row, end: RunEnd) -> String {
        let last_ok = match end.exit_status {
            0 => json!({"host": row.host, "started_ms": row.since_ms}),
            _ => name
                .head
                .as_ref()
                .filter(|h| h.record_ms > name.now)
                .and_then(|h| h.record.as_deref())
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .map(|v| v["last_ok"].clone())
                .unwrap_or(Value::Null),
        };
        json!({
            "host": row.host, "pid": row.pid, "fencing_token": row.fence, "slot": slot,
            "started_ms": row.since_ms, "ended_ms": name.now,
            "exit_status": end.exit_status, "ended_by": end.ended_by.as_str(),
            "last_ok": last_ok,
        })
        .to_string()
    }
}

impl Backend for MysqlBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let (key, ttl) = (self.key(name), millis(req.ttl)?);
        let answer = self
            .transaction(
                || None,
                async |tx| self.try_acquire(tx, &key, req, ttl).await,
            )
            .await?;
        if let Acquire::Acquired { slot, .. } = answer {
            *self.held() = Some((req.token.clone(), slot));
            self.hold_signal(name, slot).await;
        }
        Ok(answer)
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let (key, ttl) = (self.key(name), millis(ttl)?);
        let known = self
            .held()
            .clone()
            .filter(|(t, _)| t == token)
            .map(|(_, s)| s);
        self.transaction(
            || None,
            async |tx| {
                let slot = match known {
                    Some(s) => s,
                    None => match self.read(tx, &key).await?.find(token) {
                        Some((s, _)) => s,
                        None => return Err(Fail::Lock(BackendError::NotOwner)),
                    },
                };
                tx.exec_drop(&self.sql.renew, (ttl, slot_key(&key, slot), token))
                    .await?;
                match tx.affected_rows() {
                    0 => Err(Fail::Lock(BackendError::NotOwner)),
                    _ => Ok(()),
                }
            },
        )
        .await
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let key = self.key(name);
        let released = self
            .transaction(
                || None,
                async |tx| self.give_back(tx, &key, token, how, end).await,
            )
            .await;
        // Releasing ends a run: nothing more to ask.
        self.close().await;
        released
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let key = self.key(name);
        self.transaction(
            || Some(Vec::new()),
            async |tx| Ok(self.read(tx, &key).await?.holders()),
        )
        .await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        let key = self.key(name);
        let name = self
            .transaction(
                || Some(Name::default()),
                async |tx| self.read(tx, &key).await,
            )
            .await?;
        let Some(text) = name
            .head
            .as_ref()
            .filter(|h| h.record_ms > name.now)
            .and_then(|h| h.record.as_deref())
        else {
            return Ok(None);
        };
        let v: Value = serde_json::from_str(text).map_err(|_| unexpected(self))?;
        let ended_ms = v["ended_ms"].as_u64().ok_or_else(|| unexpected(self))?;
        let mut record = RunRecord::from_json(&v, ended_ms).ok_or_else(|| unexpected(self))?;
        record.last_ok = LastOk::from_json(&v["last_ok"]);
        Ok(Some(record))
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        let prefix = &self.key_prefix;
        let (from, to) = (format!("{prefix}{{"), format!("{prefix}|"));
        let keys: Vec<Vec<u8>> = self
            .transaction(
                || Some(Vec::new()),
                async |tx| Ok(tx.exec(&self.sql.names, (&from, &to)).await?),
            )
            .await?;
        Ok(keys
            .iter()
            .filter_map(|k| crate::backend::keys::name_of(prefix, &String::from_utf8_lossy(k)))
            .collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let key = self.key(name);
        self.transaction(
            || Some(Vec::new()),
            async |tx| {
                let name = self.read(tx, &key).await?;
                for h in name.holders() {
                    let skey = slot_key(&key, h.slot);
                    tx.exec_drop(&self.sql.end, (0u64, "", skey)).await?;
                }
                Ok(name.holders())
            },
        )
        .await
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        self.wait_for_signal(name, busy, max).await;
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        if self.waiter.is_empty() {
            return Ok(());
        }
        // Our place would lapse anyway: a failure here changes nothing.
        let wkey = waiter_key(&self.key(name), &self.waiter);
        let _ = self
            .transaction(
                || Some(()),
                async |tx| Ok(tx.exec_drop(&self.sql.delete, (&wkey,)).await?),
            )
            .await;
        self.close().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_waiter_polls_promptly_and_the_others_by_their_place() {
        let (ms, long) = (Duration::from_millis, Duration::from_secs(60));
        for _ in 0..50 {
            assert!(poll_slice(0, long, long) < ms(150));
            let third = poll_slice(2, long, long);
            assert!(third >= ms(500) && third < ms(550), "{third:?}");
            assert!(poll_slice(1000, long, long) < MAX_WAIT_SLICE + ms(50));
        }
        assert_eq!(poll_slice(5, long, ms(20)), ms(20));
    }

    #[test]
    fn long_host_names_are_cut_at_a_character() {
        let host = "é".repeat(200);
        assert!(short(&host).len() <= 255 && short(&host).len().is_multiple_of(2));
        assert_eq!(short("h"), "h");
    }
}
