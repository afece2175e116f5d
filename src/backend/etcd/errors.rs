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
//! after a TLS 1.3 handshake reaches the gRPC call as text only.

use super::rpc::RpcError;
use super::target::EtcdTarget;
use super::transport::{self, ConnectFailed};
use crate::backend::tls::certificate_problem;
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

/// The line for a TLS failure, or for the wrong scheme for the port, if `e` (with
/// what `look` found) is one.
fn tls_line(e: &RpcError, target: &EtcdTarget, at: &str, look: Option<&Look>) -> Option<String> {
    let tls = target.tls.as_ref();
    let refused = match look {
        Some(Look::SpeaksTls) => {
            return Some(format!(
                "etcd at {at} speaks TLS on that port: use etcds:// (and LOCKRUN_TLS_CA for a \
                 private CA)"
            ))
        }
        Some(Look::SpeaksPlain) => {
            return Some(format!(
                "etcd at {at} answers without TLS on that port: use etcd:// for it, or \
                 etcds:// with a port where etcd serves TLS (an https:// URL of its \
                 --listen-client-urls)"
            ))
        }
        Some(Look::Refused(r)) => r,
        None => tls_cause(e)?,
    };
    let private_ca = tls.is_some_and(|t| t.private_ca);
    let client_cert = tls.is_some_and(|t| t.client_cert);
    let problem = certificate_problem(refused).unwrap_or_else(|| format!("TLS failed ({refused})"));
    let fix = match refused {
        rustls::Error::InvalidCertificate(c) => certificate_fix(c, private_ca),
        rustls::Error::AlertReceived(alert) => match alert_line(*alert, client_cert, at) {
            Some(line) => return Some(line),
            None => "check etcd's TLS settings (--cipher-suites)",
        },
        _ => "check that the port is etcd's, and its TLS settings",
    };
    Some(format!("etcd at {at}: {problem}: {fix}"))
}

/// What to do about the server's certificate refused for `c`; `private_ca`:
/// `LOCKRUN_TLS_CA` is set.
fn certificate_fix(c: &rustls::CertificateError, private_ca: bool) -> &'static str {
    use rustls::CertificateError as C;
    match c {
        // A CA of the same name as the one that signed it: a bad signature.
        C::UnknownIssuer | C::BadSignature if private_ca => {
            "LOCKRUN_TLS_CA is not that CA: point LOCKRUN_TLS_CA at the CA that signed \
             etcd's --cert-file"
        }
        C::UnknownIssuer | C::BadSignature => {
            "set LOCKRUN_TLS_CA to the CA that signed it (no CA of this system did)"
        }
        C::NotValidForName | C::NotValidForNameContext { .. } => {
            "connect by a name or address the certificate holds, or give etcd a certificate \
             for this one"
        }
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            "renew the server's certificate (or set this machine's clock)"
        }
        _ => "check the server's certificate (etcd's --cert-file)",
    }
}

