//! Shared support for lockrun's integration tests: real `redis-server`s on free ports, a
//! small fault-injecting TCP proxy, and helpers that run the real `lockrun` binary, wait for
//! conditions with a deadline, and look at processes through `/proc`.
//!
//! Rules every helper keeps, so that tests can run in parallel on a small noisy machine:
//! - every test gets its own `redis-server` (never the shared one on 6379);
//! - every process started here is killed by a `Drop` guard, even when a test panics;
//! - every wait checks a condition and panics with a clear message after a deadline;
//! - the environment given to lockrun has no `LOCKRUN_*` variable unless the test sets it.
//!
//! Each test binary uses only part of this module, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

/// Upper bound for waits that should finish in well under a second on an idle machine.
pub const WAIT: Duration = Duration::from_secs(20);

/// How often waiting loops look at their condition.
pub const POLL: Duration = Duration::from_millis(5);

/// The lockrun binary under test: this build's, unless `LOCKRUN_TEST_BINARY` points
/// the suite at another build of the same sources (such as the static release binary
/// that the packages ship).
pub fn lockrun_binary() -> String {
    std::env::var("LOCKRUN_TEST_BINARY")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_lockrun").to_owned())
}

// ---------------------------------------------------------------------------------------
// Waiting and processes
// ---------------------------------------------------------------------------------------

