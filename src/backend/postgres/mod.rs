//! The PostgreSQL backend (`postgres://`, `postgresql://`): one lease row per lock, and
//! per slot of a semaphore (`--slots N`).
//!
//! Table `T` (`--pg-table`, created with its sequence `T_fence` when missing) holds a row
//! per lock key `PREFIX{NAME}` (`keys.rs`: injective, no two (prefix, name) pairs share
//! one): the holder's `token`, `fence`, `host`, `pid`, `since` and
//! `expires_at`. Release and `release --force` do not delete the row: they mark it free
//! (empty token, expired), so that the row lock orders every acquisition of a name.
//!
//! **Semaphores** (`--slots N`, N > 1) use the same table, unchanged (no column added:
//! an existing table keeps working, whoever owns it). Slot 0 is the plain lock's row
//! `PREFIX{NAME}` (so a plain lock sees a semaphore's first holder as its holder), slot
//! `i` the row `PREFIX{NAME}#i`, and the limit row `PREFIX{NAME}#slots` is live while
//! any slot is (`slots.rs`, `keys.rs`).
//! Each slot is a lease of its own, renewed, expired and released as a plain lock's
//! row. A semaphore's holder stores its token as `TOKEN/N`, which records N: a row
//! without `/N` (a plain lock, any older lockrun) was taken with N = 1. The limit row
//! (token `/N`) lasts as long as the latest lease of a slot: every acquisition and
//! renewal makes it cover its lease, and a release or `--hold-at-least` sets it to the
//! latest lease left (it ends with the last holder). An acquisition that finds a live
//! holder of slots 0 to N-1, or the limit row, with another N takes nothing and is
//! refused (`backend::slots_conflict`); a plain acquisition reads its row and the limit
//! row, so a semaphore's holder in any slot refuses it. A semaphore's acquisition, its
//! release, `--hold-at-least` and `release --force` are each one transaction, sent in
//! one round trip: the transaction-level advisory lock of the name
//! (`slots::name_lock`), then one statement; the acquisition's reads slots 0 to N-1 and
//! the limit row, checks N, and takes the lowest free slot (a missing row, an expired
//! or released one). Each sees every such step committed before it and none runs
//! beside it; the write itself keeps the plain statement's conflict clause, safe
//! against writers without the lock (a plain lockrun, an older one). A plain lock's
//! steps take no advisory lock and keep their one statement. Renewal and release name the
//! token's slot (remembered from the acquisition; for a token whose acquisition's
//! answer was lost, any of the N slots). `lockrun status --slots N` and
//! `release --force --slots N` read and free every slot.
//!
//! Holders of two N for one name, or a plain lockrun beside a semaphore, are refused
//! whenever one sees the other's rows; a plain acquisition racing a semaphore's (not
//! under the name's lock) can miss a limit row written after its snapshot, and an
//! older lockrun reads slot 0 only: such a mix is a misconfiguration the refusals
//! report, not one they can always prevent.
//!
//! **Rows of unused names** are deleted once their lease ended more than a day ago
//! (`sql::RETENTION`), a few at a time, by acquisitions that add a row (a name without
//! one, a slot without one): the table holds about a day's worth of names (and a
//! week's of run records, deleted the same way a day after they expire). This
//! keeps the ordering: a held row is never deleted (its lease has not ended), and the
//! only token of a plain lock not taken under a row lock, the INSERT's `nextval` for a
//! name without a row, could come out below a token already handed out for that name
//! only if its statement drew it before that token was drawn and inserted after that
//! token's row was deleted, that is, a day after that lease ended: no statement of ours
//! runs that long (`statement_timeout` 10 s, `lock_timeout` 5 s; and one step's
//! transaction never waits a day on another). A semaphore's tokens are all drawn under
//! the name's lock. Tokens come from the sequence, not from the row, so they keep
//! increasing once the row is gone.
//!
//! **Every row expires**: `expires_at` is the statement's clock plus a lease of at most
//! a day (`sql::MAX_LEASE`, lockrun's longest `--ttl`), checked before a statement is
//! sent; a statement that fails (an interval out of range) writes nothing. The limit
//! row's is one of its slots'. A run's record (`KEY#last`, `records.rs`), written by
//! the statement of its release or hold, expires 7 days after the run's end.
//!
//! Every step is ONE statement (in its transaction), atomic on the server (see
//! `sql.rs` and `slots.rs`):
//! - expiry is judged by the database's clock, `now()`: the start of the statement's own
//!   transaction (in the name lock's transaction, `statement_timestamp()`, the start of
//!   the statement after the wait for the lock). It is one value for the whole
//!   statement (so no check can disagree with another), it is never later than the real
//!   time of the check (so a lease is never judged expired early), and it is never
//!   earlier than our request's sending (so an expiry written as `now() + ttl` never
//!   ends before lockrun's local deadline);
//! - renew and release act only where the stored token is ours and still valid;
//! - the fencing token is `nextval` of the sequence, taken inside the acquiring write
//!   while it holds the row lock (a semaphore's: and the name's lock), so it is larger
//!   than every token committed before for that name, whatever the slot, and durable
//!   with the commit (every transaction asks for `synchronous_commit = on`, and the
//!   sequence caches nothing). One sequence for the table: tokens increase over every name.
//!
//! **Waiters** (`--wait`) queue first come first served in the table itself, in a row
//! per name, `PREFIX + NAME#queue` (`sql::queue`): each waiter's random id and the
//! time its place lapses, in the order they came. Every acquisition reads it, locked,
//! in the same statement: a free lock (a free slot) is taken only by a caller with no
//! live waiter before it (with N slots, fewer than the free slots), and a waiter that
//! takes nothing joins the queue or keeps its place, for `WAITER_ALIVE` more; one
//! that takes the lock, or gives up, leaves it. A waiter that stops trying (crashed,
//! frozen, its host gone) loses its place within `WAITER_ALIVE` (6 s). No session state
//! is involved (no session advisory lock, no setting), so the queue works the same
//! through a transaction pool (PgBouncer `pool_mode = transaction`), where each
//! transaction may run on another server connection.
//!
//! Wake-ups: a release NOTIFYs a channel per lock (`lockrun_` + a hash of table and
//! key; one for every slot of a semaphore) in the same statement, so it is sent exactly
//! when the release commits; waiters that LISTEN are all woken and ask again, and the
//! queue lets the first of them in. LISTEN needs a session of our own: through a
//! transaction pool it lands on a server connection that PgBouncer then hands to
//! others, and a notification reaching it while no client is linked makes PgBouncer
//! drop it ("got packet 'A' from server when not linked"). So a waiter LISTENs only
//! when it talks to the server itself: the process id in the connection's cancel key
//! (BackendKeyData) is the server process's own, `pg_backend_pid()`; a pooler (PgBouncer,
//! in any pool mode) makes up a key of its own. Otherwise it says so once (`-v`) and
//! polls (`requests::poll_slice`): the first waiter every [`crate::backend::MIN_WAIT_SLICE`],
//! the others more slowly the further back they are, at most every
//! [`crate::backend::MAX_WAIT_SLICE`].
//!
//! Every step is one transaction, sent in one round trip (`BEGIN` with its `SET LOCAL`
//! settings, `sql::begin`; the statement; `COMMIT`): settings never outlive it on a
//! server connection a pool shares, and an explicit transaction keeps a pool from
//! moving the statement elsewhere. Statements are unnamed (`query_typed`: no named
//! prepared statement, which PgBouncer before 1.21 cannot carry in a transaction
//! pool). Statement pooling (`pool_mode = statement`) allows no transaction: refused
//! with one line (`statement_pooling`).
//!
//! The connection lives in a [`crate::backend::conn::Slot`]: made lazily, dropped after
//! any error or abandoned call (the caller's timeout), made anew on the next call.
//!
//! Files: `target.rs` (the URL and `--pg-table`), `sql.rs` (the statements),
//! `slots.rs` (a semaphore's keys and statements, the name's lock, the queue's key),
//! `records.rs` (the run record's row, its statement parts and its reading),
//! `requests.rs` (the lock's requests and the reading of their answers), `errors.rs`
//! (error lines), `tls.rs` (rustls for `sslmode`), `socket.rs` (the connect, over
//! sockets with a byte budget per reply).

