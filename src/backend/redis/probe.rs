//! Quick looks at a Redis port when a connection fails the way a wrong scheme makes it
//! fail, so that the error line can say which scheme the port speaks. Part of
//! [`super`]; used only on those failure paths, never on a working connection.
//!
//! - `redis://` at a TLS port: the server reads our plain command as a broken TLS
//!   record and closes the connection without a word. [`speaks_tls`] sends a TLS
//!   ClientHello on a connection of its own and looks at the first byte of the answer
//!   (the looks themselves are `backend/probe.rs`, shared with etcd).
//! - `rediss://` at a plain port: the server takes our ClientHello for the start of an
//!   inline command and waits for the rest of its line, for ever. When the handshake
//!   has not ended after [`SUSPECT_AFTER`], [`speaks_plain_redis`] sends `PING` on a
//!   connection of its own; a RESP answer (`+PONG`, `-NOAUTH ...`) settles it. Any other
//!   outcome leaves the handshake to go on.

use std::time::Duration;

use redis::ConnectionAddr;

use crate::backend::probe;

/// How long a TLS handshake may take before the port is looked at.
pub const SUSPECT_AFTER: Duration = Duration::from_millis(500);

/// The host and port of a TCP address (with or without TLS).
fn host_port(addr: &ConnectionAddr) -> Option<(&str, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) => Some((host, *port)),
        ConnectionAddr::TcpTls { host, port, .. } => Some((host, *port)),
        _ => None,
    }
}

/// True when the server at `addr` answers `PING` in plain RESP.
pub async fn speaks_plain_redis(addr: &ConnectionAddr) -> bool {
    let Some((host, port)) = host_port(addr) else {
        return false;
    };
    let answer = probe::first_bytes(host, port, b"PING\r\n", 1).await;
    matches!(answer.as_deref(), Some([b'+' | b'-']))
}

/// True when the server at `addr` answers a TLS ClientHello with a TLS record (a
/// handshake message or an alert).
pub async fn speaks_tls(addr: &ConnectionAddr) -> bool {
    match host_port(addr) {
        Some((host, port)) => probe::speaks_tls(host, port).await,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