/// Polls `cond` until it holds and returns how long that took; panics naming `what` after
/// `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting until {what}");
        }
        thread::sleep(POLL);
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A port on which nothing listens (connections are refused).
pub fn closed_port() -> u16 {
    free_port()
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T`, `Z`, ...), or `None` if no such process.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// True when the process no longer runs: gone, or a zombie waiting to be reaped.
pub fn is_dead(pid: i32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// True when the process exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    !is_dead(pid)
}

/// Sends `sig` to `pid`, ignoring "no such process".
pub fn signal_pid(pid: i32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid), sig);
}

/// This machine's host name, as lockrun should record it.
pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read hostname")
        .trim()
        .to_string()
}

/// Waits until `path` holds one complete line (written by `echo ... > path`) and returns it.
pub fn wait_line(path: &Path) -> String {
    let mut line = String::new();
    wait_until(
        &format!("{} holds a line", path.display()),
        WAIT,
        || match fs::read_to_string(path) {
            Ok(s) if s.ends_with('\n') => {
                line = s.trim().to_string();
                true
            }
            _ => false,
        },
    );
    line
}

/// Waits until `path` holds a pid (written by `echo $$ > path`) and returns it.
pub fn wait_pid(path: &Path) -> i32 {
    let line = wait_line(path);
    line.parse()
        .unwrap_or_else(|_| panic!("{} holds {line:?}, not a pid", path.display()))
}

/// Kills on drop the process groups and processes registered with it: a safety net for the
/// commands and grandchildren a test learns about, in case lockrun leaves them behind.
#[derive(Default)]
pub struct Reaper {
    pids: Mutex<Vec<i32>>,
}

impl Reaper {
    /// Registers `pid` (and the group it leads, if any) to be SIGKILLed on drop.
    pub fn add(&self, pid: i32) {
        self.pids.lock().unwrap().push(pid);
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in self.pids.lock().unwrap().iter() {
            if is_alive(pid) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                signal_pid(pid, Signal::SIGKILL);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scratch directory
// ---------------------------------------------------------------------------------------

/// A per-test temporary directory for marker, pid and history files.
pub struct Scratch {
    dir: TempDir,
}

impl Scratch {
    /// A new empty directory.
    pub fn new() -> Self {
        Scratch {
            dir: tempfile::Builder::new()
                .prefix("lockrun-test-")
                .tempdir()
                .expect("create temp dir"),
        }
    }

    /// The path of `name` inside the directory (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The contents of `name`, or "" when it does not exist.
    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// True when `name` exists.
    pub fn exists(&self, name: &str) -> bool {
        self.path(name).exists()
    }

    /// Creates `name` (empty), e.g. a "go" file a command waits for.
    pub fn touch(&self, name: &str) {
        File::create(self.path(name)).expect("create file");
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------------------

/// A `redis-server` of this test's own, on a free 127.0.0.1 port, without persistence.
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    dir: TempDir,
    password: Option<String>,
    tls: Option<TlsFiles>,
    /// Extra environment of the server process (kept across restarts).
    env: Vec<(String, String)>,
    child: Option<Child>,
    con: Mutex<Option<redis::Connection>>,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_inner(None, None)
    }

    /// Starts a server that requires `password` (`--requirepass`).
    pub fn with_password(password: &str) -> Self {
        Self::start_inner(Some(password.to_string()), None)
    }

    /// Starts a server that also listens with TLS (see [`RedisServer::tls_url`]) using
    /// `tls`; the plain port stays open for the test's own inspection.
    pub fn with_tls(tls: TlsFiles) -> Self {
        Self::start_inner(None, Some(tls))
    }

    /// Starts a server with extra environment variables (for instance `LD_PRELOAD` of
    /// libfaketime, see [`FakeClock`]); a [`RedisServer::restart`] keeps them.
    pub fn with_env(env: &[(String, String)]) -> Self {
        Self::start_with(None, None, env.to_vec())
    }

    fn start_inner(password: Option<String>, tls: Option<TlsFiles>) -> Self {
        Self::start_with(password, tls, Vec::new())
    }

    fn start_with(
        password: Option<String>,
        tls: Option<TlsFiles>,
        env: Vec<(String, String)>,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockrun-redis-")
            .tempdir()
            .expect("create redis dir");
        let mut last_err = String::new();
        // A free port can be taken by someone else before redis binds it: try a few.
        for _ in 0..10 {
            let port = free_port();
            let tls_port = tls.as_ref().map(|_| free_port());
            let tls_args = tls.as_ref().map(|t| t.server_args(tls_port.unwrap()));
            match spawn_redis(
                port,
                dir.path(),
                password.as_deref(),
                tls_args.as_deref(),
                &env,
            ) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        tls_port,
                        dir,
                        password,
                        tls,
                        env,
                        child: Some(child),
                        con: Mutex::new(None),
                    }
                }
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, without the password.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:TLSPORT` (panics unless started `with_tls`).
    pub fn tls_url(&self) -> String {
        format!(
            "rediss://127.0.0.1:{}",
            self.tls_port.expect("server started without TLS")
        )
    }

    /// The TLS files it was started with (panics unless started `with_tls`).
    pub fn tls_files(&self) -> &TlsFiles {
        self.tls.as_ref().expect("server started without TLS")
    }

    /// The URL with the password in it, if the server has one.
    pub fn url_with_password(&self) -> String {
        match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// The server's pid (panics when it is not running).
    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .expect("redis-server is not running")
            .id() as i32
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        *self.con.lock().unwrap() = None;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts a new one on the same port, with no data.
    pub fn restart(&mut self) {
        self.kill();
        let mut last_err = String::new();
        for _ in 0..50 {
            let tls_args = self
                .tls
                .as_ref()
                .map(|t| t.server_args(self.tls_port.unwrap()));
            match spawn_redis(
                self.port,
                self.dir.path(),
                self.password.as_deref(),
                tls_args.as_deref(),
                &self.env,
            ) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => {
                    last_err = e;
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "could not restart redis-server on port {}: {last_err}",
            self.port
        );
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        signal_pid(self.pid(), Signal::SIGSTOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        signal_pid(self.pid(), Signal::SIGCONT);
    }

    /// Runs one command on the server (connecting, or reconnecting, as needed).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut guard = self.con.lock().unwrap();
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(self.connect());
            }
            match cmd.query::<T>(guard.as_mut().unwrap()) {
                Ok(v) => return v,
                Err(e) if attempt == 0 && (e.is_io_error() || e.is_connection_dropped()) => {
                    *guard = None;
                }
                Err(e) => panic!("query on the test redis failed: {e}"),
            }
        }
        unreachable!()
    }

    fn connect(&self) -> redis::Connection {
        let client = redis::Client::open(self.url_with_password()).expect("redis url");
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to test redis");
        con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        con.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        con
    }

    /// FLUSHALL: every key is gone, lock and fencing counter alike.
    pub fn flushall(&self) {
        let _: () = self.query(&redis::cmd("FLUSHALL"));
    }

    /// True when `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        let n: i64 = self.query(redis::cmd("EXISTS").arg(key));
        n == 1
    }

    /// PTTL of `key` in ms (-2: no key, -1: no expiry).
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key))
    }

    /// HGET `key` `field`.
    pub fn hget(&self, key: &str, field: &str) -> Option<String> {
        self.query(redis::cmd("HGET").arg(key).arg(field))
    }

    /// True when the lock `name` (default key prefix) is held.
    pub fn lock_held(&self, name: &str) -> bool {
        self.exists(&lock_key(name))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The lock's key for `name` with the default prefix: `lockrun:{name}`.
pub fn lock_key(name: &str) -> String {
    format!("lockrun:{{{name}}}")
}

/// The fencing counter's key for `name` with the default prefix.
pub fn fence_key(name: &str) -> String {
    format!("lockrun:{{{name}}}:fence")
}

fn spawn_redis(
    port: u16,
    dir: &Path,
    password: Option<&str>,
    tls_args: Option<&[String]>,
    env: &[(String, String)],
) -> Result<Child, String> {
    let log = dir.join(format!("redis-{port}.log"));
    let mut cmd = Command::new("redis-server");
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(p) = password {
        cmd.args(["--requirepass", p]);
    }
    if let Some(args) = tls_args {
        cmd.args(args);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn redis-server: {e}"))?;
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let log = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            return Err(format!(
                "redis-server on port {port} exited ({status}): {tail:?}"
            ));
        }
        if redis_answers(port) {
            return Ok(child);
        }
        if start.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("redis-server on port {port} did not answer PING"));
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// True when something on `port` answers PING like Redis (`+PONG`, or `-NOAUTH` when a
/// password is required).
fn redis_answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(n) if n > 0 => buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------
// TLS material
// ---------------------------------------------------------------------------------------

/// A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made with
/// the `openssl` command in a temporary directory.
pub struct TlsFiles {
    dir: TempDir,
    /// Whether the server demands a client certificate.
    pub require_client_cert: bool,
}

impl TlsFiles {
    /// Generates the files (a second or so of key generation).
    pub fn generate(require_client_cert: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockrun-tls-")
            .tempdir()
            .expect("create tls dir");
        let d = dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=lockrun test CA",
        ]);
        fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for who in ["server", "client"] {
            openssl(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{who}.key"),
                "-out",
                &format!("{who}.csr"),
                "-subj",
                &format!("/CN=lockrun test {who}"),
            ]);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{who}.pem"),
                "-days",
                "2",
                "-extfile",
                &format!("{who}.ext"),
            ]);
        }
        TlsFiles {
            dir,
            require_client_cert,
        }
    }

    /// The path of one of the files: `ca.pem`, `server.pem`, `server.key`, `client.pem`,
    /// `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn server_args(&self, tls_port: u16) -> Vec<String> {
        let p = |n: &str| self.path(n).to_string_lossy().into_owned();
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            p("server.pem"),
            "--tls-key-file".into(),
            p("server.key"),
            "--tls-ca-cert-file".into(),
            p("ca.pem"),
            "--tls-auth-clients".into(),
            if self.require_client_cert {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// Fault-injecting TCP proxy
// ---------------------------------------------------------------------------------------

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways.
    Pass,
    /// Accept connections and read, but deliver nothing either way and keep every socket
    /// open: a network partition as the client sees it.
    Blackhole,
    /// Close every current connection at the moment this mode is set; new connections
    /// pass.
    Cut,
    /// Close every new connection at once (current ones are left alone).
    Refuse,
}