/// The line for the server's alert, if it is about our client certificate or the lack
/// of one (`client_cert`: one was given). A TLS 1.2 server says HandshakeFailure when
/// none was sent.
fn alert_line(alert: rustls::AlertDescription, client_cert: bool, at: &str) -> Option<String> {
    use rustls::AlertDescription as A;
    let about_ours = matches!(
        alert,
        A::CertificateRequired
            | A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA
            | A::AccessDenied
            | A::DecryptError
    ) || (alert == A::HandshakeFailure && !client_cert);
    match (about_ours, client_cert) {
        (false, _) => None,
        (true, false) => Some(format!(
            "etcd at {at} demands a client certificate: set LOCKRUN_TLS_CERT and \
             LOCKRUN_TLS_KEY to one signed by a CA it trusts (its --trusted-ca-file)"
        )),
        (true, true) => Some(format!(
            "etcd at {at} did not accept the client certificate of LOCKRUN_TLS_CERT \
             ({alert:?}): use one signed by a CA it trusts (its --trusted-ca-file)"
        )),
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
            describe(&RpcError::Status(status), &target(None), "h:1", None)
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

    /// A target of one member, `h:1`, with TLS (`Some((private_ca, client_cert))`) or not.
    fn target(tls: Option<(bool, bool)>) -> EtcdTarget {
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        EtcdTarget {
            members: vec!["h:1".into()],
            credentials: None,
            tls: tls.map(|(private_ca, client_cert)| super::super::target::EtcdTls {
                config: std::sync::Arc::new(config),
                private_ca,
                client_cert,
            }),
        }
    }

    /// The error of our connector when the handshake failed with `refused`.
    fn handshake(refused: rustls::Error) -> RpcError {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refused);
        let failed = ConnectFailed::Handshake(io);
        RpcError::Status(tonic::Status::from_error(Box::new(failed)))
    }

    #[test]
    fn tls_failures_say_what_to_set() {
        use rustls::{AlertDescription as A, CertificateError as C, Error as E};
        let name = C::NotValidForName;
        let cases: [(E, (bool, bool), &str, &str); 7] = [
            (
                E::InvalidCertificate(C::UnknownIssuer),
                (false, false),
                "set LOCKRUN_TLS_CA",
                "point",
            ),
            (
                E::InvalidCertificate(C::UnknownIssuer),
                (true, false),
                "point LOCKRUN_TLS_CA at",
                "set LOCKRUN_TLS_CA",
            ),
            (
                E::InvalidCertificate(name),
                (true, false),
                "a name or address the certificate holds",
                "LOCKRUN_TLS_CA",
            ),
            (
                E::InvalidCertificate(C::Expired),
                (true, false),
                "renew the server's certificate",
                "LOCKRUN_TLS_CA",
            ),
            (
                E::AlertReceived(A::CertificateRequired),
                (true, false),
                "demands a client certificate: set LOCKRUN_TLS_CERT",
                "LOCKRUN_TLS_CA",
            ),
            (
                E::AlertReceived(A::HandshakeFailure),
                (true, false),
                "demands a client certificate",
                "LOCKRUN_TLS_CA",
            ),
            (
                E::AlertReceived(A::BadCertificate),
                (true, true),
                "did not accept the client certificate of LOCKRUN_TLS_CERT",
                "LOCKRUN_TLS_CA",
            ),
        ];
        for (refused, tls, says, never) in cases {
            let what = format!("{refused:?} {tls:?}");
            let e = describe(&handshake(refused.clone()), &target(Some(tls)), "h:1", None);
            let BackendError::Refused(line) = e else {
                panic!("{what}: not refused: {e:?}")
            };
            assert!(line.starts_with("etcd at h:1"), "{what}: {line}");
            assert!(line.contains(says), "{what}: {says:?} in {line}");
            assert!(!line.contains(never), "{what}: {never:?} in {line}");
            // Found by a look of its own (a refusal after a TLS 1.3 handshake): the same.
            let closed = RpcError::Broken("closed".into());
            let look = Look::Refused(refused);
            let by_look = describe(&closed, &target(Some(tls)), "h:1", Some(&look));
            assert_eq!(by_look, BackendError::Refused(line), "{what}");
        }
    }

    #[test]
    fn the_wrong_scheme_for_the_port_names_the_right_one() {
        let closed = RpcError::Broken("closed".into());
        let e = describe(&closed, &target(None), "h:1", Some(&Look::SpeaksTls));
        assert_eq!(
            e,
            BackendError::Refused(
                "etcd at h:1 speaks TLS on that port: use etcds:// (and LOCKRUN_TLS_CA for a \
                 private CA)"
                    .into()
            )
        );
        let e = describe(
            &closed,
            &target(Some((true, true))),
            "h:1",
            Some(&Look::SpeaksPlain),
        );
        let line = e.to_string();
        assert!(
            line.contains("answers without TLS on that port: use etcd://"),
            "{line}"
        );
    }

    #[test]
    fn a_failed_handshake_or_tcp_connection_sent_nothing() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert!(never_sent(&handshake(refused)));
        let tcp = ConnectFailed::Tcp(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(never_sent(&RpcError::Status(tonic::Status::from_error(
            Box::new(tcp)
        ))));
        let h2 = Chain("connection error detected: frame with invalid size", None);
        assert!(!never_sent(&RpcError::Status(tonic::Status::from_error(
            Box::new(h2)
        ))));
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
