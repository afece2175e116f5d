//! The tap: the shared fault-injecting proxy (`support::Proxy`) in front of the lock's
//! `redis-server`, watched so that it also *records* the lockrun traffic it carries:
//! every `EVAL` or `EVALSHA` request with the moment it reached the proxy, and the server's reply
//! with whether it was handed on to the client. It names lockrun's calls for the proxy,
//! which can then hold back the next acquire or release.
//!
//! The record is what the history checker needs to bound, from the outside, the lease
//! deadline lockrun could know: a request reaches the proxy *after* lockrun took its send
//! time, so "arrival at the proxy + TTL" is never earlier than lockrun's own deadline.
//!
//! Replies are matched to requests in order, per connection (Redis answers in order);
//! RESP3 push frames (pub/sub wake-ups) are not replies, except the `subscribe`
//! confirmation, which answers a SUBSCRIBE. A wake-up that grants the lock
//! (`granted FENCE SLOT TOKEN16`, see `src/backend/redis/grants.rs`) is recorded as an
//! acquisition: sent when the waiter's last attempt that found the lock busy reached
//! the proxy (the grant came after it, and the waiter counts its lease from there),
//! with that attempt's token.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockrun::backend::redis::{script_sha1, script_source};

use crate::support::{Proxy, Watch, Watcher};

/// A RESP value, as much of it as the checker needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    /// `+...`, `$...`, `=...`, `(...`, `,...`: the text.
    Text(String),
    /// `:N`.
    Int(i64),
    /// `-...`, `!...`.
    Error(String),
    /// `*`, `~`, `%` (flattened), `>`.
    Array(Vec<Resp>),
    /// `_`, `$-1`, `*-1`, `#`.
    Null,
}

impl Resp {
    fn text(&self) -> Option<&str> {
        match self {
            Resp::Text(s) => Some(s),
            _ => None,
        }
    }
}

/// Parses one RESP2/RESP3 frame at the start of `buf`: the value, whether it was a push
/// frame, and its length; `None` if the frame is not complete yet.
pub fn parse(buf: &[u8]) -> Option<(Resp, bool, usize)> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n")?;
    let head = std::str::from_utf8(&buf[1..line_end]).unwrap_or("");
    let after = line_end + 2;
    let kind = *buf.first()?;
    Some(match kind {
        b'+' => (Resp::Text(head.into()), false, after),
        b'-' => (Resp::Error(head.into()), false, after),
        b':' => (Resp::Int(head.parse().unwrap_or(0)), false, after),
        b',' | b'(' => (Resp::Text(head.into()), false, after),
        b'#' | b'_' => (Resp::Null, false, after),
        b'$' | b'=' | b'!' => return parse_bulk(buf, kind, head, after),
        b'*' | b'~' | b'>' | b'%' | b'|' => return parse_aggregate(buf, kind, head, after),
        // Inline commands (a bare `PING\r\n`): one line of words.
        _ => (
            Resp::Array(
                std::str::from_utf8(&buf[..line_end])
                    .unwrap_or("")
                    .split_whitespace()
                    .map(|w| Resp::Text(w.into()))
                    .collect(),
            ),
            false,
            after,
        ),
    })
}

/// A bulk string (or verbatim string, or bulk error) whose length `head` announces and
/// whose bytes start at `after`.
fn parse_bulk(buf: &[u8], kind: u8, head: &str, after: usize) -> Option<(Resp, bool, usize)> {
    let n: i64 = head.parse().unwrap_or(-1);
    if n < 0 {
        return Some((Resp::Null, false, after));
    }
    let end = after + n as usize;
    if buf.len() < end + 2 {
        return None;
    }
    let s = String::from_utf8_lossy(&buf[after..end]).into_owned();
    let v = if kind == b'!' {
        Resp::Error(s)
    } else {
        Resp::Text(s)
    };
    Some((v, false, end + 2))
}

/// An array, set, push, map (flattened) or attribute of `head` items starting at `after`.
fn parse_aggregate(buf: &[u8], kind: u8, head: &str, after: usize) -> Option<(Resp, bool, usize)> {
    let n: i64 = head.parse().unwrap_or(-1);
    if n < 0 {
        return Some((Resp::Null, false, after));
    }
    let per_item = if kind == b'%' || kind == b'|' { 2 } else { 1 };
    let mut items = Vec::new();
    let mut at = after;
    for _ in 0..n * per_item {
        let (v, _, len) = parse(&buf[at..])?;
        items.push(v);
        at += len;
    }
    if kind == b'|' {
        // An attribute: the real value follows.
        let (v, push, len) = parse(&buf[at..])?;
        return Some((v, push, at + len));
    }
    Some((Resp::Array(items), kind == b'>', at))
}