struct ProxyShared {
    mode: Mutex<Mode>,
    reply_delay: Mutex<Duration>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
    upstream: SocketAddr,
}

/// A TCP proxy on a free 127.0.0.1 port in front of a server; lockrun is pointed at it.
pub struct Proxy {
    port: u16,
    shared: Arc<ProxyShared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// A proxy in `Pass` mode in front of 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(ProxyShared {
            mode: Mutex::new(Mode::Pass),
            reply_delay: Mutex::new(Duration::ZERO),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            upstream: SocketAddr::from(([127, 0, 0, 1], upstream_port)),
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

    /// Delays every byte from the server to the client by `delay` (requests still reach the
    /// server at once): replies arrive long after the server acted on them.
    pub fn set_reply_delay(&self, delay: Duration) {
        *self.shared.reply_delay.lock().unwrap() = delay;
    }

    /// Closes every current connection, leaving the mode as it is (after `Refuse`: the
    /// server becomes unreachable at once).
    pub fn cut(&self) {
        self.shared.close_all();
    }
}

impl ProxyShared {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }

    fn close_all(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
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

fn accept_loop(listener: TcpListener, shared: Arc<ProxyShared>) {
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
        {
            let mut conns = shared.conns.lock().unwrap();
            conns.push(client.try_clone().unwrap());
            conns.push(server.try_clone().unwrap());
        }
        for (from, to, replies) in [
            (
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                false,
            ),
            (server, client, true),
        ] {
            let s = shared.clone();
            thread::spawn(move || pump(from, to, replies, s));
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, replies: bool, shared: Arc<ProxyShared>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if replies {
            let delay = *shared.reply_delay.lock().unwrap();
            thread::sleep(delay);
        }
        // Blackhole: hold what was read; nothing gets through while the mode lasts.
        while shared.mode() == Mode::Blackhole && !shared.stop.load(Ordering::SeqCst) {
            thread::sleep(POLL);
        }
        if shared.stop.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

// ---------------------------------------------------------------------------------------
// Running lockrun
// ---------------------------------------------------------------------------------------

/// `lockrun` with no `LOCKRUN_*` variable inherited from the developer's environment and
/// stdin from /dev/null.
pub fn lockrun() -> Command {
    let mut cmd = Command::new(lockrun_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKRUN_") {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// `lockrun --url URL OPTS... NAME -- COMMAND...`
pub fn lockrun_run(url: &str, name: &str, opts: &[&str], command: &[&str]) -> Command {
    let mut cmd = lockrun();
    cmd.arg("--url")
        .arg(url)
        .args(opts)
        .arg(name)
        .arg("--")
        .args(command);
    cmd
}

/// `["sh", "-c", script]`
pub fn sh(script: &str) -> Vec<&str> {
    vec!["sh", "-c", script]
}

/// How a lockrun process ended, with what it printed.
#[derive(Clone, Debug)]
pub struct Finished {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The raw status.
    pub status: ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// From spawn to the moment the test saw it end.
    pub elapsed: Duration,
    /// The moment the test saw it end.
    pub ended: Instant,
}

impl Finished {
    /// Panics unless the exit code is `code`, showing stderr.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "expected exit code {code}, got {:?}\n--- stderr:\n{}\n--- stdout:\n{}",
            self.status,
            self.stderr,
            self.stdout
        );
        self
    }

    /// The first stderr line beginning `lockrun: `, if any.
    pub fn lockrun_line(&self) -> Option<&str> {
        self.stderr.lines().find(|l| l.starts_with("lockrun: "))
    }

    /// Panics unless lockrun explained itself: a `lockrun: ` line on stderr, and no panic or
    /// Rust debug dump.
    pub fn assert_explained(&self) -> &Self {
        assert!(
            self.lockrun_line().is_some(),
            "expected a line beginning 'lockrun: ' on stderr (status {:?}), got:\n{}",
            self.status,
            self.stderr
        );
        for bad in ["panicked", "RUST_BACKTRACE", "Os {", "Error {", "kind: "] {
            assert!(
                !self.stderr.contains(bad),
                "stderr looks like a panic or a debug dump ({bad:?}):\n{}",
                self.stderr
            );
        }
        self
    }

    /// `assert_code(code)` and `assert_explained()`.
    pub fn assert_failure(&self, code: i32) -> &Self {
        self.assert_code(code).assert_explained()
    }
}

/// A running lockrun (or other) process; SIGKILLed and reaped on drop if still running.
pub struct Running {
    child: Child,
    out: File,
    err: File,
    started: Instant,
    finished: Option<Finished>,
}

/// Spawns `cmd` with stdout and stderr captured in temporary files (not pipes: a leftover
/// grandchild holding a pipe open must not hang the test).
pub fn spawn(mut cmd: Command) -> Running {
    let out = tempfile::tempfile().expect("temp file");
    let err = tempfile::tempfile().expect("temp file");
    cmd.stdout(out.try_clone().unwrap());
    cmd.stderr(err.try_clone().unwrap());
    let started = Instant::now();
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    Running {
        child,
        out,
        err,
        started,
        finished: None,
    }
}

/// Runs `cmd` to its end (at most `WAIT`).
pub fn run(cmd: Command) -> Finished {
    spawn(cmd).wait()
}

impl Running {
    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// When it was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Sends `sig` to it (not to its command).
    pub fn signal(&self, sig: Signal) {
        if self.finished.is_none() {
            signal_pid(self.pid(), sig);
        }
    }

    /// `Some` once it has ended (reaping it).
    pub fn try_finish(&mut self) -> Option<Finished> {
        if self.finished.is_none() {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                let ended = Instant::now();
                self.finished = Some(Finished {
                    code: status.code(),
                    status,
                    stdout: read_all(&mut self.out),
                    stderr: read_all(&mut self.err),
                    elapsed: ended - self.started,
                    ended,
                });
            }
        }
        self.finished.clone()
    }

    /// True while it has not ended.
    pub fn is_running(&mut self) -> bool {
        self.try_finish().is_none()
    }

    /// Waits for its end, at most `WAIT`.
    pub fn wait(&mut self) -> Finished {
        self.wait_for(WAIT)
    }

    /// Waits for its end, at most `timeout`; on timeout kills it and panics with its stderr.
    pub fn wait_for(&mut self, timeout: Duration) -> Finished {
        let start = Instant::now();
        loop {
            if let Some(f) = self.try_finish() {
                return f;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "process {} still running after {timeout:?}; stderr so far:\n{}",
                    self.pid(),
                    read_all(&mut self.err)
                );
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.finished.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_all(f: &mut File) -> String {
    let mut s = String::new();
    let _ = f.seek(SeekFrom::Start(0));
    let _ = f.read_to_string(&mut s);
    s
}

/// `lockrun status --json --url URL NAME`: its exit code and the parsed object.
pub fn status_json(url: &str, name: &str) -> (Option<i32>, serde_json::Value) {
    let mut cmd = lockrun();
    cmd.args(["status", "--json", "--url", url, name]);
    let f = run(cmd);
    let v = serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "status --json printed no JSON object ({e}): stdout {:?}, stderr {:?}",
            f.stdout, f.stderr
        )
    });
    (f.code, v)
}

/// Parses a fencing token as lockrun hands it to the command.
pub fn parse_token(s: &str) -> u128 {
    let t: u128 = s
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("fencing token {s:?} is not a decimal integer"));
    assert!(t > 0, "fencing token must be > 0, got {t}");
    t
}

// ---------------------------------------------------------------------------------------
// Clocks
// ---------------------------------------------------------------------------------------

/// Time since boot on `CLOCK_BOOTTIME`, the clock lockrun measures leases with. It is one
/// clock for every process of the machine, so instants taken by different processes (the
/// test, a command's `perl -MTime::HiRes`) can be compared.
pub fn boottime() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("clock_gettime(CLOCK_BOOTTIME)");
    Duration::from(ts)
}

