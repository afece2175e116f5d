//! Every backend behind one test interface, for the conformance suite: real servers of
//! the test's own (a `redis-server`, three for Redlock, a Sentinel deployment, a private
//! PostgreSQL cluster, an `etcd`) behind fault-injecting proxies, so that "down" (refuse
//! and cut) and "hung" (blackhole) mean the same thing for every backend, and with hooks
//! that kill and restart, or freeze and thaw, the servers themselves.
//!
//! A backend with no server (the file backend) has no ports, so no proxies: lockrun
//! reaches it by [`Service::url`], and [`Service::set_mode`] says what a fault means
//! for it, if anything.
//!
//! A new backend joins by implementing [`Service`] for its test server (the servers the
//! faults hit, and its URL through a proxy; the rest has defaults) and adding one line to
//! the suite. A server process of a new kind implements [`Server`] with one line of the
//! `server!` list below.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{
    lockrun, run, EtcdServer, Mode, PgBouncer, Pool, PrivateMysql, PrivatePg, Proxy, RedisServer,
    Sentinel, TlsFiles, ZkServer,
};

/// One server process of a test's own, that the fault tests kill and restart, or freeze
/// and thaw.
pub trait Server: Send + Sync {
    /// The port it serves clients on.
    fn port(&self) -> u16;
    /// SIGKILLs it.
    fn kill(&mut self);
    /// Starts it again on its port, with whatever data it keeps.
    fn restart(&mut self);
    /// Freezes it (SIGSTOP): connections stay open, nothing is answered.
    fn pause(&self);
    /// Thaws it (SIGCONT).
    fn resume(&self);
}

/// [`Server`] for each type, by its own methods of the same names.
macro_rules! server {
    ($($server:ty),*) => {$(
        impl Server for $server {
            fn port(&self) -> u16 {
                <$server>::port(self)
            }
            fn kill(&mut self) {
                <$server>::kill(self)
            }
            fn restart(&mut self) {
                <$server>::restart(self)
            }
            fn pause(&self) {
                <$server>::pause(self)
            }
            fn resume(&self) {
                <$server>::resume(self)
            }
        }
    )*};
}

server!(RedisServer, EtcdServer, PrivatePg, ZkServer, PrivateMysql);

/// A lock service under test.
pub trait Service: Send + Sync {
    /// Every server that holds the lock's data: what the fault tests kill and restart,
    /// or freeze and thaw (the proxies stay). None for a backend with no server.
    fn servers(&self) -> Vec<&dyn Server>;
    /// The same, to kill and restart.
    fn servers_mut(&mut self) -> Vec<&mut dyn Server>;
    /// The `--url` that reaches the server of `port` through the proxy on `via`.
    fn url_via(&self, via: u16) -> String;
    /// The ports lockrun connects to, one per server; each gets a proxy. By default the
    /// servers' own.
    fn ports(&self) -> Vec<u16> {
        self.servers().iter().map(|s| s.port()).collect()
    }
    /// The `--url` of a service with no ports, reached directly (no proxy).
    fn url(&self) -> Option<String> {
        None
    }
    /// What a proxy mode means for the service itself, besides its proxies (the file
    /// backend refuses a directory replaced by a file); nothing by default.
    fn set_mode(&self, _mode: Mode) {}
    /// True if a crashed holder's lock is free at once (the file backend: the kernel
    /// drops it with the holder's lockrun), not when its lease ends.
    fn frees_crashed_locks_at_once(&self) -> bool {
        false
    }
    /// Options this backend needs besides `--url` (a table name, ...).
    fn options(&self) -> Vec<String> {
        Vec::new()
    }
    /// Environment variables lockrun needs for it (TLS files, ...).
    fn env(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Proxies the service keeps in front of servers it hands out the address of
    /// (Sentinel's master): faults apply to them too.
    fn inner_proxies(&self) -> Vec<&Proxy> {
        Vec::new()
    }
}

/// A service behind fault-injecting proxies (one per server).
pub struct Backend {
    service: Box<dyn Service>,
    proxies: Vec<Proxy>,
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

    /// `--url URL` for each server, through the proxies (or the service's own URL).
    fn url_args(&self) -> Vec<String> {
        let urls: Vec<String> = match self.service.url() {
            Some(url) => vec![url],
            None => self
                .proxies
                .iter()
                .map(|p| self.service.url_via(p.port()))
                .collect(),
        };
        urls.into_iter()
            .flat_map(|url| ["--url".to_owned(), url])
            .collect()
    }

    /// Every proxy, the service's own included.
    fn all_proxies(&self) -> impl Iterator<Item = &Proxy> {
        self.proxies.iter().chain(self.service.inner_proxies())
    }

    /// Sets every proxy's mode (and the service's own, see [`Service::set_mode`]).
    pub fn set_mode(&self, mode: Mode) {
        self.all_proxies().for_each(|p| p.set_mode(mode));
        self.service.set_mode(mode);
    }

