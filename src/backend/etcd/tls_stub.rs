//! TEMPORARY stand-in for the shared TLS client configuration of `crate::backend::tls`
//! (branch pgtls), same API; removed by the merge.
#![allow(dead_code)]

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ConfigError;

/// How much of the server's certificate is checked.
pub enum ServerCheck {
    /// Encrypt only.
    EncryptOnly,
    /// The chain.
    Chain,
    /// The chain and the name.
    ChainAndName,
}

/// Which CAs are trusted.
pub enum Roots<'a> {
    /// The system's.
    System,
    /// A PEM file's.
    Pem(&'a [u8]),
}

/// A client configuration.
pub fn client_config(
    _check: ServerCheck,
    roots: Roots<'_>,
    client: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
    let bad = |w: &str| ConfigError::Backend(w.to_owned());
    let mut store = rustls::RootCertStore::empty();
    if let Roots::Pem(pem) = roots {
        for c in CertificateDer::pem_slice_iter(pem) {
            store
                .add(c.map_err(|_| bad("bad CA"))?)
                .map_err(|_| bad("bad CA"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| bad("tls"))?
        .with_root_certificates(store);
    let config = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad("bad cert"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| bad("bad key"))?;
            b.with_client_auth_cert(chain, key)
                .map_err(|_| bad("bad pair"))?
        }
    };
    Ok(Arc::new(config))
}

/// A refused certificate in a few words.
pub fn certificate_problem(_err: &(dyn std::error::Error + 'static)) -> Option<String> {
    None
}
