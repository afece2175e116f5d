//! etcd client errors ([`RpcError`]) translated into [`BackendError`]s: one line
//! naming the member as `host:port` only, and the few answers the backend branches on
//! (a lease that is gone, a request that never left). Part of [`super`].
//!
//! TLS (`etcds://`) has lines of its own, each saying what to set: the server's
//! certificate not signed by the CA trusted (the line says whether `LOCKRUN_TLS_CA` is
//! set), made for another name, expired; a client certificate demanded and not given,
//! or refused; and the wrong scheme for the port. Those need a look at the member
//! ([`explain`], through [`super::transport`]): `etcd://` at a TLS port and `etcds://`
//! at a plain one both end in a closed connection, and a client certificate refused
//! after a TLS 1.3 handshake reaches the gRPC call as text only. Those lines are in
//! `errors/tls.rs`; the refusals of authentication and permissions, which name the
//! user and the key prefix, in `errors/access.rs`.

mod access;
mod tls;

pub use access::{access_error, Access};
use tls::tls_line;

use super::rpc::RpcError;
use super::target::EtcdTarget;
use super::transport::{self, ConnectFailed};
use crate::backend::BackendError;

/// gRPC status codes (numbers fixed by the gRPC protocol).
mod code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// What a look at the member's port found, for the error line.
#[derive(Debug)]
pub enum Look {
    /// `etcd://`, and the port answers a TLS ClientHello.
    SpeaksTls,
    /// `etcds://`, and the port answers HTTP/2 without TLS.
    SpeaksPlain,
    /// `etcds://`, and a connection of its own failed with this TLS error.
    Refused(rustls::Error),
}

/// Translates a client error from member `at` (`host:port`) of `target` into one line,
/// after a look at the member when the error alone cannot tell the cause (see
/// [`Look`]). A look takes a second at most, and happens only on these failures of a
/// `fresh` connection (one that never had an answer: a connection that worked and
/// broke says nothing about the scheme or the TLS files).
pub async fn explain(e: &RpcError, target: &EtcdTarget, at: &str, fresh: bool) -> BackendError {
    if !fresh {
        return describe(e, target, at, None);
    }
    let look = match &target.tls {
        None if closed(e) => transport::speaks_tls(at).await.then_some(Look::SpeaksTls),
        Some(tls) if tls_cause(e).is_none() && (closed(e) || handshake_failed(e) || alert(e)) => {
            match transport::tls_refusal(tls.config.clone(), at).await {
                Some(refused) => Some(Look::Refused(refused)),
                None => transport::speaks_plain_h2(at)
                    .await
                    .then_some(Look::SpeaksPlain),
            }
        }
        _ => None,
    };
    describe(e, target, at, look.as_ref())
}

/// Translates a client error into one line naming the member as `host:port` only;
/// `look` is what a look at the member found, if one was made.
pub fn describe(e: &RpcError, target: &EtcdTarget, at: &str, look: Option<&Look>) -> BackendError {
    if let Some(line) = tls_line(e, target, at, look) {
        return BackendError::Refused(line);
    }
    match e {
        RpcError::Status(s) => {
            let io = io_reason(s);
            let message = match (&io, innermost(s)) {
                // tonic's own status for a broken connection says only "transport error".
                (None, Some(cause)) if cause != s.message() => {
                    format!("{} ({cause})", s.message())
                }
                _ => s.message().to_owned(),
            };
            status_error(s.code() as i32, &message, io, at)
        }
        RpcError::Transport(t) => BackendError::Unavailable(format!(
            "cannot reach etcd at {at}: {}",
            io_reason(t).unwrap_or_else(|| "transport error".into())
        )),
        RpcError::Invalid(what) => {
            BackendError::Refused(format!("etcd at {at} cannot be used: {what}"))
        }
        RpcError::Broken(what) => BackendError::Unavailable(format!("etcd at {at} failed: {what}")),
    }
}

/// The error at the top of `e`'s chain of causes, if it has one.
fn top(e: &RpcError) -> Option<&(dyn std::error::Error + 'static)> {
    match e {
        RpcError::Status(s) => Some(s),
        RpcError::Transport(t) => Some(t),
        RpcError::Invalid(_) | RpcError::Broken(_) => None,
    }
}

/// Each error in the chain of causes from `top`, looking inside I/O errors (whose own
/// `source()` skips the error they carry).
fn chain<'e>(
    top: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'e (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(top), |e| {
        match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        }
    })
}

/// rustls' error in `e`'s chain: the handshake of our connector keeps it.
fn tls_cause(e: &RpcError) -> Option<&rustls::Error> {
    chain(top(e)?).find_map(|c| c.downcast_ref::<rustls::Error>())
}

