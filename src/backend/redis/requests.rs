//! The [`Backend`] requests of one Redis server, each one script ([`super::scripts`])
//! run through [`RedisBackend`]'s connection. Part of [`super`].

use std::time::Duration;

use super::conn::{self, Subscriber};
use super::replies::{AcquireReply, Done, HoldersReply, LastRunReply};
use super::scripts::{Keys, Script};
use super::{ms, owned, RedisBackend};
use crate::backend::conn as slot;
use crate::backend::{
    slots_conflict, wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release,
    RunEnd, RunRecord,
};
use crate::clock::BootInstant;

/// Holders as `status` shows them: when none of them shows that they were taken with
/// another N, yet the limit key says so (`theirs`), a refusal; otherwise the holders
/// (`status` refuses those of another N itself).
pub(super) fn shown(reply: HoldersReply, ours: u32) -> Result<Vec<Holder>, BackendError> {
    let holders: Vec<Holder> = reply.holders.into_iter().map(|h| h.holder).collect();
    if reply.theirs != 0 && holders.iter().all(|h| h.slots == ours) {
        return Err(slots_conflict(reply.theirs, ours));
    }
    Ok(holders)
}

impl Backend for RedisBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        if let Some(g) = self
            .grants
            .as_ref()
            .and_then(|g| g.take(&req.token, req.ttl, BootInstant::now()))
        {
            // Granted by the holder's release: no round trip (grants.rs).
            *self.taken.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((req.token.clone(), g.slot));
            drop(self.subscriber.take());
            return Ok(Acquire::Granted {
                fencing_token: g.fence,
                slot: g.slot,
                asked_at: g.since,
            });
        }
        match self.acquire_slot(name, req, None).await? {
            AcquireReply::Acquired {
                fencing_token,
                slot,
                ..
            } => {
                *self.taken.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((req.token.clone(), slot));
                Ok(Acquire::Acquired {
                    fencing_token,
                    slot,
                })
            }
            AcquireReply::Busy(holder) => Ok(Acquire::Busy(holder)),
            AcquireReply::Conflict(theirs) => Err(self.conflict(theirs)),
            AcquireReply::Evicting { policy, maxmemory } => Err(self.evicting(&policy, maxmemory)),
        }
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let taken = match &*self.taken.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((t, slot)) if t == token => Some(*slot),
            _ => None,
        };
        self.renew_slot(name, token, ttl, taken).await
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let keep = match how {
            Release::Now => "0".to_owned(),
            Release::KeepFor(d) => ms(d),
        };
        let wake_prefix = Keys::new(&self.key_prefix, name).wake_prefix;
        // No give-back ('') and no heartbeat: a holder's release; the record's fields
        // last ('' for an attempt given up: no record).
        let (exit, ended_by) = match end {
            Some(e) => (e.exit_status.to_string(), e.ended_by.as_str()),
            None => (String::new(), ""),
        };
        let args = [token, &keep, &wake_prefix, "", "", &exit, ended_by];
        let done = self.eval(Script::Release, name, None, &args).await?;
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if taken.as_ref().is_some_and(|(t, _)| t == token) {
            *taken = None;
        }
        owned(done)
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        shown(self.holders(name).await?, self.slots)
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        self.scan_names().await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        let reply: LastRunReply = self.eval(Script::LastRun, name, None, &[]).await?;
        Ok(reply.0)
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let reply = self.force_holders(name).await?;
        if reply.theirs != 0 {
            return Err(BackendError::Refused(format!(
                "{}; nothing was broken",
                self.conflict(reply.theirs)
            )));
        }
        Ok(reply.holders.into_iter().map(|h| h.holder).collect())
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // The cap also keeps this waiter's heartbeat fresh (it is renewed by each try).
        // Without a subscription (polling, or one lost), this sleeps the slice; a lost
        // connection ends the wait early and is subscribed again at the next try.
        let slice = wait_slice(busy.ttl_left, max);
        let grants = self.grants.as_ref();
        let next = async |m: &mut conn::Messages| {
            let payload = conn::next_wakeup(m).await?;
            if let Some(g) = grants {
                g.heard(&payload);
            }
            Some(())
        };
        slot::wait_for_wakeup(&self.subscriber, Subscriber::messages, slice, next).await;
        Ok(())
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        if !self.notifications {
            return Ok(());
        }
        let Done(_) = self
            .eval(Script::Leave, name, None, &[&self.waiter_id])
            .await?;
        // A release may have granted the lock to this waiter meanwhile, unheard: give
        // it back (a token that holds nothing here changes nothing).
        if let Some(token) = self.grants.as_ref().and_then(|g| g.last_token()) {
            let _ = self.release(name, &token, Release::Now, None).await;
        }
        Ok(())
    }
}
