//! Waking waiters on MySQL, which has no notifications: a named lock (`GET_LOCK`) per
//! slot of a name, held by the session of the lockrun that holds the slot. A waiter
//! blocks in `GET_LOCK` on it until the holder's session lets it go (its release
//! closes the session; a crashed holder's session ends with it), or its slice ends;
//! then it lets go at once and asks again. Part of [`super`].
//!
//! The named lock decides nothing: the lease row and the queue do (a woken waiter may
//! find the lock busy or someone before it in the queue, and waits again). So a named
//! lock lost with its session (a reconnect), one a waiter holds for an instant when
//! the next holder asks for it (the next holder then holds none), or a server that
//! rounds the fractional timeout down (MySQL before 8 may) only cost promptness: a
//! named lock that nobody holds is found at once, and the waiter then sleeps as the
//! polling waiters do (`requests::poll_slice`), never less.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use super::requests::poll_slice;
use super::{Fail, MysqlBackend};
use crate::backend::{wait_slice, Holder, MIN_WAIT_SLICE};

/// How much longer than its own timeout a `GET_LOCK` may take before the call is
/// abandoned (and its connection with it): a frozen server answers never.
const GRACE: Duration = Duration::from_secs(1);

impl MysqlBackend {
    /// The named lock of slot `slot` of lock `name`: at most 64 characters, as MySQL
    /// wants, from a digest of the database, the table and the slot's key.
    pub(super) fn signal_name(&self, name: &str, slot: u32) -> String {
        let t = &self.target;
        let text = format!("{}\n{}\n{}#{slot}", t.database, t.table, self.key(name));
        let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let hex: String = digest.as_ref()[..20]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("lockrun_{hex}")
    }

    /// Takes the named lock of the slot just acquired, if it is free now (a waiter
    /// may hold it for an instant); a failure changes nothing but promptness.
    pub(super) async fn hold_signal(&self, name: &str, slot: u32) {
        let signal = self.signal_name(name, slot);
        let _ = self
            .transaction(
                || Some(()),
                async |tx| Ok(tx.exec_drop("DO GET_LOCK(?, 0)", (&signal,)).await?),
            )
            .await;
    }

    /// Waits for the holder of slot `busy.slot` to let its named lock go, at most
    /// the slice a waiter sleeps ([`wait_slice`]); a named lock found free sleeps as
    /// a polling waiter does.
    pub(super) async fn wait_for_signal(&self, name: &str, busy: &Holder, max: Duration) {
        let ahead = self.ahead.load(Ordering::Relaxed);
        // With N slots, the first N of the queue are next: each polls promptly.
        let ahead = ahead.saturating_sub(u64::from(self.slots.max(1)) - 1);
        let poll = poll_slice(ahead, busy.ttl_left, max);
        if busy.ttl_left.is_zero() {
            // A free lock with waiters before us: no holder to wait for.
            tokio::time::sleep(poll).await;
            return;
        }
        let slice = wait_slice(busy.ttl_left, max);
        let signal = self.signal_name(name, busy.slot);
        let start = Instant::now();
        let got = tokio::time::timeout(
            slice + GRACE,
            self.transaction(
                || Some(false),
                async |tx| {
                    let secs = slice.as_secs_f64();
                    let got: Option<Option<i64>> = tx
                        .exec_first("SELECT GET_LOCK(?, ?)", (&signal, secs))
                        .await?;
                    if got == Some(Some(1)) {
                        tx.exec_drop("DO RELEASE_LOCK(?)", (&signal,)).await?;
                        return Ok(true);
                    }
                    Ok::<_, Fail>(false)
                },
            ),
        )
        .await;
        let waited = start.elapsed();
        let woken = matches!(got, Ok(Ok(true))) && waited >= MIN_WAIT_SLICE;
        let timed_out = matches!(got, Ok(Ok(false)));
        if !woken && !timed_out {
            // Nobody held it, or the server did not say: poll instead.
            tokio::time::sleep(poll.saturating_sub(waited)).await;
        }
    }
}
