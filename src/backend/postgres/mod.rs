//! The PostgreSQL backend (`postgres://`, `postgresql://`): one lease row per lock.
//!
//! Table `T` (`--pg-table`, created with its sequence `T_fence` when missing) holds a row
//! per lock key `PREFIX + NAME`: the holder's `token`, `fence`, `host`, `pid`, `since` and
//! `expires_at`. Release and `release --force` do not delete the row: they mark it free
//! (empty token, expired), so that the row lock orders every acquisition of a name.
//!
//! **Rows of unused names** are deleted once their lease ended more than a day ago
//! (`sql::RETENTION`), a few at a time, by acquisitions of names that have no row (the
//! only statements that add one): the table holds about a day's worth of names. This
//! keeps the ordering: a held row is never deleted (its lease has not ended), and the
//! only token not taken under a row lock, the INSERT's `nextval` for a name without a
//! row, could come out below a token already handed out for that name only if its
//! statement drew it before that token was drawn and inserted after that token's row
//! was deleted, that is, a day after that lease ended: no statement of ours runs that
//! long (`statement_timeout` 10 s, `lock_timeout` 5 s; and one autocommit statement
//! never waits a day on another). Tokens come from the sequence, not from the row, so
//! they keep increasing once the row is gone.
//!
//! **Every row expires**: `expires_at` is `now()` plus a lease of at most a day
//! (`sql::MAX_LEASE`, lockrun's longest `--ttl`), checked before a statement is sent; a
//! statement that fails (an interval out of range) writes nothing.
//!
//! Every step is ONE autocommit statement, atomic on the server (see `sql.rs`):
//! - expiry is judged by the database's clock, `now()`: the start of the statement's own
//!   transaction. It is one value for the whole statement (so no check can disagree with
//!   another), it is never later than the real time of the check (so a lease is never
//!   judged expired early), and it is never earlier than our request's sending (so an
//!   expiry written as `now() + ttl` never ends before lockrun's local deadline);
//! - renew and release act only where the stored token is ours and still valid;
//! - the fencing token is `nextval` of the sequence, taken inside the acquiring write
//!   while it holds the row lock, so it is larger than every token committed before for
//!   that name, and durable with the commit (the session asks for
//!   `synchronous_commit = on`, and the sequence caches nothing).
//!
//! `--wait`ers LISTEN on a channel per lock (`lockrun_` + a hash of table and key); a
//! release NOTIFYs it in the same statement, so the wake-up is sent exactly when the
//! release commits. Wake-ups ride on the connection, which a spawned task drives.
//!
//! The connection lives in a [`crate::backend::conn::Slot`]: made lazily, dropped after
//! any error or abandoned call (the caller's timeout), made anew on the next call.
//!
//! Files: `target.rs` (the URL and `--pg-table`), `sql.rs` (the statements),
//! `errors.rs` (error lines), `tls.rs` (rustls for `sslmode`).

mod errors;
mod sql;
mod target;
mod tls;

use std::future::poll_fn;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection as PgConnection, NoTls, Row};

use crate::backend::conn::{self as slot, Connection, InUse, Slot, Wakeups};
use crate::backend::{wait_slice, Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::config::BackendConfig;
use sql::{channel, millis, Sql, SESSION};
pub use target::{PgArgs, PostgresTarget, KIND};

/// The longest a polite close may take before the connection is just dropped.
const CLOSE_TIME: Duration = Duration::from_millis(200);

/// A lock backend on PostgreSQL.
pub struct PostgresBackend {
    /// Boxed, as are the statements: the parsed configuration is large.
    target: Box<PostgresTarget>,
    display: String,
    key_prefix: String,
    sql: Box<Sql>,
    waiting: bool,
    slot: Slot<PgConn>,
}

/// A connection and what rides on it; replaced as a whole after any failure.
struct PgConn {
    client: Client,
    /// The task that drives the connection; aborting it closes the socket.
    driver: JoinHandle<()>,
    /// Wake-ups from NOTIFY (at most one pending: one is as good as many), once the
    /// connection LISTENs on the lock's channel.
    wakeups: Wakeups<mpsc::Receiver<()>>,
}

impl PgConn {
    fn wakeups(&self) -> &Wakeups<mpsc::Receiver<()>> {
        &self.wakeups
    }
}

impl Connection for PgConn {
    fn discard(&self) {
        self.driver.abort();
    }
}

type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// What a statement does when the table (or its sequence) does not exist yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// Create them and run the statement again (a lock is being taken or kept).
    Create,
    /// Answer no rows: nothing was ever locked (`status` and `release --force`
    /// create nothing).
    NoRows,
}

