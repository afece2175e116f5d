//! Redis Cluster: one URL (`redis://` at any node, or `redis+cluster://` with several
//! seeds) works for every name. Part of [`super`].
//!
//! Every key of a lock carries the `{NAME}` hash tag, so every script touches one
//! Cluster slot, owned by one master. The backend keeps one connection, to the node
//! that last answered for the name (a lockrun process works on one name):
//!
//! - `MOVED slot host:port`: the slot lives elsewhere (always, or since a migration
//!   or a failover): the node is learned, the connection is made anew to it, and the
//!   command is sent again (it did not run).
//! - `ASK slot host:port`: the slot is being migrated and the keys are already on the
//!   target: `ASKING` then the command, once, on a connection of its own to that node;
//!   the next command goes to the owner again.
//! - `TRYAGAIN`: the keys of a multi-key command are split between the two nodes of a
//!   migration: the command is sent again after a short pause.
//!
//! All of these are bounded by [`MAX_REDIRECTIONS`] per call. When a connection to a
//! node of a Cluster fails, or a call to it is abandoned unanswered (the master died or
//! froze, and a replica is being promoted), the next connection first asks the other
//! nodes heard of (the seeds, and every node named by a redirection or by an earlier
//! answer) `CLUSTER SLOTS` for the slot's master, then tries it, then every other node
//! heard of: a live node redirects to the new master once the failover is done. A
//! `redis://` URL naming the very master of the name, which is then never heard to
//! redirect, gives no other node to ask (nor is it known to be a Cluster): give several
//! seeds (`redis+cluster://`) to follow the failover of that node.
//!
//! Wake-ups stay `PUBLISH`/`SUBSCRIBE`: a Cluster sends every `PUBLISH` to every node.
//!
//! A Redlock node or a Sentinel master follows no redirection: several `--url`s are a
//! quorum of independent servers, and counting three nodes of one Cluster, which
//! redirect to a single master, as three votes would be no quorum at all. A
//! redirection there is refused (125) with a line that says so.

mod key_slot;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind, Value};

use super::conn::{self, RedisConn};
use super::errors::{describe, describe_in, Context};
use super::scripts::{wants_source, Keys, Script};
use super::target::{Node, Seeds};
use super::RedisBackend;
use crate::backend::BackendError;
pub use key_slot::key_slot;

/// How many redirections (and `TRYAGAIN` pauses) one call follows before it gives up
/// (`Unavailable`: the driver retries as for a server that does not answer).
pub const MAX_REDIRECTIONS: u32 = 16;

/// How long one node may take to connect when others are left to try, and to answer
/// `CLUSTER SLOTS`.
const NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// The first pause after a `TRYAGAIN`; it doubles up to [`TRYAGAIN_MAX`].
const TRYAGAIN_FIRST: Duration = Duration::from_millis(10);
const TRYAGAIN_MAX: Duration = Duration::from_millis(200);

/// Where the name's slot lives, as far as this process has learned.
pub struct Router {
    state: Mutex<State>,
}

struct State {
    /// Redirections are followed (the URL's kind allows it).
    follow: bool,
    /// It is known to be a Cluster: `redis+cluster://`, or a redirection was seen.
    cluster: bool,
    /// The node that owns the slot, as last learned.
    owner: Option<Node>,
    /// Every node heard of, seeds first.
    known: Vec<Node>,
    /// The node whose connection failed, or whose answer never came, last (the next
    /// connection asks the others where the slot is).
    lost: Option<Node>,
    /// The node of the current connection, for messages.
    current: Option<Node>,
}

