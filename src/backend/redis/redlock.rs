//! Redlock: one lock over N independent Redis servers (3 or 5), held only while a
//! majority holds it.
//!
//! Each server runs the same scripts as the single-server backend ([`RedisBackend`]);
//! this file only counts answers. Every call goes to all servers at once, each with a
//! per-server timeout far below the TTL, so one slow server costs nothing. The lease's
//! validity is the driver's: it counts the TTL from before the first request was sent,
//! less the drift margin, which is Redlock's "TTL − elapsed − drift".
//!
//! Semaphores (`--slots N`): a holder needs the same slot on a majority. Every server
//! first takes its lowest free slot and says which slots were free; the slot taken is
//! the lowest one free on a majority. Servers that took another one give it back and,
//! where the chosen slot was free, ask for exactly it (a second round, only when the
//! servers disagree); without a majority on one slot everything is given back and the
//! answer is busy (a split vote: retried after a short random delay). Renewals go to
//! the chosen slot only; a release looks in every slot. A slot is shown as held when a
//! majority holds it with one token. A holder of another N seen by any server is
//! refused.
//!
//! Eviction: every server checks its own memory policy in its acquire script; one that
//! may evict the lock refuses the whole acquisition (what the others took is given
//! back), since a majority that counts on it could lose the lock to eviction.
//!
//! Waiting: each server's acquire that finds the lock busy also subscribes the waiter
//! there (a server that cannot give wake-ups is polled instead); the waiter then
//! sleeps until the first wake-up or the first server's timer.
//!
//! Order of waiters: every server queues a waiter at the same place, the time this
//! lockrun started (its clock, in µs: the Lua script takes it as given), so that the
//! servers' queues agree on the order of the waiters they all have; a release wakes, on
//! each server, the first waiter of that server's own queue, and each server then
//! keeps the freed slot for the waiter it woke for [`super::WAKE_GRACE`] (anyone else
//! asking is told busy there). This matters more here than on one server: an
//! acquisition takes a round trip to every server and a majority, maybe a second round
//! for a semaphore, and a woken waiter that reached only some servers before the
//! release reached the others gives back what it got (which wakes the next waiter
//! there): without the priority, a later waiter whose timer fired in that gap, or the
//! one the give-back woke, took the slot. Why a grace and not strict
//! first-come-first-served order in the script: each server keeps its own queue, and a
//! waiter that has joined some servers' queues and not yet the others' is ahead of
//! another waiter on some servers only; with strict order each server could hold the
//! slot for a different waiter, none gets a majority, and they give back and try again
//! for ever (a livelock). With the grace, the priority lapses and the worst
//! case is a delay of [`super::WAKE_GRACE`], after which whoever asks takes the slot,
//! as before. What an acquisition without a majority took is given back
//! ([`RedisBackend::give_back`]): a woken waiter's slot goes back to it, with its place
//! at the head of the queue and the wake mark it had (so its priority ends when it
//! would have: no livelock), and the give-back wakes no one else meanwhile; before,
//! the woken waiter lost its place and its give-back woke the next waiter, who then
//! took the slot once the release had reached every server. The second round (a slot
//! `wanted` on a server where the first round took another) is not held back: it
//! passed the check in the first round.
//!
//! Fencing: each server answers with `max(its counter + 1, its clock in µs)`. The
//! quorum's token is the largest answer of the majority that granted the lock, written
//! back to a majority before it is handed out. Two majorities always share a server,
//! so a later acquisition sees a counter at least that large and answers with a larger
//! one: tokens strictly increase while a majority keeps its data.
//!
//! Where Redlock's safety rests on timing (a server that restarts without its data
//! while the lease runs, clocks that jump, long pauses), the fencing token is what
//! protects the downstream store: see docs/fencing.md.

mod urls;
mod votes;

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::{join_all, select_all};

