//! Quick looks at a Redis port when a connection fails the way a wrong scheme makes it
//! fail, so that the error line can say which scheme the port speaks. Part of
//! [`super`]; used only on those failure paths, never on a working connection.
//!
//! - `redis://` at a TLS port: the server reads our plain command as a broken TLS
//!   record and closes the connection without a word. [`speaks_tls`] sends a TLS
//!   ClientHello on a connection of its own and looks at the first byte of the answer.
//! - `rediss://` at a plain port: the server takes our ClientHello for the start of an
//!   inline command and waits for the rest of its line, for ever. When the handshake
//!   has not ended after [`SUSPECT_AFTER`], [`speaks_plain_redis`] sends `PING` on a
//!   connection of its own; a RESP answer (`+PONG`, `-NOAUTH ...`) settles it. Any other
//!   outcome leaves the handshake to go on.

use std::sync::Arc;
use std::time::Duration;

use redis::ConnectionAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a TLS handshake may take before the port is looked at.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(500);

/// How long one look may take in all.
const LOOK_TIME: Duration = Duration::from_secs(1);

/// The host and port of a TCP address (with or without TLS).
fn host_port(addr: &ConnectionAddr) -> Option<(&str, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) => Some((host, *port)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host, *port)),
        _ => None,
    }
}

/// Sends `hello` to `addr` on a new connection and gives the first byte of the
/// answer, if one comes within [`LOOK_TIME`].
async fn first_byte(addr: &ConnectionAddr, hello: &[u8]) -> Option<u8> {
    let (host, port) = host_port(addr)?;
    let look = async {
        let mut s = TcpStream::connect((host, port)).await.ok()?;
        s.write_all(hello).await.ok()?;
        let mut byte = [0u8; 1];
        match s.read(&mut byte).await {
            Ok(1) => Some(byte[0]),
            _ => None,
        }
    };
    tokio::time::timeout(LOOK_TIME, look).await.ok().flatten()
}

/// True when the server at `addr` answers `PING` in plain RESP.
pub async fn speaks_plain_redis(addr: &ConnectionAddr) -> bool {
    matches!(first_byte(addr, b"PING\r\n").await, Some(b'+' | b'-'))
}

/// True when the server at `addr` answers a TLS ClientHello with a TLS record (a
/// handshake message or an alert).
pub async fn speaks_tls(addr: &ConnectionAddr) -> bool {
    let Some(hello) = client_hello() else {
        return false;
    };
    matches!(first_byte(addr, &hello).await, Some(0x15 | 0x16))
}

/// The bytes of a TLS ClientHello. No certificate is ever checked: the look ends at the
/// first byte of the answer.
fn client_hello() -> Option<Vec<u8>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).ok()?;
    Some(hello)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_hello_is_a_tls_handshake_record() {
        let hello = client_hello().unwrap();
        assert_eq!(hello[0], 0x16, "a handshake record");
        assert_eq!(hello[1], 0x03, "TLS 1.x");
    }

    #[tokio::test]
    async fn a_closed_port_speaks_neither() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let addr = ConnectionAddr::Tcp("127.0.0.1".into(), port);
        assert!(!speaks_plain_redis(&addr).await);
        assert!(!speaks_tls(&addr).await);
    }
}
