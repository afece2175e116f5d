//! Writing and reading the record of a lock's last run on etcd ([`super::record`]), as
//! methods of [`EtcdBackend`]: the release that leaves it (one transaction, as many
//! calls as the revoke it replaces), the week's lease granted when a release finds it
//! missing, and the read for `status`. Part of [`super`].

use futures_util::future::join_all;

use super::errors::{is_lease_exists, is_lease_not_found};
use super::record::{lease_id, ok_from, record_from, RecordPut, RECORD_TTL, SWEPT};
use super::slots::SlotKeys;
use super::value::ttl_secs;
use super::wire::{Compare, Request, RequestOp, TxnRequest, TxnResponse};
use super::{EtcdBackend, OurLease};
use crate::backend::{BackendError, Release, RunEnd, RunRecord};

impl EtcdBackend {
    /// Gives up our slot (or attempt) as `how` says, leaving `record` if a run held it.
    pub(super) async fn release_slot(
        &self,
        keys: &SlotKeys,
        ours: &OurLease,
        how: Release,
        record: Option<RecordPut>,
    ) -> Result<(), BackendError> {
        match (how, ours.slot, record) {
            (Release::Now, Some(slot), Some(record)) => {
                self.release_recorded(&keys.key(slot), ours, &record).await
            }
            // Revoking deletes the key only if it is attached to our lease: a lock
            // that is someone else's by now is on another lease and stays. It frees
            // whatever slot the lease holds, known or not.
            (Release::Now, _, _) | (Release::KeepFor(_), None, _) => {
                match self.revoke(ours.id).await? {
                    true => Ok(()),
                    false => Err(BackendError::NotOwner),
                }
            }
            (Release::KeepFor(keep), Some(slot), record) => {
                self.keep_for(&keys.key(slot), ours, keep, record.as_ref())
                    .await
            }
        }
    }

    /// The record of our run that held `slot` of `keys`' name and ended as `end`.
    pub(super) fn record(
        &self,
        keys: &SlotKeys,
        ours: &OurLease,
        slot: u32,
        end: RunEnd,
    ) -> RecordPut {
        let held = (slot, ours.fence);
        let at = [keys.record_key(), keys.ok_key()];
        let mut record = RecordPut::new(at, &self.key_prefix, &ours.value, held, end);
        if let Some(period) = ours.period {
            record.ok_lease = period.id;
            record.period_key = Some(keys.period_key(ours.fence));
        }
        record
    }

    /// `Release::Now` of a run: one transaction deletes our slot's `key` if it is still
    /// on our lease and puts the run's `record`, or does nothing (NotOwner). It takes
    /// the place of the revoke a plain release sends, so a run makes no more calls
    /// than before; our lease, holding nothing now, ends with its TTL.
    pub(super) async fn release_recorded(
        &self,
        key: &str,
        ours: &OurLease,
        record: &RecordPut,
    ) -> Result<(), BackendError> {
        let mut success = vec![RequestOp::delete(key)];
        success.extend(record.ops());
        let txn = TxnRequest {
            compare: vec![Compare::on_lease(key, ours.id)],
            success,
            failure: vec![],
        };
        match self.txn_with_record(&txn, record).await?.succeeded {
            true => Ok(()),
            false => Err(BackendError::NotOwner),
        }
    }

    /// Sends `txn`, whose success branch puts `record` on its week's lease. etcd refuses
    /// the whole transaction, applying nothing, when that lease does not exist (the
    /// first release of the week under the prefix): then the lease is granted and the
    /// transaction sent once more.
    pub(super) async fn txn_with_record(
        &self,
        txn: &TxnRequest,
        record: &RecordPut,
    ) -> Result<TxnResponse, BackendError> {
        let send = async |txn: &TxnRequest| {
            self.call(async |c| match c.txn(txn.clone()).await {
                Ok(reply) => Ok(Some(reply)),
                Err(e) if is_lease_not_found(&e) => Ok(None),
                Err(e) => Err(e),
            })
            .await
        };
        if let Some(reply) = send(txn).await? {
            return Ok(reply);
        }
        self.grant_week(record.week).await?;
        if let Some(reply) = send(txn).await? {
            return Ok(reply);
        }
        // The run's period lease is gone (a run longer than its TTL, or revoked by
        // hand): its success goes on the week's lease, as without `--once-per`.
        let on_week = on_lease(txn, record.ok_lease, record.lease);
        send(&on_week).await?.ok_or_else(|| {
            BackendError::Unavailable(format!(
                "etcd at {} lost the lease of the run record {:?} just granted; try again",
                self.member(),
                record.key
            ))
        })
    }

    /// Grants the records' lease of `week` under our prefix (another lockrun may have
    /// granted it first: fine), and revokes those of the weeks [`SWEPT`] back (see
    /// `record.rs`: their records are two weeks old at least). A failed revoke leaves
    /// that lease to its TTL.
    async fn grant_week(&self, week: u64) -> Result<(), BackendError> {
        let id = lease_id(&self.key_prefix, week);
        let ttl = ttl_secs(RECORD_TTL);
        let grant = self.call(async |c| match c.lease_grant(id, ttl).await {
            Ok(_) => Ok(()),
            Err(e) if is_lease_exists(&e) => Ok(()),
            Err(e) => Err(e),
        });
        let old = SWEPT.filter_map(|back| week.checked_sub(back));
        let sweep = join_all(old.map(|w| self.revoke(lease_id(&self.key_prefix, w))));
        let (granted, _) = tokio::join!(grant, sweep);
        granted
    }

    /// The record of the name's last run, if one is stored (and is one), with its last
    /// success: both keys in one read (of the range from `:last` to `:ok`; any other
    /// key there is not read as either).
    pub(super) async fn read_record(
        &self,
        keys: &SlotKeys,
    ) -> Result<Option<RunRecord>, BackendError> {
        let (last, ok) = (keys.record_key(), keys.ok_key());
        let end = format!("{ok}\0");
        let reply = self
            .call(async |c| c.range(last.as_bytes(), end.as_bytes()).await)
            .await?;
        let value_of = |key: &str| reply.kvs.iter().find(|kv| kv.key == key.as_bytes());
        let Some(record) = value_of(&last).and_then(|kv| record_from(&kv.value)) else {
            return Ok(None);
        };
        let last_ok = value_of(&ok).and_then(|kv| ok_from(&kv.value));
        Ok(Some(RunRecord { last_ok, ..record }))
    }
}

/// `txn` with every put on lease `from` moved to lease `to`.
fn on_lease(txn: &TxnRequest, from: i64, to: i64) -> TxnRequest {
    let mut txn = txn.clone();
    for op in &mut txn.success {
        if let Some(Request::Put(put)) = op.request.as_mut() {
            if put.lease == from {
                put.lease = to;
            }
        }
    }
    txn
}
