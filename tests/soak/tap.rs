//! A fault-injecting TCP proxy in front of the lock's `redis-server` that also *records*
//! the lockrun traffic it carries: every `EVAL` request with the moment it reached the
//! proxy, and the server's reply with whether it was handed on to the client.
//!
//! The faults are those of `support::Proxy` (pass, blackhole, cut, refuse, reply delay);
//! the record is what the history checker needs to bound, from the outside, the lease
//! deadline lockrun could know: a request reaches the proxy *after* lockrun took its send
//! time, so "arrival at the proxy + TTL" is never earlier than lockrun's own deadline.
//!
//! Replies are matched to requests in order, per connection (Redis answers in order);
//! RESP3 push frames (pub/sub wake-ups) are not replies, except the `subscribe`
//! confirmation, which answers a SUBSCRIBE.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::support::{boottime, Mode, POLL};

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
    let aggregate = |n: i64, mul: i64| -> Option<(Vec<Resp>, usize)> {
        let mut items = Vec::new();
        let mut at = after;
        for _ in 0..(n.max(0) * mul) {
            let (v, _, len) = parse(&buf[at..])?;
            items.push(v);
            at += len;
        }
        Some((items, at))
    };
    Some(match kind {
        b'+' => (Resp::Text(head.into()), false, after),
        b'-' => (Resp::Error(head.into()), false, after),
        b':' => (Resp::Int(head.parse().unwrap_or(0)), false, after),
        b',' | b'(' => (Resp::Text(head.into()), false, after),
        b'#' | b'_' => (Resp::Null, false, after),
        b'$' | b'=' | b'!' => {
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
            (v, false, end + 2)
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n: i64 = head.parse().unwrap_or(-1);
            if n < 0 {
                return Some((Resp::Null, false, after));
            }
            let mul = if kind == b'%' || kind == b'|' { 2 } else { 1 };
            let (items, at) = aggregate(n, mul)?;
            if kind == b'|' {
                // An attribute: the real value follows.
                let (v, push, len) = parse(&buf[at..])?;
                return Some((v, push, at + len));
            }
            (Resp::Array(items), kind == b'>', at)
        }
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

/// Which lockrun script an `EVAL` ran, told by its keys (see `src/backend/redis.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// KEYS lock, fence, queue, alive; ARGV token, ttl, host, pid, waiter, alive_ms.
    Acquire,
    /// KEYS lock; ARGV token, ttl.
    Renew,
    /// KEYS lock, queue, alive; ARGV token, keep, prefix.
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

    /// True for an acquire that took the lock or a renewal that extended it.
    pub fn succeeded(&self) -> bool {
        match self.call {
            Call::Acquire => self.fence().is_some(),
            Call::Renew => self.reply == Some(Resp::Int(1)),
            Call::Release | Call::Other => false,
        }
    }
}

struct Pending {
    sent: Duration,
    call: Option<(Call, String)>,
    subscribe: bool,
}

struct Shared {
    mode: Mutex<Mode>,
    reply_delay: Mutex<Duration>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    upstream: SocketAddr,
    records: Mutex<Vec<Record>>,
    holds: Mutex<Holds>,
}

/// Requests held back on purpose, one kind of call at a time (for focused tests).
#[derive(Default)]
struct Holds {
    /// How many more requests of each call to hold.
    next: Vec<(Call, u32)>,
    /// Connections held now, by the call that caused it.
    held: Vec<Call>,
    /// What to do with connections held because of a call: deliver (true) or drop.
    verdict: Vec<(Call, bool)>,
}

/// The recording proxy. Dropping it closes everything.
pub struct Tap {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Tap {
    /// A tap in `Pass` mode in front of 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind tap");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            reply_delay: Mutex::new(Duration::ZERO),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            records: Mutex::new(Vec::new()),
            holds: Mutex::default(),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || accept_loop(listener, s));
        Tap {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Switches the mode; `Cut` closes every current connection now.
    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
        if mode == Mode::Cut {
            self.shared.close_all();
        }
    }

    /// Delays every chunk of replies by `delay`.
    pub fn set_reply_delay(&self, delay: Duration) {
        *self.shared.reply_delay.lock().unwrap() = delay;
    }

    /// Closes every current connection, leaving the mode as it is.
    pub fn cut(&self) {
        self.shared.close_all();
    }

    /// Holds back the next `n` requests of `call`, and everything after each on its
    /// connection, until [`Tap::release_held`]: a packet stuck in the network while
    /// later connections get through.
    pub fn hold_next(&self, call: Call, n: u32) {
        let mut h = self.shared.holds.lock().unwrap();
        h.next.retain(|(c, _)| *c != call);
        h.verdict.retain(|(c, _)| *c != call);
        h.next.push((call, n));
    }

    /// How many connections are held back because of `call` now.
    pub fn held(&self, call: Call) -> usize {
        let h = self.shared.holds.lock().unwrap();
        h.held.iter().filter(|c| **c == call).count()
    }

    /// Lets the connections held because of `call` go on (`deliver`), or drops what
    /// they held and closes them.
    pub fn release_held(&self, call: Call, deliver: bool) {
        let mut h = self.shared.holds.lock().unwrap();
        h.verdict.retain(|(c, _)| *c != call);
        h.verdict.push((call, deliver));
    }

    /// Everything recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.shared.records.lock().unwrap().clone()
    }
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }

    fn close_all(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// True (and counted as held) if a request of `call` is to be held now.
    fn take_hold(&self, call: Call) -> Option<Call> {
        let mut h = self.holds.lock().unwrap();
        let left = h.next.iter_mut().find(|(c, n)| *c == call && *n > 0)?;
        left.1 -= 1;
        h.held.push(call);
        Some(call)
    }

    /// Waits for the verdict on a connection held because of `call`: true to deliver.
    fn wait_verdict(&self, call: Call) -> bool {
        loop {
            {
                let mut h = self.holds.lock().unwrap();
                let verdict = h.verdict.iter().find(|(c, _)| *c == call).map(|v| v.1);
                if let Some(v) = verdict {
                    let i = h.held.iter().position(|c| *c == call).unwrap();
                    h.held.remove(i);
                    return v && !self.stop.load(Ordering::SeqCst);
                }
                if self.stop.load(Ordering::SeqCst) {
                    return false;
                }
            }
            thread::sleep(POLL);
        }
    }

    fn hold_while_blackholed(&self) {
        while self.mode() == Mode::Blackhole && !self.stop.load(Ordering::SeqCst) {
            thread::sleep(POLL);
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.close_all();
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else { continue };
        if shared.mode() == Mode::Refuse {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect(shared.upstream) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut conns = shared.conns.lock().unwrap();
            conns.push(client.try_clone().unwrap());
            conns.push(server.try_clone().unwrap());
        }
        let pending = Arc::new(Mutex::new(VecDeque::new()));
        let (s1, p1) = (shared.clone(), pending.clone());
        let (c, sv) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        thread::spawn(move || requests(c, sv, p1, s1));
        let s2 = shared.clone();
        thread::spawn(move || replies(server, client, pending, s2));
    }
}

/// Client to server: note each request as it arrives, then forward (or hold it while
/// blackholed: it reaches the server when the partition heals, as TCP would deliver it).
fn requests(
    mut from: TcpStream,
    mut to: TcpStream,
    pending: Arc<Mutex<VecDeque<Pending>>>,
    shared: Arc<Shared>,
) {
    let mut buf = [0u8; 16 * 1024];
    let mut acc: Vec<u8> = Vec::new();
    let mut held_by: Option<Call> = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let arrived = boottime();
        acc.extend_from_slice(&buf[..n]);
        while let Some((frame, _, len)) = parse(&acc) {
            acc.drain(..len);
            let p = classify(frame, arrived);
            if let (None, Some((call, _))) = (held_by, &p.call) {
                held_by = shared.take_hold(*call);
            }
            pending.lock().unwrap().push_back(p);
        }
        if let Some(call) = held_by {
            if !shared.wait_verdict(call) {
                break;
            }
            held_by = None;
        }
        shared.hold_while_blackholed();
        if shared.stop.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

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
    let call = (name == "EVAL").then(|| {
        let nkeys: usize = words.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
        let argv = words.get(3 + nkeys..).unwrap_or(&[]);
        let call = match (nkeys, argv.len()) {
            (4, 6) => Call::Acquire,
            (1, 2) => Call::Renew,
            (3, 3) => Call::Release,
            _ => Call::Other,
        };
        (call, argv.first().cloned().unwrap_or_default())
    });
    Pending {
        sent,
        call,
        subscribe,
    }
}

/// Server to client: match each reply to its request, delay and forward it (or hold it
/// while blackholed), and record the EVALs.
fn replies(
    mut from: TcpStream,
    mut to: TcpStream,
    pending: Arc<Mutex<VecDeque<Pending>>>,
    shared: Arc<Shared>,
) {
    let mut buf = [0u8; 16 * 1024];
    let mut acc: Vec<u8> = Vec::new();
    let mut unsent: Vec<Record> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let replied = boottime();
        acc.extend_from_slice(&buf[..n]);
        while let Some((frame, push, len)) = parse(&acc) {
            acc.drain(..len);
            if let Some(r) = match_reply(&pending, frame, push, replied) {
                unsent.push(r);
            }
        }
        let delay = *shared.reply_delay.lock().unwrap();
        thread::sleep(delay);
        shared.hold_while_blackholed();
        let ok = !shared.stop.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_ok();
        for mut r in unsent.drain(..) {
            r.delivered = ok;
            shared.records.lock().unwrap().push(r);
        }
        if !ok {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    // Requests never answered (the server died, the connection was cut) are recorded too.
    for p in pending.lock().unwrap().drain(..) {
        if let Some((call, token)) = p.call {
            shared.records.lock().unwrap().push(Record {
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