mod cancel_key;
mod errors;
mod keys;
mod records;
mod requests;
mod slots;
mod socket;
mod sql;
mod target;
mod tls;

use std::future::poll_fn;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection as PgConnection, NoTls, Row};

use crate::backend::budget::Overrun;
use crate::backend::conn::{Connection, InUse, Slot, Wakeups};
use crate::backend::url::BackendConfig;
use crate::backend::BackendError;
use cancel_key::key_pid;
use sql::{begin, channel, Sql};
pub use target::{PostgresTarget, KIND};

/// The longest a polite close may take before the connection is just dropped.
const CLOSE_TIME: Duration = Duration::from_millis(200);

/// How long a waiter's place in the queue lasts after each try: three of its longest
/// sleeps between two tries ([`crate::backend::MAX_WAIT_SLICE`]), so a loaded machine
/// does not lose it its place, and a waiter that stopped trying blocks the queue no
/// longer.
pub(super) const WAITER_ALIVE: Duration =
    Duration::from_secs(3 * crate::backend::MAX_WAIT_SLICE.as_secs());

/// How a waiter learns that the lock may be free (see the module doc): not known yet,
/// from NOTIFY on a session of its own, or by polling through a pooler.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Wake {
    Unknown = 0,
    Notified = 1,
    Polling = 2,
}