    /// Cuts every current connection of every proxy.
    pub fn cut(&self) {
        self.all_proxies().for_each(Proxy::cut);
    }

    /// SIGKILLs every server that holds the lock's data (see [`Service::servers`]).
    pub fn kill(&mut self) {
        self.service
            .servers_mut()
            .into_iter()
            .for_each(Server::kill);
    }

    /// Starts the killed servers again on their ports, with whatever data they keep.
    pub fn restart(&mut self) {
        self.service
            .servers_mut()
            .into_iter()
            .for_each(Server::restart);
    }

    /// Freezes the servers (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self) {
        self.service.servers().into_iter().for_each(Server::pause);
    }

    /// Thaws them (SIGCONT).
    pub fn resume(&self) {
        self.service.servers().into_iter().for_each(Server::resume);
    }

    /// `lockrun run` against this backend with `opts` and `command`.
    pub fn run(&self, name: &str, opts: &[&str], command: &[&str]) -> Command {
        let mut cmd = lockrun();
        cmd.arg("run")
            .args(self.url_args())
            .args(self.service.options());
        cmd.args(opts).arg(name).arg("--").args(command);
        cmd.envs(self.service.env());
        cmd
    }

    /// `lockrun SUBCOMMAND --url URL... [backend options] ARGS...` (status, release).
    pub fn admin(&self, subcommand: &str, args: &[&str]) -> Command {
        let mut cmd = lockrun();
        cmd.arg(subcommand).args(self.url_args());
        cmd.args(self.service.options()).args(args);
        cmd.envs(self.service.env());
        cmd
    }

    /// See [`Service::frees_crashed_locks_at_once`].
    pub fn frees_crashed_locks_at_once(&self) -> bool {
        self.service.frees_crashed_locks_at_once()
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

/// Redis: its own `redis-server`, restarted empty.
impl Service for RedisServer {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![self]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![self]
    }
    fn url_via(&self, via: u16) -> String {
        format!("redis://127.0.0.1:{via}")
    }
}

/// Redlock: three `redis-server`s of the test's own, every one of them faulted at once.
pub struct Quorum(Vec<RedisServer>);

impl Quorum {
    /// Starts three servers.
    pub fn start() -> Quorum {
        Quorum((0..3).map(|_| RedisServer::start()).collect())
    }
}

impl Service for Quorum {
    fn servers(&self) -> Vec<&dyn Server> {
        self.0.iter().map(|s| s as &dyn Server).collect()
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        self.0.iter_mut().map(|s| s as &mut dyn Server).collect()
    }
    fn url_via(&self, via: u16) -> String {
        format!("redis://127.0.0.1:{via}")
    }
}

/// Redis behind Sentinel: lockrun asks the Sentinel (through a proxy) for the master,
/// which it then reaches through the master's own proxy. Faults of the servers are
/// faults of the master; the Sentinel waits long before failing over, so it does not
/// while a test runs.
pub struct SentinelService(Sentinel);

impl SentinelService {
    /// Starts a master, a replica and a Sentinel.
    pub fn start() -> SentinelService {
        SentinelService(Sentinel::start(Duration::from_secs(120)))
    }
}

impl Service for SentinelService {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![self.0.master()]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![self.0.master_mut()]
    }
    /// The Sentinel's: it hands out the master's own proxy.
    fn ports(&self) -> Vec<u16> {
        vec![self.0.sentinel_port()]
    }
    fn url_via(&self, via: u16) -> String {
        self.0.url_via(via)
    }
    fn inner_proxies(&self) -> Vec<&Proxy> {
        vec![self.0.master_proxy()]
    }
}

/// The lock table of the PostgreSQL conformance runs.
fn pg_table() -> Vec<String> {
    vec!["--pg-table".into(), "lockrun_conformance".into()]
}

/// PostgreSQL: a private cluster of the test's own (so that it can be killed and
/// frozen), keeping its data across a restart.
pub struct Postgres(PrivatePg);

impl Postgres {
    /// Initialises and starts a cluster.
    pub fn start() -> Postgres {
        Postgres(PrivatePg::start())
    }
}

impl Service for Postgres {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![&self.0]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![&mut self.0]
    }
    fn url_via(&self, via: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{via}/postgres?sslmode=disable")
    }
    fn options(&self) -> Vec<String> {
        pg_table()
    }
}

/// MariaDB: a private server of the test's own (so that it can be killed and frozen),
/// keeping its data across a restart; the lease table is lockrun's default.
pub struct Mysql(PrivateMysql);

impl Mysql {
    /// Initialises and starts a server.
    pub fn start() -> Mysql {
        Mysql(PrivateMysql::start())
    }
}

impl Service for Mysql {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![&self.0]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![&mut self.0]
    }
    fn url_via(&self, via: u16) -> String {
        self.0.url_via(via)
    }
}

