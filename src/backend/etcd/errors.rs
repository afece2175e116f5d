//! etcd client errors ([`RpcError`]) translated into [`BackendError`]s: one line
//! naming the member as `host:port` only, and the few answers the backend branches on
//! (a lease that is gone, a request that never left). Part of [`super`].

use super::rpc::RpcError;
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

/// Translates a client error into one line naming the member as `host:port` only.
pub fn describe(e: &RpcError, at: &str) -> BackendError {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified_by_code_and_message() {
        let refused = |code, msg| {
            matches!(
                status_error(code, msg, None, "h:1"),
                BackendError::Refused(_)
            )
        };
        let auth = "etcdserver: authentication failed, invalid user ID or password";
        assert!(refused(code::INVALID_ARGUMENT, auth));
        assert!(refused(
            code::PERMISSION_DENIED,
            "etcdserver: permission denied"
        ));
        assert!(refused(
            code::UNIMPLEMENTED,
            "grpc-status header missing, mapped from HTTP status code 404"
        ));
        assert!(!refused(14, "etcdserver: no leader"));
        assert!(!refused(
            code::FAILED_PRECONDITION,
            "etcdserver: lease already exists"
        ));
        let e = status_error(
            14,
            "transport error",
            Some("connection refused".into()),
            "h:1",
        );
        assert_eq!(
            e,
            BackendError::Unavailable("cannot reach etcd at h:1: connection refused".into())
        );
        let e = status_error(code::INVALID_ARGUMENT, auth, None, "h:1").to_string();
        assert!(e.starts_with("etcd at h:1 refused authentication"), "{e}");
    }

    #[test]
    fn a_broken_connection_is_described_by_its_cause() {
        let describe_chain = |cause: Box<dyn std::error::Error + Send + Sync>| {
            let transport = Chain("transport error", Some(cause));
            let status = tonic::Status::from_error(Box::new(transport));
            describe(&RpcError::Status(status), "h:1")
        };
        let h2 = Chain("connection error detected: frame with invalid size", None);
        let want = "etcd at h:1 is not available: transport error (connection error \
                    detected: frame with invalid size)";
        assert_eq!(
            describe_chain(Box::new(h2)),
            BackendError::Unavailable(want.into())
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let want = "cannot reach etcd at h:1: connection closed";
        assert_eq!(
            describe_chain(Box::new(reset)),
            BackendError::Unavailable(want.into())
        );
    }

    /// An error with a message and maybe a cause, as the transport's errors are.
    #[derive(Debug)]
    struct Chain(
        &'static str,
        Option<Box<dyn std::error::Error + Send + Sync>>,
    );

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static))
        }
    }
}
