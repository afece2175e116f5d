//! ZooKeeper servers of the test's own, from Debian's `zookeeper` package (its jar and
//! the JVM): a standalone server, or a 3-member ensemble on loopback, each member on
//! free 127.0.0.1 ports with its own data directory and configuration; killed on drop,
//! killed and restarted (with or without its data), frozen and thawed on demand.
//!
//! The tests look at the servers with ZooKeeper's four-letter commands (`srvr`, `dump`,
//! `wchc`), not with lockrun's client, so what they see does not depend on the code
//! under test. `tickTime` is 200 ms so that the conformance suite's 2 s sessions are
//! granted (the server grants 1 s to 60 s).

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use super::ready::{last_lines, READY_TIMEOUT};
use super::{free_port, serial, signal_pid, WAIT};

/// Where Debian's package puts ZooKeeper (its manifest names the other jars it needs).
const JAR: &str = "/usr/share/java/zookeeper.jar";

/// How long a member of an ensemble may take to start and serve: its JVM starts, then
/// the ensemble elects a leader (a standalone server has [`READY_TIMEOUT`]).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How the error of a server that runs but does not serve in time begins.
const NOT_SERVING: &str = "ZooKeeper did not serve within";

/// One ZooKeeper server process (standalone, or a member of an ensemble).
pub struct ZkServer {
    port: u16,
    dir: PathBuf,
    /// The members' `server.N=` lines (empty when standalone).
    peers: Vec<String>,
    child: Option<Child>,
    spawned: u32,
    /// A standalone server's own directory (an ensemble keeps its members').
    _owned: Option<TempDir>,
    extra: ZkExtras,
}

/// What a standalone server of a test may run with beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct ZkExtras {
    /// `extendedTypesEnabled=true`: the server keeps TTL nodes (and removes each once
    /// its TTL passed without a write), checking its TTL and container nodes every
    /// 100 ms instead of every minute.
    pub ttl_nodes: bool,
    /// The server's wall clock (libfaketime; its session timeouts are on the monotonic
    /// clock, left alone): a TTL node's age is the wall time since its last write.
    pub clock: Option<Vec<(String, String)>>,
}

impl ZkServer {
    /// Starts a standalone server and waits until it serves.
    pub fn start() -> ZkServer {
        Self::start_with(ZkExtras::default())
    }

    /// Starts a standalone server with `extra` and waits until it serves.
    pub fn start_with(extra: ZkExtras) -> ZkServer {
        serial::side_by_side();
        let dir = tempdir();
        let mut last_err = String::new();
        // A free port can be taken by someone else before the server binds it.
        for _ in 0..5 {
            let mut server = ZkServer::new(dir.path(), free_port(), Vec::new(), 0);
            server.extra = extra.clone();
            match server.spawn().and_then(|()| server.wait_serving()) {
                Ok(()) => {
                    server._owned = Some(dir);
                    return server;
                }
                // Hung, not exited: another try would only double the wait.
                Err(e) if e.starts_with(NOT_SERVING) => panic!("could not start ZooKeeper: {e}"),
                Err(e) => last_err = e,
            }
        }
        panic!("could not start ZooKeeper: {last_err}");
    }

    fn new(parent: &Path, port: u16, peers: Vec<String>, id: usize) -> ZkServer {
        let dir = parent.join(format!("zk{id}"));
        fs::create_dir_all(dir.join("data")).expect("create the ZooKeeper data dir");
        if !peers.is_empty() {
            fs::write(dir.join("data/myid"), format!("{id}\n")).expect("write myid");
        }
        ZkServer {
            port,
            dir,
            peers,
            child: None,
            spawned: 0,
            _owned: None,
            extra: ZkExtras::default(),
        }
    }

    fn config(&self) -> String {
        let mut cfg = format!(
            "tickTime=200\ninitLimit=20\nsyncLimit=5\ndataDir={}\nclientPort={}\n\
             clientPortAddress=127.0.0.1\nminSessionTimeout=1000\nmaxSessionTimeout=60000\n\
             4lw.commands.whitelist=*\nadmin.enableServer=false\n",
            self.dir.join("data").display(),
            self.port
        );
        for peer in &self.peers {
            cfg.push_str(peer);
            cfg.push('\n');
        }
        if self.extra.ttl_nodes {
            // Set as the system property zookeeper.extendedTypesEnabled.
            cfg.push_str("extendedTypesEnabled=true\n");
        }
        cfg
    }

