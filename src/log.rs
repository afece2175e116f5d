//! lockrun's own lines on stderr: short human text by default, one JSON object a line
//! with `--log-format json`. The command's output never passes through here (its
//! stdio is inherited), so the two are never mixed within a line.
//!
//! A process-wide logger set once by `main` after parsing; before that, text at the
//! normal level. Messages are built by the callers and never contain secrets: URLs are
//! shown as `host:port` only. Depends on nothing else in the crate.
//!
//! **Writing never blocks the caller** once [`start_writer`] ran (`lockrun run` starts
//! it right after forking its guard): lines go through a bounded queue to a thread of
//! their own, which writes them to stderr. A stderr that blocks (a log shipper that
//! stopped reading, a full container log pipe) then holds back that thread only, never
//! a kill: when the queue is full a line is dropped and counted, and the count is said
//! once, in a line of its own (`log_dropped`), as soon as stderr takes lines again.
//! [`flush`] waits a bounded time for the queue at exit, so lockrun's own exit is
//! bounded too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

/// How lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `lockrun: <message>`.
    Text,
    /// One JSON object a line with `ts` (RFC 3339, microseconds), `level`, `event`,
    /// `lock`, `msg` and fields.
    Json,
}

/// Importance of a line. `-q` shows errors only, the default adds warnings, `-v`
/// adds info and `-vv` debug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// lockrun failed or stopped the command.
    Error,
    /// Something an operator should know (busy lock, renewal trouble).
    Warn,
    /// The normal course of a run (acquired, released).
    Info,
    /// Every renewal.
    Debug,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// Declares [`Event`] from one list of variants and names, so that [`Event::ALL`] and
/// [`Event::as_str`] cannot miss one.
macro_rules! events {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// What a line is about: the `event` key of a JSON line. The names are part of
        /// the contract (docs/operations.md, "Logs": log shippers match on them);
        /// renaming one is a visible change.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Event {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Event {
            /// Every event, in declaration order.
            #[cfg(test)]
            pub const ALL: &[Event] = &[$(Event::$variant,)*];

            /// The name in JSON lines.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Event::$variant => $name,)*
                }
            }
        }
    };
}

events! {
    /// The lock was taken (with its fencing token).
    Acquired => "acquired",
    /// The lock is held by someone else and `--wait` ran out.
    Busy => "busy",
    /// The random pause before the first attempt (`--splay`).
    Splay => "splay",
    /// `--once-per`: a run of the name succeeded within the period; not run.
    Skipped => "skipped",
    /// The lock is held by someone else: waiting for it (`--wait`), said once a run.
    Waiting => "waiting",
    /// A renewal failed for a reason that may pass; retried while the lease is valid.
    RenewFailed => "renew_failed",
    /// The lock was lost while the command ran; the command was stopped.
    Lost => "lost",
    /// A signal is being sent to the command's process group.
    Killing => "killing",
    /// The command (its group leader) exited.
    Exited => "exited",
    /// The lock was given back (or shortened to `--hold-at-least`).
    Released => "released",
    /// The lease was renewed.
    Renewed => "renewed",
    /// An acquire attempt failed for a reason that may pass; retrying.
    AcquireFailed => "acquire_failed",
    /// Waiting for a busy lock's release went wrong; the next attempt follows.
    WaitError => "wait_error",
    /// A signal lockrun received ended the run before the command started.
    Interrupted => "interrupted",
    /// A signal lockrun received was forwarded to the command's group.
    Forwarded => "forwarded",
    /// The command was stopped at `--max-runtime`.
    MaxRuntime => "max_runtime",
    /// The run is over (with its exit status).
    Finished => "finished",
    /// The release at the end failed; the lock expires within the TTL.
    ReleaseFailed => "release_failed",
    /// A `--ping` request failed (the exit status is not changed).
    PingFailed => "ping_failed",
    /// `release --force` broke a lock (or found none).
    ForceReleased => "force_released",
    /// lockrun failed (usage, configuration, backend, spawning the command).
    Error => "error",
    /// The `--metrics-file` could not be written, or the previous one was not read
    /// (not a regular file, or over 64 KiB).
    MetricsFailed => "metrics_failed",
    /// lockrun could not become a child subreaper.
    Subreaper => "subreaper",
    /// A signal could not be sent to the command's group.
    SignalFailed => "signal_failed",
    /// A signal ignored when lockrun started stays ignored: not forwarded.
    SignalIgnored => "signal_ignored",
    /// The password file can be read by group or others.
    PasswordFileMode => "password_file_mode",
    /// A Redis server would not let lockrun check whether it may evict the lock (no
    /// INFO for this user): the lock was taken unchecked.
    EvictionUnchecked => "eviction_unchecked",
    /// A password is sent over a connection without TLS to a host that is not this
    /// machine (`etcd://` with a user to a member that is not loopback).
    PasswordInClear => "password_in_clear",
    /// Where the job is held: its own cgroup, or the process tree under the guard.
    Contained => "contained",
    /// lockrun's guard process died; the job was stopped.
    GuardLost => "guard_lost",
    /// lockrun's guard process was stopped: continued, or the job stopped if it stays so.
    GuardStopped => "guard_stopped",
    /// lockrun's guard process is traced (a debugger): should lockrun die while the
    /// tracer holds it, nothing would stop the job.
    GuardTraced => "guard_traced",
    /// Log lines were dropped because stderr did not take them in time.
    LogDropped => "log_dropped",
}

