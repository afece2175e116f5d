//! TLS shared by the backends that speak it: the files named in the environment,
//! `LOCKRUN_TLS_CA` (a private CA to trust instead of the system roots),
//! `LOCKRUN_TLS_CERT` and `LOCKRUN_TLS_KEY` (a client certificate), all PEM files, read
//! once when the configuration is checked, so a missing file is a 125 before anything
//! starts ([`TlsFiles`]); the rustls client configuration for a server check of libpq's
//! strengths ([`client_config`]: encrypt only, the chain, the chain and the name); and
//! a refused certificate in a few words ([`certificate_problem`]). rustls with the ring
//! provider; the system roots through rustls-native-certs. Part of [`super`]; the
//! checks rustls lacks are in `verify.rs`, the words for a refusal in `problem.rs`.

use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::backend::url::UrlError;
use verify::{AnyName, EncryptOnly, NameRule};

mod problem;
mod verify;

pub use problem::{certificate_problem, certificate_problem_kind, CertProblem};
pub(crate) use verify::tlv;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

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
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier(check, roots, provider)?);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let (chain, key) = client_identity(cert, key)?;
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

/// The check of the server's certificate that `check` asks for, against `roots`.
fn verifier(
    check: ServerCheck,
    roots: Roots<'_>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, UrlError> {
    Ok(match check {
        ServerCheck::EncryptOnly => Arc::new(EncryptOnly(provider)),
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
    })
}

/// The client certificate chain and key of PEM files `cert` and `key`.
fn client_identity(
    cert: &[u8],
    key: &[u8],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), UrlError> {
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
    Ok((chain, key))
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