impl PostgresBackend {
    /// A backend for `target`; `waiting` says the caller may wait for a busy lock
    /// (`--wait`), so a busy answer subscribes to release notifications.
    pub fn new(target: PostgresTarget, config: &BackendConfig, waiting: bool) -> PostgresBackend {
        PostgresBackend {
            sql: Box::new(Sql::new(&target.table)),
            target: Box::new(target),
            display: config.display.clone(),
            key_prefix: config.key_prefix.clone(),
            waiting,
            slot: Slot::default(),
        }
    }

    /// Closes the connection politely: tokio-postgres sends Terminate (and, over TLS,
    /// close_notify) once the client is gone, so the server logs no "connection reset".
    /// Called after a run's last request; a later call would simply reconnect.
    async fn close(&self) {
        let Some(conn) = self.slot.take() else {
            return;
        };
        match std::sync::Arc::try_unwrap(conn) {
            Ok(PgConn { client, driver, .. }) => {
                drop(client);
                let abort = driver.abort_handle();
                if tokio::time::timeout(CLOSE_TIME, driver).await.is_err() {
                    abort.abort();
                }
            }
            // Still in use by an abandoned call: just close the socket.
            Err(shared) => shared.discard(),
        }
    }

    /// The connection for one call, made if needed.
    async fn conn(&self) -> Result<InUse<'_, PgConn>, BackendError> {
        self.slot.get(|_| self.connect()).await
    }

    /// Connects, starts the task that drives the socket, and sets up the session.
    async fn connect(&self) -> Result<PgConn, BackendError> {
        let mut config = self.target.config.clone();
        if config.get_application_name().is_none() {
            config.application_name("lockrun");
        }
        let (wake, wakeups) = mpsc::channel(1);
        let (client, driver) = if self.target.tls {
            let tls = tls::MakeRustls::encrypt_only().map_err(|e| {
                BackendError::Refused(format!("cannot set up TLS to {}: {e}", self.display))
            })?;
            let (client, conn) = config.connect(tls).await.map_err(|e| self.error(&e))?;
            (client, tokio::spawn(drive(conn, wake)))
        } else {
            let (client, conn) = config.connect(NoTls).await.map_err(|e| self.error(&e))?;
            (client, tokio::spawn(drive(conn, wake)))
        };
        let conn = PgConn {
            client,
            driver,
            wakeups: Wakeups::new(Some(wakeups)),
        };
        match conn.client.batch_execute(SESSION).await {
            Ok(()) => Ok(conn),
            Err(e) => {
                conn.discard();
                Err(self.error(&e))
            }
        }
    }

    /// Runs `sql` (one round trip, no prepared statement to go stale). A missing table
    /// or sequence is dealt with as `missing` says; any other failure, or the caller
    /// abandoning the call, drops the connection.
    async fn query(
        &self,
        sql: &str,
        params: &Params<'_>,
        missing: Missing,
    ) -> Result<Vec<Row>, BackendError> {
        let mut created = false;
        loop {
            let c = self.conn().await?;
            match c.client.query_typed(sql, params).await {
                Ok(rows) => {
                    c.keep();
                    return Ok(rows);
                }
                Err(e) if !created && e.code() == Some(&SqlState::UNDEFINED_TABLE) => {
                    if missing == Missing::NoRows {
                        c.keep();
                        return Ok(Vec::new());
                    }
                    let made = self.create_table(&c.client).await;
                    c.settle(made)?;
                    created = true;
                }
                Err(e) => return c.settle(Err(self.error(&e))),
            }
        }
    }

    /// Like [`PostgresBackend::query`], for a statement whose row count is the answer.
    async fn count(&self, sql: &str, params: &Params<'_>) -> Result<usize, BackendError> {
        Ok(self.query(sql, params, Missing::Create).await?.len())
    }

    async fn create_table(&self, client: &Client) -> Result<(), BackendError> {
        match client.batch_execute(&self.sql.setup).await {
            Ok(()) => Ok(()),
            // Someone created it between our check and ours, without the advisory lock
            // (an older or hand-made setup): it is there now.
            Err(e)
                if [SqlState::UNIQUE_VIOLATION, SqlState::DUPLICATE_TABLE]
                    .iter()
                    .any(|c| e.code() == Some(c)) =>
            {
                Ok(())
            }
            Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                Err(BackendError::Refused(format!(
                    "PostgreSQL at {} does not let this user create the lock table {} \
                     ({}): grant CREATE on its schema, or create it once as a user who may",
                    self.display,
                    self.target.table,
                    e.as_db_error().map_or("", |d| d.message())
                )))
            }
            Err(e) => Err(self.error(&e)),
        }
    }

    /// LISTENs on `name`'s channel, once per connection.
    async fn listen(&self, name: &str) -> Result<(), BackendError> {
        let c = self.conn().await?;
        if c.wakeups.is_subscribed() {
            c.keep();
            return Ok(());
        }
        let channel = channel(&self.target.table, &self.key(name));
        let reply = c.client.batch_execute(&format!("LISTEN {channel}")).await;
        if reply.is_ok() {
            c.wakeups.set_subscribed();
        }
        c.settle(reply.map_err(|e| self.error(&e)))
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.key_prefix)
    }

    fn channel(&self, name: &str) -> String {
        channel(&self.target.table, &self.key(name))
    }

    async fn try_acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let key = self.key(name);
        let pid = i64::from(req.pid);
        let ttl = millis(req.ttl)?;
        for _ in 0..3 {
            let rows = self
                .query(
                    &self.sql.acquire,
                    &[
                        (&key, Type::TEXT),
                        (&req.token, Type::TEXT),
                        (&req.host, Type::TEXT),
                        (&pid, Type::INT8),
                        (&ttl, Type::INT8),
                    ],
                    Missing::Create,
                )
                .await?;
            if let Some(row) = rows.first() {
                return match row.try_get::<_, bool>(0) {
                    // A sequence starts at 1: a token of 0 is not our table's.
                    Ok(true) => match self.number(row, 1)? {
                        0 => Err(self.unexpected()),
                        fencing_token => Ok(Acquire::Acquired {
                            fencing_token,
                            slot: 0,
                        }),
                    },
                    Ok(false) => Ok(Acquire::Busy(self.holder(row, 1)?)),
                    Err(_) => Err(self.unexpected()),
                };
            }
            // Taken by a transaction that committed after our statement's snapshot: its
            // row is not visible to the statement, but is to the next one.
            if let Some(holder) = self.inspect(name).await?.into_iter().next() {
                return Ok(Acquire::Busy(holder));
            }
        }
        Ok(Acquire::Busy(Holder::default()))
    }

    fn unexpected(&self) -> BackendError {
        BackendError::Refused(format!(
            "PostgreSQL at {} gave an unexpected answer: is {} a lockrun table?",
            self.display, self.target.table
        ))
    }

    fn number(&self, row: &Row, i: usize) -> Result<u64, BackendError> {
        let n: i64 = row.try_get(i).map_err(|_| self.unexpected())?;
        u64::try_from(n).map_err(|_| self.unexpected())
    }

    /// Parses `fence, host, pid, since_ms, ttl_ms` from column `at` on.
    fn holder(&self, row: &Row, at: usize) -> Result<Holder, BackendError> {
        Ok(Holder {
            fencing_token: self.number(row, at)?,
            host: row.try_get(at + 1).map_err(|_| self.unexpected())?,
            pid: u32::try_from(self.number(row, at + 2)?).unwrap_or(0),
            since_ms: self.number(row, at + 3)?,
            ttl_left: Duration::from_millis(self.number(row, at + 4)?),
            ..Holder::default()
        })
    }

    /// Translates a client error (see [`errors::describe`]).
    fn error(&self, e: &tokio_postgres::Error) -> BackendError {
        errors::describe(e, &self.display, &self.target.table)
    }
}

