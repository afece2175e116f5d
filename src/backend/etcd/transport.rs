//! How a member is reached over TLS (`etcds://`), and quick looks at a member's port
//! when a connection fails the way a wrong scheme makes it fail. Part of [`super`];
//! used by [`super::rpc`] (the connector) and [`super::errors`] (the looks).
//!
//! - [`TlsConnector`]: tonic's channel connects through it: TCP to the member, then a
//!   tokio-rustls handshake with the target's client configuration, the member's host
//!   as written being the name checked (an IP address against the certificate's IP
//!   SANs). Its errors ([`ConnectFailed`]) keep rustls' own error in their chain of
//!   causes, so that a refused certificate can be named.
//! - `etcd://` at a TLS port: etcd reads our HTTP/2 preface as a broken TLS record and
//!   closes the connection without a word. [`speaks_tls`] sends a TLS ClientHello on a
//!   connection of its own and looks at the first byte of the answer.
//! - `etcds://` at a plain port: etcd takes our ClientHello for neither HTTP/1 nor
//!   HTTP/2 and closes the connection, or waits for more. [`speaks_plain_h2`] sends
//!   the HTTP/2 preface on a connection of its own; an HTTP/2 SETTINGS frame settles it.
//!
//! - a refused client certificate: in TLS 1.3 it comes after the handshake, with the
//!   first answer, as text only; [`tls_refusal`] reads it on a connection of its own.
//!
//! The looks are made only on those failure paths, never on a working connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower_service::Service;

use crate::backend::probe;

/// Why a TLS connection to a member could not be made.
#[derive(Debug)]
pub enum ConnectFailed {
    /// The member's address is not `host:port`.
    Address,
    /// The TCP connection could not be made: nothing was sent.
    Tcp(std::io::Error),
    /// The TLS handshake failed (its cause: rustls' error, or the I/O error).
    Handshake(std::io::Error),
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectFailed::Address => f.write_str("the member's address is not host:port"),
            ConnectFailed::Tcp(e) => write!(f, "tcp connect error: {e}"),
            ConnectFailed::Handshake(e) => write!(f, "TLS handshake failed: {e}"),
        }
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectFailed::Address => None,
            ConnectFailed::Tcp(e) => Some(e),
            // io::Error's own source() skips the error it carries: hand out rustls'
            // error itself, so that the chain reaches it.
            ConnectFailed::Handshake(e) => match e.get_ref() {
                Some(inner) => Some(inner),
                None => Some(e),
            },
        }
    }
}

/// Connects tonic's channel to a member over TLS (a tower service of URIs).
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
}

impl TlsConnector {
    /// A connector with the client configuration of `etcds://` (ALPN `h2`).
    pub fn new(config: Arc<rustls::ClientConfig>) -> TlsConnector {
        TlsConnector { config }
    }
}

impl Service<Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = ConnectFailed;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectFailed>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectFailed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        Box::pin(async move {
            let (host, port) = host_port(&uri).ok_or(ConnectFailed::Address)?;
            let name = ServerName::try_from(host.clone()).map_err(|_| ConnectFailed::Address)?;
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(ConnectFailed::Tcp)?;
            // As tonic's own connector does: small gRPC frames go out at once.
            let _ = tcp.set_nodelay(true);
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(ConnectFailed::Handshake)?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// The host (without an IPv6 address's brackets) and port of `uri`.
fn host_port(uri: &Uri) -> Option<(String, u16)> {
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host.to_owned(), uri.port_u16()?))
}

/// The host and port of `member` (`host:port`, an IPv6 address in brackets).
fn member_host_port(member: &str) -> Option<(String, u16)> {
    let uri: Uri = format!("http://{member}").parse().ok()?;
    host_port(&uri)
}

/// True when `member` answers a TLS ClientHello with a TLS record (a handshake
/// message or an alert).
pub async fn speaks_tls(member: &str) -> bool {
    match member_host_port(member) {
        Some((host, port)) => probe::speaks_tls(&host, port).await,
        None => false,
    }
}

/// What a fresh TLS connection to `member` says when the handshake, or the first
/// answer after it, fails: rustls' error. In TLS 1.3 the server judges our client
/// certificate after our side of the handshake is done, so its refusal (an alert) comes
/// with the first answer, where HTTP/2 keeps only its text; here it is read at once.
/// `None` when the connection works, or cannot be made, or says nothing within
/// [`probe::LOOK_TIME`] (after the handshake, etcd sends its HTTP/2 SETTINGS at once).
pub async fn tls_refusal(config: Arc<rustls::ClientConfig>, member: &str) -> Option<rustls::Error> {
    let uri: Uri = format!("https://{member}").parse().ok()?;
    let look = async {
        let mut io = match TlsConnector::new(config).call(uri).await {
            Ok(io) => io.into_inner(),
            Err(ConnectFailed::Handshake(e)) => return rustls_error(&e),
            Err(_) => return None,
        };
        let mut byte = [0u8; 1];
        match io.read(&mut byte).await {
            Err(e) => rustls_error(&e),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(probe::LOOK_TIME, look)
        .await
        .ok()
        .flatten()
}

/// The rustls error an I/O error of tokio-rustls carries, if it carries one.
fn rustls_error(e: &std::io::Error) -> Option<rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>().cloned()
}

/// The client's HTTP/2 preface followed by an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// True when `member` answers the HTTP/2 preface without TLS with an HTTP/2 SETTINGS
/// frame (a 9-byte frame header of type 4), as a plain etcd port does.
pub async fn speaks_plain_h2(member: &str) -> bool {
    let Some((host, port)) = member_host_port(member) else {
        return false;
    };
    let answer = probe::first_bytes(&host, port, H2_PREFACE, 9).await;
    answer.is_some_and(|a| a.len() == 9 && a[3] == 0x04)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_taken_as_written_without_brackets() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(
            host_port(&uri("https://[::1]:2379")),
            Some(("::1".into(), 2379))
        );
        assert_eq!(
            host_port(&uri("https://etcd-0.example:2379")),
            Some(("etcd-0.example".into(), 2379))
        );
        assert_eq!(host_port(&uri("https://h")), None);
    }

    #[tokio::test]
    async fn a_closed_port_speaks_neither() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let member = format!("127.0.0.1:{port}");
        assert!(!speaks_tls(&member).await);
        assert!(!speaks_plain_h2(&member).await);
    }

    #[test]
    fn a_handshake_error_hands_out_rustls_error_as_its_cause() {
        use std::error::Error;
        let rustls_error = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls_error);
        let failed = ConnectFailed::Handshake(io);
        let cause = failed.source().unwrap();
        assert!(cause.downcast_ref::<rustls::Error>().is_some());
    }
}