/// Which lockrun script an `EVAL` ran, told by its source (the exact text lockrun
/// sends, from the library: its keys and arguments change with `--slots`, its source
/// does not). ARGV[1] of the three named here is lockrun's lock token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Take the lock (a slot of a semaphore), or queue as a waiter.
    Acquire,
    /// Extend the lease.
    Renew,
    /// Free the lock (the holder's slot).
    Release,
    /// Anything else (leave the queue, inspect, ...).
    Other,
}

/// One `EVAL` that went through the proxy.
#[derive(Clone, Debug)]
pub struct Record {
    /// Which script.
    pub call: Call,
    /// ARGV[1]: lockrun's lock token (random, not the fencing token) for acquire, renew
    /// and release.
    pub token: String,
    /// When the request reached the proxy (`CLOCK_BOOTTIME`).
    pub sent: Duration,
    /// When the reply came back from the server, if it did.
    pub replied: Option<Duration>,
    /// The reply.
    pub reply: Option<Resp>,
    /// True when the reply was handed to the client's socket.
    pub delivered: bool,
}

impl Record {
    /// For a successful acquire: the fencing token handed out.
    pub fn fence(&self) -> Option<u64> {
        match (&self.call, &self.reply) {
            (Call::Acquire, Some(Resp::Array(a))) if a.first() == Some(&Resp::Int(1)) => {
                a.get(1)?.text()?.parse().ok()
            }
            _ => None,
        }
    }

