//! The one interface every lock backend implements, and its typed results.
//!
//! A backend stores, per lock name, the holder's random token with an expiry, a fencing
//! counter that only grows, and the holder's description for `status`. Its answers
//! are never folded into a bool: "held by someone else" ([`Acquire::Busy`]), "not
//! yours any more" ([`BackendError::NotOwner`]) and "cannot tell right now"
//! ([`BackendError::Unavailable`]) lead to different exit statuses and actions.
//! One module per backend, which owns everything about itself: its URL schemes and
//! their parser, its options, its connection ([`conn::Slot`]) and its requests. The
//! rest of the program knows backends only through the registry ([`registry::KINDS`]:
//! the `--url` help and the unknown-scheme message are built from it) and through
//! [`AnyBackend`]. Adding a backend is a new module and one line in that table. What
//! every backend shares about URLs is the leaf [`url`]; the byte budget of a reply on
//! a connection, the leaf [`budget`].

pub(crate) mod budget;
pub(crate) mod conn;
mod error;
pub(crate) mod etcd;
pub(crate) mod file;
pub mod keys;
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod probe;
pub mod record;
pub mod redis;
pub(crate) mod registry;
pub(crate) mod tls;
pub(crate) mod url;
pub(crate) mod zookeeper;

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::time::Duration;

use crate::clock::BootInstant;

pub use error::{slots_conflict, BackendError};
pub use record::{EndedBy, LastOk, Period, RunEnd, RunRecord, Skip};

/// The longest lease any backend takes: lockrun's largest `--ttl` and
/// `--hold-at-least` ([`crate::config::bounds`]). Each backend refuses a longer one
/// before writing anything (so no lock outlives it), and gives a lock it finds without
/// an expiry this much, so that it frees eventually and its waiters wait, not poll.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The largest `--slots`: every acquire of a semaphore looks at each slot, so N is
/// kept to what one request can read.
pub const MAX_SLOTS: u32 = 1000;

/// The longest a waiter sleeps without asking the backend again, in case a wake-up
/// was lost (a connection cut, a woken waiter that died before taking the lock).
pub const MAX_WAIT_SLICE: Duration = Duration::from_secs(2);

/// The shortest a waiter sleeps before asking again. A lease about to expire, or one
/// reported with no time left (a key without an expiry, a clock step on the server),
/// must not turn waiters into a busy loop against the server: the finding was 40
/// requests a second from one waiter.
pub const MIN_WAIT_SLICE: Duration = Duration::from_millis(100);

/// How long a waiter sleeps before trying again: until the busy lease would expire
/// (`expires_in`: a crashed holder never sends a wake-up), at least
/// [`MIN_WAIT_SLICE`], at most [`MAX_WAIT_SLICE`], plus up to 50 ms of jitter so that
/// waiters that time out together do not ask together; and never past `max`, the
/// `--wait` left (the last try may come sooner than the floor: after it, the waiter
/// gives up).
pub fn wait_slice(expires_in: Duration, max: Duration) -> Duration {
    let jitter = Duration::from_millis(crate::token::random_u64() % 50);
    expires_in
        .clamp(MIN_WAIT_SLICE, MAX_WAIT_SLICE)
        .saturating_add(jitter)
        .min(max)
}

/// Who holds a lock, as stored by the holder's lockrun.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Host name of the holder.
    pub host: String,
    /// Process id of the holder's lockrun.
    pub pid: u32,
    /// Acquisition time, milliseconds since the Unix epoch (server clock).
    pub since_ms: u64,
    /// The fencing token handed out with this acquisition.
    pub fencing_token: u64,
    /// Lease time left.
    pub ttl_left: Duration,
    /// The slot held, 0 to N-1 (0 for a plain lock).
    pub slot: u32,
    /// The N of `--slots` this holder was taken with (1 for a plain lock, and for a
    /// record written before semaphores existed).
    pub slots: u32,
}

impl Default for Holder {
    /// Nothing known, of a plain lock (slot 0 of 1).
    fn default() -> Holder {
        Holder {
            host: String::new(),
            pid: 0,
            since_ms: 0,
            fencing_token: 0,
            ttl_left: Duration::ZERO,
            slot: 0,
            slots: 1,
        }
    }
}