/// The logger's settings.
#[derive(Clone, Debug)]
pub struct Logger {
    format: Format,
    max_level: Level,
    lock: String,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

impl Logger {
    /// A logger writing `format`, showing lines up to `max_level`, about lock `lock`.
    pub fn new(format: Format, max_level: Level, lock: &str) -> Logger {
        Logger {
            format,
            max_level,
            lock: lock.to_owned(),
        }
    }

    /// The level for `-q` (quiet) and a count of `-v`.
    pub fn level_for(quiet: bool, verbose: u8) -> Level {
        match (quiet, verbose) {
            (true, _) => Level::Error,
            (false, 0) => Level::Warn,
            (false, 1) => Level::Info,
            (false, _) => Level::Debug,
        }
    }

    /// Makes this the process-wide logger (the first call wins).
    pub fn install(self) {
        let _ = LOGGER.set(self);
    }

    /// Renders one line (without the newline), or `None` if the level is filtered.
    pub fn render(
        &self,
        level: Level,
        event: Event,
        msg: &str,
        fields: &[(&str, Value)],
    ) -> Option<String> {
        if level > self.max_level {
            return None;
        }
        Some(match self.format {
            // A text line is one line: whatever a message quotes from a server or a
            // stored holder (a newline, a terminal escape) is shown escaped.
            Format::Text => format!("lockrun: {}", crate::units::printable(msg)),
            Format::Json => {
                let mut obj = Map::new();
                let ts = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
                obj.insert("ts".into(), Value::String(ts));
                obj.insert("level".into(), level.as_str().into());
                obj.insert("event".into(), event.as_str().into());
                obj.insert("lock".into(), self.lock.clone().into());
                obj.insert("msg".into(), msg.into());
                for (k, v) in fields {
                    obj.insert((*k).to_owned(), v.clone());
                }
                // (Keys keep this order: serde_json's preserve_order feature.)
                Value::Object(obj).to_string()
            }
        })
    }
}

/// Writes one line through the process-wide logger.
pub fn emit(level: Level, event: Event, msg: &str, fields: &[(&str, Value)]) {
    let fallback;
    let logger = match LOGGER.get() {
        Some(l) => l,
        None => {
            fallback = Logger::new(Format::Text, Level::Warn, "");
            &fallback
        }
    };
    if let Some(line) = logger.render(level, event, msg, fields) {
        write_line(format!("{line}\n").into_bytes());
    }
}

/// How many lines the writer's queue holds before lines are dropped.
const QUEUE: usize = 64;

/// The writer thread's end of things.
struct Writer {
    queue: SyncSender<Vec<u8>>,
    /// Lines queued and not yet written, to wait on at exit.
    pending: Mutex<usize>,
    written: Condvar,
}

static WRITER: OnceLock<Writer> = OnceLock::new();

/// Set by [`start_writer`]: lines may go through a writer thread from now on.
static THREADS_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Lines dropped since the last report of them.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// From now on, lines go through a thread of their own, so that [`emit`] never blocks.
/// Call it once the process may have threads (after lockrun forked its guard). The
/// thread starts with the first line written (a quiet run that succeeds has none).
pub fn start_writer() {
    THREADS_ALLOWED.store(true, Ordering::Release);
}

/// The writer thread's queue, the thread started on first use.
fn writer() -> Option<&'static Writer> {
    if !THREADS_ALLOWED.load(Ordering::Acquire) {
        return None;
    }
    Some(WRITER.get_or_init(|| {
        let (queue, lines) = sync_channel(QUEUE);
        let spawned = std::thread::Builder::new()
            .name("lockrun-log".into())
            .spawn(move || write_lines(lines));
        if spawned.is_err() {
            // No thread: queued lines are lost; the kill path still never waits on
            // stderr.
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Writer {
            queue,
            pending: Mutex::new(0),
            written: Condvar::new(),
        }
    }))
}

/// The writer thread: writes each line, and after a line that went through, says how
/// many were dropped before it.
fn write_lines(lines: Receiver<Vec<u8>>) {
    for line in lines {
        write_stderr(&line);
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let msg = format!("{dropped} log line(s) dropped: stderr did not take them in time");
            let fields = [("dropped", Value::from(dropped))];
            let fallback = Logger::new(Format::Text, Level::Warn, "");
            let logger = LOGGER.get().unwrap_or(&fallback);
            if let Some(l) = logger.render(Level::Warn, Event::LogDropped, &msg, &fields) {
                write_stderr(format!("{l}\n").as_bytes());
            }
        }
        // The queue's owner is set before its first line can be sent.
        if let Some(writer) = WRITER.get() {
            let mut pending = writer
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *pending = pending.saturating_sub(1);
            writer.written.notify_all();
        }
    }
}

