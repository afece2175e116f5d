//! A private `etcd`: one single-member cluster per test on free 127.0.0.1 ports, with its
//! data in a temporary directory, killed on drop, and restarted with its data on demand.
//! The tests look at it with `etcdctl` (not with lockrun's own client), so what they see
//! does not depend on the code under test. [`EtcdServer::start_tls`] serves clients over
//! TLS only (`etcds://`), on 127.0.0.1 and on 127.0.0.2 (an address its certificate does
//! not hold), demanding a client certificate if the files say so.

use std::fs::{self, File};
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::ready::{wait_ready, NotReady};
use super::{free_port, serial, signal_pid, TlsFiles, WAIT};

/// An `etcd` process of this test's own.
pub struct EtcdServer {
    port: u16,
    peer: u16,
    dir: TempDir,
    /// How many times a server was spawned (each writes its own log).
    spawned: u32,
    child: Option<Child>,
    /// `user:password` for etcdctl once authentication is on.
    auth: Option<String>,
    /// The server's certificate, its CA and a client certificate, when clients speak TLS.
    tls: Option<TlsFiles>,
}

impl EtcdServer {
    /// Starts etcd and waits until it serves requests.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts etcd serving clients over TLS with `files`' server certificate, demanding
    /// a client certificate its CA signed if `files.require_client_cert`
    /// (`--client-cert-auth`).
    pub fn start_tls(files: TlsFiles) -> Self {
        Self::start_with(Some(files))
    }

    fn start_with(tls: Option<TlsFiles>) -> Self {
        serial::side_by_side();
        let dir = tempfile::Builder::new()
            .prefix("lockrun-etcd-")
            .tempdir()
            .expect("create etcd dir");
        let mut etcd = EtcdServer {
            port: 0,
            peer: 0,
            dir,
            spawned: 0,
            child: None,
            auth: None,
            tls,
        };
        let mut last_err = String::new();
        // A free port can be taken by someone else before etcd binds it: try a few, each
        // with a fresh data directory (a failed start may leave one behind).
        for _ in 0..10 {
            (etcd.port, etcd.peer) = (free_port(), free_port());
            if etcd.port == etcd.peer {
                continue;
            }
            let _ = fs::remove_dir_all(etcd.data());
            match etcd.spawn() {
                Ok(()) => return etcd,
                Err(NotReady::Exited(e)) => last_err = e,
                Err(e) => panic!("could not start etcd: {}", e.message()),
            }
        }
        panic!("could not start etcd: {last_err}");
    }