/// PostgreSQL through PgBouncer in transaction pooling: the proxy stands in front of
/// PgBouncer, so "down" and "hung" are PgBouncer (or the way to it) gone or silent;
/// the servers killed or frozen are PostgreSQL behind it, with PgBouncer up and
/// answering its clients: the failure a pooler hides, which lockrun must see through
/// (a renewal that PgBouncer cannot pass on, or that hangs there, is no renewal).
pub struct PgBouncerService(PgBouncer);

impl PgBouncerService {
    /// Starts a cluster and PgBouncer in front of it.
    pub fn start() -> PgBouncerService {
        PgBouncerService(PgBouncer::start())
    }
}

impl Service for PgBouncerService {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![self.0.pg()]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![self.0.pg_mut()]
    }
    /// PgBouncer's.
    fn ports(&self) -> Vec<u16> {
        vec![self.0.port()]
    }
    fn url_via(&self, via: u16) -> String {
        self.0.url_via(via, Pool::Transaction)
    }
    fn options(&self) -> Vec<String> {
        pg_table()
    }
}

/// etcd: its own single-member cluster, keeping its data across a restart.
impl Service for EtcdServer {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![self]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![self]
    }
    fn url_via(&self, via: u16) -> String {
        format!("etcd://127.0.0.1:{via}")
    }
}

/// etcd over TLS (`etcds://`): its own single-member cluster serving clients over TLS
/// only and demanding a client certificate, reached with a private CA and a client
/// certificate (`LOCKRUN_TLS_*`) through proxies on 127.0.0.1, an address its
/// certificate holds.
pub struct EtcdTls(EtcdServer);

impl EtcdTls {
    /// Makes a CA and certificates, and starts the server.
    pub fn start() -> EtcdTls {
        EtcdTls(EtcdServer::start_tls(TlsFiles::generate(true)))
    }
}

impl Service for EtcdTls {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![&self.0]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![&mut self.0]
    }
    fn url_via(&self, via: u16) -> String {
        format!("etcds://127.0.0.1:{via}")
    }
    fn env(&self) -> Vec<(&'static str, String)> {
        self.0.tls_env()
    }
}

/// ZooKeeper: its own standalone server, keeping its data across a restart.
impl Service for ZkServer {
    fn servers(&self) -> Vec<&dyn Server> {
        vec![self]
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        vec![self]
    }
    fn url_via(&self, via: u16) -> String {
        format!("zk://127.0.0.1:{via}")
    }
}

/// The file backend: a lock directory in a temporary directory of the test's own. It
/// has no server: nothing to proxy, kill or freeze (the fault tests do not run for it);
/// [`Mode::Refuse`] puts a regular file where the lock directory was, so that lockrun
/// cannot use it, and [`Mode::Pass`] puts the directory back.
pub struct FileService {
    root: tempfile::TempDir,
}

impl FileService {
    /// A new, empty place for a lock directory (lockrun creates it).
    pub fn start() -> FileService {
        let root = tempfile::Builder::new()
            .prefix("lockrun-file-")
            .tempdir()
            .expect("create a temporary directory");
        FileService { root }
    }

    /// The lock directory.
    pub fn dir(&self) -> PathBuf {
        self.root.path().join("locks")
    }

    /// `file://` and the lock directory.
    pub fn lock_url(&self) -> String {
        format!("file://{}", self.dir().display())
    }

    /// The lock file of `name` under the default prefix (`lockrun:`; `/` is `+`).
    pub fn lock_file(&self, name: &str) -> PathBuf {
        self.dir()
            .join(format!("lockrun:={}", name.replace('/', "+")))
    }

    /// The temporary directory the lock directory is in.
    pub fn root(&self) -> &std::path::Path {
        self.root.path()
    }

    fn away(&self) -> PathBuf {
        self.root.path().join("locks.away")
    }
}

impl Service for FileService {
    fn servers(&self) -> Vec<&dyn Server> {
        Vec::new()
    }
    fn servers_mut(&mut self) -> Vec<&mut dyn Server> {
        Vec::new()
    }
    fn url_via(&self, _via: u16) -> String {
        unreachable!("the file backend has no server, so no proxy")
    }
    fn url(&self) -> Option<String> {
        Some(self.lock_url())
    }
    fn set_mode(&self, mode: Mode) {
        let (dir, away) = (self.dir(), self.away());
        match mode {
            Mode::Refuse if !away.exists() => {
                std::fs::create_dir_all(&dir).expect("create the lock directory");
                std::fs::rename(&dir, &away).expect("move the lock directory away");
                std::fs::write(&dir, "not a directory\n").expect("write a file in its place");
            }
            Mode::Pass if away.exists() => {
                std::fs::remove_file(&dir).expect("remove the file");
                std::fs::rename(&away, &dir).expect("put the lock directory back");
            }
            _ => {}
        }
    }
    fn frees_crashed_locks_at_once(&self) -> bool {
        true
    }
}
