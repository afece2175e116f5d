//! A hostile or broken server on a free loopback port ([`FakeServer`]): it accepts every
//! connection and answers as its [`Behaviour`] says (silence, garbage, a reply without
//! end in the Redis, ZooKeeper or PostgreSQL framing, a slow drip, a ZooKeeper session
//! grant of the test's choosing), each connection on a thread of its own. Dropped, it
//! stops: its threads see the flag within a write timeout and close their sockets.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{spawn, Finished};

/// How a [`FakeServer`] answers each connection.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Accepts and never answers (reads and drops what it is sent).
    Silent,
    /// Once the client has sent something: bytes of no protocol, then silence.
    Garbage,
    /// Once the client has sent something: `*2147483647\r\n`, then `:1\r\n` without end.
    RedisHuge,
    /// Once the client has sent something: a frame length of 2^31 - 1, then bytes
    /// without end.
    ZkHuge,
    /// `N` to an SSLRequest, `AuthenticationOk` to the startup message, then
    /// `NoticeResponse` messages without end.
    PgNotices,
    /// Once the client has sent something: `*2147483647\r\n`, then one `:1\r\n` every
    /// 50 ms without end.
    Drip,
    /// A ZooKeeper server that grants sessions of this many milliseconds, and answers
    /// every later request with an empty success.
    ZkGrant(i32),
}

/// A server on `127.0.0.1:`[`FakeServer::port`]; stopped on drop.
pub struct FakeServer {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    /// Listens on a free port and answers each connection as `behaviour` says.
    pub fn start(behaviour: Behaviour) -> FakeServer {
        let listener = super::listen_on_a_new_port();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (b, stop) = (behaviour.clone(), stopped.clone());
                thread::spawn(move || serve(conn, &b, &stop));
            }
        });
        FakeServer { port, stop }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, as lockrun names it in messages.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Answers one connection; any error (the client gone) ends it.
fn serve(mut conn: TcpStream, behaviour: &Behaviour, stop: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = match behaviour {
        Behaviour::Silent => drain(&mut conn, stop),
        Behaviour::Garbage => first_bytes(&mut conn, stop)
            .and_then(|()| write(&mut conn, b"\x00\xffHTTP/1.1 418 teapot\r\n\r\n", stop))
            .and_then(|()| drain(&mut conn, stop)),
        Behaviour::RedisHuge => first_bytes(&mut conn, stop)
            .and_then(|()| write(&mut conn, b"*2147483647\r\n", stop))
            .and_then(|()| endless(&mut conn, b":1\r\n", None, stop)),
        Behaviour::Drip => first_bytes(&mut conn, stop)
            .and_then(|()| write(&mut conn, b"*2147483647\r\n", stop))
            .and_then(|()| endless(&mut conn, b":1\r\n", Some(Duration::from_millis(50)), stop)),
        Behaviour::ZkHuge => first_bytes(&mut conn, stop)
            .and_then(|()| write(&mut conn, &0x7fff_ffffu32.to_be_bytes(), stop))
            .and_then(|()| endless(&mut conn, b"\x01", None, stop)),
        Behaviour::PgNotices => pg_notices(&mut conn, stop),
        Behaviour::ZkGrant(ms) => zk_grant(&mut conn, *ms, stop),
    };
}

type Io = std::io::Result<()>;

/// Whether the test is over (the server dropped): an error that ends the connection.
fn check(stop: &AtomicBool) -> Io {
    if stop.load(Ordering::SeqCst) {
        return Err(std::io::ErrorKind::Interrupted.into());
    }
    Ok(())
}