/// True when the connection was closed under the call (or the TLS handshake).
fn closed(e: &RpcError) -> bool {
    top(e).is_some_and(|t| io_reason(t).as_deref() == Some("connection closed"))
        || top(e).is_some_and(|t| chain(t).any(|c| c.to_string() == "connection closed"))
}

/// True when the server ended the connection with a TLS alert (known by its text only:
/// HTTP/2 keeps no more of an I/O error).
fn alert(e: &RpcError) -> bool {
    top(e).is_some_and(|t| chain(t).any(|c| c.to_string().contains("received fatal alert")))
}

/// True when our connector's TLS handshake failed.
fn handshake_failed(e: &RpcError) -> bool {
    top(e).is_some_and(|t| {
        chain(t).any(|c| matches!(c.downcast_ref(), Some(ConnectFailed::Handshake(_))))
    })
}

/// Classifies a gRPC status by its code and etcd's message.
fn status_error(code: i32, message: &str, io: Option<String>, at: &str) -> BackendError {
    let msg = message.trim().trim_start_matches("etcdserver: ");
    let refused = |what: String| BackendError::Refused(format!("etcd at {at} {what}"));
    match code {
        code::INVALID_ARGUMENT if msg.contains("authentication failed") => {
            refused("refused authentication: check the user and password".into())
        }
        code::FAILED_PRECONDITION if msg.contains("authentication is not enabled") => {
            refused("has authentication disabled: remove the user from the URL".into())
        }
        code::UNAUTHENTICATED | code::PERMISSION_DENIED => refused(format!(
            "denied access ({msg}): check the user and its role's permissions on the key prefix"
        )),
        // Our random lease ID was taken (odds 2^-63): the next try draws another.
        // Something that speaks HTTP/2 but is not etcd (a proxy, another service).
        _ if msg.contains("grpc-status header missing") => refused(format!(
            "did not answer as etcd does ({msg}): check the host and port"
        )),
        code::FAILED_PRECONDITION if msg.contains("lease already exists") => {
            BackendError::Unavailable(format!("etcd at {at}: {msg}"))
        }
        code::INVALID_ARGUMENT
        | code::FAILED_PRECONDITION
        | code::OUT_OF_RANGE
        | code::UNIMPLEMENTED => refused(format!("rejected a request: {msg}")),
        _ => BackendError::Unavailable(match io {
            Some(reason) => format!("cannot reach etcd at {at}: {reason}"),
            None => format!("etcd at {at} is not available: {msg}"),
        }),
    }
}

/// The operating-system reason somewhere in an error's chain, in a few words.
fn io_reason(top: &(dyn std::error::Error + 'static)) -> Option<String> {
    use std::io::ErrorKind as K;
    let mut timed_out = false;
    let mut cur = Some(top);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(match io.kind() {
                K::ConnectionRefused => "connection refused".into(),
                K::TimedOut => "timed out".into(),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
                    "connection closed".into()
                }
                _ => io.to_string(),
            });
        }
        let text = e.to_string();
        timed_out |= text.contains("timed out") || text.contains("timeout");
        cur = e.source();
    }
    timed_out.then(|| "timed out".into())
}

/// The message of the last error in `top`'s chain of causes, if it has any.
fn innermost(top: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = top.source()?;
    while let Some(next) = cause.source() {
        cause = next;
    }
    Some(cause.to_string())
}

/// True when the request cannot have reached the member: its connection was never
/// made. Such a call is safe to send to another member.
pub fn never_sent(e: &RpcError) -> bool {
    let top: &(dyn std::error::Error + 'static) = match e {
        RpcError::Status(s) => s,
        RpcError::Transport(t) => t,
        RpcError::Invalid(_) | RpcError::Broken(_) => return false,
    };
    let mut cur = Some(top);
    while let Some(e) = cur {
        // Our TLS connector: no request is sent before the handshake is done.
        if matches!(
            e.downcast_ref(),
            Some(ConnectFailed::Tcp(_) | ConnectFailed::Handshake(_))
        ) {
            return true;
        }
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        let text = e.to_string();
        if text.contains("tcp connect error") || text.contains("dns error") {
            return true;
        }
        cur = e.source();
    }
    false
}

/// True for etcd's answer that a lease does not exist (expired or revoked). A
/// keep-alive says so with a TTL of 0 instead.
pub fn is_lease_not_found(e: &RpcError) -> bool {
    match e {
        RpcError::Status(s) => s.message().contains("requested lease not found"),
        _ => false,
    }
}

/// True when `e` says a lease granted with our ID exists already (etcd's
/// `ErrGRPCLeaseExist`): a run record's week lease another lockrun granted first.
pub fn is_lease_exists(e: &RpcError) -> bool {
    match e {
        RpcError::Status(s) => s.message().contains("lease already exists"),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