impl Router {
    /// The router of a target with `seeds` (none: never follow).
    pub fn new(seeds: Option<&Seeds>) -> Router {
        let nodes = seeds.map(|s| s.nodes.clone()).unwrap_or_default();
        Router {
            state: Mutex::new(State {
                follow: !nodes.is_empty(),
                cluster: seeds.is_some_and(|s| s.declared) && !nodes.is_empty(),
                owner: None,
                known: nodes,
                lost: None,
                current: None,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether redirections are followed.
    pub fn follows(&self) -> bool {
        self.state().follow
    }

    /// Whether it is known to be a Cluster (`redis+cluster://`, or a redirection seen).
    pub fn is_cluster(&self) -> bool {
        self.state().cluster
    }

    /// The node to connect to first, then the others, without repeats.
    fn candidates(&self) -> Vec<Node> {
        let s = self.state();
        let mut list: Vec<Node> = s.owner.iter().cloned().collect();
        for n in &s.known {
            if !list.contains(n) {
                list.push(n.clone());
            }
        }
        list
    }

    fn learn(s: &mut State, node: &Node) {
        if !s.known.contains(node) {
            s.known.push(node.clone());
        }
    }

    /// The slot lives on `node` (a `MOVED`, or `CLUSTER SLOTS`).
    fn moved(&self, node: &Node) {
        let mut s = self.state();
        s.cluster = true;
        Self::learn(&mut s, node);
        s.owner = Some(node.clone());
    }

    /// A command is about to be sent to the current node: until it is answered, the
    /// node counts as lost (a call abandoned by the caller's timeout, on a frozen or
    /// partitioned master, never answers).
    fn sending(&self) {
        let mut s = self.state();
        s.lost = s.current.clone();
    }

    /// The current node answered (a reply or a server error).
    fn answered(&self) {
        self.state().lost = None;
    }

    /// The node of the current connection as `host:port`, or `fallback`.
    pub fn at(&self, fallback: &str) -> String {
        self.state()
            .current
            .as_ref()
            .map_or_else(|| fallback.to_owned(), show)
    }
}

/// `host:port`
pub(super) fn show((host, port): &Node) -> String {
    format!("{host}:{port}")
}

/// The node of a redirection's `host:port`; an empty or `?` host (a node that does
/// not know its own address) is the host of the node that answered, `from`.
fn redirected(addr: &str, from: Option<&Node>) -> Option<Node> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|&p| p != 0)?;
    let host = match host {
        "" | "?" => from?.0.clone(),
        h => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
    };
    Some((host, port))
}

/// One range of a `CLUSTER SLOTS` answer: first and last slot, the master, every node.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Range {
    first: u16,
    last: u16,
    pub(super) master: Node,
    nodes: Vec<Node>,
}

/// Parses `CLUSTER SLOTS` as asked of `from`; ranges that do not parse are skipped.
pub(super) fn slot_ranges(reply: &Value, from: &Node) -> Vec<Range> {
    let int = |v: &Value| match v {
        Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let node = |v: &Value| -> Option<Node> {
        let Value::Array(parts) = v else { return None };
        let host = match parts.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let port = int(parts.get(1)?)?;
        redirected(&format!("{host}:{port}"), Some(from))
    };
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let nodes: Vec<Node> = r.iter().skip(2).filter_map(node).collect();
            Some(Range {
                first: int(r.first()?)?,
                last: int(r.get(1)?)?,
                master: node(r.get(2)?)?,
                nodes,
            })
        })
        .collect()
}

/// What a redirection asks for.
enum Redirect {
    Moved(Node),
    Ask(Node),
}

/// The redirection in `e`, if it is one (`Err` when it does not parse).
fn redirect_of(e: &redis::RedisError, from: Option<&Node>) -> Option<Result<Redirect, ()>> {
    let ask = match e.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => false,
        ErrorKind::Server(ServerErrorKind::Ask) => true,
        _ => return None,
    };
    let node = e
        .redirect_node()
        .and_then(|(addr, _)| redirected(addr, from));
    Some(match node {
        Some(n) if ask => Ok(Redirect::Ask(n)),
        Some(n) => Ok(Redirect::Moved(n)),
        None => Err(()),
    })
}

fn is_tryagain(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
}

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

impl RedisBackend {
    /// Where a waiter subscribes to its wake-ups: the node of the current connection
    /// in a Cluster (every node hears every `PUBLISH`), else the URL's server.
    pub(super) fn subscriber_target(&self) -> super::RedisTarget {
        let current = self.router.state().current.clone();
        match current {
            Some(node) if self.router.follows() => self.target.at(&node),
            _ => self.target.clone(),
        }
    }