impl Holder {
    /// The holder a stored JSON description names (`host`, `pid`, `since_ms`; anything
    /// else gives empty fields), for the backends that store one (etcd, ZooKeeper); the
    /// caller sets what the backend itself knows (the token, the time left).
    pub fn from_json(v: &serde_json::Value) -> Holder {
        Holder {
            host: v["host"].as_str().unwrap_or_default().to_owned(),
            pid: v["pid"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0),
            since_ms: v["since_ms"].as_u64().unwrap_or(0),
            slot: v["slot"]
                .as_u64()
                .and_then(|s| u32::try_from(s).ok())
                .unwrap_or(0),
            slots: v["slots"]
                .as_u64()
                .and_then(|s| u32::try_from(s).ok())
                .filter(|&n| n >= 1)
                .unwrap_or(1),
            ..Holder::default()
        }
    }

    /// The acquisition time as RFC 3339 (seconds, UTC), for messages; `None` past
    /// the year 9999 (a stored time is whatever the backend holds).
    pub fn since(&self) -> Option<String> {
        crate::units::rfc3339_ms(self.since_ms)
    }
}

/// What lockrun asks for when acquiring.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The random token that proves ownership (hex of 128 random bits).
    pub token: String,
    /// Lease length.
    pub ttl: Duration,
    /// This host's name, stored for `status`.
    pub host: String,
    /// This lockrun's pid, stored for `status`.
    pub pid: u32,
}

/// The answer to an acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Ours, with this fencing token.
    Acquired {
        /// Strictly larger than every token handed out before for this name.
        fencing_token: u64,
        /// The slot taken, 0 to N-1 (0 for a plain lock).
        slot: u32,
    },
    /// Ours, granted by the last holder's release while we waited (Redis): its lease
    /// counts from `asked_at`, when the last attempt that found the lock busy was sent,
    /// not from the attempt that returns this.
    Granted {
        /// As for [`Acquire::Acquired`].
        fencing_token: u64,
        /// As for [`Acquire::Acquired`].
        slot: u32,
        /// When the lease began, at the latest.
        asked_at: BootInstant,
    },
    /// Someone else holds it (with `--slots N`: every slot is held; this is the
    /// holder whose lease ends first, the one a waiter waits for).
    Busy(Holder),
}

/// What to do with the key when releasing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Delete it now.
    Now,
    /// Keep it for this much longer (`--hold-at-least`), then let it expire.
    KeepFor(Duration),
}

/// A lock backend. Every call checks ownership by token on the server side (renew
/// and release never touch another holder's lock; the token also names the slot
/// held, so they need no more) and is bounded in time by the
/// caller with a timeout shorter than the lease left. Methods take `&self` so that a
/// renewal can be in flight while the driver does other work; implementations keep
/// their connection state behind short-lived locks, never held across an await.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// Tries once to take lock `name`: with `--slots N` (given when the backend was
    /// opened), its lowest free slot. A holder taken with another N is refused
    /// ([`slots_conflict`]).
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError>;

    /// Extends our lease to `ttl` from now, if the stored token is still `token`.
    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError>;

    /// Gives the lock up if the stored token is still `token` and wakes one waiter;
    /// a backend that keeps run records writes the run's ([`RunRecord`], from the
    /// stored holder and `end`) in the same step. `end` is `None` when no command ran
    /// under this token (an attempt given up): no record then.
    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError>;

    /// Who holds `name` now: every live holder, by slot (empty when free).
    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError>;

    /// The record of `name`'s last run that ended, if there is one (every backend keeps
    /// one; a backend that did not would answer `None`).
    async fn last_run(&self, _name: &str) -> Result<Option<RunRecord>, BackendError> {
        Ok(None)
    }

    /// `--once-per`: may the run of `token`, holding `name`, start? [`Period::ByRecords`]
    /// (the default): the caller judges from `inspect` and `last_run` (etcd judges itself).
    async fn once_per(&self, _: &str, _: &str, _: Duration) -> Result<Period, BackendError> {
        Ok(Period::ByRecords)
    }

    /// Every lock name under the key prefix that may be held or have a record of its
    /// last run (`lockrun list`), in any order, repeats allowed; the caller asks each
    /// one for its holders and record.
    async fn names(&self) -> Result<Vec<String>, BackendError>;

    /// Breaks the lock whoever holds it (every slot); returns the holders it removed.
    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError>;

    /// Waits until `name` may have become free: a release notification, the busy
    /// lease's expiry (`busy`), or `max`, whichever is first. Returning early is
    /// always allowed; the caller tries again.
    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError>;

    /// Stops waiting for `name` (forgets this waiter's place in the queue).
    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError>;

    /// Descriptors whose open files hold our lock of `name` on this host (the file
    /// backend's lock file), for the guard to keep open while the job lives: the lock
    /// then stays taken until the job is dead, even if lockrun dies first. A backend
    /// whose lock lives on a server has none.
    fn lock_fds(&self, _name: &str) -> Vec<RawFd> {
        Vec::new()
    }
}