/// Reads into `buf` until it is full, waiting through read timeouts.
fn read_exact(conn: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> Io {
    let mut got = 0;
    while got < buf.len() {
        check(stop)?;
        match conn.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits for the client's first byte(s).
fn first_bytes(conn: &mut TcpStream, stop: &AtomicBool) -> Io {
    let mut buf = [0u8; 4096];
    loop {
        check(stop)?;
        match conn.read(&mut buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => return Ok(()),
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads and drops everything until the client goes or the test ends.
fn drain(conn: &mut TcpStream, stop: &AtomicBool) -> Io {
    loop {
        first_bytes(conn, stop)?;
    }
}

/// Writes all of `bytes`, waiting through write timeouts (a client that reads nothing).
fn write(conn: &mut TcpStream, mut bytes: &[u8], stop: &AtomicBool) -> Io {
    while !bytes.is_empty() {
        check(stop)?;
        match conn.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `unit` over and over: in 64 KiB batches as fast as the client reads, or one
/// at a time every `every`.
fn endless(conn: &mut TcpStream, unit: &[u8], every: Option<Duration>, stop: &AtomicBool) -> Io {
    let batch = match every {
        Some(_) => unit.to_vec(),
        None => unit.repeat(64 * 1024 / unit.len()),
    };
    loop {
        write(conn, &batch, stop)?;
        if let Some(pause) = every {
            thread::sleep(pause);
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads one message of the PostgreSQL startup phase (a length that counts itself,
/// then the body); returns the body.
fn pg_startup_message(conn: &mut TcpStream, stop: &AtomicBool) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact(conn, &mut len, stop)?;
    let len = u32::from_be_bytes(len).clamp(4, 10_000) as usize;
    let mut body = vec![0u8; len - 4];
    read_exact(conn, &mut body, stop)?;
    Ok(body)
}

/// PostgreSQL's start, well enough for a client to get past TLS and authentication,
/// then notices without end.
fn pg_notices(conn: &mut TcpStream, stop: &AtomicBool) -> Io {
    const SSL_REQUEST: [u8; 4] = 80877103u32.to_be_bytes();
    let mut body = pg_startup_message(conn, stop)?;
    if body.starts_with(&SSL_REQUEST) {
        write(conn, b"N", stop)?;
        body = pg_startup_message(conn, stop)?;
    }
    let _ = body;
    // AuthenticationOk.
    write(conn, &[b'R', 0, 0, 0, 8, 0, 0, 0, 0], stop)?;
    let fields = b"SNOTICE\0C00000\0Mnoise\0\0";
    let mut notice = vec![b'N'];
    notice.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    notice.extend_from_slice(fields);
    endless(conn, &notice, None, stop)
}

/// Reads one ZooKeeper frame (a 4-byte length, then the body); returns the body.
fn zk_frame(conn: &mut TcpStream, stop: &AtomicBool) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact(conn, &mut len, stop)?;
    let len = u32::from_be_bytes(len).min(1 << 20) as usize;
    let mut body = vec![0u8; len];
    read_exact(conn, &mut body, stop)?;
    Ok(body)
}

/// Writes `body` as one ZooKeeper frame.
fn zk_send(conn: &mut TcpStream, body: &[u8], stop: &AtomicBool) -> Io {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    write(conn, &frame, stop)
}

/// A ZooKeeper server granting sessions of `ms` milliseconds: the connect response,
/// then an empty success (xid, zxid 0, error 0) to every request.
fn zk_grant(conn: &mut TcpStream, ms: i32, stop: &AtomicBool) -> Io {
    zk_frame(conn, stop)?;
    let mut response = Vec::new();
    response.extend_from_slice(&0i32.to_be_bytes()); // protocol version
    response.extend_from_slice(&ms.to_be_bytes()); // the session timeout granted
    response.extend_from_slice(&0x1234_5678i64.to_be_bytes()); // session id
    response.extend_from_slice(&16i32.to_be_bytes());
    response.extend_from_slice(&[7u8; 16]); // password
    response.push(0); // not read-only
    zk_send(conn, &response, stop)?;
    loop {
        let request = zk_frame(conn, stop)?;
        let xid = request.get(..4).unwrap_or(&[0; 4]);
        let mut reply = xid.to_vec();
        reply.extend_from_slice(&0i64.to_be_bytes());
        reply.extend_from_slice(&0i32.to_be_bytes());
        zk_send(conn, &reply, stop)?;
    }
}

/// Runs `cmd` (a lockrun) to its end, at most `within`, reading its peak resident
/// memory (`VmHWM`, which only grows) every few milliseconds; returns how it ended and
/// the highest peak seen, in KiB. A run whose peak passes `limit_kib` is killed at once
/// (its growth would otherwise take the machine's memory) and so ends by SIGKILL.
pub fn run_watching_memory(cmd: Command, within: Duration, limit_kib: u64) -> (Finished, u64) {
    let mut running = spawn(cmd);
    let pid = running.pid();
    let mut peak = 0;
    let start = Instant::now();
    loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            peak = peak.max(kib);
            if peak > limit_kib {
                running.signal(Signal::SIGKILL);
            }
        }
        if let Some(f) = running.try_finish() {
            return (f, peak);
        }
        assert!(
            start.elapsed() < within,
            "still running after {within:?} (peak {peak} KiB); stderr so far:\n{}",
            running.stderr_so_far()
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// `VmHWM` of process `pid` in KiB (none once it has ended).
fn vm_hwm_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The peak resident memory a run may reach against a hostile server, in KiB.
pub const MEMORY_LIMIT_KIB: u64 = 64 * 1024;

/// Points lockrun (with `opts`) at `url`, whose server sends a reply without end, and
/// asserts: its peak memory stays under [`MEMORY_LIMIT_KIB`]; the command is never
/// started; exit 125 and one line within `within`, naming `server` (`host:port`) and
/// each of `says`. Returns the peak in KiB.
pub fn assert_endless_reply_refused(
    url: &str,
    server: &str,
    opts: &[&str],
    says: &[&str],
    within: Duration,
) -> u64 {
    let s = super::Scratch::new();
    let mut cmd = super::lockrun_run(url, "job", opts, &super::sh(r#"touch "$RAN""#));
    cmd.env("RAN", s.path("ran"));
    let (f, peak) = run_watching_memory(cmd, Duration::from_secs(60), MEMORY_LIMIT_KIB);
    assert!(
        peak < MEMORY_LIMIT_KIB,
        "{url}: peak RSS {peak} KiB (killed at {MEMORY_LIMIT_KIB}); stderr:\n{}",
        f.stderr
    );
    assert!(!s.exists("ran"), "{url}: the command ran");
    eprintln!("{url}: peak RSS {peak} KiB, ended after {:?}", f.elapsed);
    let says: Vec<&str> = says.iter().copied().chain([server]).collect();
    f.assert_refused_in_one_line(url, within, &says, &[]);
    peak
}

/// Points lockrun at `url`, a server that accepts and never answers, with `--wait`
/// `wait_s` seconds, and asserts: the run ends (125, the command not started) no sooner
/// than `--wait` and no later than `--wait` plus the give-back after giving up (1 s) and
/// a margin for starting the process (1.5 s), and its line says it waited `wait_s`
/// seconds for `server`.
pub fn assert_silence_ends_with_wait(url: &str, server: &str, wait_s: u64) {
    let s = super::Scratch::new();
    let wait = format!("{wait_s}s");
    let mut cmd = super::lockrun_run(
        url,
        "job",
        &["--wait", &wait],
        &super::sh(r#"touch "$RAN""#),
    );
    cmd.env("RAN", s.path("ran"));
    let f = spawn(cmd).wait_for(Duration::from_secs(30));
    assert!(!s.exists("ran"), "{url}: the command ran");
    f.assert_failure(125);
    let stated = Duration::from_secs(wait_s);
    assert!(
        f.elapsed >= stated && f.elapsed < stated + Duration::from_millis(2500),
        "{url}: --wait {wait} against a silent server took {:?}:\n{}",
        f.elapsed,
        f.stderr
    );
    let line = f.lockrun_line().unwrap_or_default();
    assert!(
        line.contains(server) && line.contains(&format!("did not answer within {wait}")),
        "{url}: the line names the server and the time waited:\n{}",
        f.stderr
    );
}