/// A lock backend on PostgreSQL.
pub struct PostgresBackend {
    /// Boxed, as are the statements: the parsed configuration is large.
    target: Box<PostgresTarget>,
    display: String,
    key_prefix: String,
    /// `--slots`: 1 is a plain lock (today's row and statements), more a semaphore.
    slots: u32,
    /// The slot our last acquisition took, with its token: renewals and the release
    /// touch that row only. A token not found here (an acquisition whose answer was
    /// lost) is looked for in every slot.
    held: Mutex<Option<(String, u32)>>,
    sql: Box<Sql>,
    waiting: bool,
    /// This run's id in the waiters' queue (random hex), or empty when it will not wait.
    waiter: String,
    /// How many live waiters were ahead of this one at its last try.
    ahead: AtomicU64,
    /// How this waiter is woken ([`Wake`]), found out when it first waits.
    wake: AtomicU8,
    slot: Slot<PgConn>,
    /// Set once a connection's reply went over the byte budget (it is then dead, and
    /// every error says so).
    overrun: Overrun,
}

/// A connection and what rides on it; replaced as a whole after any failure.
struct PgConn {
    client: Client,
    /// The task that drives the connection; aborting it closes the socket.
    driver: JoinHandle<()>,
    /// Wake-ups from NOTIFY (at most one pending: one is as good as many), once the
    /// connection LISTENs on the lock's channel.
    wakeups: Wakeups<mpsc::Receiver<()>>,
    /// The process id of the cancel key the server gave (BackendKeyData), if read: the
    /// server process's own unless a pooler answers for it.
    key_pid: Option<i32>,
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
            slots: config.slots,
            held: Mutex::new(None),
            waiting,
            waiter: match waiting {
                true => format!("{:016x}", crate::token::random_u64()),
                false => String::new(),
            },
            ahead: AtomicU64::new(0),
            wake: AtomicU8::new(Wake::Unknown as u8),
            slot: Slot::default(),
            overrun: Overrun::default(),
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
        let (client, driver) = if let Some(tls) = &self.target.tls {
            let tls = tls::MakeRustls::new(tls);
            let made = socket::connect(&config, tls, &self.overrun).await;
            let (client, conn) = made.map_err(|e| self.connect_error(e))?;
            (client, tokio::spawn(drive(conn, wake)))
        } else {
            let made = socket::connect(&config, NoTls, &self.overrun).await;
            let (client, conn) = made.map_err(|e| self.connect_error(e))?;
            (client, tokio::spawn(drive(conn, wake)))
        };
        let key_pid = key_pid(&client).await;
        Ok(PgConn {
            client,
            driver,
            wakeups: Wakeups::new(Some(wakeups)),
            key_pid,
        })
    }

    /// Runs `sql` in a transaction of its own (one round trip, no prepared statement to
    /// go stale, see [`statement`]). A missing table
    /// or sequence is dealt with as `missing` says; any other failure, or the caller
    /// abandoning the call, drops the connection.
    async fn query(
        &self,
        sql: &str,
        params: &Params<'_>,
        missing: Missing,
    ) -> Result<Vec<Row>, BackendError> {
        self.query_locked(None, sql, params, missing).await
    }

    /// [`PostgresBackend::query`], in a transaction of its own after the advisory lock
    /// `lock` when there is one ([`slots::name_lock`]).
    async fn query_locked(
        &self,
        lock: Option<i64>,
        sql: &str,
        params: &Params<'_>,
        missing: Missing,
    ) -> Result<Vec<Row>, BackendError> {
        let mut created = false;
        loop {
            let c = self.conn().await?;
            match statement(&c.client, lock, sql, params).await {
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
                let msg = e.as_db_error().map_or("", |d| d.message());
                Err(errors::create_denied(&self.display, self.grantee(), msg))
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
        keys::lock_key(&self.key_prefix, name)
    }

    fn channel(&self, name: &str) -> String {
        channel(&self.target.table, &self.key(name))
    }

    /// Translates a client error (see [`errors::describe`]): a pooler in statement
    /// pooling mode is refused ([`statement_pooling`]), and a privilege error names the
    /// GRANT that fixes it ([`errors::privilege_error`]).
    fn error(&self, e: &tokio_postgres::Error) -> BackendError {
        if self.overrun.happened() {
            return errors::too_large(&self.display);
        }
        if let Some(refusal) = statement_pooling(e, &self.display) {
            return refusal;
        }
        errors::privilege_error(e, &self.display, self.grantee())
            .unwrap_or_else(|| errors::describe(e, &self.display, &self.target.table))
    }

    /// Translates a failed connect.
    fn connect_error(&self, e: socket::ConnectError) -> BackendError {
        match e {
            _ if self.overrun.happened() => errors::too_large(&self.display),
            socket::ConnectError::Pg(e) => self.error(&e),
            socket::ConnectError::Socket(e) => errors::unreachable(&e, &self.display),
            socket::ConnectError::Config(why) => errors::unusable(&why, &self.display),
            socket::ConnectError::SessionAttrs(why) => errors::session_attrs(why, &self.display),
        }
    }

    /// The user and the lock table, for privilege errors.
    fn grantee(&self) -> errors::Grantee<'_> {
        errors::Grantee {
            user: self.target.config.get_user(),
            table: &self.target.table,
        }
    }

    /// How this waiter is woken.
    fn wake(&self) -> Wake {
        match self.wake.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Wake::Notified,
            2 => Wake::Polling,
            _ => Wake::Unknown,
        }
    }
}