use super::replies::{AcquireReply, HoldersReply};
use super::RedisBackend;
use crate::backend::url::{BackendConfig, Target};
use crate::backend::{
    Acquire, AcquireRequest, Backend, BackendError, Holder, Release, RunEnd, RunRecord,
};
pub use urls::{parse, RedlockTarget};
use votes::{
    choose_slot, conflict_in, disagree, free_maps, group, majority_record, other_n, votes,
};

/// A lock backend over a quorum of independent Redis servers.
pub struct RedlockBackend {
    /// At least [`urls::MIN_NODES`] (a [`RedlockTarget`] cannot have fewer).
    nodes: Vec<RedisBackend>,
    /// The N of `--slots` (1: a plain lock).
    slots: u32,
    /// The token and slot of our last acquisition: renewals go to that slot only on
    /// every server. Held for no await.
    taken: Mutex<Option<(String, u32)>>,
}

impl RedlockBackend {
    /// A backend over the servers of `target`.
    pub fn new(target: &RedlockTarget, config: &BackendConfig, waiting: bool) -> RedlockBackend {
        let place = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let nodes = target
            .nodes
            .iter()
            .map(|t| {
                let node_config = BackendConfig {
                    display: t.display(),
                    ..config.clone()
                };
                RedisBackend::new(t.clone(), &node_config, waiting).queued_at(place)
            })
            .collect();
        RedlockBackend {
            nodes,
            slots: config.slots.max(1),
            taken: Mutex::new(None),
        }
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Runs `call` on every server at once, each bounded by `timeout`.
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        call: F,
    ) -> Vec<Result<T, BackendError>>
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T, BackendError>> + 'a,
    {
        self.on_each(timeout, |_, node| call(node)).await
    }

