//! Unit tests of [`super`] (`backend::etcd::errors`).

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

/// A TLS refusal, the TLS files set (a CA, a client certificate), what the line must
/// say and what it must not.
type TlsCase = (rustls::Error, (bool, bool), &'static str, &'static str);

/// The TLS refusals of [`tls_failures_say_what_to_set`].
fn tls_cases() -> [TlsCase; 7] {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let name = C::NotValidForName;
    [
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
    ]
}

#[test]
fn tls_failures_say_what_to_set() {
    for (refused, tls, says, never) in tls_cases() {
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