    /// Makes the connection for lock `name`: to the server of the URL, or, for a
    /// target that follows a Cluster, to the slot's owner as learned (after a failed
    /// connection, asking the other nodes first), else to each node heard of in turn.
    pub(super) async fn connect(&self, name: &str) -> Result<RedisConn, BackendError> {
        if !self.router.follows() {
            return conn::connect(&self.target, &self.display).await;
        }
        let refresh = {
            let mut s = self.router.state();
            let lost = s.lost.take();
            lost.filter(|_| s.cluster)
        };
        if let Some(lost) = refresh {
            let slot = key_slot(&Keys::new(&self.key_prefix, name).lock);
            self.refresh(slot, &lost).await;
        }
        let candidates = self.router.candidates();
        let mut last = None;
        for (i, node) in candidates.iter().enumerate() {
            let at = show(node);
            let target = self.target.at(node);
            let attempt = conn::connect(&target, &at);
            let made = if i + 1 < candidates.len() {
                tokio::time::timeout(NODE_TIMEOUT, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(BackendError::Unavailable(format!(
                            "cannot reach Redis at {at}: timed out"
                        )))
                    })
            } else {
                attempt.await
            };
            match made {
                Ok(c) => {
                    self.router.state().current = Some(node.clone());
                    return Ok(c);
                }
                // A refusal (authentication, TLS trust) is the same on every node.
                Err(e @ BackendError::Refused(_)) => return Err(e),
                Err(e) => {
                    let mut s = self.router.state();
                    if s.owner.as_ref() == Some(node) {
                        s.owner = None;
                    }
                    last = Some(e);
                }
            }
        }
        Err(match last {
            Some(e) if candidates.len() > 1 => {
                let tried: Vec<String> = candidates.iter().map(show).collect();
                BackendError::Unavailable(format!(
                    "no node of the Redis Cluster answered (tried {}); the last: {e}",
                    tried.join(", ")
                ))
            }
            Some(e) => e,
            None => BackendError::Unavailable("no node of the Redis Cluster to connect to".into()),
        })
    }

    /// Asks the nodes heard of, `lost` last, for the master of `slot`, and learns it
    /// and every node named.
    async fn refresh(&self, slot: u16, lost: &Node) {
        let mut order = self.router.candidates();
        order.retain(|n| n != lost);
        order.push(lost.clone());
        for node in order {
            let ask = async {
                let c = conn::connect(&self.target.at(&node), &show(&node)).await?;
                let mut conn = c.conn.clone();
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(|e| describe(&e, &show(&node)))
            };
            let Ok(Ok(reply)) = tokio::time::timeout(NODE_TIMEOUT, ask).await else {
                continue;
            };
            let ranges = slot_ranges(&reply, &node);
            if ranges.is_empty() {
                continue;
            }
            {
                let mut s = self.router.state();
                for n in ranges.iter().flat_map(|r| &r.nodes) {
                    Router::learn(&mut s, n);
                }
            }
            if let Some(r) = ranges.iter().find(|r| r.first <= slot && slot <= r.last) {
                self.router.moved(&r.master);
            }
            return;
        }
    }

    /// Sends `cmd` (a command on lock `name`'s keys) and answers its reply, following
    /// the Cluster's redirections (see the module documentation). A failed call drops
    /// the connection (so does an abandoned one). `source`: `cmd` is an `EVALSHA`, and
    /// this makes its `EVAL`, sent instead where the server lacks the script.
    pub(super) async fn query(
        &self,
        name: &str,
        cmd: &redis::Cmd,
        script: Script,
        source: Option<&dyn Fn() -> redis::Cmd>,
    ) -> Result<Value, BackendError> {
        let mut pause = TRYAGAIN_FIRST;
        let mut by_source = None;
        for _ in 0..MAX_REDIRECTIONS {
            let cmd = by_source.as_ref().unwrap_or(cmd);
            let c = self.conn(name).await?;
            let at = self.router.at(&self.display);
            let e = match self.send(&c, cmd).await {
                Ok(v) => return c.settle(Ok(v)),
                Err(e) => e,
            };
            if let Some(source) = source.filter(|_| by_source.is_none() && wants_source(&e)) {
                c.keep();
                by_source = Some(source());
                continue;
            }
            let from = self.router.state().current.clone();
            match redirect_of(&e, from.as_ref()) {
                Some(_) if !self.router.follows() => {
                    c.keep();
                    return Err(not_following(&at, &e));
                }
                Some(Ok(Redirect::Moved(node))) => {
                    self.router.moved(&node);
                    // Forgets this connection: the next one goes to the owner.
                    drop(c);
                }
                Some(Ok(Redirect::Ask(node))) => {
                    c.keep();
                    let to = (&node, source);
                    if let Some(v) = self.follow_ask(to, cmd, script, &mut pause).await? {
                        return Ok(v);
                    }
                }
                Some(Err(())) => return c.settle(Err(describe(&e, &at))),
                None if !self.router.follows() || !is_tryagain(&e) => {
                    let ctx = Context::new(&self.target, &at, &self.key_prefix);
                    let error = c.explain(&e, &ctx, Some(script)).await;
                    return c.settle(Err(error));
                }
                None => {
                    c.keep();
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(TRYAGAIN_MAX);
                }
            }
        }
        Err(BackendError::Unavailable(format!(
            "the Redis Cluster at {} redirected lockrun {MAX_REDIRECTIONS} times in a row \
             (a slot migration or failover in progress?)",
            self.router.at(&self.display)
        )))
    }

    /// Sends `cmd` on `c`; tells the router and the connection what became of it.
    async fn send(&self, c: &RedisConn, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        let mut conn = c.conn.clone();
        self.router.sending();
        let reply = cmd.query_async::<Value>(&mut conn).await;
        match &reply {
            Ok(_) => {
                self.router.answered();
                c.answered();
            }
            Err(e) if !is_connection_error(e) => self.router.answered(),
            Err(_) => {}
        }
        reply
    }

    /// Follows an `ASK` redirection to `node`: its answer, or `None` to try again (a
    /// `TRYAGAIN`, after a pause that doubles up to [`TRYAGAIN_MAX`], or a further
    /// redirection). By `source` if given: the node the slot moves to may lack the script.
    async fn follow_ask(
        &self,
        (node, source): (&Node, Option<&dyn Fn() -> redis::Cmd>),
        cmd: &redis::Cmd,
        script: Script,
        pause: &mut Duration,
    ) -> Result<Option<Value>, BackendError> {
        let full = source.map(|f| f());
        match self.asking(node, full.as_ref().unwrap_or(cmd)).await? {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_tryagain(&e) => {
                tokio::time::sleep(*pause).await;
                *pause = (*pause * 2).min(TRYAGAIN_MAX);
                Ok(None)
            }
            Err(e) if redirect_of(&e, Some(node)).is_some() => Ok(None),
            Err(e) => {
                let at = show(node);
                let ctx = Context::new(&self.target, &at, &self.key_prefix);
                Err(describe_in(&e, &ctx, Some(script)))
            }
        }
    }

    /// `ASKING`, then `cmd`, on a connection of their own to `node` (the target of a
    /// slot migration).
    /// The outer error: no connection could be made.
    async fn asking(
        &self,
        node: &Node,
        cmd: &redis::Cmd,
    ) -> Result<redis::RedisResult<Value>, BackendError> {
        let c = conn::connect(&self.target.at(node), &show(node)).await?;
        let mut conn = c.conn.clone();
        Ok(
            match redis::cmd("ASKING").query_async::<()>(&mut conn).await {
                Ok(()) => cmd.query_async::<Value>(&mut conn).await,
                Err(e) => Err(e),
            },
        )
    }
}

/// The refusal of a Cluster node's redirection (`e`) where lockrun was not told it
/// talks to a Cluster (`redis://`, or several `--url`).
fn not_following(at: &str, e: &redis::RedisError) -> BackendError {
    BackendError::Refused(format!(
        "Redis at {at} is a node of a Redis Cluster (it answered {}): several \
         --url make a Redlock quorum of independent servers; give one node \
         of the Cluster (redis://HOST:PORT) or its seeds \
         (redis+cluster://HOST:PORT,HOST:PORT) as the one --url",
        e.code().unwrap_or("MOVED")
    ))
}

#[cfg(test)]
mod tests;
