//! The MySQL and MariaDB backend (`mysql://`, `mariadb://`): a lease row per lock, and
//! per slot of a semaphore (`--slots N`), in an InnoDB table of lockrun's own.
//!
//! Table `T` (the URL's `table`, `lockrun_locks` by default, created when missing)
//! holds a row per lock key `PREFIX{NAME}` (the name's row: slot 0's lease and the
//! last run's record), `PREFIX{NAME}#i` for slot `i` of a
//! semaphore, `PREFIX{NAME}#w:ID` for each waiter's place in the queue, and the
//! counter's row, key `''` (no lock's key is empty). Rows are never deleted but the
//! queue's: release and `release --force` mark a lease free (empty token, expired),
//! so that the name's row orders every step of the name.
//!
//! Every step that changes a name is one transaction (READ COMMITTED, so no gap locks)
//! that first takes the name's row lock (`INSERT ... ON DUPLICATE KEY UPDATE` of the
//! name's row, which makes it if missing and locks it exclusively either way), then
//! reads every row of the name (`SELECT ... FOR UPDATE`, with the database's clock),
//! decides in Rust what to write ([`sql::Name`]) and writes it: the steps of one name
//! run one at a time, each seeing every step committed before it. A plain lock's
//! renewal is a single `UPDATE` whose `WHERE` checks the token and the expiry.
//!
//! - **Expiry** is judged by the database's clock: `NOW(3)` of each statement, in UTC
//!   (`sql::NOW_MS`), never later than the real time of the check; a lease is written
//!   as `NOW_MS + ttl` by the statement that takes or extends it, so it never ends
//!   before lockrun's own deadline, which starts before the request is sent.
//! - **Fencing tokens** come from the counter's row, incremented in the acquiring
//!   transaction (`LAST_INSERT_ID(fence + 1)`) while it holds the name's row lock, and
//!   committed with it: durable as InnoDB's commit is (`innodb_flush_log_at_trx_commit
//!   = 1`, the default), larger than every token committed before, whatever the name.
//! - **Semaphores**: each holder's row keeps the N it was taken with (`slots`). Every
//!   acquisition, plain or not, reads every slot's row of the name, refuses a live
//!   holder of another N (`backend::slots_conflict`), and takes the lowest free slot:
//!   a plain lock sees a semaphore held in any slot.
//! - **Waiters** queue first come first served in rows of their own: a ticket from
//!   the counter when they first find the lock busy, kept alive for
//!   [`WAITER_ALIVE`] by each try. A free slot goes to a caller only when fewer live
//!   waiters are before it than slots are free. MySQL has no notifications: the
//!   holder of a slot holds a named lock (`GET_LOCK`) on its session, which its
//!   release (closing the session) or its crash lets go; a waiter blocks on it, and
//!   asks again when it is let go (`wake.rs`). The named lock only wakes: the rows
//!   decide. Found free (no holder's session holds it), the waiter polls: the first of
//!   the queue every [`crate::backend::MIN_WAIT_SLICE`], the others more slowly the
//!   further back they are (`requests::poll_slice`).
//! - **Run records**: the release's transaction writes the run (JSON, with the last
//!   success) on the name's row, kept 7 days.
//!
//! TLS follows the `mysql` client's `ssl-mode` (`target/tls.rs`). Each session sets
//! `time_zone = '+00:00'`, READ COMMITTED and
//! `innodb_lock_wait_timeout = 5`. A deadlock or lock wait timeout is tried again, up
//! to three times. The connection lives in a [`crate::backend::conn::Slot`]: made
//! lazily, dropped after any error or abandoned call.
//!
//! Files: `target.rs` (the URL; `target/tls.rs`, TLS), `sql.rs` (the statements, the reading of a name's
//! rows), `requests.rs` (the lock's requests), `wake.rs` (waking waiters), `errors.rs`
//! (error lines).

