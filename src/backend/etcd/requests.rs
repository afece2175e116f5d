//! The etcd backend's requests that take more than one step (lease grant, keep-alive and
//! revoke, reads of a name's keys and their holders, the `--hold-at-least` hand-over,
//! a waiter's watch), as methods of [`EtcdBackend`]. Part of [`super`].

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};

use super::errors::{access_error, explain, is_lease_not_found, Access};
use super::record::RecordPut;
use super::slots::{Held, Read, SlotKeys};
use super::value::{holder_from, lease_secs, new_lease_id, ttl_secs, MAX_LEASE};
use super::wire::{
    Compare, EventType, FilterType, KeyValue, PutRequest, Request, RequestOp, TxnRequest,
    WatchCreateRequest,
};
use super::{EtcdBackend, OurLease};
use crate::backend::{BackendError, Holder};

/// How many holders' leases are looked up at once (a semaphore may have 1000).
const LOOKUPS_AT_ONCE: usize = 32;

/// The shortest time between two keep-alives of a waiter's lease.
const MIN_KEEP_ALIVE: Duration = Duration::from_millis(100);

impl EtcdBackend {
    /// The line for error `e` of member number `member`: an authentication or
    /// permission refusal names the user and the key prefix ([`access_error`]); any
    /// other error is [`explain`]ed, with a look at the member's port when the
    /// connection was `fresh` (it never answered).
    pub(super) async fn describe(
        &self,
        e: &super::rpc::RpcError,
        member: u64,
        fresh: bool,
    ) -> BackendError {
        let at = self.member_name(member);
        let who = Access {
            user: self.target.credentials.as_ref().map(|(u, _)| u.as_str()),
            prefix: &self.key_prefix,
        };
        match access_error(e, at, who) {
            Some(refused) => refused,
            None => explain(e, &self.target, at, fresh).await,
        }
    }

    /// Revokes lease `id` (and so deletes the keys attached to it). False if the lease
    /// was already gone.
    pub(super) async fn revoke(&self, id: i64) -> Result<bool, BackendError> {
        self.call(async |c| match c.lease_revoke(id).await {
            Ok(()) => Ok(true),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        })
        .await
    }

    /// One keep-alive of lease `id`: false if the lease is gone.
    pub(super) async fn keep_alive(&self, id: i64) -> Result<bool, BackendError> {
        self.call(async |c| match c.lease_keep_alive(id).await {
            // TTL ≤ 0: the lease is gone.
            Ok(ttl) => Ok(ttl > 0),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        })
        .await
    }

    /// Our lease for `token` and the revision it queued at, if it waits in the queue.
    pub(super) fn waiting(&self, token: &str) -> Option<(i64, i64)> {
        let ours = self.our_lease(token).filter(|l| l.slot.is_none())?;
        Some((ours.id, ours.queued?))
    }

    /// Records that our lease `id` queued at `revision`.
    pub(super) fn set_queued(&self, id: i64, revision: i64) {
        if let Some(ours) = self.local().lease.as_mut().filter(|l| l.id == id) {
            ours.queued = Some(revision);
        }
    }

    /// Our lease for `token`, if we have one.
    pub(super) fn our_lease(&self, token: &str) -> Option<OurLease> {
        self.local().lease.clone().filter(|l| l.token == token)
    }

    /// Our lease for `token` and the slot it holds, if it took one.
    pub(super) fn our_slot(&self, token: &str) -> Option<(OurLease, u32)> {
        let ours = self.our_lease(token)?;
        let slot = ours.slot?;
        Some((ours, slot))
    }

    /// Revokes lease `id` of an attempt that took nothing (every transaction answered
    /// that it did not apply) and forgets it. A failed revoke is left to the lease's
    /// expiry: nothing is on it.
    pub(super) async fn give_back(&self, id: i64) {
        {
            let mut local = self.local();
            if local.lease.as_ref().is_some_and(|l| l.id == id) {
                local.lease = None;
            }
        }
        let _ = self.revoke(id).await;
    }

