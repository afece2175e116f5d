//! TLS shared by the backends that speak it: the files named in the environment,
//! `LOCKRUN_TLS_CA` (a private CA to trust instead of the system roots),
//! `LOCKRUN_TLS_CERT` and `LOCKRUN_TLS_KEY` (a client certificate), all PEM files, read
//! once when the configuration is checked, so a missing file is a 125 before anything
//! starts ([`TlsFiles`]); the rustls client configuration for a server check of libpq's
//! strengths ([`client_config`]: encrypt only, the chain, the chain and the name); and
//! a refused certificate in a few words ([`certificate_problem`]). rustls with the ring
//! provider; the system roots through rustls-native-certs. Part of [`super`].

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore,
    SignatureScheme,
};

use crate::backend::url::UrlError;

/// The PEM contents of the files named in the environment.
#[derive(Clone, Default)]
pub struct TlsFiles {
    /// A private CA to trust instead of the system roots.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl TlsFiles {
    /// Reads the files named in the environment (`get` looks a variable up).
    pub fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<TlsFiles, UrlError> {
        let read = |var: &'static str| -> Result<Option<Vec<u8>>, UrlError> {
            match get(var).filter(|p| !p.is_empty()) {
                None => Ok(None),
                Some(path) => std::fs::read(&path)
                    .map(Some)
                    .map_err(|e| UrlError::TlsFile {
                        var,
                        path,
                        reason: e.kind().to_string(),
                    }),
            }
        };
        let client = match (read("LOCKRUN_TLS_CERT")?, read("LOCKRUN_TLS_KEY")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(UrlError::TlsHalfPair),
        };
        Ok(TlsFiles {
            ca: read("LOCKRUN_TLS_CA")?,
            client,
        })
    }
}

/// How much of the server's certificate is checked (libpq's `sslmode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerCheck {
    /// Nothing but the handshake's signature (libpq `require` without a root file):
    /// encrypted, not authenticated.
    EncryptOnly,
    /// The chain up to a trusted root, its dates and purpose; any name (libpq `verify-ca`).
    Chain,
    /// The chain and the host name, or an IP address against the certificate's IP
    /// addresses (RFC 6125; what Go and browsers do).
    ChainAndName,
    /// libpq's `verify-full`: [`ServerCheck::ChainAndName`], except that a certificate
    /// without a DNS name among its subject alternative names (nor, for an IP address,
    /// an IP address) may name the host in its subject's common name (CN), where
    /// `*.example.com` stands for one label.
    ChainAndNameOrCommonName,
}

/// Which CAs are trusted.
#[derive(Clone, Copy, Debug)]
pub enum Roots<'a> {
    /// The operating system's roots (rustls-native-certs: `/etc/ssl/certs` and
    /// `SSL_CERT_FILE` / `SSL_CERT_DIR` on Linux).
    System,
    /// The certificates of a PEM file.
    Pem(&'a [u8]),
}

