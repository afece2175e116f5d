//! The fault-injecting TCP proxy that tests put between lockrun and a server: it passes
//! traffic, blackholes it (a partition as the client sees it), cuts or refuses
//! connections, delays replies, and holds back chosen requests (with everything after
//! them on their connection) until the test lets them go on or drops them.
//!
//! A [`Watch`] given at start sees the traffic of every connection as it passes (the
//! soak's tap records lockrun's calls with it) and names the requests it sees, which is
//! what [`Proxy::hold_next`] holds by.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::{boottime, POLL};

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Accept connections and read, but deliver nothing either way and keep every socket
    /// open: a network partition as the client sees it. What was read is delivered when
    /// the mode ends, as TCP would.
    Blackhole,
    /// Close every current connection at the moment this mode is set; new connections
    /// pass.
    Cut,
    /// Close every new connection at once (current ones are left alone).
    Refuse,
}

/// Watches the connections of a proxy: makes a [`Watcher`] for each new one.
pub trait Watch: Send + Sync {
    /// The watcher of a connection just opened.
    fn connection(&self) -> Arc<dyn Watcher>;
}

/// Sees the traffic of one connection, from its two directions' threads. Instants are
/// `CLOCK_BOOTTIME`, taken as the bytes reached the proxy.
pub trait Watcher: Send + Sync {
    /// Bytes from the client, before they are forwarded; returns the names of the
    /// requests they complete (for [`Proxy::hold_next`]).
    fn requests(&self, bytes: &[u8], at: Duration) -> Vec<&'static str>;
    /// Bytes from the server, before they are forwarded.
    fn replies(&self, bytes: &[u8], at: Duration);
    /// The bytes last given to [`Watcher::replies`] reached the client (`true`) or
    /// could not be handed on.
    fn forwarded(&self, delivered: bool);
    /// The server's side of the connection ended: no more replies will come.
    fn closed(&self);
}

/// Requests held back on purpose, by the name the watcher gave them.
#[derive(Default)]
struct Holds {
    /// How many more requests of each name to hold.
    next: Vec<(&'static str, u32)>,
    /// Connections held now, by the name of the request that caused it.
    held: Vec<&'static str>,
    /// What to do with connections held because of a name: deliver (true) or drop.
    verdict: Vec<(&'static str, bool)>,
}

struct Shared {
    mode: Mutex<Mode>,
    reply_delay: Mutex<Duration>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    upstream: SocketAddr,
    watch: Option<Box<dyn Watch>>,
    holds: Mutex<Holds>,
}

/// A TCP proxy on a free 127.0.0.1 port in front of a server; lockrun is pointed at it.
/// Dropping it closes everything.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy in `Pass` mode in front of 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Self {
        Self::start_with(upstream_port, None)
    }

    /// Like [`Proxy::start`], with `watch` seeing every connection's traffic.
    pub fn watched(upstream_port: u16, watch: impl Watch + 'static) -> Self {
        Self::start_with(upstream_port, Some(Box::new(watch)))
    }

