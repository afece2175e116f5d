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
//!   up to the granted value (the queue node records it, and `status` shows it).
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
//! against `--ttl` in ensembles (README).
//!
//! **`--hold-at-least`**: a session cannot outlive the process, so the release moves
//! the lock, in one multi-request (atomic), from our queue node to a persistent `hold`
//! node in the directory that says for how long it keeps the lock. Its creation time
//! and the "now" it is compared with are both the server's clock (a waiter gets "now"
//! from a write of its own), never a lockrun host's. The first in the queue takes the
//! lock only once the hold is over (then it deletes it); `release --force` deletes it
//! too. The hold node is one small node per name, removed by the next holder.
//!
//! **ACLs**: nodes are created readable and writable by anyone, or, with a user and
//! password in the URL (ZooKeeper's `digest` scheme), by that identity only.
//!
//! **Client**: the `zookeeper-client` crate (pure Rust, async, its own connection task
//! on our runtime). Its TLS feature would build a C cryptography library (aws-lc), so
//! `zk://` has no TLS.

mod errors;
mod layout;
mod queue;
mod target;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use zookeeper_client::{Acls, Client};

use crate::backend::{
    Acquire, AcquireRequest, Backend, BackendError, Holder, Release, MIN_WAIT_SLICE,
};
use crate::config::BackendConfig;
use errors::{describe, session_over};
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
    /// The caller may wait (`--wait`): queue when the lock is busy.
    waiting: bool,
    /// The session: made by the first call, kept for the whole run (our nodes live and
    /// die with it), made again only once it has ended.
    session: Mutex<Option<Client>>,
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

/// Our queue node.
#[derive(Clone, Debug)]
struct OurNode {
    /// The lock's directory.
    dir: String,
    /// The token in its name.
    token: String,
    /// Its path, once the server has answered its creation.
    path: Option<String>,
    /// Its creation zxid: the fencing token.
    czxid: i64,
    /// Its value (written again to stamp the time the lock was taken).
    value: Vec<u8>,
    /// A busy answer was given with it: taking the lock later stamps the time.
    waited: bool,
}

/// What a waiter waits for.
#[derive(Clone, Debug)]
enum WaitFor {
    /// The deletion of the node just ahead of ours.
    Node(String),
    /// The end of a `--hold-at-least` (or the deletion of its node), in at most this long.
    Hold(String, Duration),
}

impl ZkBackend {
    /// A backend for `target`; `waiting`: the caller may wait for a busy lock.
    pub fn new(target: ZkTarget, config: &BackendConfig, waiting: bool) -> ZkBackend {
        ZkBackend {
            target,
            key_prefix: config.key_prefix.clone(),
            waiting,
            session: Mutex::new(None),
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
        crate::backend::Target::display(&self.target)
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
        let client = connector
            .connect(&self.target.connect_string())
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
        if granted < req.ttl {
            return Err(BackendError::Refused(format!(
                "ZooKeeper at {} grants sessions of at most {} (its maxSessionTimeout), less \
                 than --ttl {}: use --ttl {} or less, or raise maxSessionTimeout",
                self.at(),
                crate::run::ms(granted),
                crate::run::ms(req.ttl),
                crate::run::ms(granted)
            )));
        }
        let dir = self.dir(name);
        self.drop_stale(&client, &req.token).await?;
        if self.our_node(&req.token).is_none() {
            // Without --wait, a busy lock is answered without queueing; a free one may
            // be taken without listing the queue again (see `busy_now`).
            let mut first_if = None;
            if !self.waiting {
                match self.busy_now(&client, &dir).await? {
                    Err(holder) => return Ok(Acquire::Busy(holder)),
                    Ok(empty_at) => first_if = empty_at,
                }
            }
            let sequence = self.enqueue(&client, &dir, req, granted).await?;
            if first_if == Some(sequence) {
                return self.taken(&client).await;
            }
        }
        self.take_or_wait(&client, &dir, &req.token).await
    }

    async fn renew(&self, _name: &str, token: &str, _ttl: Duration) -> Result<(), BackendError> {
        // Never a new session here: a new one would own nothing.
        let (Some(node), Some(client)) = (self.our_node(token), self.current()) else {
            return Err(BackendError::NotOwner);
        };
        let path = node.path.unwrap_or_default();
        let sync = client.sync(&node.dir);
        let exists = client.check_stat(&path);
        let (synced, exists) = tokio::join!(sync, exists);
        // A definite loss from either answer wins over an error from the other.
        match (&exists, &synced) {
            (Ok(Some(stat)), Ok(())) if stat.ephemeral_owner == client.session_id().0 => Ok(()),
            (Ok(_), Ok(())) => Err(BackendError::NotOwner),
            (Err(e), _) | (_, Err(e)) if session_over(e) => Err(BackendError::NotOwner),
            (Ok(None), _) => Err(BackendError::NotOwner),
            (Err(e), _) | (_, Err(e)) => Err(self.error(e, &path)),
        }
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
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
        match (node, how) {
            (Some(node @ OurNode { path: Some(_), .. }), Release::KeepFor(keep)) => {
                self.keep_for(&client, &node, keep).await
            }
            (Some(node), _) => self.delete_ours(&client, &node.dir, token, node.path).await,
            // A token never seen answered: delete whatever node it may have made.
            (None, _) => {
                self.delete_ours(&client, &self.dir(name), token, None)
                    .await
            }
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let client = self.session(ADMIN_SESSION).await?;
            Ok(self.look(&client, &self.dir(name)).await?.map(|(h, _)| h))
        }
        .await;
        Ok(one?.into_iter().collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let client = self.session(ADMIN_SESSION).await?;
            self.break_lock(&client, &self.dir(name)).await
        }
        .await;
        Ok(one?.into_iter().collect())
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
        let (path, slice) = match what {
            WaitFor::Node(path) => (path, max.min(WATCH_SLICE)),
            // The hold ends by the server's clock: look again a little after it should.
            WaitFor::Hold(path, left) => (path, max.min(left + MIN_WAIT_SLICE)),
        };
        let watched = async {
            let (stat, watcher) = client
                .check_and_watch_stat(&path)
                .await
                .map_err(|e| self.error(&e, &path))?;
            if stat.is_some() {
                watcher.changed().await;
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
                let gone = self.delete_ours(&client, &node.dir, &node.token, node.path);
                match gone.await {
                    Ok(()) | Err(BackendError::NotOwner) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            _ => Ok(()),
        }
    }
}
