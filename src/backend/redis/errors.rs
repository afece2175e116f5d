//! Redis client errors translated into [`BackendError`]s: one line that says what
//! happened and what to do, naming the server as `host:port` only (never the URL,
//! which may hold a password). Part of [`super`].

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::backend::BackendError;

/// Translates a client error from the server at `at` (`host:port`).
pub fn describe(e: &RedisError, at: &str) -> BackendError {
    let detail = e.detail().unwrap_or("").trim();
    let refused = |what: &str| BackendError::Refused(format!("Redis at {at} {what}"));
    let auth = || {
        refused(&format!(
            "refused authentication: check the password or user ({detail})"
        ))
    };
    match e.kind() {
        ErrorKind::AuthenticationFailed => auth(),
        ErrorKind::Server(ServerErrorKind::NoPerm) => refused(&format!(
            "denied a command to this user: grant it EVAL, PUBLISH and SUBSCRIBE ({detail})"
        )),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown,
        ) => BackendError::Unavailable(format!(
            "Redis at {at} is not ready: {}",
            e.code().unwrap_or("error")
        )),
        ErrorKind::Server(_) if e.code() == Some("NOAUTH") || e.code() == Some("WRONGPASS") => {
            auth()
        }
        ErrorKind::Server(_)
        | ErrorKind::Extension
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Parse => refused(&format!(
            "answered with an error: {} {detail}",
            e.code().unwrap_or("")
        )),
        ErrorKind::InvalidClientConfig | ErrorKind::RESP3NotSupported => refused(&format!(
            "cannot be used: {}",
            if e.kind() == ErrorKind::RESP3NotSupported {
                "--wait needs Redis 6 or later"
            } else {
                "bad client configuration"
            }
        )),
        _ if is_tls_trust_error(e) => refused(&format!(
            "presented a certificate that is not trusted ({}): set LOCKRUN_TLS_CA to the CA that signed it",
            io_reason(e)
        )),
        _ => BackendError::Unavailable(format!("cannot reach Redis at {at}: {}", io_reason(e))),
    }
}

/// The operating-system reason of an I/O error, without addresses.
pub fn io_reason(e: &RedisError) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connection_refusal() {
        "connection refused".into()
    } else if e.is_connection_dropped() {
        "connection closed".into()
    } else {
        // The I/O error's own text: an OS or TLS reason, never the URL.
        e.to_string()
    }
}

/// True for a TLS handshake that failed on the server's certificate: retrying will
/// not help, and never falls back to plain text.
fn is_tls_trust_error(e: &RedisError) -> bool {
    let text = format!("{e}").to_ascii_lowercase();
    text.contains("certificate") || text.contains("unknownissuer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authentication_and_permission_errors_are_refusals() {
        let e = RedisError::from((ErrorKind::AuthenticationFailed, "auth", "bad".to_owned()));
        let d = describe(&e, "h:1");
        assert!(
            matches!(&d, BackendError::Refused(m) if m.starts_with("Redis at h:1 refused authentication")),
            "{d}"
        );
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            describe(&io, "h:1"),
            BackendError::Unavailable("cannot reach Redis at h:1: connection refused".into())
        );
    }
}
