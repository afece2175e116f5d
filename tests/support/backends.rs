//! Every backend behind one test interface, for the conformance suite: a real server
//! (its own `redis-server`, its own `etcd`, or a fresh table in the machine's PostgreSQL)
//! behind a fault-injecting [`Proxy`], so that "down" (refuse and cut) and "hung"
//! (blackhole) mean the same thing for every backend.
//!
//! Backends join the conformance suite one at a time, so some services here may not be
//! used by every build of the suite.
#![allow(dead_code)]

use std::fs::File;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::support::*;

/// A lock service under test.
pub trait Service: Send + Sync {
    /// The port the proxy forwards to.
    fn port(&self) -> u16;
    /// The `--url` that reaches the service through `port`.
    fn url_via(&self, port: u16) -> String;
    /// Every server's port, for a service of several (Redlock); each gets a proxy.
    fn ports(&self) -> Vec<u16> {
        vec![self.port()]
    }
    /// Options this backend needs besides `--url` (a table name, ...).
    fn options(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A service behind fault-injecting proxies (one per server).
pub struct Backend {
    /// The service (kept alive as long as the backend).
    pub service: Box<dyn Service>,
    /// The proxies lockrun talks to, one per server.
    pub proxies: Vec<Proxy>,
}

impl Backend {
    /// Puts each server of `service` behind a new proxy.
    pub fn new(service: impl Service + 'static) -> Backend {
        let proxies = service.ports().into_iter().map(Proxy::start).collect();
        Backend {
            service: Box::new(service),
            proxies,
        }
    }

    /// `--url URL` for each server, through the proxies.
    pub fn url_args(&self) -> Vec<String> {
        self.proxies
            .iter()
            .flat_map(|p| ["--url".to_owned(), self.service.url_via(p.port())])
            .collect()
    }

    /// Sets every proxy's mode.
    pub fn set_mode(&self, mode: Mode) {
        self.proxies.iter().for_each(|p| p.set_mode(mode));
    }

    /// Cuts every current connection of every proxy.
    pub fn cut(&self) {
        self.proxies.iter().for_each(Proxy::cut);
    }

    /// `lockrun run` against this backend with `opts` and `command`.
    pub fn run(&self, name: &str, opts: &[&str], command: &[&str]) -> Command {
        let mut cmd = lockrun();
        cmd.arg("run")
            .args(self.url_args())
            .args(self.service.options());
        cmd.args(opts).arg(name).arg("--").args(command);
        cmd
    }

    /// `lockrun SUBCOMMAND --url URL... [backend options] ARGS...` (status, release).
    pub fn admin(&self, subcommand: &str, args: &[&str]) -> Command {
        let mut cmd = lockrun();
        cmd.arg(subcommand).args(self.url_args());
        cmd.args(self.service.options()).args(args);
        cmd
    }

    /// True if `lockrun status` says `name` is held.
    pub fn held(&self, name: &str) -> bool {
        let f = run(self.admin("status", &[name]));
        match f.code {
            Some(0) => true,
            Some(1) => false,
            _ => panic!("lockrun status failed: {:?}\n{}", f.status, f.stderr),
        }
    }
}

/// Redis: its own `redis-server`.
impl Service for RedisServer {
    fn port(&self) -> u16 {
        RedisServer::port(self)
    }
    fn url_via(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }
}

/// Redlock: three `redis-server`s of the test's own.
pub struct Quorum(pub Vec<RedisServer>);

impl Quorum {
    /// Starts three servers.
    pub fn start() -> Quorum {
        Quorum((0..3).map(|_| RedisServer::start()).collect())
    }
}

impl Service for Quorum {
    fn port(&self) -> u16 {
        self.0[0].port()
    }
    fn ports(&self) -> Vec<u16> {
        self.0.iter().map(RedisServer::port).collect()
    }
    fn url_via(&self, port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }
}

/// PostgreSQL: the machine's server on 127.0.0.1:5432, with a table of the test's own
/// (dropped at the end).
pub struct Postgres {
    table: String,
}

impl Postgres {
    /// A fresh table name in database `test`.
    pub fn start() -> Postgres {
        let suffix: u64 = rand_u64();
        Postgres {
            table: format!("lockrun_conformance_{suffix:016x}"),
        }
    }
}

fn rand_u64() -> u64 {
    let mut buf = [0u8; 8];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read /dev/urandom");
    u64::from_le_bytes(buf)
}

impl Service for Postgres {
    fn port(&self) -> u16 {
        5432
    }
    fn url_via(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/test?sslmode=disable")
    }
    fn options(&self) -> Vec<String> {
        vec!["--pg-table".into(), self.table.clone()]
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
                "-q",
                "-c",
            ])
            .arg(format!(
                "DROP TABLE IF EXISTS {0}; DROP SEQUENCE IF EXISTS {0}_fence",
                self.table
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// etcd: its own single-member cluster in a temporary directory.
pub struct Etcd {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Etcd {
    /// Starts etcd on free ports and waits until it answers.
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir");
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (Debian package etcd-server)");
        let etcd = Etcd {
            child,
            port,
            _dir: dir,
        };
        wait_until("etcd answers", Duration::from_secs(30), || {
            Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &client_url, "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        etcd
    }
}

impl Service for Etcd {
    fn port(&self) -> u16 {
        self.port
    }
    fn url_via(&self, port: u16) -> String {
        format!("etcd://127.0.0.1:{port}")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
