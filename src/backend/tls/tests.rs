//! Unit tests of [`super`] (`backend::tls`).

use super::testing::*;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{AlertDescription, CertificateError};

use super::problem::rustls_problem;
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

/// A folder with two CAs, `a` (its server certificate for db.example and 127.0.0.1)
/// and `b` (its server certificate for db.example).
fn two_cas() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ca_and_server(dir.path(), "a", "DNS:db.example,IP:127.0.0.1");
    ca_and_server(dir.path(), "b", "DNS:db.example");
    dir
}

/// The webpki verifier that trusts the CA `ca` (its certificate `ca.pem` in `d`).
fn webpki_trusting(d: &std::path::Path, ca: &str) -> Arc<WebPkiServerVerifier> {
    let ca = std::fs::read(d.join(format!("{ca}.pem"))).unwrap();
    let store = root_store(Roots::Pem(&ca)).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .unwrap()
}

#[test]
fn chain_ignores_the_name_but_not_the_issuer_and_chain_and_name_checks_both() {
    let dir = two_cas();
    let d = dir.path();
    let full = webpki_trusting(d, "a");
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
}

#[test]
fn the_client_configuration_builds_for_every_check_and_refuses_a_key_not_its_own() {
    let dir = two_cas();
    let d = dir.path();
    let ca = std::fs::read(d.join("a.pem")).unwrap();
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
    let full = webpki_trusting(d, "a");
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
