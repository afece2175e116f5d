//! `redis-server`s of the test's own on free 127.0.0.1 ports, without persistence: plain,
//! with a password, with TLS (see `tls`), with extra environment (a fake clock), with
//! ACL users; killed, restarted empty, frozen and thawed on demand; and the test's own
//! look at their keys.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::{free_port, serial, signal_pid, TlsFiles, WAIT};

/// How a server is started; kept for its restarts.
#[derive(Default)]
struct Setup {
    password: Option<String>,
    tls: Option<TlsFiles>,
    /// Extra environment of the server process.
    env: Vec<(String, String)>,
    /// Extra command line arguments.
    args: Vec<String>,
}

/// A `redis-server` of this test's own, on a free 127.0.0.1 port, without persistence.
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    dir: TempDir,
    setup: Setup,
    child: Option<Child>,
    con: Mutex<Option<redis::Connection>>,
}

impl RedisServer {
    /// Starts a server and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(Setup::default())
    }

    /// Starts a server that requires `password` (`--requirepass`).
    pub fn with_password(password: &str) -> Self {
        Self::start_with(Setup {
            password: Some(password.to_string()),
            ..Setup::default()
        })
    }

    /// Starts a server that also listens with TLS (see [`RedisServer::tls_url`]) using
    /// `tls`; the plain port stays open for the test's own inspection.
    pub fn with_tls(tls: TlsFiles) -> Self {
        Self::start_with(Setup {
            tls: Some(tls),
            ..Setup::default()
        })
    }

    /// Starts a server with extra command line arguments (`--replicaof HOST PORT`, ...);
    /// a [`RedisServer::restart`] keeps them.
    pub fn with_args(args: &[String]) -> Self {
        Self::start_with(Setup {
            args: args.to_vec(),
            ..Setup::default()
        })
    }

    /// Starts a server that requires `password`, with extra command line arguments; a
    /// [`RedisServer::restart`] keeps both.
    pub fn with_password_and_args(password: &str, args: &[String]) -> Self {
        Self::start_with(Setup {
            password: Some(password.to_string()),
            args: args.to_vec(),
            ..Setup::default()
        })
    }

    fn start_with(mut setup: Setup) -> Self {
        serial::side_by_side();
        let dir = tempfile::Builder::new()
            .prefix("lockrun-redis-")
            .tempdir()
            .expect("create redis dir");
        let mut last_err = String::new();
        // A free port can be taken by someone else before redis binds it: try a few.
        for attempt in 0..10 {
            let port = free_port();
            let tls_port = setup.tls.as_ref().map(|_| free_port());
            if attempt > 0 {
                // A Cluster node's bus port can be taken the same way: a new one too.
                if let Some(i) = setup.args.iter().position(|a| a == "--cluster-port") {
                    if let Some(bus) = setup.args.get_mut(i + 1) {
                        *bus = free_port().to_string();
                    }
                }
            }
            match spawn_redis(port, tls_port, dir.path(), &setup) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        tls_port,
                        dir,
                        setup,
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
        self.setup.tls.as_ref().expect("server started without TLS")
    }

    /// The URL with the password in it, if the server has one.
    pub fn url_with_password(&self) -> String {
        match &self.setup.password {
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

    /// True until [`RedisServer::kill`]ed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        // Not `unwrap`: a query that panicked poisoned it, and this runs in `Drop`.
        *self
            .con
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
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
            match spawn_redis(self.port, self.tls_port, self.dir.path(), &self.setup) {
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

    /// Like [`RedisServer::query`], but a server error is returned rather than a panic.
    pub fn try_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut guard = self.con.lock().unwrap();
        if guard.is_none() {
            *guard = Some(self.connect());
        }
        cmd.query::<T>(guard.as_mut().unwrap())
    }

    /// EVALs lockrun's script `name` (see [`lockrun_script`]) with `keys` and `args`,
    /// as lockrun would, but with whatever arguments the test chooses.
    pub fn eval_lockrun_script(
        &self,
        name: &str,
        keys: &[&str],
        args: &[&str],
    ) -> redis::RedisResult<redis::Value> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(lockrun_script(name))
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        self.try_query(&cmd)
    }

    /// How many EVALs the server has run since it started (INFO commandstats).
    pub fn evals(&self) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("commandstats"));
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_eval:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a number of calls"))
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

    /// The server's wall clock jumps `by` forward, as its keys see it: every key with a
    /// time to live expires `by` sooner (at once if that is past), in one script, so no
    /// request comes between two keys. Without preloading into the server (libfaketime
    /// crashes or hangs Redis 8 at start) and on Redis 7.0 on and Valkey alike
    /// (`PEXPIRETIME`). `TIME` does not move. Returns how many keys moved.
    pub fn jump_clock(&self, by: Duration) -> i64 {
        const JUMP: &str = "local n = 0
            for _, k in ipairs(redis.call('KEYS', '*')) do
              local at = redis.call('PEXPIRETIME', k)
              if at > 0 then redis.call('PEXPIREAT', k, at - tonumber(ARGV[1])); n = n + 1 end
            end
            return n";
        self.query(
            redis::cmd("EVAL")
                .arg(JUMP)
                .arg(0)
                .arg(by.as_millis() as u64),
        )
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

    /// Creates (or changes) the ACL user `user` with `rules` (`ACL SETUSER`).
    pub fn acl_user(&self, user: &str, rules: &[&str]) {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(user).arg(rules);
        let _: String = self.query(&cmd);
    }

    /// Writes a holder into slot key `key` as a lockrun of `--slots slots` would (with
    /// `slots` 1, no `slots` field: a plain lock), with `token` and `ttl_ms` left.
    pub fn write_holder(&self, key: &str, token: &str, slots: u32, ttl_ms: u64) {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(key).arg(&[
            "token", token, "fence", "5", "host", "h", "pid", "7", "since_ms", "1",
        ]);
        if slots > 1 {
            cmd.arg("slots").arg(slots);
        }
        let _: i64 = self.query(&cmd);
        let _: i64 = self.query(redis::cmd("PEXPIRE").arg(key).arg(ttl_ms));
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

/// The Lua source lockrun sends as script `name` (`acquire`, `renew`, ...), taken
/// from the library itself, so the tests EVAL exactly what lockrun runs.
pub fn lockrun_script(name: &str) -> String {
    lockrun::backend::redis::script_source(name)
        .unwrap_or_else(|| panic!("lockrun has no Redis script {name:?}"))
        .to_owned()
}

/// The key of `what` (`waiters`, `alive`) of lock `name` with the default prefix.
pub fn waiter_key(name: &str, what: &str) -> String {
    format!("lockrun:{{{name}}}:{what}")
}

/// The key of slot `i` of semaphore `name` with the default prefix: the lock's key for
/// slot 0, `lockrun:{name}#i` for the others.
pub fn slot_key(name: &str, i: u32) -> String {
    match i {
        0 => lock_key(name),
        i => format!("lockrun:{{{name}}}#{i}"),
    }
}

/// The limit key of `name` with the default prefix: the N of its semaphore's holders.
pub fn limit_key(name: &str) -> String {
    format!("lockrun:{{{name}}}:slots")
}

/// The fencing counter's key for `name` with the default prefix.
pub fn fence_key(name: &str) -> String {
    format!("lockrun:{{{name}}}:fence")
}

/// The keys of the acquire script for `name` of `n` slots: fence, queue, alive, limit,
/// then every slot's.
pub fn acquire_keys(name: &str, n: u32) -> Vec<String> {
    let mut keys = vec![
        fence_key(name),
        waiter_key(name, "waiters"),
        waiter_key(name, "alive"),
        limit_key(name),
    ];
    keys.extend((0..n).map(|i| slot_key(name, i)));
    keys
}

/// The keys of the release script for `name` of `n` slots: queue, alive, limit, the
/// run record, the fencing counter, then every slot's.
pub fn release_keys(name: &str, n: u32) -> Vec<String> {
    let mut keys = vec![
        waiter_key(name, "waiters"),
        waiter_key(name, "alive"),
        limit_key(name),
        format!("{}:last", lock_key(name)),
        fence_key(name),
    ];
    keys.extend((0..n).map(|i| slot_key(name, i)));
    keys
}

fn spawn_redis(
    port: u16,
    tls_port: Option<u16>,
    dir: &Path,
    setup: &Setup,
) -> Result<Child, String> {
    let log = dir.join(format!("redis-{port}.log"));
    let mut cmd = Command::new(server_program());
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
    if let Some(p) = &setup.password {
        cmd.args(["--requirepass", p]);
    }
    if let (Some(tls), Some(tls_port)) = (&setup.tls, tls_port) {
        cmd.args(tls.server_args(tls_port));
    }
    cmd.args(&setup.args)
        .envs(setup.env.iter().map(|(k, v)| (k, v)));
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

/// The server program the tests start for Redis, Sentinel and Cluster nodes:
/// `redis-server`, or `valkey-server` when `LOCKRUN_TEST_VALKEY` is set (scripts/test
/// runs the Redis conformance and deployment tests a second time so, where Valkey is
/// installed).
pub fn server_program() -> &'static str {
    if valkey() {
        "valkey-server"
    } else {
        "redis-server"
    }
}

/// The command-line client of [`server_program`]: `redis-cli` or `valkey-cli`.
pub fn cli_program() -> &'static str {
    if valkey() {
        "valkey-cli"
    } else {
        "redis-cli"
    }
}

fn valkey() -> bool {
    std::env::var_os("LOCKRUN_TEST_VALKEY").is_some_and(|v| !v.is_empty() && v != "0")
}
