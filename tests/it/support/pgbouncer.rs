//! PgBouncer for lockrun's integration tests: Debian's `pgbouncer` on a free 127.0.0.1
//! port in front of a private PostgreSQL cluster of the test's own ([`PrivatePg`]),
//! with its configuration and log in a temporary directory, killed on drop. One
//! PgBouncer serves the cluster's database `postgres` under three names, one per pool
//! mode ([`Pool`]), so that a test can reach it through each.
//!
//! Authentication is `trust` (the cluster's too), with an `auth_file` naming the user
//! `postgres`. As root it runs as the `postgres` user, like the clusters: PgBouncer
//! refuses to run as root.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::pg::{as_server_user, server_user};
use super::{free_port, serial, Db, PrivatePg, WAIT};

/// A PgBouncer pool mode, and the database name that reaches the cluster through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pool {
    /// `pool_mode = transaction`: a server connection per transaction.
    Transaction,
    /// `pool_mode = session`: a server connection per client connection.
    Session,
    /// `pool_mode = statement`: a server connection per statement; no transactions.
    Statement,
}

impl Pool {
    /// The database name of this pool (PgBouncer's alias of `postgres`).
    pub fn database(self) -> &'static str {
        match self {
            Pool::Transaction => "tx",
            Pool::Session => "session",
            Pool::Statement => "statement",
        }
    }

    fn mode(self) -> &'static str {
        match self {
            Pool::Transaction => "transaction",
            Pool::Session => "session",
            Pool::Statement => "statement",
        }
    }
}

/// PgBouncer in front of a private cluster; both killed on drop.
pub struct PgBouncer {
    dir: TempDir,
    port: u16,
    child: Option<Child>,
    pg: PrivatePg,
}

impl PgBouncer {
    /// Starts a private cluster and PgBouncer in front of it.
    pub fn start() -> PgBouncer {
        serial::side_by_side();
        let pg = PrivatePg::start();
        let dir = tempfile::Builder::new()
            .prefix("lockrun-pgbouncer-")
            .tempdir()
            .expect("create PgBouncer's directory");
        let mut bouncer = PgBouncer {
            dir,
            port: 0,
            child: None,
            pg,
        };
        std::fs::write(bouncer.dir.path().join("users.txt"), "\"postgres\" \"\"\n")
            .expect("write the auth_file");
        if let Some((uid, gid)) = server_user() {
            for p in [bouncer.dir.path().to_owned(), bouncer.path("users.txt")] {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).expect("chown");
            }
        }
        for _ in 0..10 {
            bouncer.port = free_port();
            if bouncer.spawn() {
                return bouncer;
            }
        }
        panic!("could not start PgBouncer: {}", bouncer.log());
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the configuration for `self.port` and starts PgBouncer; true once it
    /// accepts connections, false if it exits first; panics if it does not answer.
    fn spawn(&mut self) -> bool {
        let databases: String = [Pool::Transaction, Pool::Session, Pool::Statement]
            .iter()
            .map(|p| {
                format!(
                    "{} = host=127.0.0.1 port={} dbname=postgres pool_mode={}\n",
                    p.database(),
                    self.pg.port(),
                    p.mode()
                )
            })
            .collect();
        let config = format!(
            "[databases]\n{databases}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n\
             auth_file = {users}\nlogfile = {log}\nmax_client_conn = 200\n\
             default_pool_size = 10\n",
            port = self.port,
            users = self.path("users.txt").display(),
            log = self.path("pgbouncer.log").display(),
        );
        let ini = self.path("pgbouncer.ini");
        std::fs::write(&ini, config).expect("write pgbouncer.ini");
        // Debian puts it in /usr/sbin, which a user's PATH may lack.
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("pgbouncer");
        let mut cmd = Command::new(program);
        cmd.arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        as_server_user(&mut cmd, server_user());
        let mut child = cmd
            .spawn()
            .expect("spawn pgbouncer: install Debian's package `pgbouncer`");
        let start = Instant::now();
        while start.elapsed() < WAIT {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if Db::try_connect(&self.url(Pool::Transaction)).is_ok() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        // It ran but never answered: another port would not help.
        panic!(
            "PgBouncer on port {} did not answer within {WAIT:?}; its log ends:\n{}",
            self.port,
            super::ready::last_lines(&self.path("pgbouncer.log"), 15)
        );
    }

    /// The URL of the cluster's database through the pool `pool`.
    pub fn url(&self, pool: Pool) -> String {
        self.url_via(self.port, pool)
    }

    /// The URL of the cluster's database through the pool `pool`, at port `via` (a
    /// proxy in front of PgBouncer).
    pub fn url_via(&self, via: u16, pool: Pool) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{via}/{}?sslmode=disable",
            pool.database()
        )
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster behind it (its direct URL, and faults of the server itself).
    pub fn pg(&self) -> &PrivatePg {
        &self.pg
    }

    /// The cluster behind it, to kill and restart.
    pub fn pg_mut(&mut self) -> &mut PrivatePg {
        &mut self.pg
    }

    /// What PgBouncer logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("pgbouncer.log")).unwrap_or_default()
    }

    /// The lines of PgBouncer's log that say something went wrong: a warning, an
    /// error, or a packet from a server connection no client was linked to (a
    /// notification for a LISTEN left behind on a pooled connection).
    pub fn trouble(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| {
                [" WARNING ", " ERROR ", " FATAL ", "not linked"]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .map(str::to_owned)
            .collect()
    }

    /// Panics with the lines of [`PgBouncer::trouble`], if any.
    pub fn assert_clean_log(&self) {
        let trouble = self.trouble();
        assert!(
            trouble.is_empty(),
            "PgBouncer logged trouble:\n{}",
            trouble.join("\n")
        );
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}
