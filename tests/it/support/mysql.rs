//! MariaDB for lockrun's integration tests: a private server on a free port
//! ([`PrivateMysql`], never the machine's server on 3306) that a test may kill,
//! restart and freeze, with a `lockrun` database made for it. The test's own queries
//! go through mysql_async on a small runtime ([`MyDb`]).
//!
//! It needs Debian's `mariadb-server` (`mariadb-install-db`, `mariadbd`); as root the
//! server runs as root (`--user=root`), which mariadbd allows when told.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::ready::{last_lines, wait_ready, NotReady};
use super::{free_port, serial, wait_until, WAIT};

/// A connection for the test's own queries.
pub struct MyDb {
    rt: tokio::runtime::Runtime,
    conn: std::cell::RefCell<mysql_async::Conn>,
}

impl MyDb {
    /// Connects to the server on `port` as `user` (no password) to `db`, or says why not.
    pub fn try_connect(port: u16, user: &str, db: Option<&str>) -> Result<MyDb, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let opts = mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(port)
            .user(Some(user))
            .db_name(db)
            .prefer_socket(false);
        let conn = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), mysql_async::Conn::new(opts)).await
            })
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(MyDb {
            rt,
            conn: std::cell::RefCell::new(conn),
        })
    }

    /// Runs `sql` (one statement); panics on error.
    pub fn exec(&self, sql: &str) {
        let mut conn = self.conn.borrow_mut();
        self.rt
            .block_on(conn.query_drop(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of the first row of `sql`, as text, if any.
    pub fn value(&self, sql: &str) -> Option<String> {
        let mut conn = self.conn.borrow_mut();
        let row: Option<mysql_async::Row> = self
            .rt
            .block_on(conn.query_first(sql))
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        row.and_then(|mut r| r.take::<Option<String>, _>(0).flatten())
    }
}

/// A private MariaDB server of this test's own on a free 127.0.0.1 port, killed on drop.
pub struct PrivateMysql {
    dir: TempDir,
    port: u16,
    child: Option<Child>,
    /// Server options besides the usual ones (TLS files).
    extra: Vec<String>,
}

impl PrivateMysql {
    /// Initialises a data directory, starts the server and makes database `lockrun`.
    /// Without TLS: MariaDB 11.4 on (Debian 13's 11.8) serves TLS with a certificate
    /// of its own unless told not to.
    pub fn start() -> PrivateMysql {
        PrivateMysql::start_with(&["--skip-ssl".to_owned()])
    }

    /// [`PrivateMysql::start`] serving TLS with certificate `cert` and key `key` too.
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> PrivateMysql {
        PrivateMysql::start_with(&[
            format!("--ssl-cert={}", cert.display()),
            format!("--ssl-key={}", key.display()),
        ])
    }

    /// [`PrivateMysql::start_tls`] that also checks client certificates against `ca`.
    pub fn start_tls_clients(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> PrivateMysql {
        PrivateMysql::start_with(&[
            format!("--ssl-cert={}", cert.display()),
            format!("--ssl-key={}", key.display()),
            format!("--ssl-ca={}", ca.display()),
        ])
    }

    /// [`PrivateMysql::start`] with server options `extra`.
    fn start_with(extra: &[String]) -> PrivateMysql {
        serial::side_by_side();
        let dir = tempfile::Builder::new()
            .prefix("lockrun-mysql-")
            .tempdir()
            .expect("create server dir");
        let out = Command::new("cp")
            .arg("-a")
            .arg(template().join("data"))
            .arg(dir.path())
            .output()
            .expect("run cp");
        assert!(out.status.success(), "cp -a of the template failed");
        std::fs::create_dir(dir.path().join("tmp")).expect("create tmpdir");
        let mut server = PrivateMysql {
            dir,
            port: 0,
            child: None,
            extra: extra.to_vec(),
        };
        for _ in 0..10 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => {
                    server.db("mysql").exec("CREATE DATABASE lockrun");
                    return server;
                }
                Err(NotReady::Exited(_)) => continue,
                Err(NotReady::Silent(m)) => panic!("{m}"),
            }
        }
        panic!(
            "could not start a private MariaDB: {}",
            last_lines(&server.log_path(), 15)
        );
    }

    /// Starts the server on `self.port`; ready once it accepts a connection.
    fn spawn(&mut self) -> Result<(), NotReady> {
        let d = self.dir.path();
        let mut child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", self.log_path().display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--port={}", self.port))
            .args(["--bind-address=127.0.0.1", "--skip-name-resolve"])
            .args([
                "--innodb-buffer-pool-size=16M",
                "--max-connections=60",
                LOG_FILE_SIZE,
            ])
            .args(user_arg())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn mariadbd: install Debian's package `mariadb-server`");
        let port = self.port;
        let ready = wait_ready(
            "mariadbd",
            &mut child,
            &self.log_path(),
            Duration::from_millis(50),
            || MyDb::try_connect(port, "root", None).is_ok(),
        );
        if ready.is_ok() {
            self.child = Some(child);
        }
        ready
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// A connection as root to database `db`.
    pub fn db(&self, db: &str) -> MyDb {
        MyDb::try_connect(self.port, "root", Some(db))
            .unwrap_or_else(|e| panic!("cannot connect to the test MariaDB: {e}"))
    }

    /// `mysql://root@127.0.0.1:PORT/lockrun?ssl-mode=DISABLED`
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// The URL of this server's `lockrun` database as root, through port `via`.
    pub fn url_via(&self, via: u16) -> String {
        format!("mysql://root@127.0.0.1:{via}/lockrun?ssl-mode=DISABLED")
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn signal(&self, sig: Signal) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// SIGKILLs the server and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open, unanswered.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP);
    }

    /// Thaws a paused server.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Starts the killed server again on the same port, with its data (InnoDB recovers
    /// what was committed).
    pub fn restart(&mut self) {
        self.kill();
        wait_until(
            "the old server's port is free and the new one up",
            WAIT * 2,
            || match self.spawn() {
                Ok(()) => true,
                Err(NotReady::Exited(_)) => false,
                Err(NotReady::Silent(m)) => panic!("{m}"),
            },
        );
    }
}

