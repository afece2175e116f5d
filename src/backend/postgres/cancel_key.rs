//! The process id of a connection's cancel key, which tokio-postgres keeps to itself:
//! read from the cancel request it writes into memory ([`key_pid`]). Part of [`super`].

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Client;

/// The process id of `client`'s cancel key (BackendKeyData), which tokio-postgres keeps
/// to itself: read from the cancel request it writes, here into memory (nothing is
/// sent anywhere). None if it cannot be read.
pub(super) async fn key_pid(client: &Client) -> Option<i32> {
    let written = Arc::new(Mutex::new(Vec::new()));
    let capture = Capture {
        written: written.clone(),
        answered: false,
    };
    client
        .cancel_token()
        .cancel_query_raw(capture, Passthrough)
        .await
        .ok()?;
    let bytes = written
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    // The CancelRequest: length 16, code 80877102, process id, secret key (after an
    // SSLRequest of 8 bytes when the connection asked for TLS).
    let request = bytes.get(bytes.len().checked_sub(16)?..)?;
    let word =
        |i: usize| i32::from_be_bytes([request[i], request[i + 1], request[i + 2], request[i + 3]]);
    (word(0) == 16 && word(4) == 80_877_102).then(|| word(8))
}

/// A stream that keeps what is written to it and answers `S` (go ahead with TLS) to a
/// read: where the cancel request of [`key_pid`] goes.
struct Capture {
    written: Arc<Mutex<Vec<u8>>>,
    answered: bool,
}

impl AsyncRead for Capture {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !std::mem::replace(&mut self.answered, true) {
            buf.put_slice(b"S");
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        written.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl tokio_postgres::tls::TlsStream for Capture {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        tokio_postgres::tls::ChannelBinding::none()
    }
}

/// A "TLS" that is the stream itself, for [`Capture`] only.
struct Passthrough;

impl tokio_postgres::tls::TlsConnect<Capture> for Passthrough {
    type Stream = Capture;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Capture, std::io::Error>>;

    fn connect(self, stream: Capture) -> Self::Future {
        std::future::ready(Ok(stream))
    }
}