/// Drives connection `conn` (it does the socket I/O for every request) and passes
/// on notifications; ends, closing the socket, when the connection fails or the
/// client is gone, or when aborted.
async fn drive<S, T>(mut conn: PgConnection<S, T>, wake: mpsc::Sender<()>)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    while let Some(Ok(message)) = poll_fn(|cx| conn.poll_message(cx)).await {
        if let AsyncMessage::Notification(_) = message {
            let _ = wake.try_send(());
        }
    }
}

impl Backend for PostgresBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        let first = self.try_acquire(name, req).await?;
        if !self.waiting
            || matches!(first, Acquire::Acquired { .. })
            || slot::subscribed(&self.slot, PgConn::wakeups)
        {
            return Ok(first);
        }
        // Busy, and about to wait: LISTEN, then try once more, so a release between the
        // first try and the LISTEN is not missed. An uncontended run never pays for it.
        self.listen(name).await?;
        self.try_acquire(name, req).await
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        let (key, ttl) = (self.key(name), millis(ttl)?);
        let params: &Params<'_> = &[(&key, Type::TEXT), (&token, Type::TEXT), (&ttl, Type::INT8)];
        match self.count(&self.sql.extend, params).await? {
            0 => Err(BackendError::NotOwner),
            _ => Ok(()),
        }
    }

    async fn release(&self, name: &str, token: &str, how: Release) -> Result<(), BackendError> {
        let key = self.key(name);
        let released = match how {
            Release::Now => {
                let channel = self.channel(name);
                let params: &Params<'_> = &[
                    (&key, Type::TEXT),
                    (&token, Type::TEXT),
                    (&channel, Type::TEXT),
                ];
                self.count(&self.sql.release, params).await?
            }
            Release::KeepFor(d) => {
                let keep = millis(d)?;
                let params: &Params<'_> = &[
                    (&key, Type::TEXT),
                    (&token, Type::TEXT),
                    (&keep, Type::INT8),
                ];
                self.count(&self.sql.extend, params).await?
            }
        };
        // Releasing ends a run: nothing more to ask.
        self.close().await;
        match released {
            0 => Err(BackendError::NotOwner),
            _ => Ok(()),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let key = self.key(name);
            let params: &Params<'_> = &[(&key, Type::TEXT)];
            let rows = self
                .query(&self.sql.inspect, params, Missing::NoRows)
                .await?;
            rows.first().map(|r| self.holder(r, 0)).transpose()
        }
        .await;
        Ok(one?.into_iter().collect())
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        let one: Result<Option<Holder>, BackendError> = async {
            let (key, channel) = (self.key(name), self.channel(name));
            let params: &Params<'_> = &[(&key, Type::TEXT), (&channel, Type::TEXT)];
            let rows = self.query(&self.sql.force, params, Missing::NoRows).await?;
            rows.first().map(|r| self.holder(r, 0)).transpose()
        }
        .await;
        Ok(one?.into_iter().collect())
    }

    async fn wait_for_release(
        &self,
        _name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        let slice = wait_slice(busy.ttl_left, max);
        // The connection's end (`None`) forgets it: the next call listens again.
        slot::wait_for_wakeup(&self.slot, PgConn::wakeups, slice, async |w| w.recv().await).await;
        Ok(())
    }

    async fn stop_waiting(&self, _name: &str) -> Result<(), BackendError> {
        // Nothing is queued on the server: a LISTEN ends with the connection. Giving up
        // on a busy lock ends a run, so the connection is closed (a release that may
        // follow, when abandoning, reconnects).
        self.close().await;
        Ok(())
    }
}