    /// For a successful acquire whose reply names the slot taken (`{1, fence, slot,
    /// ...}`): that slot.
    pub fn slot(&self) -> Option<u32> {
        match (&self.call, &self.reply) {
            (Call::Acquire, Some(Resp::Array(a))) if a.first() == Some(&Resp::Int(1)) => {
                match a.get(2)? {
                    Resp::Int(i) => u32::try_from(*i).ok(),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// True for an acquire that took the lock or a renewal that extended it.
    pub fn succeeded(&self) -> bool {
        match self.call {
            Call::Acquire => self.fence().is_some(),
            Call::Renew => self.reply == Some(Resp::Int(1)),
            Call::Release | Call::Other => false,
        }
    }
}

impl Call {
    /// The name the proxy holds requests by, and the script's own name.
    fn name(self) -> &'static str {
        match self {
            Call::Acquire => "acquire",
            Call::Renew => "renew",
            Call::Release => "release",
            Call::Other => "other",
        }
    }
}

/// The recording proxy. Dropping it closes everything.
pub struct Tap {
    proxy: Proxy,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Tap {
    /// A tap in `Pass` mode in front of 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Tap {
        let records = Arc::new(Mutex::new(Vec::new()));
        let watch = Recorder {
            records: records.clone(),
        };
        Tap {
            proxy: Proxy::watched(upstream_port, watch),
            records,
        }
    }

    /// The proxy, for its faults.
    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.proxy.url()
    }

    /// Holds back the next `n` requests of `call` (see [`Proxy::hold_next`]).
    pub fn hold_next(&self, call: Call, n: u32) {
        self.proxy.hold_next(call.name(), n);
    }

    /// How many connections are held back because of `call` now.
    pub fn held(&self, call: Call) -> usize {
        self.proxy.held(call.name())
    }

    /// Lets the connections held because of `call` go on (`deliver`), or drops them.
    pub fn release_held(&self, call: Call, deliver: bool) {
        self.proxy.release_held(call.name(), deliver);
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }
}

/// Makes a [`Connection`] recorder for each connection of the tap.
struct Recorder {
    records: Arc<Mutex<Vec<Record>>>,
}

impl Watch for Recorder {
    fn connection(&self) -> Arc<dyn Watcher> {
        Arc::new(Connection {
            records: self.records.clone(),
            pending: Mutex::default(),
            requests: Mutex::default(),
            replies: Mutex::default(),
            unsent: Mutex::default(),
        })
    }
}

/// A request waiting for its reply.
struct Pending {
    sent: Duration,
    call: Option<(Call, String)>,
    subscribe: bool,
}

/// The record of one connection: requests in the order they came, each matched with
/// the next reply (Redis answers in order).
struct Connection {
    records: Arc<Mutex<Vec<Record>>>,
    pending: Mutex<VecDeque<Pending>>,
    /// Bytes of a request frame not complete yet.
    requests: Mutex<Vec<u8>>,
    /// Bytes of a reply frame not complete yet.
    replies: Mutex<Vec<u8>>,
    /// Replies matched but not yet handed on.
    unsent: Mutex<Vec<Record>>,
}

impl Watcher for Connection {
    fn requests(&self, bytes: &[u8], at: Duration) -> Vec<&'static str> {
        let mut acc = self.requests.lock().unwrap();
        acc.extend_from_slice(bytes);
        let mut calls = Vec::new();
        while let Some((frame, _, len)) = parse(&acc) {
            acc.drain(..len);
            let p = classify(frame, at);
            calls.extend(p.call.as_ref().map(|(call, _)| call.name()));
            self.pending.lock().unwrap().push_back(p);
        }
        calls
    }

    fn replies(&self, bytes: &[u8], at: Duration) {
        let mut acc = self.replies.lock().unwrap();
        acc.extend_from_slice(bytes);
        while let Some((frame, push, len)) = parse(&acc) {
            acc.drain(..len);
            if let Some(r) = grant(&self.records, &frame, at) {
                self.unsent.lock().unwrap().push(r);
                continue;
            }
            if let Some(r) = match_reply(&self.pending, frame, push, at) {
                self.unsent.lock().unwrap().push(r);
            }
        }
    }

    fn forwarded(&self, delivered: bool) {
        let mut records = self.records.lock().unwrap();
        for mut r in self.unsent.lock().unwrap().drain(..) {
            r.delivered = delivered;
            records.push(r);
        }
    }

    fn closed(&self) {
        // Requests never answered (the server died, the connection was cut) are
        // recorded too.
        let mut records = self.records.lock().unwrap();
        for p in self.pending.lock().unwrap().drain(..) {
            if let Some((call, token)) = p.call {
                records.push(Record {
                    call,
                    token,
                    sent: p.sent,
                    replied: None,
                    reply: None,
                    delivered: false,
                });
            }
        }
    }
}

/// Reads a request frame: which lockrun call it is, if it is one, and whether it
/// subscribes.
fn classify(frame: Resp, sent: Duration) -> Pending {
    let words: Vec<String> = match frame {
        Resp::Array(a) => a
            .into_iter()
            .map(|v| v.text().unwrap_or("").to_owned())
            .collect(),
        _ => Vec::new(),
    };
    let name = words
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    let subscribe = name.ends_with("SUBSCRIBE");
    let call = (name == "EVAL" || name == "EVALSHA").then(|| {
        let body = words.get(1).map_or("", String::as_str);
        let of = |c: &Call| match name.as_str() {
            "EVAL" => script_source(c.name()),
            _ => script_sha1(c.name()),
        };
        let call = [Call::Acquire, Call::Renew, Call::Release]
            .into_iter()
            .find(|c| of(c) == Some(body))
            .unwrap_or(Call::Other);
        let nkeys: usize = words.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        let argv = words.get(3 + nkeys..).unwrap_or(&[]);
        (call, argv.first().cloned().unwrap_or_default())
    });
    Pending {
        sent,
        call,
        subscribe,
    }
}

/// A pub/sub message that grants the lock: the acquisition it is (see the module),
/// found among `records` by the token's first 16 characters.
fn grant(records: &Mutex<Vec<Record>>, frame: &Resp, at: Duration) -> Option<Record> {
    let Resp::Array(parts) = frame else {
        return None;
    };
    let [kind, _channel, payload] = parts.as_slice() else {
        return None;
    };
    let words: Vec<&str> = payload.text()?.split(' ').collect();
    let [granted, fence, slot, token16] = words.as_slice() else {
        return None;
    };
    if kind.text() != Some("message") || *granted != "granted" {
        return None;
    }
    let busy = |r: &&Record| {
        r.call == Call::Acquire
            && r.token.starts_with(token16)
            && r.sent <= at
            && matches!(&r.reply, Some(Resp::Array(a)) if a.first() == Some(&Resp::Int(0)))
    };
    let records = records.lock().unwrap();
    let asked = records.iter().filter(busy).max_by_key(|r| r.sent);
    Some(Record {
        call: Call::Acquire,
        token: asked.map_or_else(|| token16.to_string(), |r| r.token.clone()),
        sent: asked.map_or(at, |r| r.sent),
        replied: Some(at),
        reply: Some(Resp::Array(vec![
            Resp::Int(1),
            Resp::Text(fence.to_string()),
            Resp::Int(slot.parse().ok()?),
        ])),
        delivered: false,
    })
}

/// Matches a reply frame to the request it answers; returns the record of a lockrun
/// call.
fn match_reply(
    pending: &Mutex<VecDeque<Pending>>,
    frame: Resp,
    push: bool,
    replied: Duration,
) -> Option<Record> {
    let mut pending = pending.lock().unwrap();
    if push {
        // A subscribe confirmation answers the SUBSCRIBE; other pushes answer nothing.
        let confirms = matches!(&frame, Resp::Array(a)
            if a.first().and_then(Resp::text).is_some_and(|w| w.ends_with("subscribe")));
        if confirms && pending.front().is_some_and(|p| p.subscribe) {
            pending.pop_front();
        }
        return None;
    }
    // A RESP2 subscribe confirmation is a plain array; skip unanswered SUBSCRIBEs.
    while pending.front().is_some_and(|p| p.subscribe) {
        pending.pop_front();
    }
    let p = pending.pop_front()?;
    let (call, token) = p.call?;
    Some(Record {
        call,
        token,
        sent: p.sent,
        replied: Some(replied),
        reply: Some(frame),
        delivered: false,
    })
}
