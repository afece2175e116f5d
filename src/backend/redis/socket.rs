//! The socket under every Redis connection lockrun makes (a server's, a Cluster
//! node's, a Redlock member's, a Sentinel's, a waiter's subscription): TCP, then TLS
//! for `rediss://` with the files of the environment, counted by the reply
//! [`budget`](crate::backend::budget) in bytes and in lines (values). The client library would open its own socket,
//! without a bound on a reply's size; this one is handed to it instead. Part of
//! [`super`].

use std::pin::Pin;
use std::sync::Arc;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, RedisResult};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use crate::backend::budget::{Budgeted, Overrun, Stream, REPLY_LINES};
use crate::backend::tls::TlsFiles;

/// A counted socket to the server of `info`.
pub type Counted = Budgeted<Pin<Box<dyn Stream>>>;

/// A multiplexed connection to `info` over a socket counted by `overrun` (a fresh
/// one), with its driver spawned on the runtime.
pub async fn multiplexed(
    info: &ConnectionInfo,
    tls: Option<&TlsFiles>,
    config: AsyncConnectionConfig,
    overrun: &Overrun,
) -> RedisResult<MultiplexedConnection> {
    let stream = open(info, tls, overrun).await?;
    let (conn, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    tokio::spawn(driver);
    Ok(conn)
}

/// A pub/sub connection to `info` over a socket counted by `overrun` (a fresh one; a
/// message taken resets the count: see [`Overrun::reset`]).
pub async fn pubsub(
    info: &ConnectionInfo,
    tls: Option<&TlsFiles>,
    overrun: &Overrun,
) -> RedisResult<PubSub> {
    let stream = open(info, tls, overrun).await?;
    PubSub::new(info.redis_settings(), stream).await
}

/// Opens the socket of `info`: TCP to the first address of the host that accepts, then
/// TLS if `info` is a `rediss` address (checked against `tls`'s CA, or the system's
/// roots, with `tls`'s client certificate if any), as the client library would.
async fn open(
    info: &ConnectionInfo,
    tls: Option<&TlsFiles>,
    overrun: &Overrun,
) -> RedisResult<Counted> {
    let stream: Pin<Box<dyn Stream>> = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Box::pin(tcp(host, *port).await?),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            ..
        } => {
            if *insecure {
                return Err((ErrorKind::InvalidClientConfig, "#insecure is not supported").into());
            }
            let config = client_config(tls.cloned().unwrap_or_default())?;
            let name = ServerName::try_from(host.as_str())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?
                .to_owned();
            let tcp = tcp(host, *port).await?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            Box::pin(connector.connect(name, tcp).await?)
        }
        ConnectionAddr::Unix(path) => Box::pin(tokio::net::UnixStream::connect(path).await?),
        _ => return Err((ErrorKind::InvalidClientConfig, "unsupported address").into()),
    };
    Ok(Budgeted::new(stream, overrun).with_lines(REPLY_LINES))
}

/// TCP to `host:port`: each address in turn, the last error if none accepts.
async fn tcp(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "could not resolve to any addresses",
        )
    }))
}

/// The rustls configuration the client library would make: `tls`'s CA (else the
/// system's roots), `tls`'s client certificate if any, the provider installed.
fn client_config(tls: TlsFiles) -> RedisResult<rustls::ClientConfig> {
    let bad = |what: String| redis::RedisError::from(std::io::Error::other(what));
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| bad(format!("unable to parse the CA: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|_| bad("unable to parse TLS trust anchors".into()))?;
            }
        }
        None => {
            let mut native = rustls_native_certs::load_native_certs();
            if let Some(e) = native.errors.pop() {
                return Err(bad(e.to_string()));
            }
            for cert in native.certs {
                roots.add(cert)?;
            }
        }
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    Ok(match &tls.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("unable to parse the client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| bad(format!("unable to parse the client key: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                redis::RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "Unable to build client with TLS parameters provided.",
                    e.to_string(),
                ))
            })?
        }
    })
}
