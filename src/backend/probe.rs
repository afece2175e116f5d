//! Quick looks at a server's port when a connection fails the way a wrong scheme makes
//! it fail (TLS spoken to a plain port, or the other way round), so that the error line
//! can say which scheme the port speaks. Used only on those failure paths, never on a
//! working connection; every look is bounded by [`LOOK_TIME`]. Part of the backend
//! layer every backend may use; depends on tokio and rustls only.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one look may take in all.
pub const LOOK_TIME: Duration = Duration::from_secs(1);

/// Sends `hello` to `host`:`port` on a new connection and gives the first bytes of the
/// answer (up to `want`), if they come within [`LOOK_TIME`].
pub async fn first_bytes(host: &str, port: u16, hello: &[u8], want: usize) -> Option<Vec<u8>> {
    let look = async {
        let mut s = TcpStream::connect((host, port)).await.ok()?;
        s.write_all(hello).await.ok()?;
        let mut answer = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match s.read(&mut answer[got..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        answer.truncate(got);
        Some(answer).filter(|a| !a.is_empty())
    };
    tokio::time::timeout(LOOK_TIME, look).await.ok().flatten()
}

/// True when the server at `host`:`port` answers a TLS ClientHello with a TLS record
/// (a handshake message or an alert).
pub async fn speaks_tls(host: &str, port: u16) -> bool {
    let Some(hello) = client_hello() else {
        return false;
    };
    matches!(
        first_bytes(host, port, &hello, 1).await.as_deref(),
        Some([0x15 | 0x16])
    )
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
    async fn a_closed_port_answers_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        assert!(!speaks_tls("127.0.0.1", port).await);
        assert_eq!(first_bytes("127.0.0.1", port, b"PING\r\n", 1).await, None);
    }
}
