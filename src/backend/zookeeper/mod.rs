//! The ZooKeeper backend (`zk://[user:pass@]host:port[,host:port...][/chroot]`): the
//! lock is ZooKeeper's own recipe, an ephemeral sequential node in a queue, and the
//! lease is the ZooKeeper session that owns it.
//!
//! **The recipe.** Lock `NAME` under prefix `P` is a directory (`layout.rs`: one node
//! name for `P`, one for `NAME`, both container nodes, so the server removes them once
//! empty). An acquirer creates an ephemeral sequential node `lock-<token>-<seq>` in it;
//! the lowest sequence holds the lock; a waiter watches only the node just before its
//! own (first come, first served, one watch per waiter, no herd). The queue node stays
//! across the acquire calls of one wait and is deleted by `stop_waiting` (giving up, a
//! signal) or by `release`. Without `--wait` (`open(.., waiting: false)`) a busy lock
//! is answered from a listing, without queueing at all; a free one is taken without a
//! second listing when our node's sequence number is the directory's child version of
//! the first (no child came or went in between). The token in the node's name
//! makes ownership checkable by name, and lets lockrun find a node whose creation it
//! never saw answered (the driver gives such a token back: every node of it is deleted).
//!
//! **Fencing token**: the lock node's creation zxid. The ensemble orders all writes by
//! zxid (epoch in the high bits, so it grows across leader changes and restarts), and
//! a holder's node was created after every node ahead of it in the queue, so each
//! holder of `NAME` gets a larger one than all holders before it.
//!
//! **Semaphores (`--slots N`, N > 1)** keep the same directory, queue and session
//! lease. `place.rs` decides each step from one listing (admission, the slot, what to
//! watch, and why no waiter is forgotten and no herd woken); `slots.rs` claims a slot.
//! - *Nodes*: a queue node's name carries N (`lock-<token>-n<N>-<seq>`), so every
//!   acquirer sees each other's N in the listing it reads anyway. A node ahead of ours
//!   with another N (a name without one is N = 1: a plain lock, also an older
//!   lockrun's), or a hold that is on with another N, refuses ours (`slots_conflict`,
//!   125) and our node leaves the queue at once. That is checked where the slot is
//!   taken: nodes only join behind ours, so a listing read after our node's creation
//!   shows every node that can ever be ahead of it, and a later node with another N
//!   sees ours and refuses itself.
//! - *Slots*: an admitted node (fewer than N nodes and holds ahead) claims the lowest
//!   free slot `i` in one multi-request that creates the ephemeral node `slot-<i>`
//!   (only one create of a name succeeds: never two holders of a slot, never more
//!   than N) and writes our queue node's value with the slot. Every deletion of a
//!   claimed queue node deletes its slot node in the same multi-request (release,
//!   `--hold-at-least`, `release --force`; a session's end deletes all its nodes at
//!   once), so a slot node never outlives its owner's queue node, and that node's
//!   value names the slot: a release whose acquire's answer was lost reads the node
//!   to find the slot (deleting with the version read, so no claim applies between).
//!   A renewal checks the slot node as well as the queue node.
//! - *Fencing token*: the zxid of the claim (the queue node's last modification, the
//!   slot node's creation). The ensemble orders claims like every write, so tokens
//!   grow with every acquisition whatever the slot, also between holders that queued
//!   in the other order. A plain lock keeps its node's creation zxid.
//! - *`--hold-at-least`*, per slot: the release moves slot `i` from our queue and slot
//!   nodes to the slot's persistent hold node (`hold` for slot 0, the plain lock's;
//!   `hold-<i>` otherwise), judged by the server's clock as below. A hold that is on
//!   keeps its slot and counts as an occupant ahead of every waiter. Only the holder of
//!   slot `i` writes its hold node; the claim that found it over deletes it with its
//!   own release (or overwrites it with its own hold), so at most one hold node per
//!   slot is left behind.
//! - *Busy*: the holder named is the hold that ends first, else the first in line (the
//!   time left of a session is not visible to other clients).
//!
//! With N = 1 the nodes, values and requests are the plain lock's, as before semaphores.
//!
//! **The lease is the session.** lockrun asks for a session timeout of `--ttl`. The
//! server clamps it to its `minSessionTimeout`..`maxSessionTimeout` (by default 2 and 20
//! times `tickTime`), and the granted value governs the server: a session it has not
//! heard from for that long expires, and our node with it. lockrun's local deadline is
//! counted, as on every backend (`run/supervise.rs`), from the send time of the last
//! request the server answered, plus `--ttl`. So:
//! - a grant *below* `--ttl` (the server's maximum is lower) would let the session
//!   expire before lockrun's deadline: it is refused before anything is created (125),
//!   naming the granted value and the fix. This keeps the lease machinery unchanged: no
//!   backend reports a lease of its own to it, and none needs to;
//! - a grant *above* `--ttl` (the server's minimum is higher) leaves lockrun's deadline
//!   earlier than the server's expiry, which is safe; only a crashed holder's lock lasts
//!   up to the granted value (the queue node records it, and `status` shows it). So a
//!   grant above both `--ttl` and [`errors::GRANT_ABOVE_TTL`] is refused (125) and its session
//!   closed: no server of a sane configuration gives one, and a hostile one (or anyone
//!   in the middle of `zk://`) could make a crashed holder's lock last 24 days.
//!
//! A renewal is an explicit request: `sync` (which a follower must pass to the leader,
//! so a server cut off from the quorum cannot answer it) then an `exists` of our node,
//! both touching the session. A node that is gone or owned by another session, or an
//! expired session, is a definite loss (NotOwner, exit 124); any other error is
//! transient and retried until the deadline. The client library also pings the server
//! on its own while idle; that only lengthens the server's session, never lockrun's
//! deadline. A disconnected client reconnects (to another server of the list) within
//! the session; lockrun's deadline does not wait for it. One bound is ZooKeeper's own:
//! the leader expires sessions, and a follower passes on the heartbeats it received at
//! the leader's next ping (every half `tickTime`); a follower cut off from the leader
//! just after answering a renewal leaves the leader a heartbeat up to that much older
//! (plus the client's idle ping period, 3/20 of the timeout). Keep `tickTime` small
//! against `--ttl` in ensembles (docs/backends.md).
//!
//! **`--hold-at-least`**: a session cannot outlive the process, so the release moves
//! the lock, in one multi-request (atomic), from our queue node to a persistent `hold`
//! node in the directory that says for how long it keeps the lock (a semaphore's: its
//! slot, see above). Its creation time
//! and the "now" it is compared with are both the server's clock (a waiter gets "now"
//! from a write of its own), never a lockrun host's. The first in the queue takes the
//! lock only once the hold is over (then it deletes it); `release --force` deletes it
//! too. The hold node is one small node per name, removed by the next holder.
//!
//! **The run's record**: the release of a run that held the lock writes the record of
//! its last run, the persistent node `last` in the directory (a TTL node where the
//! server has them), in the multi-request that deletes its nodes or leaves its hold
//! node: no extra round trip once the name has a record (`record.rs`).
//!
//! **ACLs**: nodes are created readable and writable by anyone, or, with a user and
//! password in the URL (ZooKeeper's `digest` scheme), by that identity only.
//!
//! **Client**: `zookeeper-client` (pure Rust, async, its connection task on our runtime);
//! its TLS feature would build aws-lc, a C library, so `zk://` has no TLS.

