//! A byte budget per reply on a backend's connection: [`Budgeted`] wraps the socket
//! (below TLS, if any) and counts the bytes read since the last request was written;
//! past [`REPLY_BUDGET`] its reads fail, so the client library drops the connection
//! instead of buffering a reply without end (a hostile server, or anyone in the middle
//! of a plain connection, could otherwise grow lockrun to gigabytes within one request
//! timeout). The [`Overrun`] flag it shares tells the backend why the connection died,
//! for its one line. Depends on tokio's I/O traits only.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket as client libraries take it (TCP, Unix, or TLS over either).
pub trait Stream: AsyncRead + AsyncWrite + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Send + Sync> Stream for T {}

/// The most a server may send in answer to one request: 1 MiB. The largest legitimate
/// reply is a status of `--slots 1000` (a thousand holders of a few hundred bytes each,
/// about 300 KiB); ZooKeeper's own servers refuse frames over 1 MB (`jute.maxbuffer`).
/// A client library may take several times a reply's size while parsing it (a Redis
/// integer of 4 bytes on the wire is a value of some 50), so 1 MiB keeps a hostile
/// reply well under lockrun's 64 MiB.
pub const REPLY_BUDGET: usize = 1 << 20;

/// The budget in words, for messages.
pub const REPLY_BUDGET_WORDS: &str = "1 MiB";

/// The most lines (`\n`) a Redis reply may hold: each value of RESP takes one line at
/// least, and a client library's value takes some 50 bytes, so a megabyte of tiny
/// values (`:1\r\n`) would take 25 MiB or more to parse, times the servers of a Redlock
/// quorum. A status of `--slots 1000` takes some 15,000 lines.
pub const REPLY_LINES: usize = 1 << 16;

/// Set once a connection read more than its budget; shared by the connection's
/// [`Budgeted`] stream and the backend that reads its errors.
#[derive(Clone, Debug, Default)]
pub struct Overrun {
    over: Arc<AtomicBool>,
    read: Arc<AtomicUsize>,
    lines: Arc<AtomicUsize>,
}

impl Overrun {
    /// True once the connection went over its budget.
    pub fn happened(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Starts the count afresh: a reply (a pushed message) has been taken whole.
    pub fn reset(&self) {
        self.read.store(0, Ordering::Relaxed);
        self.lines.store(0, Ordering::Relaxed);
    }
}

/// A stream whose reads fail once more than [`REPLY_BUDGET`] bytes (or more lines than
/// its line budget) came in since the last write (or [`Overrun::reset`]).
pub struct Budgeted<S> {
    inner: S,
    overrun: Overrun,
    max_lines: usize,
}

impl<S> Budgeted<S> {
    /// `inner`, counted; `overrun` (a fresh one) tells whether it went over.
    pub fn new(inner: S, overrun: &Overrun) -> Budgeted<S> {
        Budgeted {
            inner,
            overrun: overrun.clone(),
            max_lines: usize::MAX,
        }
    }

    /// This stream, failing also past `max_lines` lines in one reply.
    pub fn with_lines(self, max_lines: usize) -> Budgeted<S> {
        Budgeted { max_lines, ..self }
    }
}

/// The error a read over budget fails with.
fn over_budget() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("a reply larger than {REPLY_BUDGET_WORDS}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.overrun.happened() {
            return Poll::Ready(Err(over_budget()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = &buf.filled()[before..];
            let (got, lines) = (new.len(), new.iter().filter(|&&b| b == b'\n').count());
            let read = self.overrun.read.fetch_add(got, Ordering::Relaxed) + got;
            let lines = self.overrun.lines.fetch_add(lines, Ordering::Relaxed) + lines;
            if read > REPLY_BUDGET || lines > self.max_lines {
                self.overrun.over.store(true, Ordering::Relaxed);
                // What was read is not handed on: the connection is over.
                buf.set_filled(before);
                return Poll::Ready(Err(over_budget()));
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                // A request went out: its reply has a budget of its own.
                self.overrun.reset();
            }
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn reads_fail_past_the_budget_and_a_write_starts_it_afresh() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (near, mut far) = tokio::io::duplex(64 * 1024);
            let overrun = Overrun::default();
            let mut near = Budgeted::new(near, &overrun);
            let chunk = vec![b'x'; 64 * 1024];
            let mut buf = vec![0u8; 64 * 1024];
            // Just the budget, then a request: the next reply may be as long again.
            for _ in 0..2 {
                let mut left = REPLY_BUDGET;
                while left > 0 {
                    far.write_all(&chunk).await.unwrap();
                    left -= near.read_exact(&mut buf).await.unwrap();
                }
                near.write_all(b"next request").await.unwrap();
                far.read_exact(&mut [0u8; 12]).await.unwrap();
            }
            assert!(!overrun.happened());
            let mut left = REPLY_BUDGET;
            while left > 0 {
                far.write_all(&chunk).await.unwrap();
                left -= near.read_exact(&mut buf).await.unwrap();
            }
            far.write_all(b"y").await.unwrap();
            let err = near.read(&mut buf).await.unwrap_err();
            assert!(err.to_string().contains("larger than 1 MiB"), "{err}");
            assert!(overrun.happened());
        });
    }

    #[test]
    fn reads_fail_past_the_line_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (near, mut far) = tokio::io::duplex(64 * 1024);
            let overrun = Overrun::default();
            let mut near = Budgeted::new(near, &overrun).with_lines(3);
            let mut buf = [0u8; 64];
            far.write_all(b":1\r\n:1\r\n:1\r\n").await.unwrap();
            near.read_exact(&mut buf[..12]).await.unwrap();
            far.write_all(b":1\r\n").await.unwrap();
            assert!(near.read(&mut buf).await.is_err());
            assert!(overrun.happened());
        });
    }
}