    /// The holder stored in `kv`, with the time left on its lease (0 for a key on no
    /// lease).
    pub(super) async fn holder(&self, kv: &KeyValue) -> Result<Holder, BackendError> {
        let lease = kv.lease;
        let ttl = if lease == 0 {
            0
        } else {
            self.call(async |c| c.lease_time_to_live(lease).await)
                .await?
        };
        Ok(holder_from(&kv.value, kv.create_revision, ttl))
    }

    /// Like [`EtcdBackend::holder`], for a lock someone may wait for: a key on no lease
    /// (lockrun always puts it on one: this one was written by hand) would be held
    /// forever, so it is first put on a new lease of [`MAX_LEASE`], if it is still the
    /// key that was read (its value and create revision, the fencing token, stay).
    pub(super) async fn live_holder(&self, kv: &KeyValue) -> Result<Holder, BackendError> {
        if kv.lease != 0 {
            return self.holder(kv).await;
        }
        let id = new_lease_id();
        let ttl = ttl_secs(MAX_LEASE);
        self.call(async |c| c.lease_grant(id, ttl).await).await?;
        let attach = TxnRequest {
            compare: vec![Compare::modified_at(&kv.key, kv.mod_revision)],
            success: vec![RequestOp::from(Request::Put(PutRequest {
                key: kv.key.clone(),
                value: Vec::new(),
                lease: id,
                ignore_value: true,
            }))],
            failure: vec![],
        };
        let attached = self
            .call(async |c| c.txn(attach.clone()).await)
            .await
            .map(|r| r.succeeded);
        if attached != Ok(true) {
            let _ = self.revoke(id).await;
        }
        // Changed since it was read: the next look finds out what it is now.
        let ttl = if attached? { ttl } else { 0 };
        Ok(holder_from(&kv.value, kv.create_revision, ttl))
    }

    /// Every slot key of the name (and the queue, if waiters queue) as stored now, with
    /// the revision of the read.
    pub(super) async fn read(&self, keys: &SlotKeys) -> Result<(Read, i64), BackendError> {
        let end = keys.read_end();
        let reply = self
            .call(async |c| c.range(keys.start(), &end).await)
            .await?;
        let revision = reply.header.map_or(0, |h| h.revision);
        Ok((keys.read(reply.kvs), revision))
    }

    /// The holders of `held`, by slot, with the time left on their leases; `live`: as
    /// [`EtcdBackend::live_holder`] (a key on no lease is put on one).
    pub(super) async fn holders(
        &self,
        held: Held,
        live: bool,
    ) -> Result<Vec<Holder>, BackendError> {
        let lookups = held.into_iter().map(|(slot, kv)| async move {
            let holder = match live {
                true => self.live_holder(&kv).await?,
                false => self.holder(&kv).await?,
            };
            Ok::<_, BackendError>(Holder { slot, ..holder })
        });
        futures_util::stream::iter(lookups)
            .buffered(LOOKUPS_AT_ONCE)
            .try_collect()
            .await
    }

    /// Revokes a lease left from an earlier try that failed part-way (its transaction
    /// may have been applied: a new try would find the lock "busy" with ourselves).
    pub(super) async fn drop_stale_lease(&self) -> Result<(), BackendError> {
        let stale = self.local().lease.clone();
        if let Some(old) = stale {
            self.revoke(old.id).await?;
            let mut local = self.local();
            if local.lease.as_ref().is_some_and(|l| l.id == old.id) {
                local.lease = None;
            }
        }
        Ok(())
    }

