//! Waking waiters on MySQL, which has no notifications: a named lock (`GET_LOCK`) per
//! slot of a name, held by the session of the lockrun that holds the slot. A waiter
//! blocks in `GET_LOCK` on it until the holder's session lets it go (its release
//! closes the session; a crashed holder's session ends with it), or its slice ends;
//! then it lets go at once and asks again. Part of [`super`].
//!
//! The named lock decides nothing: the lease row and the queue do (a woken waiter may
//! find the lock busy or someone before it in the queue, and waits again). So a named
//! lock lost with its session (a reconnect), one that waiters hold longer than the next
//! holder waits for it (that holder then holds none), or a server that rounds the
//! fractional timeout down only cost promptness: a named lock that no session holds
//! (`IS_USED_LOCK`) wakes no one, and the waiter then sleeps as the polling waiters do
//! (`requests::poll_slice`), never less.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use super::requests::poll_slice;
use super::{Fail, MysqlBackend};
use crate::backend::{wait_slice, Holder};

/// How long a new holder waits for its slot's named lock: the woken waiters hold it
/// one round trip each, and a stale holder's frozen session could hold it for good.
const TAKE: Duration = Duration::from_millis(100);

/// How much longer than its own timeout a `GET_LOCK` may take before the call is
/// abandoned (and its connection with it): a frozen server answers never.
const GRACE: Duration = Duration::from_secs(1);

/// What a waiter found of its holder's named lock.
enum Signal {
    /// Held by no session.
    Free,
    /// Let go while we waited (or just before).
    LetGo,
    /// Still held when the slice ended.
    TimedOut,
}

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

    /// Takes the named lock of the slot just acquired, waiting up to [`TAKE`] for the
    /// woken waiters that each hold it for an instant; a failure changes nothing but
    /// promptness.
    pub(super) async fn hold_signal(&self, name: &str, slot: u32) {
        let signal = self.signal_name(name, slot);
        let _ = self
            .transaction(
                || Some(()),
                async |tx| {
                    Ok(tx
                        .exec_drop("DO GET_LOCK(?, ?)", (&signal, TAKE.as_secs_f64()))
                        .await?)
                },
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
        // A free lock with waiters before us (no lease left): the one before us is
        // about to take slot `busy.slot`; wait on it as on a holder, for as long as a
        // polling waiter would sleep.
        let slice = match busy.ttl_left.is_zero() {
            true => poll,
            false => wait_slice(busy.ttl_left, max),
        };
        let signal = self.signal_name(name, busy.slot);
        let start = Instant::now();
        let got = tokio::time::timeout(
            slice + GRACE,
            self.transaction(
                || Some(Signal::Free),
                async |tx| {
                    // Held by no session (no holder, or one that could not take it):
                    // nothing will wake us.
                    let used: Option<Option<i64>> =
                        tx.exec_first("SELECT IS_USED_LOCK(?)", (&signal,)).await?;
                    if used.flatten().is_none() {
                        return Ok(Signal::Free);
                    }
                    let secs = slice.as_secs_f64();
                    let got: Option<Option<i64>> = tx
                        .exec_first("SELECT GET_LOCK(?, ?)", (&signal, secs))
                        .await?;
                    if got.flatten() != Some(1) {
                        return Ok(Signal::TimedOut);
                    }
                    tx.exec_drop("DO RELEASE_LOCK(?)", (&signal,)).await?;
                    Ok::<_, Fail>(Signal::LetGo)
                },
            ),
        )
        .await;
        match got {
            Ok(Ok(Signal::LetGo | Signal::TimedOut)) => {}
            // Nobody to wake us, or the server did not say: poll instead.
            _ => tokio::time::sleep(poll.saturating_sub(start.elapsed())).await,
        }
    }
}