/// A rustls client configuration (ring provider) that checks the server as `check`
/// says against `roots` (unused for [`ServerCheck::EncryptOnly`]) and, with `client`
/// (certificate chain and key, PEM), offers a client certificate. A file without a
/// certificate, a key that cannot be read or does not match, no system roots: a
/// one-line [`UrlError::Backend`].
pub fn client_config(
    check: ServerCheck,
    roots: Roots<'_>,
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<ClientConfig>, UrlError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| UrlError::Backend(format!("cannot set up TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        ServerCheck::EncryptOnly => Arc::new(EncryptOnly(provider.clone())),
        ServerCheck::Chain | ServerCheck::ChainAndName | ServerCheck::ChainAndNameOrCommonName => {
            let store = root_store(roots)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
                .build()
                .map_err(|e| UrlError::Backend(format!("cannot use the CA file: {e}")))?;
            match check {
                ServerCheck::Chain => Arc::new(AnyName(webpki, NameRule::Any)),
                ServerCheck::ChainAndNameOrCommonName => {
                    Arc::new(AnyName(webpki, NameRule::CommonName))
                }
                _ => webpki,
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = pem_certificates(cert)
                .map_err(|why| UrlError::Backend(format!("the client certificate file {why}")))?;
            if chain.is_empty() {
                return Err(UrlError::Backend(
                    "the client certificate file holds no PEM certificate".to_owned(),
                ));
            }
            // The reason is not shown: it could quote the key.
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
                UrlError::Backend(
                    "the client key file holds no usable private key (PEM: PKCS#8, PKCS#1 or SEC1)"
                        .to_owned(),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| match e {
                    rustls::Error::InconsistentKeys(_) => UrlError::Backend(
                        "the client key does not belong to the client certificate".to_owned(),
                    ),
                    rustls::Error::General(why) => UrlError::Backend(format!(
                        "the client key file holds no usable private key ({why})"
                    )),
                    _ => {
                        UrlError::Backend(format!("cannot use the client certificate and key: {e}"))
                    }
                })?
        }
    };
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (an empty list if it has none), or why not.
fn pem_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("is not PEM: {e}"))
}

/// The trust anchors of `roots`.
fn root_store(roots: Roots<'_>) -> Result<RootCertStore, UrlError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::Pem(pem) => {
            let certs = pem_certificates(pem)
                .map_err(|why| UrlError::Backend(format!("the CA file {why}")))?;
            if certs.is_empty() {
                return Err(UrlError::Backend(
                    "the CA file holds no PEM certificate".to_owned(),
                ));
            }
            for cert in certs {
                store.add(cert).map_err(|e| {
                    UrlError::Backend(format!(
                        "the CA file holds a certificate that cannot be a root: {e}"
                    ))
                })?;
            }
        }
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(UrlError::Backend(
                    "no system root certificates were found (install ca-certificates, or \
                     name a CA file)"
                        .to_owned(),
                ));
            }
        }
    }
    Ok(store)
}

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
fn rustls_problem(e: &rustls::Error) -> Option<(CertProblem, String)> {
    use CertProblem::*;
    const SERVER: &str = "the server's certificate";
    Some(match e {
        rustls::Error::InvalidCertificate(c) => match c {
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
        },
        rustls::Error::AlertReceived(alert) => match alert {
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
        },
        rustls::Error::NoCertificatesPresented => {
            (Other, "the server presented no certificate".to_owned())
        }
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
fn show_name(name: &ServerName<'_>) -> String {
    match name {
        ServerName::DnsName(d) => d.as_ref().to_owned(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

/// Checks the chain as [`WebPkiServerVerifier`] does but accepts any name (libpq
/// `verify-ca`), or a name in the common name where the alternative names have none
/// (libpq `verify-full`): webpki checks the chain (issuer, dates, purpose) before the
/// name, so a name error means the chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>, NameRule);

/// What [`AnyName`] accepts when the alternative names do not hold the host.
#[derive(Debug, PartialEq)]
enum NameRule {
    Any,
    CommonName,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.1 == NameRule::Any => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected,
                presented,
            })) if common_name_applies(&expected, &presented)
                && subject_common_name(end_entity)
                    .is_some_and(|cn| common_name_matches(&cn, &show_name(&expected))) =>
            {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// libpq's rule: the CN counts when the alternative names (`presented`, as webpki
/// shows them) hold no DNS name and, for an IP address, no IP address.
fn common_name_applies(expected: &ServerName<'_>, presented: &[String]) -> bool {
    let has = |kind: &str| presented.iter().any(|n| n.starts_with(kind));
    let is_ip = matches!(expected, ServerName::IpAddress(_));
    let hidden = has("DnsName(") || (is_ip && has("IpAddress("));
    !hidden
}

/// `cn` names `host`: equal, ignoring case, or `*.rest` with `host` one label more
/// than `rest`.
fn common_name_matches(cn: &str, host: &str) -> bool {
    match cn.strip_prefix("*.") {
        Some(rest) => host
            .split_once('.')
            .is_some_and(|(label, tail)| !label.is_empty() && tail.eq_ignore_ascii_case(rest)),
        None => cn.eq_ignore_ascii_case(host),
    }
}

/// The last common name (2.5.4.3) of a DER certificate's subject, if it is text.
fn subject_common_name(der: &[u8]) -> Option<String> {
    let (_, certificate, _) = tlv(der)?;
    let (_, tbs, _) = tlv(certificate)?;
    let mut rest = tbs;
    // [0] version (optional), serial, signature, issuer, validity, then the subject.
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (_, mut rdns, _) = tlv(rest)?;
    let mut found = None;
    while !rdns.is_empty() {
        let (_, set, next) = tlv(rdns)?;
        rdns = next;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, next) = tlv(atvs)?;
            atvs = next;
            let (oid_tag, oid, value) = tlv(atv)?;
            let (value_tag, text, _) = tlv(value)?;
            // UTF8String, PrintableString, T61String, IA5String.
            if oid_tag == 0x06
                && oid == [0x55, 0x04, 0x03]
                && [0x0c, 0x13, 0x14, 0x16].contains(&value_tag)
            {
                found = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    found
}

/// One DER element: its tag, its contents and what follows it (`None` where the DER
/// is cut short or longer than 4 GiB).
pub(crate) fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// Accepts any server certificate (libpq's `sslmode=require`) but checks that the
/// handshake was signed with the key of the certificate presented.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Throw-away certificates for the unit tests, made with the `openssl` command.
#[cfg(test)]
pub(crate) mod testing {
    /// Runs `openssl ARGS` in `dir`.
    pub(crate) fn openssl(dir: &std::path::Path, args: &[&str]) {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A CA (`NAME.pem`) and a server certificate it signed (`NAME-server.pem`,
    /// `.key`) for `san`, as EC keys (quick to make).
    pub(crate) fn ca_and_server(dir: &std::path::Path, name: &str, san: &str) {
        let ca_key = format!("{name}.key");
        let ca = format!("{name}.pem");
        let subject = format!("/CN=test CA {name}");
        let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subject];
        args.extend(EC);
        args.extend(["-keyout", &ca_key, "-out", &ca]);
        openssl(dir, &args);
        issue(
            dir,
            name,
            &format!("{name}-server"),
            "test server",
            &format!("subjectAltName={san}"),
        );
    }

    const EC: [&str; 5] = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];

    /// `FILE.pem` and `FILE.key`, from CA `ca` (made by [`ca_and_server`]), with the
    /// subject `/CN=CN` and the extension line `ext` (`""` for none).
    pub(crate) fn issue(dir: &std::path::Path, ca: &str, file: &str, cn: &str, ext: &str) {
        let (key, csr, pem) = (
            format!("{file}.key"),
            format!("{file}.csr"),
            format!("{file}.pem"),
        );
        let ext_file = format!("{file}.ext");
        std::fs::write(dir.join(&ext_file), format!("{ext}\n")).unwrap();
        let subject = format!("/CN={cn}");
        let mut args = vec!["req", "-subj", &subject];
        args.extend(EC);
        args.extend(["-keyout", &key, "-out", &csr]);
        openssl(dir, &args);
        let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
        let mut args = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &pem,
        ];
        if !ext.is_empty() {
            args.extend(["-extfile", &ext_file]);
        }
        openssl(dir, &args);
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn half_a_client_pair_is_refused_and_keys_are_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, "SECRET-KEY-MATERIAL").unwrap();
        let path = cert.display().to_string();
        let only_cert = |v: &str| (v == "LOCKRUN_TLS_CERT").then(|| path.clone());
        assert_eq!(
            TlsFiles::from_env(&only_cert).unwrap_err(),
            UrlError::TlsHalfPair
        );
        let both = |v: &str| v.starts_with("LOCKRUN_TLS_").then(|| path.clone());
        let files = TlsFiles::from_env(&both).unwrap();
        assert!(files.ca.is_some() && files.client.is_some());
        assert!(!format!("{files:?}").contains("SECRET"));
        let missing = |v: &str| (v == "LOCKRUN_TLS_CA").then(|| "/nonexistent/ca".to_owned());
        assert!(matches!(
            TlsFiles::from_env(&missing),
            Err(UrlError::TlsFile {
                var: "LOCKRUN_TLS_CA",
                ..
            })
        ));
    }

    fn cert(dir: &std::path::Path, file: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(dir.join(file)).unwrap()
    }

    #[test]
    fn chain_ignores_the_name_but_not_the_issuer_and_chain_and_name_checks_both() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        ca_and_server(d, "a", "DNS:db.example,IP:127.0.0.1");
        ca_and_server(d, "b", "DNS:db.example");
        let ca = std::fs::read(d.join("a.pem")).unwrap();
        let store = root_store(Roots::Pem(&ca)).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let full = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .unwrap();
        let any = AnyName(full.clone(), NameRule::Any);
        let good = cert(d, "a-server.pem");
        let stranger = cert(d, "b-server.pem");
        let now = UnixTime::now();
        let name = |n: &str| ServerName::try_from(n.to_owned()).unwrap();
        let check = |v: &dyn ServerCertVerifier, c: &CertificateDer<'_>, n: &str| {
            v.verify_server_cert(c, &[], &name(n), &[], now)
                .map(|_| ())
                .map_err(|e| rustls_problem(&e).unwrap().1)
        };
        assert_eq!(check(&*full, &good, "db.example"), Ok(()));
        assert_eq!(check(&*full, &good, "127.0.0.1"), Ok(()));
        let wrong = check(&*full, &good, "other.example").unwrap_err();
        assert!(
            wrong.ends_with(
                "not valid for the host name other.example (it names: db.example, 127.0.0.1)"
            ),
            "{wrong}"
        );
        let wrong_ip = check(&*full, &good, "127.0.0.2").unwrap_err();
        assert!(wrong_ip.contains("host name 127.0.0.2"), "{wrong_ip}");
        assert_eq!(check(&any, &good, "other.example"), Ok(()));
        assert_eq!(check(&any, &good, "127.0.0.2"), Ok(()));
        for v in [&*full as &dyn ServerCertVerifier, &any] {
            assert_eq!(
                check(v, &stranger, "db.example"),
                Err("the server's certificate is signed by an unknown CA".to_owned())
            );
        }
        // The public entry point builds for every check, with and without a client.
        let key = std::fs::read(d.join("b-server.key")).unwrap();
        let pem = std::fs::read(d.join("b-server.pem")).unwrap();
        for check in [
            ServerCheck::EncryptOnly,
            ServerCheck::Chain,
            ServerCheck::ChainAndName,
        ] {
            assert!(client_config(check, Roots::Pem(&ca), None).is_ok());
            assert!(client_config(check, Roots::Pem(&ca), Some((&pem, &key))).is_ok());
        }
        // A key that is not the certificate's.
        let other_key = std::fs::read(d.join("a-server.key")).unwrap();
        assert_eq!(
            client_config(
                ServerCheck::Chain,
                Roots::Pem(&ca),
                Some((&pem, &other_key))
            )
            .unwrap_err()
            .to_string(),
            "the client key does not belong to the client certificate"
        );
    }

    #[test]
    fn files_without_certificates_or_keys_are_one_line_without_their_contents() {
        let garbage = b"SECRET-KEY-MATERIAL\n".as_slice();
        let no_ca = client_config(ServerCheck::ChainAndName, Roots::Pem(garbage), None)
            .unwrap_err()
            .to_string();
        assert_eq!(no_ca, "the CA file holds no PEM certificate");
        let no_cert = client_config(
            ServerCheck::EncryptOnly,
            Roots::System,
            Some((garbage, garbage)),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            no_cert,
            "the client certificate file holds no PEM certificate"
        );
        let dir = tempfile::tempdir().unwrap();
        ca_and_server(dir.path(), "a", "DNS:x");
        let pem = std::fs::read(dir.path().join("a-server.pem")).unwrap();
        let bad_key = b"-----BEGIN PRIVATE KEY-----\nSECRETSECRET\n-----END PRIVATE KEY-----\n";
        let no_key = client_config(
            ServerCheck::EncryptOnly,
            Roots::System,
            Some((&pem, bad_key)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            no_key.starts_with("the client key file holds no usable private key"),
            "{no_key}"
        );
        assert!(!no_key.contains("SECRET") && !no_key.contains('\n'));
        // Encrypt-only never reads the roots; the system's are found (ca-certificates).
        assert!(client_config(ServerCheck::EncryptOnly, Roots::Pem(b""), None).is_ok());
        assert!(client_config(ServerCheck::ChainAndName, Roots::System, None).is_ok());
    }

    /// An error that wraps another, as tokio-postgres' does.
    #[derive(Debug)]
    struct Wrapper(Box<dyn std::error::Error + Send + Sync>);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error performing TLS handshake")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn certificate_problems_are_found_inside_io_errors_and_wrappers() {
        let wrapped = |e: rustls::Error| {
            Wrapper(Box::new(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                e,
            )))
        };
        let problem = |e: rustls::Error| certificate_problem(&wrapped(e));
        assert_eq!(
            problem(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            ))
            .unwrap(),
            "the server's certificate is signed by an unknown CA"
        );
        assert_eq!(
            problem(rustls::Error::InvalidCertificate(
                CertificateError::ExpiredContext {
                    time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(100)),
                    not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(50)),
                }
            ))
            .unwrap(),
            "the server's certificate has expired"
        );
        assert_eq!(
            problem(rustls::Error::AlertReceived(
                AlertDescription::CertificateRequired
            ))
            .unwrap(),
            "the server asked for a client certificate"
        );
        assert_eq!(
            problem(rustls::Error::AlertReceived(AlertDescription::UnknownCA)).unwrap(),
            "the server refused the client certificate"
        );
        assert_eq!(
            certificate_problem(&rustls::Error::InvalidCertificate(
                CertificateError::NotValidYet
            ))
            .unwrap(),
            "the server's certificate is not valid yet (check the clocks)"
        );
        assert_eq!(
            problem(rustls::Error::AlertReceived(
                AlertDescription::ProtocolVersion
            )),
            None
        );
        let plain = Wrapper(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(certificate_problem(&plain), None);
    }

    #[test]
    fn libpq_verify_full_reads_the_common_name_only_without_alternative_dns_names() {
        // An extension, so that the certificate is v3 (webpki refuses v1), but no SAN.
        const NO_SAN: &str = "basicConstraints=CA:FALSE";
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        ca_and_server(d, "a", "DNS:san.example");
        issue(d, "a", "cn-only", "db.example", NO_SAN);
        issue(d, "a", "cn-wild", "*.example.com", NO_SAN);
        issue(
            d,
            "a",
            "cn-and-san",
            "db.example",
            "subjectAltName=DNS:san.example",
        );
        issue(d, "a", "cn-ip", "127.0.0.1", NO_SAN);
        issue(
            d,
            "a",
            "cn-and-ip-san",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.2",
        );
        let ca = std::fs::read(d.join("a.pem")).unwrap();
        let store = root_store(Roots::Pem(&ca)).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let full = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
            .build()
            .unwrap();
        let libpq = AnyName(full.clone(), NameRule::CommonName);
        let ok = |v: &dyn ServerCertVerifier, file: &str, host: &str| {
            let name = ServerName::try_from(host.to_owned()).unwrap();
            v.verify_server_cert(&cert(d, file), &[], &name, &[], UnixTime::now())
                .is_ok()
        };
        assert!(ok(&libpq, "cn-only.pem", "db.example"));
        assert!(ok(&libpq, "cn-only.pem", "DB.Example"));
        assert!(
            !ok(&*full, "cn-only.pem", "db.example"),
            "RFC 6125 ignores the CN"
        );
        assert!(!ok(&libpq, "cn-only.pem", "other.example"));
        assert!(ok(&libpq, "cn-wild.pem", "a.example.com"));
        assert!(!ok(&libpq, "cn-wild.pem", "a.b.example.com"));
        assert!(!ok(&libpq, "cn-wild.pem", "example.com"));
        assert!(
            !ok(&libpq, "cn-and-san.pem", "db.example"),
            "a DNS SAN hides the CN"
        );
        assert!(ok(&libpq, "cn-and-san.pem", "san.example"));
        assert!(ok(&libpq, "cn-ip.pem", "127.0.0.1"));
        assert!(
            !ok(&libpq, "cn-and-ip-san.pem", "127.0.0.1"),
            "an IP SAN hides the CN"
        );
        assert!(ok(&libpq, "cn-and-ip-san.pem", "127.0.0.2"));
        // The chain is still checked.
        ca_and_server(d, "b", "DNS:x");
        issue(d, "b", "b-cn-only", "db.example", NO_SAN);
        assert!(!ok(&libpq, "b-cn-only.pem", "db.example"));
    }
}
