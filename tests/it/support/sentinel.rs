//! Redis behind Sentinel, of the test's own: a master, one replica and one Sentinel, each
//! on a free port. The master sits behind a [`Proxy`] that everyone reaches it through
//! (lockrun, the replica and the Sentinel, which hands out the proxy's address), so a
//! fault of that proxy is a fault of the master for all of them.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::{free_port, serial, wait_until, Proxy, RedisServer, WAIT};

/// The name the Sentinel monitors the master under.
const MASTER_NAME: &str = "mymaster";

/// A master, its replica and a Sentinel watching them.
pub struct Sentinel {
    master: RedisServer,
    master_proxy: Proxy,
    replica: RedisServer,
    sentinel: Child,
    sentinel_port: u16,
    _dir: TempDir,
}

impl Sentinel {
    /// Starts the three and waits until the Sentinel knows the master and its replica.
    /// The Sentinel fails the master over once it has not answered for `down_after`.
    pub fn start(down_after: Duration) -> Sentinel {
        serial::side_by_side();
        let dir = tempfile::tempdir().expect("create sentinel dir");
        // Full syncs at once: by default a master waits 5 s for more replicas to sync.
        let master = RedisServer::with_args(&["--repl-diskless-sync-delay".into(), "0".into()]);
        let master_proxy = Proxy::start(master.port());
        let replica = RedisServer::with_args(&[
            "--replicaof".into(),
            "127.0.0.1".into(),
            master_proxy.port().to_string(),
        ]);
        wait_until("the replica is in sync", WAIT, || {
            let info: String = replica.query(redis::cmd("INFO").arg("replication"));
            info.contains("master_link_status:up")
        });
        let sentinel_port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                 sentinel failover-timeout {MASTER_NAME} 2000\n",
                dir.path().display(),
                master_proxy.port(),
                down_after.as_millis()
            ),
        )
        .expect("write sentinel.conf");
        let sentinel = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let cluster = Sentinel {
            master,
            master_proxy,
            replica,
            sentinel,
            sentinel_port,
            _dir: dir,
        };
        wait_until(
            "the Sentinel knows the master and its replica",
            Duration::from_secs(30),
            || {
                cluster.master_port() == Some(cluster.master_proxy.port())
                    && cluster
                        .ask::<Vec<redis::Value>>(
                            redis::cmd("SENTINEL").arg("replicas").arg(MASTER_NAME),
                        )
                        .is_some_and(|r| !r.is_empty())
            },
        );
        cluster
    }

    /// `redis+sentinel://127.0.0.1:PORT/mymaster` with the Sentinel's own port.
    pub fn url(&self) -> String {
        self.url_via(self.sentinel_port)
    }

    /// The URL that reaches the Sentinel through `port` (a proxy in front of it).
    pub fn url_via(&self, port: u16) -> String {
        format!("redis+sentinel://127.0.0.1:{port}/{MASTER_NAME}")
    }

    /// The Sentinel's port.
    pub fn sentinel_port(&self) -> u16 {
        self.sentinel_port
    }

    /// The master's server (its own port, not the proxy's).
    pub fn master(&self) -> &RedisServer {
        &self.master
    }

    /// The master's server, to kill or restart it.
    pub fn master_mut(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The proxy in front of the master.
    pub fn master_proxy(&self) -> &Proxy {
        &self.master_proxy
    }

    /// The replica's server.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Kills the master and waits until the Sentinel has promoted the replica.
    pub fn kill_master_and_wait_for_failover(&mut self) {
        self.master.kill();
        let replica = self.replica.port();
        wait_until(
            "the Sentinel promoted the replica",
            Duration::from_secs(60),
            || self.master_port() == Some(replica),
        );
    }

    /// The master's port as the Sentinel tells it now.
    fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = self.ask(
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER_NAME),
        )?;
        addr.map(|(_, port)| port)
    }

    /// Asks the Sentinel; `None` when it does not answer (yet).
    fn ask<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Option<T> {
        let url = format!("redis://127.0.0.1:{}", self.sentinel_port);
        let client = redis::Client::open(url).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        cmd.query(&mut con).ok()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.sentinel.kill();
        let _ = self.sentinel.wait();
    }
}