mod errors;
mod layout;
mod leave;
mod look;
mod node;
mod place;
mod queue;
mod record;
mod relay;
mod slots;
mod target;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use zookeeper_client::{Acls, Client};

use crate::backend::url::BackendConfig;
use crate::backend::{
    Acquire, AcquireRequest, Backend, BackendError, Holder, Release, RunEnd, RunRecord,
    MIN_WAIT_SLICE,
};
use errors::{describe, session_over};
use node::{Claim, OurNode};
pub use target::{ZkTarget, KIND};

/// The session timeout asked for by `status` and `release --force`, which hold nothing.
const ADMIN_SESSION: Duration = Duration::from_secs(10);

/// The longest a waiter waits for its watch before looking at the queue again. Watches
/// survive reconnections (the client sets them again) and end with the session, so a
/// wake-up is not lost; the look is only a safety net, kept rare so that many waiters
/// do not poll.
const WATCH_SLICE: Duration = Duration::from_secs(10);

/// A lock backend on a ZooKeeper ensemble.
pub struct ZkBackend {
    target: ZkTarget,
    key_prefix: String,
    /// `--slots`: 1 is a plain lock.
    slots: u32,
    /// The caller may wait (`--wait`): queue when the lock is busy.
    waiting: bool,
    /// The session: made by the first call, kept for the whole run (our nodes live and
    /// die with it), made again only once it has ended.
    session: Mutex<Option<Client>>,
    /// The relays the client reaches the servers through (`relay.rs`), made with the
    /// first session.
    relays: tokio::sync::OnceCell<relay::Relays>,
    local: Mutex<Local>,
}

