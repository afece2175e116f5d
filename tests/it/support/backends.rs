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
//! A new backend joins by implementing [`Service`] for its test server and adding one
//! line to the suite.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{
    lockrun, run, EtcdServer, Mode, PgBouncer, Pool, PrivatePg, Proxy, RedisServer, Sentinel,
    TlsFiles,
};

/// A lock service under test.
pub trait Service: Send + Sync {
    /// The ports lockrun connects to, one per server; each gets a proxy. None for a
    /// backend with no server.
    fn ports(&self) -> Vec<u16>;
    /// The `--url` that reaches the server of `port` through the proxy on `via`.
    fn url_via(&self, via: u16) -> String;
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
    /// SIGKILLs every server that holds the lock's data (the proxies stay).
    fn kill(&mut self);
    /// Starts the killed servers again on their ports, with whatever data they keep.
    fn restart(&mut self);
    /// Freezes those servers (SIGSTOP): connections stay open, nothing is answered.
    fn pause(&self);
    /// Thaws them (SIGCONT).
    fn resume(&self);
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

    /// Kills the servers (see [`Service::kill`]).
    pub fn kill(&mut self) {
        self.service.kill();
    }

    /// Restarts the killed servers (see [`Service::restart`]).
    pub fn restart(&mut self) {
        self.service.restart();
    }

    /// Freezes the servers (see [`Service::pause`]).
    pub fn pause(&self) {
        self.service.pause();
    }

    /// Thaws the servers (see [`Service::resume`]).
    pub fn resume(&self) {
        self.service.resume();
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
    fn ports(&self) -> Vec<u16> {
        vec![self.port()]
    }
    fn url_via(&self, via: u16) -> String {
        format!("redis://127.0.0.1:{via}")
    }
    fn kill(&mut self) {
        RedisServer::kill(self);
    }
    fn restart(&mut self) {
        RedisServer::restart(self);
    }
    fn pause(&self) {
        RedisServer::pause(self);
    }
    fn resume(&self) {
        RedisServer::resume(self);
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
    fn ports(&self) -> Vec<u16> {
        self.0.iter().map(RedisServer::port).collect()
    }
    fn url_via(&self, via: u16) -> String {
        format!("redis://127.0.0.1:{via}")
    }
    fn kill(&mut self) {
        self.0.iter_mut().for_each(RedisServer::kill);
    }
    fn restart(&mut self) {
        self.0.iter_mut().for_each(RedisServer::restart);
    }
    fn pause(&self) {
        self.0.iter().for_each(RedisServer::pause);
    }
    fn resume(&self) {
        self.0.iter().for_each(RedisServer::resume);
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
    fn ports(&self) -> Vec<u16> {
        vec![self.0.sentinel_port()]
    }
    fn url_via(&self, via: u16) -> String {
        self.0.url_via(via)
    }
    fn inner_proxies(&self) -> Vec<&Proxy> {
        vec![self.0.master_proxy()]
    }
    fn kill(&mut self) {
        self.0.master_mut().kill();
    }
    fn restart(&mut self) {
        self.0.master_mut().restart();
    }
    fn pause(&self) {
        self.0.master().pause();
    }
    fn resume(&self) {
        self.0.master().resume();
    }
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
    fn ports(&self) -> Vec<u16> {
        vec![self.0.port()]
    }
    fn url_via(&self, via: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{via}/postgres?sslmode=disable")
    }
    fn options(&self) -> Vec<String> {
        vec!["--pg-table".into(), "lockrun_conformance".into()]
    }
    fn kill(&mut self) {
        self.0.kill();
    }
    fn restart(&mut self) {
        self.0.restart();
    }
    fn pause(&self) {
        self.0.pause();
    }
    fn resume(&self) {
        self.0.resume();
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
    fn ports(&self) -> Vec<u16> {
        vec![self.0.port()]
    }
    fn url_via(&self, via: u16) -> String {
        self.0.url_via(via, Pool::Transaction)
    }
    fn options(&self) -> Vec<String> {
        vec!["--pg-table".into(), "lockrun_conformance".into()]
    }
    fn kill(&mut self) {
        self.0.pg_mut().kill();
    }
    fn restart(&mut self) {
        self.0.pg_mut().restart();
    }
    fn pause(&self) {
        self.0.pg().pause();
    }
    fn resume(&self) {
        self.0.pg().resume();
    }
}

/// etcd: its own single-member cluster, keeping its data across a restart.
impl Service for EtcdServer {
    fn ports(&self) -> Vec<u16> {
        vec![self.port()]
    }
    fn url_via(&self, via: u16) -> String {
        format!("etcd://127.0.0.1:{via}")
    }
    fn kill(&mut self) {
        EtcdServer::kill(self);
    }
    fn restart(&mut self) {
        EtcdServer::restart(self);
    }
    fn pause(&self) {
        EtcdServer::pause(self);
    }
    fn resume(&self) {
        EtcdServer::resume(self);
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
    fn ports(&self) -> Vec<u16> {
        vec![self.0.port()]
    }
    fn url_via(&self, via: u16) -> String {
        format!("etcds://127.0.0.1:{via}")
    }
    fn env(&self) -> Vec<(&'static str, String)> {
        self.0.tls_env()
    }
    fn kill(&mut self) {
        self.0.kill();
    }
    fn restart(&mut self) {
        self.0.restart();
    }
    fn pause(&self) {
        self.0.pause();
    }
    fn resume(&self) {
        self.0.resume();
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
    fn ports(&self) -> Vec<u16> {
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
    fn kill(&mut self) {}
    fn restart(&mut self) {}
    fn pause(&self) {}
    fn resume(&self) {}
}

/// ZooKeeper: its own standalone server, keeping its data across a restart.
impl Service for super::ZkServer {
    fn ports(&self) -> Vec<u16> {
        vec![self.port()]
    }
    fn url_via(&self, via: u16) -> String {
        format!("zk://127.0.0.1:{via}")
    }
    fn kill(&mut self) {
        super::ZkServer::kill(self);
    }
    fn restart(&mut self) {
        super::ZkServer::restart(self);
    }
    fn pause(&self) {
        super::ZkServer::pause(self);
    }
    fn resume(&self) {
        super::ZkServer::resume(self);
    }
}