/// Runs `sql` on `client` in a transaction of its own ([`begin`]: with its local
/// settings, and after the advisory lock `lock` when there is one), pipelined in one
/// round trip (BEGIN, the statement, COMMIT: each request is sent when its future is
/// first polled, and `join3` polls them in order). A failure aborts the transaction;
/// COMMIT then rolls it back, and the first failure is the answer.
async fn statement(
    client: &Client,
    lock: Option<i64>,
    sql: &str,
    params: &Params<'_>,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let begin = begin(lock);
    let (begun, rows, committed) = futures_util::future::join3(
        client.batch_execute(&begin),
        client.query_typed(sql, params),
        client.batch_execute("COMMIT"),
    )
    .await;
    begun?;
    let rows = rows?;
    committed?;
    Ok(rows)
}

/// The refusal of a pooler in statement pooling mode (PgBouncer's `pool_mode =
/// statement`), which ends the connection at lockrun's first `BEGIN`: every step of
/// lockrun is a transaction. None for any other error.
fn statement_pooling(e: &tokio_postgres::Error, at: &str) -> Option<BackendError> {
    let db = e.as_db_error()?;
    db.message().contains("statement pooling").then(|| {
        BackendError::Refused(format!(
            "PostgreSQL at {at} is reached through a pooler in statement pooling mode, \
             where lockrun cannot work (each of its steps is a transaction): use \
             transaction or session pooling (PgBouncer pool_mode) for lockrun's database \
             ({})",
            db.message().replace('\n', " ")
        ))
    })
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