/// What this lockrun remembers between calls; never locked across an await.
#[derive(Default)]
struct Local {
    /// Our queue node, from the moment its creation is asked for.
    node: Option<OurNode>,
    /// What the last busy answer said to wait for.
    waiting_for: Option<WaitFor>,
}

/// What a waiter waits for: any of these nodes changing or going, or, when one of
/// them is a `--hold-at-least` node, the end of the earliest hold, in this long.
#[derive(Clone, Debug)]
struct WaitFor {
    paths: Vec<String>,
    within: Option<Duration>,
}

impl ZkBackend {
    /// A backend for `target`; `waiting`: the caller may wait for a busy lock.
    pub fn new(target: ZkTarget, config: &BackendConfig, waiting: bool) -> ZkBackend {
        ZkBackend {
            target,
            key_prefix: config.key_prefix.clone(),
            slots: config.slots,
            waiting,
            session: Mutex::new(None),
            relays: tokio::sync::OnceCell::new(),
            local: Mutex::new(Local::default()),
        }
    }

    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Option<Client> {
        let session = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        session.clone()
    }

    /// The ensemble as shown in messages.
    fn at(&self) -> String {
        crate::backend::url::Target::display(&self.target)
    }

    fn dir(&self, name: &str) -> String {
        layout::lock_dir(&self.key_prefix, name)
    }

    /// The ACL of every node we create: the URL's identity only, or anyone.
    fn acls(&self) -> Acls<'static> {
        match self.target.digest {
            Some(_) => Acls::creator_all(),
            None => Acls::anyone_all(),
        }
    }

    /// Translates a client error met on `path`.
    fn error(&self, e: &zookeeper_client::Error, path: &str) -> BackendError {
        if let Some(server) = self.relays.get().and_then(|r| r.overrun()) {
            return errors::too_large(server);
        }
        describe(e, &self.at(), path)
    }

    /// The session, made with a timeout of `ttl` if there is none (or it has ended).
    async fn session(&self, ttl: Duration) -> Result<Client, BackendError> {
        if let Some(c) = self.current().filter(|c| !c.state().is_terminated()) {
            return Ok(c);
        }
        let mut connector = Client::connector()
            .with_session_timeout(ttl)
            .with_fail_eagerly();
        if let Some(digest) = &self.target.digest {
            connector = connector.with_auth("digest", digest.as_bytes());
        }
        let relays = self
            .relays
            .get_or_try_init(|| relay::Relays::start(&self.target.servers))
            .await
            .map_err(|e| {
                BackendError::Unavailable(format!(
                    "cannot relay to ZooKeeper at {}: {e}",
                    self.at()
                ))
            })?;
        let client = connector
            .connect(&relays.connect_string(&self.target.chroot))
            .await
            .map_err(|e| self.error(&e, "/"))?;
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// Our node, if it is for `token` and its creation was answered.
    fn our_node(&self, token: &str) -> Option<OurNode> {
        self.local()
            .node
            .clone()
            .filter(|n| n.token == token && n.path.is_some())
    }
}