impl Drop for PrivateMysql {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A data directory made by `mariadb-install-db` (root may log in from 127.0.0.1
/// without a password; no test database), which each server copies: kept under
/// cargo's `CARGO_TARGET_TMPDIR`, one per version of the server, and made once
/// (in a directory of its own, then renamed into place, so that test processes side
/// by side never see half of one).
fn template() -> PathBuf {
    static TEMPLATE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TEMPLATE.get_or_init(make_template).clone()
}

fn make_template() -> PathBuf {
    let version = Command::new("mariadbd")
        .arg("--version")
        .output()
        .expect("run mariadbd: install Debian's package `mariadb-server`");
    let version = String::from_utf8_lossy(&version.stdout);
    let version: String = version
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let done = root.join(format!("mariadb-template-{version}"));
    if done.join("data/mysql").exists() {
        return done;
    }
    let dir = tempfile::Builder::new()
        .prefix("mariadb-template-")
        .tempdir_in(&root)
        .expect("create template dir");
    std::fs::create_dir(dir.path().join("tmp")).expect("create tmpdir");
    let out = Command::new("mariadb-install-db")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", dir.path().join("data").display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .arg(format!("--tmpdir={}", dir.path().join("tmp").display()))
        .arg(LOG_FILE_SIZE)
        .args(user_arg())
        .stdin(Stdio::null())
        .output()
        .expect("run mariadb-install-db: install Debian's package `mariadb-server`");
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test process may have won: its template is as good.
    let made = dir.keep();
    if std::fs::rename(&made, &done).is_err() {
        let _ = std::fs::remove_dir_all(&made);
    }
    done
}

/// A small redo log: each server copies the template's.
const LOG_FILE_SIZE: &str = "--innodb-log-file-size=8M";

/// `--user=root` when running as root (mariadbd refuses root unless told).
fn user_arg() -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self").map_or(1, |m| m.uid()) {
        0 => vec!["--user=root".to_owned()],
        _ => Vec::new(),
    }
}