    /// A waiter's turn may have come (or `deadline` passed): the waiter just before us
    /// left the queue, or, when none is, a slot freed (of the plain lock: its key was
    /// deleted), since the busy read. Meanwhile a waiter in the queue keeps its lease
    /// alive: its waiter key lives on it.
    pub(super) async fn wait_turn(
        &self,
        keys: &SlotKeys,
        deadline: tokio::time::Instant,
    ) -> Result<(), BackendError> {
        let (after, next_ahead, queued) = {
            let local = self.local();
            let queued = local.lease.as_ref().filter(|l| l.queued.is_some());
            let queued = queued.map(|l| (l.id, l.ttl));
            (local.busy_revision, local.next_ahead.clone(), queued)
        };
        let (key, range_end) = match (next_ahead, keys.queued()) {
            (Some(waiter), true) => (waiter, Vec::new()),
            (_, true) => (keys.start().to_vec(), keys.end()),
            (_, false) => (keys.start().to_vec(), Vec::new()),
        };
        let Some((id, ttl)) = queued else {
            return self.watch_deletion(key, range_end, after, deadline).await;
        };
        let every = (ttl / 3).max(MIN_KEEP_ALIVE);
        let keep_alive = async {
            loop {
                tokio::time::sleep(every).await;
                // A lease that is gone ends the wait: the next acquire queues again.
                if let Ok(false) = self.keep_alive(id).await {
                    return;
                }
            }
        };
        tokio::select! {
            watched = self.watch_deletion(key, range_end, after, deadline) => watched,
            () = keep_alive => Ok(()),
        }
    }

    /// Waits for a DELETE of `key` (of the keys in `[key, range_end)`, if not empty)
    /// after revision `after`; returns at `deadline`.
    async fn watch_deletion(
        &self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        after: i64,
        deadline: tokio::time::Instant,
    ) -> Result<(), BackendError> {
        let create = WatchCreateRequest {
            key,
            range_end,
            start_revision: after + 1,
            filters: vec![FilterType::NoPut as i32],
        };
        self.call(async |c| {
            let watch = async {
                let mut replies = c.watch(create.clone()).await?;
                // A cancelled watch (its start was compacted away) also ends the wait.
                while let Some(reply) = replies.message().await? {
                    let deleted = reply.events.iter().any(|e| e.r#type() == EventType::Delete);
                    if deleted || reply.canceled {
                        break;
                    }
                }
                Ok(())
            };
            tokio::time::timeout_at(deadline, watch)
                .await
                .unwrap_or(Ok(()))
        })
        .await
    }

    /// `Release::KeepFor`: moves the key to a new lease of `keep` (so it expires then),
    /// if it is still on ours, writing the run's `record` in the same transaction, and
    /// revokes ours.
    pub(super) async fn keep_for(
        &self,
        key: &str,
        ours: &OurLease,
        keep: Duration,
        record: Option<&RecordPut>,
    ) -> Result<(), BackendError> {
        let id = new_lease_id();
        let secs = lease_secs(keep)?;
        self.call(async |c| c.lease_grant(id, secs).await).await?;
        let mut move_key = TxnRequest {
            compare: vec![Compare::on_lease(key, ours.id)],
            success: vec![RequestOp::put(key, &ours.value, id)],
            failure: vec![],
        };
        let reply = match record {
            Some(record) => {
                move_key.success.extend(record.ops());
                self.txn_with_record(&move_key, record).await
            }
            None => self.call(async |c| c.txn(move_key.clone()).await).await,
        };
        let moved = matches!(reply, Ok(ref r) if r.succeeded);
        if !moved {
            // Not ours any more (or no answer): the new lease is not needed.
            let _ = self.revoke(id).await;
        }
        // Nothing is on our old lease now (or, without an answer, let it go anyway).
        let _ = self.revoke(ours.id).await;
        match (reply, moved) {
            (Err(e), _) => Err(e),
            (Ok(_), true) => Ok(()),
            (Ok(_), false) => Err(BackendError::NotOwner),
        }
    }

    /// Grants our lease `id` of `ttl` (rounded up to whole seconds); a server that
    /// grants less (its maximum TTL is lower) is a refusal, never a shorter lease, and
    /// so is a lease longer than [`MAX_LEASE`], before anything is granted.
    pub(super) async fn grant(&self, id: i64, ttl: Duration) -> Result<(), BackendError> {
        let ttl = lease_secs(ttl)?;
        let granted = self.call(async |c| c.lease_grant(id, ttl).await).await?;
        if granted < ttl {
            return Err(BackendError::Refused(format!(
                "etcd at {} granted a lease of {granted}s instead of {ttl}s: raise its maximum lease TTL",
                self.member(),
            )));
        }
        Ok(())
    }
}