mod errors;
mod requests;
mod sql;
mod target;
mod wake;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DriverError, OptsBuilder, SslOpts, Transaction, TxOpts};

use crate::backend::conn::{Connection, InUse, Slot};
use crate::backend::url::BackendConfig;
use crate::backend::BackendError;
use sql::Sql;
pub use target::{MysqlTarget, SslMode, KIND};

/// How long a waiter's place in the queue lasts after each try: three of its longest
/// sleeps between two tries ([`crate::backend::MAX_WAIT_SLICE`]).
pub(super) const WAITER_ALIVE: Duration =
    Duration::from_secs(3 * crate::backend::MAX_WAIT_SLICE.as_secs());

/// The longest a polite close may take before the connection is just dropped.
const CLOSE_TIME: Duration = Duration::from_millis(200);

/// How often a transaction that met a deadlock or a lock wait timeout is tried.
const TRIES: u32 = 3;

/// A lock backend on MySQL or MariaDB.
pub struct MysqlBackend {
    target: Box<MysqlTarget>,
    display: String,
    key_prefix: String,
    /// `--slots`: 1 is a plain lock.
    slots: u32,
    sql: Box<Sql>,
    /// This run's id in the waiters' queue (random hex), or empty when it will not wait.
    waiter: String,
    /// How many live waiters were ahead of this one at its last try.
    ahead: std::sync::atomic::AtomicU64,
    slot: Slot<MyConn>,
    /// The slot our last acquisition took, with its token.
    held: Mutex<Option<(String, u32)>>,
}

/// A connection. mysql_async's calls take it mutably: one call at a time, the others
/// wait their turn (an abandoned call drops its turn and the connection with it).
struct MyConn {
    conn: tokio::sync::Mutex<Conn>,
}

impl Connection for MyConn {}

/// Why a transaction's body failed: the database, or the lock's own answer (nothing
/// is committed either way).
enum Fail {
    Db(mysql_async::Error),
    Lock(BackendError),
}

impl From<mysql_async::Error> for Fail {
    fn from(e: mysql_async::Error) -> Fail {
        Fail::Db(e)
    }
}

/// The server's error code of `e`, if it is one.
fn code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// No such table.
const NO_SUCH_TABLE: u16 = 1146;
/// A deadlock (the transaction was rolled back) or a lock wait timeout.
const TRY_AGAIN: [u16; 2] = [1213, 1205];

impl MysqlBackend {
    /// A backend for `target`; `waiting` says the caller may wait for a busy lock.
    pub fn new(target: MysqlTarget, config: &BackendConfig, waiting: bool) -> MysqlBackend {
        MysqlBackend {
            sql: Box::new(Sql::new(&target.table)),
            target: Box::new(target),
            display: config.display.clone(),
            key_prefix: config.key_prefix.clone(),
            slots: config.slots,
            waiter: match waiting {
                true => format!("{:016x}", crate::token::random_u64()),
                false => String::new(),
            },
            ahead: Default::default(),
            slot: Slot::default(),
            held: Mutex::new(None),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<(String, u32)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects (with TLS as `ssl-mode` says) and sets the session up.
    async fn connect(&self) -> Result<MyConn, BackendError> {
        let tls = &self.target.tls;
        let conn = match Conn::new(self.opts(tls.ssl_opts())).await {
            // PREFERRED: a server without TLS is spoken to in plain text.
            Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer))
                if tls.mode == SslMode::Preferred =>
            {
                Conn::new(self.opts(None)).await
            }
            // The chain held, the name did not, and only the chain is to be checked:
            // again, by a name the certificate holds.
            Err(e) if !tls.checks_name() => match target::presented_name(&e) {
                Some(name) => {
                    let opts = tls
                        .ssl_opts()
                        .map(|o| o.with_danger_tls_hostname_override(Some(name)));
                    Conn::new(self.opts(opts)).await
                }
                None => Err(e),
            },
            made => made,
        };
        let conn = conn.map_err(|e| errors::describe(&e, self))?;
        Ok(MyConn {
            conn: tokio::sync::Mutex::new(conn),
        })
    }