impl Backend for ZkBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let client = self.session(req.ttl).await?;
        let granted = client.session_timeout();
        if let Some(refusal) = errors::bad_grant(&self.at(), granted, req.ttl) {
            // A grant too long would let a crashed holder's lock last it: close it now.
            self.session
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            return Err(refusal);
        }
        let dir = self.dir(name);
        self.drop_stale(&client, &req.token).await?;
        let mut known = None;
        if self.our_node(&req.token).is_none() {
            // Without --wait, a busy lock is answered without queueing; a free one may
            // be taken without listing the queue again (see `busy_now`).
            let mut first_if = None;
            if !self.waiting {
                match self.busy_now(&client, &dir).await? {
                    Err(holder) => return Ok(Acquire::Busy(holder)),
                    Ok(listed) => first_if = listed,
                }
            }
            let sequence = self.enqueue(&client, &dir, req, granted).await?;
            match first_if {
                Some((at, _)) if at == sequence && self.slots == 1 => {
                    return self.taken(&client).await
                }
                Some((at, listing)) if at == sequence => known = self.with_ours(listing),
                _ => {}
            }
        }
        self.take_or_wait(&client, &dir, &req.token, known).await
    }

    async fn renew(&self, _name: &str, token: &str, _ttl: Duration) -> Result<(), BackendError> {
        // Never a new session here: a new one would own nothing.
        let (Some(node), Some(client)) = (self.our_node(token), self.current()) else {
            return Err(BackendError::NotOwner);
        };
        // A semaphore's holder also has its slot node: both must still be ours.
        let slot = match node.claim {
            Claim::Held { slot, .. } => Some(format!("{}/{}", node.dir, layout::slot_name(slot))),
            _ => None,
        };
        let mine: Vec<String> = node.path.into_iter().chain(slot).collect();
        let sync = client.sync(&node.dir);
        let exists = join_all(mine.iter().map(|p| client.check_stat(p)));
        let (synced, stats) = tokio::join!(sync, exists);
        let session = client.session_id().0;
        let lost = stats.iter().any(|s| match s {
            Ok(Some(stat)) => stat.ephemeral_owner != session,
            Ok(None) => true,
            Err(_) => false,
        });
        let errors: Vec<zookeeper_client::Error> = synced
            .err()
            .into_iter()
            .chain(stats.into_iter().filter_map(Result::err))
            .collect();
        // A definite loss from any answer wins over an error from another.
        match errors.first() {
            _ if lost || errors.iter().any(session_over) => Err(BackendError::NotOwner),
            Some(e) => Err(self.error(e, &mine[0])),
            None => Ok(()),
        }
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        let node = {
            let mut local = self.local();
            local.waiting_for = None;
            match local.node.take() {
                Some(n) if n.token == token => Some(n),
                other => {
                    local.node = other;
                    None
                }
            }
        };
        let Some(client) = self.current() else {
            return Err(BackendError::NotOwner);
        };
        // A run that held the lock leaves its record (`record.rs`).
        let record = match (&node, end) {
            (Some(node), Some(end)) => self.recording(node, end).await,
            _ => None,
        };
        match (node, how) {
            (Some(node @ OurNode { path: Some(_), .. }), Release::KeepFor(keep)) => {
                self.keep_for(&client, &node, keep, record).await
            }
            (Some(node), _) => self.delete_ours(&client, &node, record).await,
            // A token never seen answered: delete whatever node it may have made (and
            // the slot its value names: see `slots.rs`).
            (None, _) => {
                let lost = OurNode::lost(self.dir(name), token);
                self.delete_ours(&client, &lost, None).await
            }
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let client = self.session(ADMIN_SESSION).await?;
        let dir = self.dir(name);
        Ok(self
            .look(&client, &dir)
            .await?
            .into_iter()
            .map(|(h, _)| h)
            .collect())
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        let client = self.session(ADMIN_SESSION).await?;
        let under = layout::prefix_dir(&self.key_prefix);
        let children = self.children(&client, &under).await?;
        Ok(children.iter().filter_map(|c| layout::decode(c)).collect())
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        let client = self.session(ADMIN_SESSION).await?;
        self.read_record(&client, &self.dir(name)).await
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let client = self.session(ADMIN_SESSION).await?;
        self.break_lock(&client, &self.dir(name)).await
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        _busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        let what = self.local().waiting_for.clone();
        let (Some(client), Some(what)) = (self.current(), what) else {
            tokio::time::sleep(max.min(MIN_WAIT_SLICE)).await;
            return Ok(());
        };
        let slice = match what.within {
            None => max.min(WATCH_SLICE),
            // A hold ends by the server's clock: look again a little after it should.
            Some(left) => max.min(left + MIN_WAIT_SLICE),
        };
        let watched = async {
            // One watch per node (all set in one round trip); any of them firing, or a
            // node already gone, ends the wait. The others are dropped, which removes
            // them from the server too.
            let set = join_all(what.paths.iter().map(|p| client.check_and_watch_stat(p))).await;
            let mut watchers = Vec::with_capacity(set.len());
            for (answer, path) in set.into_iter().zip(&what.paths) {
                match answer {
                    Ok((Some(_), watcher)) => watchers.push(Box::pin(watcher.changed())),
                    Ok((None, _)) => return Ok(()),
                    Err(e) => return Err(self.error(&e, path)),
                }
            }
            match watchers.is_empty() {
                true => std::future::pending::<()>().await,
                false => drop(select_all(watchers).await),
            }
            Ok(())
        };
        match tokio::time::timeout(slice, watched).await {
            Ok(Err(e)) => {
                // Not a busy loop against a failing server.
                tokio::time::sleep(max.min(MIN_WAIT_SLICE)).await;
                Err(e)
            }
            Ok(Ok(())) | Err(_) => Ok(()),
        }
    }

    async fn stop_waiting(&self, _name: &str) -> Result<(), BackendError> {
        let node = {
            let mut local = self.local();
            local.waiting_for = None;
            local.node.take()
        };
        match (node, self.current()) {
            (Some(node), Some(client)) => {
                let gone = self.delete_ours(&client, &node, None);
                match gone.await {
                    Ok(()) | Err(BackendError::NotOwner) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        }
    }
}
