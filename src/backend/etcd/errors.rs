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

// ---------------------------------------------------------------------------------
// Authentication and permissions (issue 13 item 5): lines that name the user, the key
// prefix and the fix. Kept apart from `describe` (which knows only the member).

/// Who asks, for the lines of [`access_error`]: the user (none without credentials)
/// and the key prefix its role needs.
#[derive(Clone, Copy, Debug)]
pub struct Access<'a> {
    /// The user of the URL, if any (never its password).
    pub user: Option<&'a str>,
    /// `--key-prefix`.
    pub prefix: &'a str,
}

/// The line for an authentication or permission refusal of member `at`, naming the
/// user, the prefix and the fix; `None` for any other error (see [`describe`]).
pub fn access_error(e: &RpcError, at: &str, who: Access<'_>) -> Option<BackendError> {
    let RpcError::Status(s) = e else {
        return None;
    };
    let msg = s.message().trim().trim_start_matches("etcdserver: ");
    let code = s.code() as i32;
    let user = who.user.unwrap_or_default();
    let line = match code {
        code::INVALID_ARGUMENT if msg.contains("user name is empty") => format!(
            "etcd at {at} has authentication enabled and no user was given: use \
             etcd://USER@{at} with the password in --password-file or LOCKRUN_PASSWORD"
        ),
        code::INVALID_ARGUMENT if msg.contains("authentication failed") => format!(
            "etcd at {at} refused authentication as user {user:?}: check the user name and \
             its password (--password-file, LOCKRUN_PASSWORD or the URL)"
        ),
        code::FAILED_PRECONDITION if msg.contains("authentication is not enabled") => format!(
            "etcd at {at} has authentication disabled, yet user {user:?} was given: remove \
             the user and password from the URL (or turn authentication on: etcdctl auth enable)"
        ),
        code::PERMISSION_DENIED => {
            let asker = match who.user {
                Some(u) => format!("user {u:?}"),
                None => "lockrun".to_owned(),
            };
            format!(
                "etcd at {at} denied {asker} access to the keys under the prefix {:?} ({msg}): \
                 grant its role readwrite on them: etcdctl role grant-permission ROLE \
                 --prefix=true readwrite {}",
                who.prefix,
                shell_quote(who.prefix)
            )
        }
        _ => return None,
    };
    Some(BackendError::Refused(line))
}

/// `s` quoted for a POSIX shell: in single quotes, each `'` written `'\''`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod access_tests {
    use super::*;

    fn status(code: tonic::Code, msg: &str) -> RpcError {
        RpcError::Status(tonic::Status::new(code, msg))
    }

    /// Each refusal, as etcd words it, and what its line must say.
    #[test]
    fn each_refusal_names_its_cause_and_fix_in_one_line() {
        use tonic::Code;
        let app = Access {
            user: Some("app"),
            prefix: "team's:",
        };
        let none = Access {
            user: None,
            prefix: "lockrun:",
        };
        let cases: [(RpcError, Access<'_>, &[&str]); 5] = [
            (
                status(Code::InvalidArgument, "etcdserver: user name is empty"),
                none,
                &[
                    "authentication enabled",
                    "no user",
                    "etcd://USER@h:1",
                    "LOCKRUN_PASSWORD",
                ],
            ),
            (
                status(
                    Code::InvalidArgument,
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                app,
                &["refused authentication", "\"app\"", "password"],
            ),
            (
                status(
                    Code::FailedPrecondition,
                    "etcdserver: authentication is not enabled",
                ),
                app,
                &["authentication disabled", "\"app\"", "remove the user"],
            ),
            (
                status(Code::PermissionDenied, "etcdserver: permission denied"),
                app,
                &[
                    "user \"app\"",
                    "prefix \"team's:\"",
                    r"etcdctl role grant-permission ROLE --prefix=true readwrite 'team'\''s:'",
                ],
            ),
            (
                status(Code::PermissionDenied, "etcdserver: permission denied"),
                none,
                &["denied lockrun", "readwrite 'lockrun:'"],
            ),
        ];
        for (e, who, want) in cases {
            let Some(BackendError::Refused(line)) = access_error(&e, "h:1", who) else {
                panic!("{e:?} is not an access refusal")
            };
            assert!(!line.contains('\n'), "{line}");
            for w in want {
                assert!(line.contains(w), "{line:?} lacks {w:?}");
            }
        }
        for other in [
            status(Code::Unavailable, "etcdserver: no leader"),
            status(Code::FailedPrecondition, "etcdserver: lease already exists"),
            RpcError::Broken("x".into()),
        ] {
            assert_eq!(access_error(&other, "h:1", app), None);
        }
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