    /// Starts the killed server again on the same ports, with its data.
    pub fn restart(&mut self) {
        self.kill();
        let mut last_err = String::new();
        let start = Instant::now();
        while start.elapsed() < WAIT {
            match self.spawn() {
                Ok(()) => return,
                Err(NotReady::Exited(e)) => last_err = e,
                Err(e) => panic!("could not restart etcd: {}", e.message()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not restart etcd on port {}: {last_err}", self.port);
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Starts etcd on `self.port`; ready once it answers etcdctl's health check (a read
    /// of key `health`, which etcd answers once it has a leader; a permission refused
    /// by authentication counts as an answer).
    fn spawn(&mut self) -> Result<(), NotReady> {
        self.spawned += 1;
        let log = self.dir.path().join(format!("etcd-{}.log", self.spawned));
        let (port, peer, tls) = (self.port, self.peer, self.tls.as_ref());
        let mut child =
            spawn_etcd(&self.data(), &log, port, peer, tls).map_err(NotReady::Exited)?;
        let every = Duration::from_millis(50);
        wait_ready("etcd", &mut child, &log, every, || {
            // etcdctl only once something listens: its dial would wait out its timeout.
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                && self
                    .etcdctl_command(&["--dial-timeout=2s", "endpoint", "health"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `etcd://127.0.0.1:PORT` (`etcds://` for a server of [`EtcdServer::start_tls`]).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The TLS files of a server of [`EtcdServer::start_tls`].
    pub fn tls_files(&self) -> &TlsFiles {
        self.tls.as_ref().expect("etcd does not speak TLS")
    }

    /// `LOCKRUN_TLS_CA`, `_CERT` and `_KEY` that let lockrun in (the CA and client
    /// certificate of [`EtcdServer::tls_files`]).
    pub fn tls_env(&self) -> Vec<(&'static str, String)> {
        let files = self.tls_files();
        let path = |name: &str| files.path(name).display().to_string();
        vec![
            ("LOCKRUN_TLS_CA", path("ca.pem")),
            ("LOCKRUN_TLS_CERT", path("client.pem")),
            ("LOCKRUN_TLS_KEY", path("client.key")),
        ]
    }

    /// The server's pid (panics when it is not running).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("etcd is not running").id() as i32
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal_pid(self.pid(), Signal::SIGSTOP);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn resume(&self) {
        signal_pid(self.pid(), Signal::SIGCONT);
    }

    /// `etcdctl ARGS` against this server, not started yet.
    fn etcdctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={scheme}://127.0.0.1:{}", self.port))
            .arg("--command-timeout=5s");
        if let Some(files) = &self.tls {
            for (flag, name) in [
                ("cacert", "ca.pem"),
                ("cert", "client.pem"),
                ("key", "client.key"),
            ] {
                cmd.arg(format!("--{flag}={}", files.path(name).display()));
            }
        }
        if let Some(auth) = &self.auth {
            cmd.arg(format!("--user={auth}"));
        }
        cmd.args(args);
        cmd
    }

    /// Runs `etcdctl ARGS` against this server.
    pub fn try_etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl")
    }

    /// Runs `etcdctl ARGS` and returns its stdout; panics if it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = self.try_etcdctl(args);
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `etcdctl ARGS -w json`, parsed.
    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-w", "json"]);
        let out = self.etcdctl(&all);
        serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("etcdctl {args:?} printed no JSON ({e}): {out}"))
    }

    /// The key as stored now, if it exists.
    pub fn get(&self, key: &str) -> Option<StoredKey> {
        let v = self.json(&["get", key]);
        let kv = v["kvs"].as_array()?.first()?;
        let value = self.etcdctl(&["get", key, "--print-value-only"]);
        Some(StoredKey {
            value: value.trim_end_matches('\n').to_string(),
            create_revision: kv["create_revision"].as_u64().unwrap_or(0),
            lease: kv["lease"].as_u64().unwrap_or(0),
        })
    }

    /// True when `key` exists.
    pub fn exists(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every key that begins with `prefix`, in etcd's (byte) order.
    pub fn keys_with_prefix(&self, prefix: &str) -> Vec<String> {
        let out = self.etcdctl(&["get", "--prefix", "--keys-only", prefix]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The seconds left on lease `id` (-1 when it does not exist).
    pub fn lease_ttl(&self, id: u64) -> i64 {
        self.json(&["lease", "timetolive", &format!("{id:x}")])["ttl"]
            .as_i64()
            .unwrap_or(-1)
    }

    /// How many leases exist.
    pub fn lease_count(&self) -> usize {
        let out = self.etcdctl(&["lease", "list"]);
        out.lines().skip(1).filter(|l| !l.trim().is_empty()).count()
    }

    /// The IDs of the leases that exist.
    pub fn leases(&self) -> Vec<u64> {
        let out = self.etcdctl(&["lease", "list"]);
        out.lines()
            .skip(1)
            .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok())
            .collect()
    }

    /// The keys attached to lease `id` (none when it holds none or is gone; keys with
    /// no space in them, as every key of lockrun under the tests' prefixes).
    pub fn lease_keys(&self, id: u64) -> Vec<String> {
        let out = self.etcdctl(&["lease", "timetolive", &format!("{id:x}"), "--keys"]);
        let Some((_, rest)) = out.split_once("attached keys([") else {
            return Vec::new();
        };
        let inside = rest.split_once("])").map_or(rest, |(keys, _)| keys);
        inside.split_whitespace().map(str::to_owned).collect()
    }

    /// Every lease that holds keys, with its keys, sorted: what is left once every
    /// lease that holds nothing (a released holder's, until its TTL ends) is set aside.
    pub fn leases_with_keys(&self) -> Vec<(u64, Vec<String>)> {
        self.leases()
            .into_iter()
            .map(|id| {
                let mut keys = self.lease_keys(id);
                keys.sort();
                (id, keys)
            })
            .filter(|(_, keys)| !keys.is_empty())
            .collect()
    }

    /// The keys of [`EtcdServer::leases_with_keys`], one list per lease, sorted.
    pub fn keys_on_leases(&self) -> Vec<Vec<String>> {
        let mut all: Vec<Vec<String>> = self
            .leases_with_keys()
            .into_iter()
            .map(|(_, k)| k)
            .collect();
        all.sort();
        all
    }

    /// One HTTP/1.0 request to the client port (plain HTTP: etcd serves its metrics
    /// and a JSON gateway to its API there too); the whole answer.
    fn http(&self, request: &str) -> String {
        use std::io::Read;
        assert!(self.tls.is_none(), "plain HTTP only");
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.port))
            .expect("connect to etcd's client port");
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(request.as_bytes())
            .expect("send etcd an HTTP request");
        let mut text = String::new();
        conn.read_to_string(&mut text).expect("read etcd's answer");
        text
    }

    /// Grants a lease of `ttl` seconds with the ID `id` (which etcdctl cannot choose:
    /// through etcd's JSON gateway).
    pub fn grant_lease(&self, id: u64, ttl: u64) {
        let body = format!(r#"{{"TTL": {ttl}, "ID": {id}}}"#);
        let answer = self.http(&format!(
            "POST /v3/lease/grant HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
        assert!(
            answer.contains(r#""ID""#),
            "lease {id:x} not granted: {answer}"
        );
    }

    /// How many calls of each gRPC method the server has started, by method name
    /// (`Txn`, `LeaseGrant`, ...; those never called left out), from its `/metrics`.
    pub fn grpc_calls(&self) -> std::collections::BTreeMap<String, u64> {
        let text = self.http("GET /metrics HTTP/1.0\r\n\r\n");
        let mut calls = std::collections::BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("grpc_server_started_total{grpc_method=\"") else {
                continue;
            };
            let (method, _) = rest.split_once('"').expect("a method name");
            let count: u64 = line.rsplit(' ').next().unwrap().parse().expect("a count");
            if count > 0 {
                calls.insert(method.to_owned(), count);
            }
        }
        calls
    }

    /// Creates user `root` with `password` and turns authentication on.
    pub fn enable_auth(&mut self, password: &str) {
        self.etcdctl(&[
            "user",
            "add",
            "root",
            &format!("--new-user-password={password}"),
        ]);
        self.etcdctl(&["auth", "enable"]);
        self.auth = Some(format!("root:{password}"));
    }

    /// Sets user `root`'s password again, to the same one: etcd forgets every token it
    /// gave `root`, as when they expire.
    pub fn forget_tokens(&self) {
        let password = self.auth.as_ref().and_then(|a| a.split_once(':'));
        let (_, password) = password.expect("authentication is not on");
        let mut cmd = self.etcdctl_command(&["user", "passwd", "root", "--interactive=false"]);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run etcdctl");
        let mut stdin = child.stdin.take().expect("etcdctl's stdin");
        writeln!(stdin, "{password}").expect("give etcdctl the password");
        drop(stdin);
        let out = child.wait_with_output().expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl user passwd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A key as etcd stores it.
#[derive(Clone, Debug)]
pub struct StoredKey {
    /// The value, as text.
    pub value: String,
    /// The revision that created it.
    pub create_revision: u64,
    /// The lease it is attached to (0: none).
    pub lease: u64,
}

/// The etcd key of lock `name` under the default prefix.
pub fn etcd_key(name: &str) -> String {
    format!("lockrun:{{{name}}}")
}

/// The etcd key of slot `slot` of semaphore `name` under the default prefix (slot 0 is
/// the plain lock's key).
pub fn etcd_slot_key(name: &str, slot: u32) -> String {
    match slot {
        0 => etcd_key(name),
        i => format!("lockrun:{{{name}}}#{i}"),
    }
}

fn spawn_etcd(
    data: &Path,
    log_path: &Path,
    port: u16,
    peer: u16,
    tls: Option<&TlsFiles>,
) -> Result<Child, String> {
    let log = File::create(log_path).map_err(|e| e.to_string())?;
    let mut cmd = Command::new("etcd");
    let (client, listen) = match tls {
        None => {
            let client = format!("http://127.0.0.1:{port}");
            (client.clone(), client)
        }
        Some(files) => {
            let file = |name: &str| files.path(name).display().to_string();
            cmd.arg(format!("--cert-file={}", file("server.pem")))
                .arg(format!("--key-file={}", file("server.key")));
            if files.require_client_cert {
                cmd.arg("--client-cert-auth")
                    .arg(format!("--trusted-ca-file={}", file("ca.pem")));
            }
            let client = format!("https://127.0.0.1:{port}");
            // etcd binds both listeners before it serves either.
            let listen = format!("{client},https://127.0.0.2:{port}");
            (client, listen)
        }
    };
    let peer = format!("http://127.0.0.1:{peer}");
    let child = cmd
        .arg("--name=t")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={listen}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=t={peer}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("spawn etcd: {e}"))?;
    Ok(child)
}