    /// Runs `call` on every server at once (given its index), each bounded by
    /// `timeout`.
    async fn on_each<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        call: F,
    ) -> Vec<Result<T, BackendError>>
    where
        F: Fn(usize, &'a RedisBackend) -> Fut,
        Fut: Future<Output = Result<T, BackendError>> + 'a,
    {
        join_all(self.nodes.iter().enumerate().map(|(i, node)| {
            let fut = call(i, node);
            async move {
                tokio::time::timeout(timeout, fut)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BackendError::Unavailable(format!(
                            "Redis at {} did not answer within {} ms",
                            node.display(),
                            timeout.as_millis()
                        )))
                    })
            }
        }))
        .await
    }

    /// The second round, when the servers took different slots: each server that took
    /// another slot than `slot` gives it back and, where `slot` was free, asks for it.
    /// The other answers stand.
    async fn move_to(
        &self,
        name: &str,
        req: &AcquireRequest,
        timeout: Duration,
        first: Vec<Result<AcquireReply, BackendError>>,
        slot: u32,
    ) -> Vec<Result<AcquireReply, BackendError>> {
        let first = &first;
        self.on_each(timeout, |i, n| async move {
            let before = first[i].clone();
            let Ok(AcquireReply::Acquired {
                slot: took, free, ..
            }) = &before
            else {
                return before;
            };
            if *took == slot {
                return before;
            }
            n.give_back(name, &req.token).await?;
            match free.get(slot as usize) {
                Some(true) => n.acquire_slot(name, req, Some(slot)).await,
                // Given back, and not asked again: still counted as a split vote.
                _ => before,
            }
        })
        .await
    }

    /// Gives `token` back on every server, if any of `answers` took a slot.
    async fn give_back(
        &self,
        name: &str,
        token: &str,
        timeout: Duration,
        answers: &[Result<AcquireReply, BackendError>],
    ) {
        if answers
            .iter()
            .any(|a| matches!(a, Ok(AcquireReply::Acquired { .. })))
        {
            let _ = self.on_all(timeout, |n| n.give_back(name, token)).await;
        }
    }

    /// The quorum's fencing token for `slot`, taken by a majority with `fences`: the
    /// largest, written back to a majority before it is handed out (or everything
    /// given back).
    async fn fence(
        &self,
        name: &str,
        req: &AcquireRequest,
        timeout: Duration,
        slot: u32,
        fences: Vec<u64>,
    ) -> Result<u64, BackendError> {
        let fence = fences.iter().copied().max().unwrap_or(0);
        let written = self
            .on_all(timeout, |n| n.raise_fence(name, fence, &req.token, slot))
            .await;
        if written.iter().filter(|w| w.is_ok()).count() >= self.quorum() {
            *self.taken.lock().unwrap_or_else(|e| e.into_inner()) = Some((req.token.clone(), slot));
            return Ok(fence);
        }
        let _ = self
            .on_all(timeout, |n| n.give_back(name, &req.token))
            .await;
        Err(self.no_quorum("recorded the fencing token", 0, &written))
    }

    /// The answer when no slot was granted by a majority (and everything was given
    /// back): busy if enough servers answered to know, with the holder whose lease
    /// ends first; after a split vote, busy for a short random time.
    fn not_granted(
        &self,
        answers: &[Result<AcquireReply, BackendError>],
        chosen: Option<u32>,
    ) -> Result<Acquire, BackendError> {
        let split = answers
            .iter()
            .any(|a| matches!(a, Ok(AcquireReply::Acquired { .. })));
        let busy = answers
            .iter()
            .filter_map(|a| match a {
                Ok(AcquireReply::Busy(h)) => Some(h),
                _ => None,
            })
            .min_by_key(|h| h.ttl_left)
            .cloned();
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum() || (busy.is_none() && !split) {
            let granted = chosen.map_or(0, |s| votes(answers, s).len());
            return Err(self.no_quorum("granted the lock", granted, answers));
        }
        // Others hold the slots on a majority (or will lose them soon): wait.
        let mut holder = busy.unwrap_or(Holder {
            slots: self.slots,
            ..Holder::default()
        });
        if split {
            // A split vote between contenders (or servers that disagree on which slot
            // is free): each gives its votes back, so retry after a short random delay
            // rather than the holder's TTL.
            holder.ttl_left = Duration::from_millis(5 + crate::token::random_u64() % 45);
        }
        Ok(Acquire::Busy(holder))
    }

    /// The refusal that one server's answer makes for the whole quorum, if any: a
    /// server that may evict the lock (the first one named), or a holder of another N.
    fn refusal(&self, answers: &[Result<AcquireReply, BackendError>]) -> Option<BackendError> {
        let evicting = answers
            .iter()
            .zip(&self.nodes)
            .find_map(|(a, node)| match a {
                Ok(AcquireReply::Evicting { policy, maxmemory }) => {
                    Some(node.evicting(policy, *maxmemory))
                }
                _ => None,
            });
        evicting.or_else(|| conflict_in(answers).map(|theirs| self.nodes[0].conflict(theirs)))
    }
}