/// A backend as the rest of the program holds it: any [`Backend`], behind one pointer.
/// Each backend module makes one from its checked [`url::Target`]; nothing outside
/// `backend/` names a backend type.
pub struct AnyBackend(Box<dyn DynBackend>);

impl AnyBackend {
    /// Wraps `backend`.
    pub fn new<B: Backend + 'static>(backend: B) -> AnyBackend {
        AnyBackend(Box::new(backend))
    }
}

/// A call of [`DynBackend`]: a boxed future, so that [`Backend`] (whose `async fn`s
/// cannot be called through a pointer) can be.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + 'a>>;

/// [`Backend`] with boxed futures: what [`AnyBackend`] holds. One allocation per call,
/// a few per run.
trait DynBackend {
    fn acquire<'a>(&'a self, name: &'a str, req: &'a AcquireRequest) -> Call<'a, Acquire>;
    fn renew<'a>(&'a self, name: &'a str, token: &'a str, ttl: Duration) -> Call<'a, ()>;
    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Call<'a, ()>;
    fn inspect<'a>(&'a self, name: &'a str) -> Call<'a, Vec<Holder>>;
    fn last_run<'a>(&'a self, name: &'a str) -> Call<'a, Option<RunRecord>>;
    fn once_per<'a>(&'a self, name: &'a str, token: &'a str, period: Duration) -> Call<'a, Period>;
    fn names(&self) -> Call<'_, Vec<String>>;
    fn force_release<'a>(&'a self, name: &'a str) -> Call<'a, Vec<Holder>>;
    fn wait_for_release<'a>(
        &'a self,
        name: &'a str,
        busy: &'a Holder,
        max: Duration,
    ) -> Call<'a, ()>;
    fn stop_waiting<'a>(&'a self, name: &'a str) -> Call<'a, ()>;
    fn lock_fds(&self, name: &str) -> Vec<RawFd>;
}

impl<B: Backend> DynBackend for B {
    fn acquire<'a>(&'a self, name: &'a str, req: &'a AcquireRequest) -> Call<'a, Acquire> {
        Box::pin(Backend::acquire(self, name, req))
    }
    fn renew<'a>(&'a self, name: &'a str, token: &'a str, ttl: Duration) -> Call<'a, ()> {
        Box::pin(Backend::renew(self, name, token, ttl))
    }
    fn release<'a>(
        &'a self,
        name: &'a str,
        token: &'a str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Call<'a, ()> {
        Box::pin(Backend::release(self, name, token, how, end))
    }
    fn inspect<'a>(&'a self, name: &'a str) -> Call<'a, Vec<Holder>> {
        Box::pin(Backend::inspect(self, name))
    }
    fn last_run<'a>(&'a self, name: &'a str) -> Call<'a, Option<RunRecord>> {
        Box::pin(Backend::last_run(self, name))
    }
    fn once_per<'a>(&'a self, name: &'a str, token: &'a str, period: Duration) -> Call<'a, Period> {
        Box::pin(Backend::once_per(self, name, token, period))
    }
    fn names(&self) -> Call<'_, Vec<String>> {
        Box::pin(Backend::names(self))
    }
    fn force_release<'a>(&'a self, name: &'a str) -> Call<'a, Vec<Holder>> {
        Box::pin(Backend::force_release(self, name))
    }
    fn wait_for_release<'a>(
        &'a self,
        name: &'a str,
        busy: &'a Holder,
        max: Duration,
    ) -> Call<'a, ()> {
        Box::pin(Backend::wait_for_release(self, name, busy, max))
    }
    fn stop_waiting<'a>(&'a self, name: &'a str) -> Call<'a, ()> {
        Box::pin(Backend::stop_waiting(self, name))
    }
    fn lock_fds(&self, name: &str) -> Vec<RawFd> {
        Backend::lock_fds(self, name)
    }
}

