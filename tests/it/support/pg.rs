//! PostgreSQL for lockrun's integration tests: private clusters on free ports
//! ([`PrivatePg`], never the machine's server) that a test may kill, freeze, run on a fake
//! clock or serve over TLS, and a fresh lock table in one ([`Table`]). The test's own
//! queries go through tokio-postgres on a small runtime.
//!
//! A private cluster needs the server binaries (Debian's `postgresql`); as root it runs
//! as the `postgres` user, since PostgreSQL refuses to run as root.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::{free_port, lockrun, run, serial, wait_until, Finished, TlsFiles, WAIT};

/// A random lower-case suffix for names of tables and locks.
pub fn random_suffix() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// A connection for the test's own queries.
pub struct Db {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Db {
    /// Connects to `url`, or says why not.
    pub fn try_connect(url: &str) -> Result<Db, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let connect = async {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, tokio_postgres::Error>(client)
        };
        let client = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), connect).await })
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
        Ok(Db { rt, client })
    }

    /// Connects to `url` (panics if it cannot).
    pub fn connect(url: &str) -> Db {
        Db::try_connect(url).unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"))
    }

    /// Runs `sql` (one or more statements); panics on error.
    pub fn exec(&self, sql: &str) {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
    }

    /// The first column of each row of `sql`, as text (NULL as "").
    pub fn column(&self, sql: &str) -> Vec<String> {
        let messages = self
            .rt
            .block_on(self.client.simple_query(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e} {:?}", e.as_db_error()));
        messages
            .iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some(r.get(0).unwrap_or("").to_string())
                }
                _ => None,
            })
            .collect()
    }

    /// The first column of the first row of `sql`, if any.
    pub fn value(&self, sql: &str) -> Option<String> {
        self.column(sql).into_iter().next()
    }
}

/// A lock table of the test's own in the database at `url`, dropped (with its sequence)
/// when the test ends.
pub struct Table {
    /// The table's name, for `--pg-table`.
    pub name: String,
    /// The database's URL.
    pub url: String,
    /// The test's own connection.
    pub db: Db,
    /// The cluster the table lives in, when the table started it.
    pub server: Option<PrivatePg>,
}

impl Table {
    /// A fresh table name in a private cluster of its own (the table is not created:
    /// lockrun does).
    pub fn private() -> Table {
        PrivatePg::start().into_table()
    }

    /// A fresh table name in the database at `url`.
    pub fn on(url: &str) -> Table {
        Table {
            name: format!("lockrun_test_{}", random_suffix()),
            url: url.to_string(),
            db: Db::connect(url),
            server: None,
        }
    }

    /// `lockrun --url URL --pg-table TABLE OPTS... NAME -- COMMAND...`
    pub fn run(&self, name: &str, opts: &[&str], command: &[&str]) -> Command {
        let mut cmd = lockrun();
        cmd.args(["--url", &self.url, "--pg-table", &self.name])
            .args(opts)
            .arg(name)
            .arg("--")
            .args(command);
        cmd
    }

    /// `lockrun SUB --url URL --pg-table TABLE ARGS...` (SUB: status, release).
    pub fn admin(&self, sub: &str, args: &[&str]) -> Finished {
        let mut cmd = lockrun();
        cmd.arg(sub)
            .args(["--url", &self.url, "--pg-table", &self.name])
            .args(args);
        run(cmd)
    }

    /// `lockrun status --json` of `name`: its exit code and the parsed object.
    pub fn status_json(&self, name: &str) -> (Option<i32>, serde_json::Value) {
        self.status_json_with(name, &[])
    }

    /// [`Table::status_json`] with options (`--slots N`).
    pub fn status_json_with(&self, name: &str, opts: &[&str]) -> (Option<i32>, serde_json::Value) {
        let mut args = vec!["--json"];
        args.extend_from_slice(opts);
        args.push(name);
        let f = self.admin("status", &args);
        let v = serde_json::from_str(f.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "status --json printed no JSON object ({e}): stdout {:?}, stderr {:?}",
                f.stdout, f.stderr
            )
        });
        (f.code, v)
    }

    /// The stored row key of lock `name` (default key prefix): `lockrun:{NAME}`.
    pub fn key(name: &str) -> String {
        format!("lockrun:{{{name}}}")
    }

    /// Runs `sql` with `$T` replaced by the table's name and `$K` by the quoted key of
    /// `name`; returns the first column of the first row.
    pub fn sql(&self, name: &str, sql: &str) -> Option<String> {
        let sql = sql
            .replace("$T", &self.name)
            .replace("$K", &format!("'{}'", Table::key(name)));
        self.db.value(&sql)
    }

    /// True when lock `name` is held now, by the database's clock.
    pub fn held(&self, name: &str) -> bool {
        self.sql(
            name,
            "SELECT count(*) FROM $T WHERE name = $K AND expires_at > now()",
        )
        .as_deref()
            == Some("1")
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let sql = format!(
            "DROP TABLE IF EXISTS {0}; DROP SEQUENCE IF EXISTS {0}_fence",
            self.name
        );
        let _ = self.db.rt.block_on(self.db.client.batch_execute(&sql));
    }
}