/// The per-server timeout: a tenth of the TTL, between 50 ms and 1 s.
fn node_timeout(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl Backend for RedlockBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let timeout = node_timeout(req.ttl);
        let first = self
            .on_all(timeout, |n| n.acquire_slot(name, req, None))
            .await;
        if let Some(refusal) = self.refusal(&first) {
            self.give_back(name, &req.token, timeout, &first).await;
            return Err(refusal);
        }
        let chosen = choose_slot(&free_maps(&first), self.quorum());
        // Servers that took another slot than the one chosen give it back, and take
        // the chosen one where it was free: a second round only when they disagree.
        let answers = match chosen {
            Some(slot) if disagree(&first, slot) => {
                self.move_to(name, req, timeout, first, slot).await
            }
            _ => first,
        };
        if let Some(refusal) = self.refusal(&answers) {
            self.give_back(name, &req.token, timeout, &answers).await;
            return Err(refusal);
        }
        if let Some(slot) = chosen {
            let fences = votes(&answers, slot);
            if fences.len() >= self.quorum() {
                return self
                    .fence(name, req, timeout, slot, fences)
                    .await
                    .map(|fencing_token| Acquire::Acquired {
                        fencing_token,
                        slot,
                    });
            }
        }
        // No majority on one slot: give back what we got, everywhere.
        self.give_back(name, &req.token, timeout, &answers).await;
        self.not_granted(&answers, chosen)
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let taken = match &*self.taken.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((t, slot)) if t == token => Some(*slot),
            _ => None,
        };
        let answers = self
            .on_all(node_timeout(ttl), |n| n.renew_slot(name, token, ttl, taken))
            .await;
        let ok = answers.iter().filter(|a| a.is_ok()).count();
        let lost = answers
            .iter()
            .filter(|a| matches!(a, Err(BackendError::NotOwner)))
            .count();
        if ok >= self.quorum() {
            Ok(())
        } else if lost > self.nodes.len() - self.quorum() {
            // A majority can no longer be ours: a definite loss.
            Err(BackendError::NotOwner)
        } else {
            Err(self.no_quorum("renewed the lease", ok, &answers))
        }
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.release(name, token, how, end))
            .await;
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if taken.as_ref().is_some_and(|(t, _)| t == token) {
            *taken = None;
        }
        if answers.iter().any(|a| a.is_ok()) {
            Ok(())
        } else if answers
            .iter()
            .all(|a| matches!(a, Err(BackendError::NotOwner)))
        {
            Err(BackendError::NotOwner)
        } else {
            Err(self.no_quorum("released the lock", 0, &answers))
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.holders(name))
            .await;
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        if answered < self.quorum() {
            return Err(self.no_quorum("answered", answered, &answers));
        }
        let replies: Vec<&HoldersReply> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        // A slot is held only if a majority holds it with one token; each is shown
        // with the quorum's fencing token (the largest of those servers').
        let held: Vec<Holder> = group(replies.iter().flat_map(|r| &r.holders))
            .into_iter()
            .filter(|(count, _)| *count >= self.quorum())
            .map(|(_, h)| h)
            .collect();
        if held.iter().all(|h| h.slots == self.slots) {
            // Holders of another N that no majority shows, or in slots beyond ours
            // (the limit key), are refused here: `status` cannot list them.
            if let Some(theirs) = replies.iter().find_map(|r| other_n(r, self.slots)) {
                return Err(self.nodes[0].conflict(theirs));
            }
        }
        Ok(held)
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        self.quorum_names().await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.last_run(name))
            .await;
        let records: Vec<Option<RunRecord>> = answers.iter().flatten().cloned().collect();
        if records.len() < self.quorum() {
            return Err(self.no_quorum("answered", records.len(), &answers));
        }
        Ok(majority_record(&records, self.quorum()))
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let answers = self
            .on_all(Duration::from_secs(1), |n| n.force_holders(name))
            .await;
        let replies: Vec<&HoldersReply> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        if replies.len() < self.quorum() {
            return Err(self.no_quorum("answered", replies.len(), &answers));
        }
        let refused = replies.iter().filter(|r| r.theirs != 0).count();
        if let Some(theirs) = replies.iter().map(|r| r.theirs).find(|&t| t != 0) {
            let broken = match refused == replies.len() {
                true => "nothing was broken".to_owned(),
                false => format!(
                    "{} of {} servers broke their slots",
                    replies.len() - refused,
                    self.nodes.len()
                ),
            };
            let e = self.nodes[0].conflict(theirs);
            return Err(BackendError::Refused(format!("{e}; {broken}")));
        }
        Ok(group(replies.iter().flat_map(|r| &r.holders))
            .into_iter()
            .map(|(_, h)| h)
            .collect())
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        // A release wakes this waiter on every server that queued it: the first
        // wake-up (or the first timer) is enough.
        let waits: Vec<_> = self
            .nodes
            .iter()
            .map(|n| Box::pin(n.wait_for_release(name, busy, max)))
            .collect();
        if waits.is_empty() {
            // Cannot happen (a quorum has servers), but `select_all` must not see it.
            tokio::time::sleep(crate::backend::wait_slice(busy.ttl_left, max)).await;
            return Ok(());
        }
        let (first, _, _) = select_all(waits).await;
        first
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        let _ = self
            .on_all(Duration::from_secs(1), |n| n.stop_waiting(name))
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