impl Backend for AnyBackend {
    async fn acquire(&self, name: &str, req: &AcquireRequest) -> Result<Acquire, BackendError> {
        self.0.acquire(name, req).await
    }

    async fn renew(&self, name: &str, token: &str, ttl: Duration) -> Result<(), BackendError> {
        self.0.renew(name, token, ttl).await
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        how: Release,
        end: Option<RunEnd>,
    ) -> Result<(), BackendError> {
        self.0.release(name, token, how, end).await
    }

    async fn inspect(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        self.0.inspect(name).await
    }

    async fn last_run(&self, name: &str) -> Result<Option<RunRecord>, BackendError> {
        self.0.last_run(name).await
    }

    async fn once_per(
        &self,
        name: &str,
        token: &str,
        period: Duration,
    ) -> Result<Period, BackendError> {
        self.0.once_per(name, token, period).await
    }

    async fn names(&self) -> Result<Vec<String>, BackendError> {
        self.0.names().await
    }

    async fn force_release(&self, name: &str) -> Result<Vec<Holder>, BackendError> {
        self.0.force_release(name).await
    }

    async fn wait_for_release(
        &self,
        name: &str,
        busy: &Holder,
        max: Duration,
    ) -> Result<(), BackendError> {
        self.0.wait_for_release(name, busy, max).await
    }

    async fn stop_waiting(&self, name: &str) -> Result<(), BackendError> {
        self.0.stop_waiting(name).await
    }

    fn lock_fds(&self, name: &str) -> Vec<RawFd> {
        self.0.lock_fds(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_slices_end_at_the_expiry_the_cap_or_the_wait_left() {
        let ms = Duration::from_millis;
        for _ in 0..100 {
            let s = wait_slice(ms(300), Duration::from_secs(60));
            assert!(s >= ms(300) && s < ms(350), "{s:?}");
            let s = wait_slice(Duration::from_secs(30), Duration::from_secs(60));
            assert!(s >= MAX_WAIT_SLICE && s < MAX_WAIT_SLICE + ms(50), "{s:?}");
            assert_eq!(wait_slice(Duration::from_secs(30), ms(100)), ms(100));
        }
    }

    #[test]
    fn a_slots_conflict_names_both_limits_and_the_fix() {
        let e = slots_conflict(1, 3);
        assert!(!e.is_transient());
        let msg = e.to_string();
        assert!(
            msg.contains("a plain lock (--slots 1), not --slots 3"),
            "{msg}"
        );
        assert!(msg.contains("the same --slots"), "{msg}");
        assert!(slots_conflict(4, 2)
            .to_string()
            .contains("--slots 4, not --slots 2"));
    }

    #[test]
    fn a_stored_description_gives_the_slot_and_a_plain_lock_by_default() {
        let v = serde_json::json!({"host": "h", "pid": 7, "slot": 2, "slots": 3});
        let h = Holder::from_json(&v);
        assert_eq!((h.host.as_str(), h.pid, h.slot, h.slots), ("h", 7, 2, 3));
        let old = Holder::from_json(&serde_json::json!({"host": "h"}));
        assert_eq!((old.slot, old.slots), (0, 1));
    }

    #[test]
    fn waiters_never_poll_faster_than_every_100ms() {
        let ms = Duration::from_millis;
        for expires_in in [Duration::ZERO, Duration::from_nanos(1), ms(1), ms(99)] {
            for _ in 0..100 {
                let s = wait_slice(expires_in, Duration::from_secs(60));
                assert!(s >= MIN_WAIT_SLICE && s < ms(150), "{expires_in:?}: {s:?}");
            }
        }
        // Only the wait left cuts a slice shorter: the last try before giving up.
        assert_eq!(wait_slice(Duration::ZERO, ms(30)), ms(30));
    }
}
