//! A refused certificate in a few words: what rustls said about it, told as the
//! problem to fix ([`CertProblem`]). Part of [`super`].

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, CertificateError};

/// What was wrong with a certificate in a TLS handshake ([`certificate_problem_kind`]),
/// for the hint that goes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertProblem {
    /// The server's certificate is not from a trusted CA.
    UnknownIssuer,
    /// The server's certificate does not name the host connected to.
    WrongName,
    /// The server's certificate has expired or is not valid yet.
    Dates,
    /// The server wants a client certificate and none was given.
    ClientCertWanted,
    /// The server refused the client certificate.
    ClientCertRefused,
    /// Anything else about the server's certificate.
    Other,
}

/// The server's refused certificate (or our refused client certificate) found in the
/// source chain of `err`, in a few words; `None` when no certificate was refused.
pub fn certificate_problem(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    certificate_problem_kind(err).map(|(_, words)| words)
}

/// [`certificate_problem`], with its kind.
pub fn certificate_problem_kind(
    err: &(dyn std::error::Error + 'static),
) -> Option<(CertProblem, String)> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = as_rustls(e).and_then(rustls_problem) {
            return Some(found);
        }
        // io::Error's source() skips the error it wraps: look inside first.
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => match as_rustls(inner) {
                Some(tls) => return rustls_problem(tls),
                None => Some(inner),
            },
            None => e.source(),
        };
    }
    None
}

fn as_rustls<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    e.downcast_ref::<rustls::Error>()
}

/// The words for a rustls error about a certificate, if it is one.
pub(super) fn rustls_problem(e: &rustls::Error) -> Option<(CertProblem, String)> {
    match e {
        rustls::Error::InvalidCertificate(c) => Some(server_problem(c)),
        rustls::Error::AlertReceived(alert) => client_problem(*alert),
        rustls::Error::NoCertificatesPresented => Some((
            CertProblem::Other,
            "the server presented no certificate".to_owned(),
        )),
        _ => None,
    }
}

/// The words for the server's certificate, refused here.
fn server_problem(c: &CertificateError) -> (CertProblem, String) {
    use CertProblem::*;
    const SERVER: &str = "the server's certificate";
    match c {
        CertificateError::UnknownIssuer => {
            (UnknownIssuer, format!("{SERVER} is signed by an unknown CA"))
        }
        CertificateError::NotValidForNameContext { expected, presented } => {
            let names = if presented.is_empty() {
                "none".to_owned()
            } else {
                presented
                    .iter()
                    .map(|n| plain_name(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            (
                WrongName,
                format!(
                    "{SERVER} is not valid for the host name {} (it names: {names})",
                    show_name(expected)
                ),
            )
        }
        CertificateError::NotValidForName => {
            (WrongName, format!("{SERVER} is not valid for the host name"))
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            (Dates, format!("{SERVER} has expired"))
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            (Dates, format!("{SERVER} is not valid yet (check the clocks)"))
        }
        CertificateError::Revoked => (Other, format!("{SERVER} has been revoked")),
        CertificateError::BadSignature => (
            UnknownIssuer,
            format!(
                "{SERVER} has a signature its trusted CA did not make (another CA of the same name?)"
            ),
        ),
        CertificateError::BadEncoding => (Other, format!("{SERVER} cannot be decoded")),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => (
            Other,
            format!("{SERVER} is not for a TLS server (its extended key usage)"),
        ),
        other => (Other, format!("{SERVER} was refused: {other:?}")),
    }
}

/// The words for the server's alert about our client certificate, if it is one.
fn client_problem(alert: AlertDescription) -> Option<(CertProblem, String)> {
    use CertProblem::*;
    Some(match alert {
        AlertDescription::CertificateRequired => (
            ClientCertWanted,
            "the server asked for a client certificate".to_owned(),
        ),
        AlertDescription::UnknownCA
        | AlertDescription::BadCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::AccessDenied => (
            ClientCertRefused,
            "the server refused the client certificate".to_owned(),
        ),
        AlertDescription::CertificateExpired => (
            ClientCertRefused,
            "the server refused the client certificate: it has expired".to_owned(),
        ),
        AlertDescription::CertificateRevoked => (
            ClientCertRefused,
            "the server refused the client certificate: it has been revoked".to_owned(),
        ),
        _ => return None,
    })
}

/// A name rustls presents as `DnsName("x")` or `IpAddress(1.2.3.4)`, as typed.
fn plain_name(presented: &str) -> &str {
    ["DnsName(\"", "IpAddress("]
        .iter()
        .find_map(|p| presented.strip_prefix(p))
        .map_or(presented, |rest| {
            rest.trim_end_matches(')').trim_end_matches('"')
        })
}

/// A server name as typed.
pub(super) fn show_name(name: &ServerName<'_>) -> String {
    match name {
        ServerName::DnsName(d) => d.as_ref().to_owned(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}