    fn start_with(upstream_port: u16, watch: Option<Box<dyn Watch>>) -> Self {
        let listener = super::listen_on_a_new_port();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            reply_delay: Mutex::new(Duration::ZERO),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
            watch,
            holds: Mutex::default(),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || accept_loop(listener, s));
        Proxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PROXYPORT`.
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

    /// Delays every chunk from the server to the client by `delay` (requests still reach
    /// the server at once): replies arrive long after the server acted on them.
    pub fn set_reply_delay(&self, delay: Duration) {
        *self.shared.reply_delay.lock().unwrap() = delay;
    }

    /// Closes every current connection, leaving the mode as it is (after `Refuse`: the
    /// server becomes unreachable at once).
    pub fn cut(&self) {
        self.shared.close_all();
    }

    /// Holds back the next `n` requests the watcher names `request`, and everything after
    /// each on its connection, until [`Proxy::release_held`]: a packet stuck in the
    /// network while later connections get through.
    pub fn hold_next(&self, request: &'static str, n: u32) {
        let mut h = self.shared.holds.lock().unwrap();
        h.next.retain(|(r, _)| *r != request);
        h.verdict.retain(|(r, _)| *r != request);
        h.next.push((request, n));
    }

    /// How many connections are held back because of `request` now.
    pub fn held(&self, request: &str) -> usize {
        let h = self.shared.holds.lock().unwrap();
        h.held.iter().filter(|r| **r == request).count()
    }

    /// Lets the connections held because of `request` go on (`deliver`), or drops what
    /// they held and closes them.
    pub fn release_held(&self, request: &'static str, deliver: bool) {
        let mut h = self.shared.holds.lock().unwrap();
        h.verdict.retain(|(r, _)| *r != request);
        h.verdict.push((request, deliver));
    }
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn close_all(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// `Some(request)` (counted as held) if a request so named is to be held now.
    fn take_hold(&self, request: &'static str) -> Option<&'static str> {
        let mut h = self.holds.lock().unwrap();
        let left = h.next.iter_mut().find(|(r, n)| *r == request && *n > 0)?;
        left.1 -= 1;
        h.held.push(request);
        Some(request)
    }

    /// Waits for the verdict on a connection held because of `request`: true to deliver.
    fn wait_verdict(&self, request: &'static str) -> bool {
        loop {
            {
                let mut h = self.holds.lock().unwrap();
                let verdict = h.verdict.iter().find(|(r, _)| *r == request).map(|v| v.1);
                if let Some(v) = verdict {
                    let i = h.held.iter().position(|r| *r == request).unwrap();
                    h.held.remove(i);
                    return v && !self.stopped();
                }
                if self.stopped() {
                    return false;
                }
            }
            thread::sleep(POLL);
        }
    }

    /// Blackhole: hold what was read; nothing gets through while the mode lasts.
    fn hold_while_blackholed(&self) {
        while self.mode() == Mode::Blackhole && !self.stopped() {
            thread::sleep(POLL);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.close_all();
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopped() {
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
        let watcher = shared.watch.as_ref().map(|w| w.connection());
        let (s1, w1) = (shared.clone(), watcher.clone());
        let (c, sv) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        thread::spawn(move || requests(c, sv, w1, s1));
        let s2 = shared.clone();
        thread::spawn(move || replies(server, client, watcher, s2));
    }
}

/// Client to server: show each chunk to the watcher as it arrives, hold it if it
/// completes a request to be held, then forward it (after a blackhole ends).
fn requests(
    mut from: TcpStream,
    mut to: TcpStream,
    watcher: Option<Arc<dyn Watcher>>,
    shared: Arc<Shared>,
) {
    let mut buf = [0u8; 16 * 1024];
    let mut held_by: Option<&'static str> = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(w) = &watcher {
            for request in w.requests(&buf[..n], boottime()) {
                if held_by.is_none() {
                    held_by = shared.take_hold(request);
                }
            }
        }
        if let Some(request) = held_by.take() {
            if !shared.wait_verdict(request) {
                break;
            }
        }
        shared.hold_while_blackholed();
        if shared.stopped() || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Server to client: show each chunk to the watcher, delay it, forward it (after a
/// blackhole ends) and tell the watcher whether it got through.
fn replies(
    mut from: TcpStream,
    mut to: TcpStream,
    watcher: Option<Arc<dyn Watcher>>,
    shared: Arc<Shared>,
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(w) = &watcher {
            w.replies(&buf[..n], boottime());
        }
        let delay = *shared.reply_delay.lock().unwrap();
        thread::sleep(delay);
        shared.hold_while_blackholed();
        let delivered = !shared.stopped() && to.write_all(&buf[..n]).is_ok();
        if let Some(w) = &watcher {
            w.forwarded(delivered);
        }
        if !delivered {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    if let Some(w) = &watcher {
        w.closed();
    }
}
