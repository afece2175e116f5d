//! TLS to PostgreSQL with rustls: tokio-postgres' TLS traits over the configuration
//! `target.rs` made from `sslmode` and the files ([`crate::backend::tls::client_config`]:
//! encrypt only, the chain, or the chain and the name of the host being connected to,
//! which tokio-postgres passes for each host it tries). `prefer` falls back to plain
//! text only when the server says it has no TLS at all; `require` never does
//! (tokio-postgres enforces both); a certificate that fails the check always fails the
//! connection.
//!
//! Channel binding (SCRAM-SHA-256-PLUS, `channel_binding`): `tls-server-end-point`
//! (RFC 5929 section 4.1), the hash of the server's end-entity certificate with the hash
//! of its signature algorithm, SHA-256 for MD5, SHA-1 and anything unknown, as
//! PostgreSQL computes it.
//!
//! Depends on tokio-postgres' TLS traits, tokio-rustls, rustls and ring's digests.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{InvalidDnsNameError, ServerName};
use rustls::ClientConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use super::target::PgTls;
use crate::backend::tls::tlv;

/// Makes rustls client sessions for tokio-postgres.
#[derive(Clone)]
pub struct MakeRustls(Arc<ClientConfig>);

impl MakeRustls {
    /// Sessions as `tls` says (see [`PgTls`]).
    pub fn new(tls: &PgTls) -> MakeRustls {
        MakeRustls(tls.config.clone())
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        Ok(RustlsConnect {
            config: self.0.clone(),
            server: ServerName::try_from(domain.to_owned())?,
        })
    }
}

/// One TLS handshake to come.
pub struct RustlsConnect {
    config: Arc<ClientConfig>,
    server: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            let tls = connector.connect(self.server, stream).await?;
            let end_point = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| server_end_point(cert.as_ref()));
            Ok(RustlsStream(Box::new(tls), end_point))
        })
    }
}

/// An established TLS session (boxed: rustls' state is large), with the server's
/// `tls-server-end-point`.
pub struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>, Option<Vec<u8>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        match &self.1 {
            Some(hash) => ChannelBinding::tls_server_end_point(hash.clone()),
            None => ChannelBinding::none(),
        }
    }
}

/// `tls-server-end-point` of a DER certificate: its hash with the digest of its
/// signature algorithm; SHA-256 for MD5, SHA-1, RSA-PSS, EdDSA and anything not read.
fn server_end_point(der: &[u8]) -> Vec<u8> {
    let algorithm = match signature_algorithm(der) {
        Some(oid) if SHA384.contains(&oid) => &ring::digest::SHA384,
        Some(oid) if SHA512.contains(&oid) => &ring::digest::SHA512,
        _ => &ring::digest::SHA256,
    };
    ring::digest::digest(algorithm, der).as_ref().to_vec()
}

/// The OIDs (DER contents) of sha384WithRSAEncryption and ecdsa-with-SHA384.
const SHA384: &[&[u8]] = &[
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c],
    &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],
];
/// The OIDs of sha512WithRSAEncryption and ecdsa-with-SHA512.
const SHA512: &[&[u8]] = &[
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d],
    &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],
];

/// The OID of a certificate's `signatureAlgorithm` (RFC 5280: `SEQUENCE { tbsCertificate
/// SEQUENCE, signatureAlgorithm SEQUENCE { OID, ... }, signature }`), or `None` where the
/// DER is not that.
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    let (tag, certificate, _) = tlv(der)?;
    if tag != 0x30 {
        return None;
    }
    let (_, _, rest) = tlv(certificate)?; // tbsCertificate
    let (tag, algorithm, _) = tlv(rest)?;
    if tag != 0x30 {
        return None;
    }
    match tlv(algorithm)? {
        (0x06, oid, _) => Some(oid),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;

    /// A self-signed certificate made with `openssl req -x509 -DIGEST`.
    fn self_signed(dir: &std::path::Path, digest: &str, key: &[&str]) -> Vec<u8> {
        let out = format!("{digest}.pem");
        let mut args = vec!["req", "-x509", "-nodes", "-days", "1", "-subj", "/CN=cb"];
        args.extend(key);
        let keyout = format!("{digest}.key");
        args.extend([digest, "-keyout", &keyout, "-out", &out]);
        crate::backend::tls::testing::openssl(dir, &args);
        CertificateDer::from_pem_file(dir.join(&out))
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn tls_server_end_point_hashes_with_the_signature_digest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        for (digest, len, key) in [
            ("-sha1", 32, &ec[..]),
            ("-sha256", 32, &ec[..]),
            ("-sha384", 48, &ec[..]),
            ("-sha512", 64, &["-newkey", "rsa:1024"][..]),
        ] {
            let der = self_signed(d, digest, key);
            let hash = server_end_point(&der);
            assert_eq!(hash.len(), len, "{digest}");
            let algorithm = match len {
                32 => &ring::digest::SHA256,
                48 => &ring::digest::SHA384,
                _ => &ring::digest::SHA512,
            };
            assert_eq!(
                hash,
                ring::digest::digest(algorithm, &der).as_ref(),
                "{digest}"
            );
        }
        assert_eq!(server_end_point(b"not DER").len(), 32);
        assert_eq!(signature_algorithm(&[0x30, 0x85, 1, 2, 3, 4, 5]), None);
    }
}