/// Queues `line` for the writer thread (never waiting), or writes it at once when
/// there is no writer thread.
fn write_line(line: Vec<u8>) {
    let Some(writer) = writer() else {
        write_stderr(&line);
        return;
    };
    let mut pending = writer
        .pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match writer.queue.try_send(line) {
        Ok(()) => *pending += 1,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits at most `limit` for the queued lines to be written (lockrun's exit).
pub fn flush(limit: Duration) {
    let Some(writer) = WRITER.get() else {
        return;
    };
    let until = Instant::now() + limit;
    let mut pending = writer
        .pending
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    while *pending > 0 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        pending = writer
            .written
            .wait_timeout(pending, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Writes all of `bytes` to file descriptor 2, in as few calls as it takes (one for a
/// line, so concurrent writers do not interleave within it); gives up on an error.
fn write_stderr(mut bytes: &[u8]) {
    // SAFETY: fd 2 is open for the whole life of the process (or writes fail with
    // EBADF, which ends this loop).
    #[allow(unsafe_code)]
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(2) };
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
            Err(nix::errno::Errno::EINTR) => {}
            // A non-blocking stderr (set by whoever shares it): wait a little.
            Err(nix::errno::Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_are_prefixed_and_filtered_by_level() {
        let l = Logger::new(Format::Text, Level::Warn, "job");
        assert_eq!(
            l.render(Level::Warn, Event::Busy, "lock is busy", &[])
                .unwrap(),
            "lockrun: lock is busy"
        );
        assert!(l.render(Level::Info, Event::Acquired, "x", &[]).is_none());
        assert!(l.render(Level::Error, Event::Error, "x", &[]).is_some());
    }

    #[test]
    fn a_text_line_stays_one_line_whatever_it_quotes() {
        let l = Logger::new(Format::Text, Level::Warn, "job");
        let line = l
            .render(
                Level::Warn,
                Event::Busy,
                "held by h\nlockrun: acquired\u{1b}[2J",
                &[],
            )
            .unwrap();
        assert_eq!(line, "lockrun: held by h\\nlockrun: acquired\\u{1b}[2J");
    }

    #[test]
    fn json_lines_carry_the_required_keys_and_fields() {
        let l = Logger::new(Format::Json, Level::Debug, "job");
        let line = l
            .render(
                Level::Info,
                Event::Acquired,
                "acquired \"job\"",
                &[("fencing_token", 42.into())],
            )
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["event"], "acquired");
        assert_eq!(v["lock"], "job");
        assert_eq!(v["fencing_token"], 42);
        assert!(v["ts"].as_str().unwrap().ends_with('Z'));
        assert!(!line.contains('\n'));
        assert!(line.starts_with("{\"ts\":"), "ts comes first: {line}");
    }

    /// The event names are a contract (docs/operations.md, "Logs"): this list changes
    /// only on purpose, with docs/operations.md, the man page and the log shippers'
    /// filters.
    #[test]
    fn event_names_are_the_documented_ones() {
        let names: Vec<&str> = Event::ALL.iter().map(|e| e.as_str()).collect();
        assert_eq!(
            names,
            [
                "acquired",
                "busy",
                "splay",
                "skipped",
                "waiting",
                "renew_failed",
                "lost",
                "killing",
                "exited",
                "released",
                "renewed",
                "acquire_failed",
                "wait_error",
                "interrupted",
                "forwarded",
                "max_runtime",
                "finished",
                "release_failed",
                "ping_failed",
                "force_released",
                "error",
                "metrics_failed",
                "subreaper",
                "signal_failed",
                "signal_ignored",
                "password_file_mode",
                "eviction_unchecked",
                "password_in_clear",
                "contained",
                "guard_lost",
                "guard_stopped",
                "guard_traced",
                "log_dropped",
            ]
        );
    }

    #[test]
    fn verbosity_flags_map_to_levels() {
        assert_eq!(Logger::level_for(true, 3), Level::Error);
        assert_eq!(Logger::level_for(false, 0), Level::Warn);
        assert_eq!(Logger::level_for(false, 1), Level::Info);
        assert_eq!(Logger::level_for(false, 2), Level::Debug);
    }
}