    fn spawn(&mut self) -> Result<(), String> {
        if !Path::new(JAR).exists() {
            panic!(
                "ZooKeeper is not installed ({JAR} is missing): apt-get install zookeeper \
                 (Debian's package), or run scripts/test, which installs it"
            );
        }
        self.spawned += 1;
        let cfg = self.dir.join("zoo.cfg");
        fs::write(&cfg, self.config()).map_err(|e| e.to_string())?;
        let log = fs::File::create(self.dir.join(format!("zk-{}.log", self.spawned)))
            .map_err(|e| e.to_string())?;
        let mut java = Command::new("java");
        if self.extra.ttl_nodes {
            java.arg("-Dznode.container.checkIntervalMs=100");
        }
        if let Some(clock) = &self.extra.clock {
            java.envs(clock.iter().map(|(k, v)| (k, v)));
        }
        let child = java
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .args([
                "-cp",
                JAR,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run java (apt-get install zookeeper): {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the server answers `srvr` with a mode (it serves clients).
    fn wait_serving(&mut self) -> Result<(), String> {
        let start = Instant::now();
        let timeout = match self.peers.is_empty() {
            true => READY_TIMEOUT,
            false => START_TIMEOUT,
        };
        loop {
            if self.mode().is_some() {
                return Ok(());
            }
            let path = self.dir.join(format!("zk-{}.log", self.spawned));
            let log = || last_lines(&path, 15);
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!(
                    "ZooKeeper exited with {status}; its log ends:\n{}",
                    log()
                ));
            }
            if start.elapsed() > timeout {
                self.kill();
                return Err(format!(
                    "{NOT_SERVING} {timeout:?}; its log ends:\n{}",
                    log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `zk://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// The answer to four-letter command `cmd` (empty if the server does not answer).
    pub fn four(&self, cmd: &str) -> String {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return String::new();
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut out = String::new();
        if s.write_all(cmd.as_bytes()).is_ok() {
            let _ = s.read_to_string(&mut out);
        }
        out
    }

    /// `standalone`, `leader` or `follower`, while it serves clients.
    pub fn mode(&self) -> Option<String> {
        let srvr = self.four("srvr");
        let mode = srvr.lines().find_map(|l| l.strip_prefix("Mode: "))?;
        Some(mode.trim().to_owned())
    }

    /// The server's pid (panics when it is not running).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("ZooKeeper is not running").id() as i32
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the killed server again on the same port, with its data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn()
            .and_then(|()| self.wait_serving())
            .unwrap_or_else(|e| panic!("could not restart ZooKeeper on port {}: {e}", self.port));
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal_pid(self.pid(), Signal::SIGSTOP);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn resume(&self) {
        signal_pid(self.pid(), Signal::SIGCONT);
    }

    /// The ephemeral nodes the server knows of, by session (`dump`; a standalone
    /// server or the leader).
    pub fn ephemerals(&self) -> Vec<String> {
        let dump = self.four("dump");
        dump.lines()
            .map(str::trim)
            .filter(|l| l.starts_with('/'))
            .map(str::to_owned)
            .collect()
    }

    /// Runs Debian's `zkCli.sh` against this server (`create /path`, ...); panics if
    /// it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("/usr/share/zookeeper/bin/zkCli.sh")
            .arg("-server")
            .arg(format!("127.0.0.1:{}", self.port))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run zkCli.sh (apt-get install zookeeper)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "zkCli.sh {args:?} failed: {text}");
        text
    }

    /// How many nodes the server holds (`srvr`), its own under `/zookeeper` included.
    pub fn node_count(&self) -> usize {
        let srvr = self.four("srvr");
        let count = srvr.lines().find_map(|l| l.strip_prefix("Node count: "));
        count
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no node count in srvr: {srvr}"))
    }

    /// The transactions the server logged, one entry each (`session 0x... cxid ...
    /// zxid ... TYPE ...`, as ZooKeeper's `TxnLogToolkit` prints them, data included:
    /// a multi-request is one entry listing its operations), oldest first.
    pub fn txns(&self) -> Vec<String> {
        let logs = self.dir.join("data/version-2");
        let mut files: Vec<PathBuf> = fs::read_dir(&logs)
            .expect("the server's log directory")
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("log."))
            })
            .collect();
        files.sort();
        let mut txns: Vec<String> = Vec::new();
        for file in files {
            let out = Command::new("java")
                .args([
                    "-cp",
                    JAR,
                    "org.apache.zookeeper.server.persistence.TxnLogToolkit",
                ])
                .arg(&file)
                .stdin(Stdio::null())
                .output()
                .expect("run ZooKeeper's TxnLogToolkit");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let body = text
                .lines()
                .filter(|l| !l.starts_with("ZooKeeper Transactional") && !l.starts_with("EOF "));
            for line in body {
                match (line.contains(" session 0x"), txns.last_mut()) {
                    (true, _) => txns.push(line.to_owned()),
                    // A value or an ACL list that holds a line break.
                    (false, Some(last)) => last.push_str(line),
                    (false, None) => {}
                }
            }
        }
        txns
    }

    /// The paths each session watches (`wchc`), one list per session that watches any.
    pub fn watches(&self) -> Vec<Vec<String>> {
        let mut sessions: Vec<Vec<String>> = Vec::new();
        for line in self.four("wchc").lines() {
            let line = line.trim();
            if line.starts_with("0x") {
                sessions.push(Vec::new());
            } else if let (Some(paths), true) = (sessions.last_mut(), line.starts_with('/')) {
                paths.push(line.to_owned());
            }
        }
        sessions
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Three members of one ensemble on loopback.
pub struct ZkEnsemble {
    servers: Vec<ZkServer>,
    /// The members' directories, removed after the members are gone (fields drop in order).
    _dir: TempDir,
}

impl ZkEnsemble {
    /// Starts three members and waits until each serves (a leader was elected).
    pub fn start() -> ZkEnsemble {
        serial::side_by_side();
        let dir = tempdir();
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!("server.{}=127.0.0.1:{quorum}:{election}", i + 1)
            })
            .collect();
        let mut servers: Vec<ZkServer> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, _, _))| ZkServer::new(dir.path(), *client, peers.clone(), i + 1))
            .collect();
        for s in &mut servers {
            s.spawn()
                .unwrap_or_else(|e| panic!("could not start a member: {e}"));
        }
        for s in &mut servers {
            s.wait_serving()
                .unwrap_or_else(|e| panic!("a member did not serve: {e}"));
        }
        ZkEnsemble { servers, _dir: dir }
    }

    /// `zk://h:p,h:p,h:p`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// The member that leads now (waits for an election to end).
    pub fn leader(&mut self) -> &mut ZkServer {
        let start = Instant::now();
        loop {
            if let Some(i) = self
                .servers
                .iter()
                .position(|s| s.child.is_some() && s.mode().as_deref() == Some("leader"))
            {
                return &mut self.servers[i];
            }
            assert!(start.elapsed() < WAIT, "no member leads");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("lockrun-zk-")
        .tempdir()
        .expect("create the ZooKeeper dir")
}