/// The directory of the newest installed PostgreSQL server binaries.
fn server_bin() -> PathBuf {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries not found: install Debian's package `postgresql`")
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop()
        .expect("no /usr/lib/postgresql/*/bin/postgres: install Debian's package `postgresql`")
        .1
}

/// The uid and gid of user `postgres`, when running as root (PostgreSQL refuses root).
pub(super) fn server_user() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let euid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    if euid != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("running as root, and there is no user `postgres` to run a private cluster as");
    let f: Vec<&str> = line.split(':').collect();
    Some((f[2].parse().unwrap(), f[3].parse().unwrap()))
}

/// A private PostgreSQL cluster of this test's own on a free 127.0.0.1 port, killed (its
/// whole process group) on drop.
pub struct PrivatePg {
    dir: TempDir,
    port: u16,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl PrivatePg {
    /// Initialises a cluster (trust authentication) and starts it.
    pub fn start() -> PrivatePg {
        PrivatePg::start_with(&[], &[])
    }

    /// Like [`PrivatePg::start`], with extra environment for the server (say, a
    /// `FakeClock`'s) and extra `initdb` arguments.
    pub fn start_with(env: &[(String, String)], initdb_args: &[&str]) -> PrivatePg {
        PrivatePg::init(env, initdb_args).launch()
    }

    /// An initialised cluster, not started yet.
    fn init(env: &[(String, String)], initdb_args: &[&str]) -> PrivatePg {
        serial::side_by_side();
        let dir = tempfile::Builder::new()
            .prefix("lockrun-pg-")
            .tempdir()
            .expect("create cluster dir");
        let user = server_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let mut initdb = Command::new(server_bin().join("initdb"));
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ])
            .args(initdb_args)
            .stdin(Stdio::null());
        as_server_user(&mut initdb, user);
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PrivatePg {
            dir,
            port: 0,
            env: env.to_vec(),
            child: None,
        }
    }

    /// A cluster serving TLS (`ssl=on`) with the server certificate of `tls` (for
    /// 127.0.0.1, from its CA), besides plain connections.
    pub fn start_tls(tls: &TlsFiles) -> PrivatePg {
        let pg = PrivatePg::init(&[], &[]);
        pg.install("server.crt", &tls.path("server.pem"));
        pg.install("server.key", &tls.path("server.key"));
        pg.append_conf("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'");
        pg.launch()
    }

    /// A cluster serving TLS (`ssl=on`) with `cert` and `key`, asking clients for a
    /// certificate from `client_ca` (`ssl_ca_file`), with `hba` as its whole
    /// `pg_hba.conf` (which must let `postgres` in from 127.0.0.1 without TLS, for
    /// [`PrivatePg::url`]), and connections logged.
    pub fn start_ssl(cert: &Path, key: &Path, client_ca: &Path, hba: &str) -> PrivatePg {
        let pg = PrivatePg::init(&[], &[]);
        pg.install("server.crt", cert);
        pg.install("server.key", key);
        pg.install("client_ca.crt", client_ca);
        std::fs::write(pg.dir.path().join("data/pg_hba.conf"), hba).expect("write pg_hba.conf");
        pg.append_conf(
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'client_ca.crt'\nlog_connections = on",
        );
        pg.launch()
    }

    /// Serves `cert` and `key` from now on (a reload); returns once a new TLS session
    /// gets the certificate whose subject holds `cn` (asked with `openssl s_client`).
    pub fn swap_server_cert(&self, cert: &Path, key: &Path, cn: &str) {
        self.install("server.crt", cert);
        self.install("server.key", key);
        Db::connect(&self.url()).exec("SELECT pg_reload_conf()");
        wait_until("the server serves the new certificate", WAIT, || {
            let out = Command::new("openssl")
                .args(["s_client", "-starttls", "postgres", "-connect"])
                .arg(format!("127.0.0.1:{}", self.port))
                .stdin(Stdio::null())
                .output()
                .expect("run openssl s_client");
            String::from_utf8_lossy(&out.stdout).contains(cn)
        });
    }

    /// Turns TLS off (a reload); returns once a new session sees it.
    pub fn ssl_off(&self) {
        let db = Db::connect(&self.url());
        // Not in one string: ALTER SYSTEM refuses to run in a transaction block.
        db.exec("ALTER SYSTEM SET ssl = off");
        db.exec("SELECT pg_reload_conf()");
        wait_until("ssl is off", WAIT, || {
            Db::connect(&self.url()).value("SHOW ssl").as_deref() == Some("off")
        });
    }

    /// Copies `from` into the data directory as `name`, the server's own and 0600.
    fn install(&self, name: &str, from: &Path) {
        let dest = self.dir.path().join("data").join(name);
        std::fs::copy(from, &dest).expect("copy TLS file");
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).unwrap();
        if let Some((uid, gid)) = server_user() {
            std::os::unix::fs::chown(&dest, Some(uid), Some(gid)).expect("chown");
        }
    }

    /// Appends `lines` to postgresql.conf.
    fn append_conf(&self, lines: &str) {
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("data/postgresql.conf"))
            .expect("open postgresql.conf");
        writeln!(conf, "{lines}").expect("write postgresql.conf");
    }

    /// Starts the initialised cluster on a free port.
    fn launch(mut self) -> PrivatePg {
        for _ in 0..10 {
            self.port = free_port();
            if self.spawn() {
                return self;
            }
        }
        panic!("could not start a private PostgreSQL: {}", self.log());
    }

    /// Starts the server on `self.port`; true once it accepts connections, false if it
    /// exits first (its port was taken, say); panics if it does not answer.
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(server_bin().join("postgres"));
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=40"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log_path()).expect("log file"))
            .process_group(0);
        as_server_user(&mut cmd, server_user());
        let mut child = cmd.spawn().expect("spawn postgres");
        let start = Instant::now();
        while start.elapsed() < WAIT {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if Db::try_connect(&self.url()).is_ok() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        // It ran but never answered: another port would not help.
        panic!(
            "PostgreSQL on port {} did not answer within {WAIT:?}; its log ends:\n{}",
            self.port,
            super::ready::last_lines(&self.log_path(), 15)
        );
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable`
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// A fresh lock table in this cluster, which the table keeps (and stops with it).
    pub fn into_table(self) -> Table {
        let mut table = Table::on(&self.url());
        table.server = Some(self);
        table
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (its data is in `data/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster and every process it forked. Each backend is the leader of a
    /// process group of its own (PostgreSQL calls setsid in every child), so signalling
    /// the postmaster's group would miss them.
    fn processes(&self) -> Vec<Pid> {
        let Some(child) = &self.child else {
            return Vec::new();
        };
        let postmaster = child.id() as i32;
        let mut pids = vec![Pid::from_raw(postmaster)];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // Fields after the command name (which ends at the last ')'): state, ppid, ...
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(postmaster) {
                pids.push(Pid::from_raw(pid));
            }
        }
        pids
    }

    fn signal_all(&self, sig: Signal) {
        // The postmaster first, so it forks no one new meanwhile.
        for pid in self.processes() {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    }

    /// SIGKILLs the server and every backend at once, and reaps it.
    pub fn kill(&mut self) {
        self.signal_all(Signal::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// Freezes the server and its backends (SIGSTOP): connections stay open, unanswered.
    pub fn pause(&self) {
        self.signal_all(Signal::SIGSTOP);
    }

    /// Thaws a paused server.
    pub fn resume(&self) {
        self.signal_all(Signal::SIGCONT);
    }

    /// Starts the killed server again on the same port, with its data.
    pub fn restart(&mut self) {
        self.kill();
        wait_until("the old server's port is free", WAIT, || self.spawn());
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.resume();
        }
        self.kill();
    }
}

pub(super) fn as_server_user(cmd: &mut Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid)
            .gid(gid)
            .env("HOME", "/tmp")
            .env("USER", "postgres");
    }
}