    /// The connection options, with `tls`.
    fn opts(&self, tls: Option<SslOpts>) -> OptsBuilder {
        let t = &self.target;
        OptsBuilder::default()
            .ip_or_hostname(t.host.clone())
            .tcp_port(t.port)
            .user(Some(t.user.clone()))
            .pass(t.password.clone())
            .db_name(Some(t.database.clone()))
            .prefer_socket(false)
            .client_found_rows(true)
            .ssl_opts(tls)
            .init(vec![
                "SET SESSION time_zone = '+00:00', SESSION innodb_lock_wait_timeout = 5",
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ])
    }

    /// Closes the connection politely (COM_QUIT), so that the server logs no "Aborted
    /// connection" for it. Called after a run's last request; a later call would
    /// simply connect again.
    async fn close(&self) {
        let Some(conn) = self.slot.take() else {
            return;
        };
        // Still in use by an abandoned call: it goes with that call.
        if let Ok(c) = std::sync::Arc::try_unwrap(conn) {
            let conn = c.conn.into_inner();
            let _ = tokio::time::timeout(CLOSE_TIME, conn.disconnect()).await;
        }
    }

    async fn conn(&self) -> Result<InUse<'_, MyConn>, BackendError> {
        self.slot.get(|_| self.connect()).await
    }

    /// Runs `body` in a transaction, committed if it answers `Ok`, rolled back
    /// otherwise. A missing table is made (then the body runs again) unless
    /// `if_missing` gives the answer; a deadlock or lock wait timeout is tried again.
    async fn transaction<T>(
        &self,
        if_missing: impl Fn() -> Option<T>,
        mut body: impl AsyncFnMut(&mut Transaction<'_>) -> Result<T, Fail>,
    ) -> Result<T, BackendError> {
        let (mut created, mut tries) = (false, 0);
        loop {
            let c = self.conn().await?;
            let result = {
                let mut conn = c.conn.lock().await;
                run_in_transaction(&mut conn, &mut body).await
            };
            match result {
                Ok(v) => {
                    c.keep();
                    return Ok(v);
                }
                Err(Fail::Lock(e)) => {
                    c.keep();
                    return Err(e);
                }
                Err(Fail::Db(e)) if code(&e) == Some(NO_SUCH_TABLE) && !created => {
                    if let Some(v) = if_missing() {
                        c.keep();
                        return Ok(v);
                    }
                    let made = self.create_table(&c).await;
                    c.settle(made)?;
                    created = true;
                }
                Err(Fail::Db(e)) if code(&e).is_some_and(|c| TRY_AGAIN.contains(&c)) => {
                    tries += 1;
                    if tries >= TRIES {
                        return c.settle(Err(errors::describe(&e, self)));
                    }
                    c.keep();
                }
                Err(Fail::Db(e)) => return c.settle(Err(errors::describe(&e, self))),
            }
        }
    }

    async fn create_table(&self, c: &MyConn) -> Result<(), BackendError> {
        let mut conn = c.conn.lock().await;
        for statement in &self.sql.setup {
            conn.query_drop(statement)
                .await
                .map_err(|e| errors::describe(&e, self))?;
        }
        Ok(())
    }

    fn key(&self, name: &str) -> String {
        format!("{}{{{name}}}", self.key_prefix)
    }
}

/// Runs `body` in a transaction of `conn`'s: commits on `Ok`, rolls back otherwise.
async fn run_in_transaction<T>(
    conn: &mut Conn,
    body: &mut impl AsyncFnMut(&mut Transaction<'_>) -> Result<T, Fail>,
) -> Result<T, Fail> {
    let mut tx = conn.start_transaction(TxOpts::default()).await?;
    match body(&mut tx).await {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}
