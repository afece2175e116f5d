//! The lines of a TLS failure (`etcds://`), each saying what to set, and of the wrong
//! scheme for the port. Part of [`super`].

use super::super::rpc::RpcError;
use super::super::target::EtcdTarget;
use super::{tls_cause, Look};
use crate::backend::tls::certificate_problem;

/// The line for a TLS failure, or for the wrong scheme for the port, if `e` (with
/// what `look` found) is one.
pub(super) fn tls_line(
    e: &RpcError,
    target: &EtcdTarget,
    at: &str,
    look: Option<&Look>,
) -> Option<String> {
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
