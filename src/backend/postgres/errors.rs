//! What PostgreSQL's and the client's errors mean for a lock: [`BackendError::Unavailable`]
//! (may pass: retry) or [`BackendError::Refused`] (will not pass: give up), in one line
//! that names the server as `host:port` only, never the URL (it may hold a password).
//! Depends on tokio-postgres' error types only.

use crate::backend::BackendError;

/// Translates a client error into a one-line message that names the server as
/// `host:port` only (never the URL, which may hold a password).
pub(super) fn describe(e: &tokio_postgres::Error, at: &str, table: &str) -> BackendError {
    let refused = |what: String| BackendError::Refused(format!("PostgreSQL at {at} {what}"));
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        let msg = db.message().replace('\n', " ");
        return match code {
            c if c.starts_with("28") => refused(format!(
                "refused authentication: check the user and password ({msg})"
            )),
            "3D000" => refused(format!("has no such database ({msg})")),
            "42501" => refused(format!("denied access to the lock table {} ({msg})", table)),
            "3F000" => refused(format!(
                "has no schema for the lock table {} ({msg})",
                table
            )),
            "25006" => BackendError::Unavailable(format!(
                "PostgreSQL at {at} is read-only (a standby?): use the primary, or \
                 target_session_attrs=read-write with several hosts ({msg})"
            )),
            "55P03" | "57014" => {
                BackendError::Unavailable(format!("PostgreSQL at {at} is busy: {msg}"))
            }
            c if ["08", "40", "53", "57", "58"]
                .iter()
                .any(|p| c.starts_with(p)) =>
            {
                BackendError::Unavailable(format!("PostgreSQL at {at} is not ready: {msg}"))
            }
            c if c.starts_with("42") => refused(format!(
                "rejected a statement on {}: is it a lockrun table? ({msg})",
                table
            )),
            _ => refused(format!("answered with an error: {code} {msg}")),
        };
    }
    let kind = e.to_string();
    let reason = reason(e);
    if kind.contains("TLS") && !reason.is_io {
        return refused(format!("failed the TLS handshake: {}", reason.text));
    }
    if kind.contains("authentication") {
        return refused(format!(
            "asked for a password that was not given or not accepted: set LOCKRUN_PASSWORD or --password-file ({})",
            reason.text
        ));
    }
    if kind.contains("configuration") {
        return refused(format!("cannot be used: {}", reason.text));
    }
    BackendError::Unavailable(format!("cannot reach PostgreSQL at {at}: {}", reason.text))
}

/// Why a client error happened, in words, and whether the operating system said so.
struct Reason {
    text: String,
    is_io: bool,
}

/// The innermost cause of `e`: an OS reason without addresses where there is one.
fn reason(e: &tokio_postgres::Error) -> Reason {
    use std::error::Error as _;
    use std::io::ErrorKind;
    let mut source = e.source();
    let mut last = None;
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let text = match io.kind() {
                ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                ErrorKind::TimedOut => "timed out".to_owned(),
                ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof => "connection closed".to_owned(),
                _ => match io.get_ref() {
                    Some(inner) => inner.to_string(),
                    None => io.to_string(),
                },
            };
            // A TLS failure wrapped in an I/O error is not a network problem.
            let is_io = io.get_ref().is_none() || io.kind() != ErrorKind::InvalidData;
            return Reason { text, is_io };
        }
        last = Some(s.to_string());
        source = s.source();
    }
    let text = match last {
        Some(cause) => format!("{e}: {cause}"),
        None if e.is_closed() => "connection closed".to_owned(),
        None => e.to_string(),
    };
    Reason {
        text: text.replace('\n', " "),
        is_io: e.is_closed(),
    }
}
