//! Redis behind Sentinel, of the test's own: a master, one replica and one Sentinel, each
//! on a free port. The master sits behind a [`Proxy`] that everyone reaches it through
//! (lockrun, the replica and the Sentinel, which hands out the proxy's address), so a
//! fault of that proxy is a fault of the master for all of them.
//!
//! [`Security`] adds passwords (the master's and replica's `requirepass`, the Sentinel's
//! own `requirepass`) and TLS (every server and the Sentinel listen with TLS and
//! replicate and monitor over it, `tls-replication yes`; each keeps a plain port for
//! the test's own look).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::{free_port, serial, wait_until, Proxy, RedisServer, TlsFiles, WAIT};

/// The name the Sentinel monitors the master under.
const MASTER_NAME: &str = "mymaster";

/// How a deployment is secured; the default: not at all.
#[derive(Default)]
pub struct Security {
    /// `requirepass` of the master and the replica (the replica's `masterauth`, the
    /// Sentinel's `sentinel auth-pass`).
    pub master_password: Option<String>,
    /// The Sentinel's own `requirepass`.
    pub sentinel_password: Option<String>,
    /// An ACL user of the Sentinel's (name, password) that may do everything, with its
    /// default user switched off.
    pub sentinel_user: Option<(String, String)>,
    /// TLS with these files everywhere (`tls-replication yes`).
    pub tls: Option<TlsFiles>,
}

/// A master, its replica and a Sentinel watching them.
pub struct Sentinel {
    master: RedisServer,
    master_proxy: Proxy,
    replica: RedisServer,
    /// The replica's port as the Sentinel knows it (its TLS port with TLS).
    replica_port: u16,
    sentinel: Child,
    sentinel_port: u16,
    sentinel_tls_port: Option<u16>,
    security: Security,
    _dir: TempDir,
}

impl Sentinel {
    /// Starts the three and waits until the Sentinel knows the master and its replica.
    /// The Sentinel fails the master over once it has not answered for `down_after`.
    pub fn start(down_after: Duration) -> Sentinel {
        Sentinel::start_secured(down_after, Security::default())
    }

    /// [`Sentinel::start`], with passwords and TLS as `security` says.
    pub fn start_secured(down_after: Duration, security: Security) -> Sentinel {
        serial::side_by_side();
        let dir = tempfile::tempdir().expect("create sentinel dir");
        let tls_args = |port: Option<u16>| -> Vec<String> {
            match (&security.tls, port) {
                (Some(tls), Some(port)) => {
                    let mut args = tls.server_args(port);
                    args.extend(["--tls-replication".into(), "yes".into()]);
                    args
                }
                _ => Vec::new(),
            }
        };
        let server = |args: &[String]| match &security.master_password {
            Some(pw) => RedisServer::with_password_and_args(pw, args),
            None => RedisServer::with_args(args),
        };
        let master_tls_port = security.tls.as_ref().map(|_| free_port());
        // Full syncs at once: by default a master waits 5 s for more replicas to sync.
        let mut master_args = vec!["--repl-diskless-sync-delay".into(), "0".into()];
        master_args.extend(tls_args(master_tls_port));
        let master = server(&master_args);
        let master_proxy = Proxy::start(master_tls_port.unwrap_or(master.port()));
        let replica_tls_port = security.tls.as_ref().map(|_| free_port());
        let mut replica_args = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master_proxy.port().to_string(),
        ];
        if let Some(pw) = &security.master_password {
            replica_args.extend(["--masterauth".into(), pw.clone()]);
        }
        replica_args.extend(tls_args(replica_tls_port));
        let replica = server(&replica_args);
        wait_until("the replica is in sync", WAIT, || {
            let info: String = replica.query(redis::cmd("INFO").arg("replication"));
            info.contains("master_link_status:up")
        });
        let sentinel_port = free_port();
        let sentinel_tls_port = security.tls.as_ref().map(|_| free_port());
        let mut conf_text = format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds {MASTER_NAME} {}\n\
             sentinel failover-timeout {MASTER_NAME} 2000\n",
            dir.path().display(),
            master_proxy.port(),
            down_after.as_millis()
        );
        if let Some(pw) = &security.master_password {
            conf_text += &format!("sentinel auth-pass {MASTER_NAME} {pw}\n");
        }
        if let Some(pw) = &security.sentinel_password {
            conf_text += &format!("requirepass {pw}\n");
        }
        if let Some((user, pw)) = &security.sentinel_user {
            conf_text += &format!("user {user} on >{pw} +@all\nuser default off\n");
        }
        let args = tls_args(sentinel_tls_port);
        for pair in args.chunks(2) {
            conf_text += &format!("{} {}\n", pair[0].trim_start_matches("--"), pair[1]);
        }
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(&conf, conf_text).expect("write sentinel.conf");
        let sentinel = Command::new(super::redis::server_program())
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
            replica_port: replica_tls_port.unwrap_or(replica.port()),
            replica,
            sentinel,
            sentinel_port,
            sentinel_tls_port,
            security,
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

    /// `redis+sentinel://127.0.0.1:PORT/mymaster` with the Sentinel's own port
    /// (`rediss+sentinel://` and its TLS port with TLS), without a password.
    pub fn url(&self) -> String {
        self.url_with("")
    }

    /// [`Sentinel::url`] with `userinfo` (`:password`, `user:password`) in it.
    pub fn url_with(&self, userinfo: &str) -> String {
        let at = if userinfo.is_empty() { "" } else { "@" };
        match self.sentinel_tls_port {
            Some(port) => format!("rediss+sentinel://{userinfo}{at}127.0.0.1:{port}/{MASTER_NAME}"),
            None => format!(
                "redis+sentinel://{userinfo}{at}127.0.0.1:{}/{MASTER_NAME}",
                self.sentinel_port
            ),
        }
    }

    /// The TLS files of a deployment started with TLS.
    pub fn tls_files(&self) -> &TlsFiles {
        self.security.tls.as_ref().expect("started without TLS")
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
        let replica = self.replica_port;
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
        let auth = match (
            &self.security.sentinel_user,
            &self.security.sentinel_password,
        ) {
            (Some((user, pw)), _) => format!("{user}:{pw}@"),
            (None, Some(pw)) => format!(":{pw}@"),
            (None, None) => String::new(),
        };
        let url = format!("redis://{auth}127.0.0.1:{}", self.sentinel_port);
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