/// A wall clock that a test can jump, for one `redis-server`: Debian's libfaketime
/// (package `faketime`) preloaded with a timestamp file that is read on every clock call
/// (`FAKETIME_NO_CACHE=1`), so the offset of a running server changes the moment the file
/// does. Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC=1`): key expiry and
/// `TIME` follow it, as they would follow an NTP step.
///
/// Redis links jemalloc, which calls `clock_gettime` while libfaketime is still
/// initialising (libfaketime issue #130: the server dies at start). glibc's
/// `libc_malloc_debug.so.0`, preloaded first, makes the server use glibc's malloc.
pub struct FakeClock {
    dir: TempDir,
    offset: Mutex<Duration>,
    preload: String,
}

impl FakeClock {
    /// A clock at offset zero; panics, naming the package, if libfaketime is missing.
    pub fn new() -> Self {
        let find = |names: &[&str]| -> Option<String> {
            let dirs = [
                "/usr/lib/x86_64-linux-gnu",
                "/lib/x86_64-linux-gnu",
                "/usr/lib64",
            ];
            let mut all: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
            // Other architectures: /usr/lib/<triplet>/.
            if let Ok(rd) = fs::read_dir("/usr/lib") {
                all.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            all.push(PathBuf::from("/usr/lib"));
            all.iter()
                .flat_map(|d| names.iter().map(move |n| d.join(n)))
                .find(|p| p.exists())
                .map(|p| p.to_string_lossy().into_owned())
        };
        let faketime = find(&["faketime/libfaketime.so.1"])
            .expect("libfaketime not found: install Debian's package `faketime`");
        let malloc = find(&["libc_malloc_debug.so.0"])
            .expect("glibc's libc_malloc_debug.so.0 not found (glibc 2.34 or later)");
        let dir = tempfile::Builder::new()
            .prefix("lockrun-faketime-")
            .tempdir()
            .expect("create faketime dir");
        let clock = FakeClock {
            dir,
            offset: Mutex::new(Duration::ZERO),
            preload: format!("{malloc}:{faketime}"),
        };
        clock.write(Duration::ZERO);
        clock
    }

    /// The environment that puts a process on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), self.preload.clone()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                self.file().to_string_lossy().into_owned(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ]
    }

    /// Moves the clock forward by `by` (at once, for every process on it); returns the
    /// new offset from the real time.
    pub fn jump_forward(&self, by: Duration) -> Duration {
        let mut offset = self.offset.lock().unwrap();
        *offset += by;
        self.write(*offset);
        *offset
    }

    /// The offset from the real time.
    pub fn offset(&self) -> Duration {
        *self.offset.lock().unwrap()
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("timestamp")
    }

    fn write(&self, offset: Duration) {
        // Written to a temporary file and renamed, so a reader never sees half a line.
        let tmp = self.dir.path().join("timestamp.tmp");
        fs::write(&tmp, format!("+{:.6}\n", offset.as_secs_f64())).expect("write timestamp");
        fs::rename(&tmp, self.file()).expect("rename timestamp");
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}
