//! The byte budget of a ZooKeeper reply: the client library opens its own sockets
//! (async-net) and would buffer a frame of any announced length, so a hostile server,
//! or anyone in the middle of `zk://` (plain text), could grow lockrun to gigabytes
//! with one length prefix. Each server of the URL is reached instead through a relay
//! of lockrun's own on a loopback port: it passes the client's bytes on as they come,
//! and the server's frame by frame, closing the connection at a frame longer than
//! [`REPLY_BUDGET`] (ZooKeeper's own servers send none over 1 MB, their
//! `jute.maxbuffer`), and noting which server sent it. Part of [`super`].
//!
//! The relay's port takes connections from any local process, as the server's does;
//! it only ever connects to the server it stands for.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::backend::budget::REPLY_BUDGET;

/// The relays of one backend, one a server; stopped (every connection through them
/// closed) when dropped.
pub struct Relays {
    relays: Vec<Relay>,
}

/// The relay of one server.
struct Relay {
    /// The server as the URL gives it (`host:port`).
    server: String,
    /// Where the client connects instead.
    local: SocketAddr,
    /// Set once the server sent a frame over the budget.
    overrun: Arc<AtomicBool>,
    /// The accepting task; its connections end with it.
    task: JoinHandle<()>,
}

impl Relays {
    /// A relay for each of `servers` (`host:port`), on free loopback ports.
    pub async fn start(servers: &[String]) -> io::Result<Relays> {
        let mut relays = Vec::with_capacity(servers.len());
        for server in servers {
            let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
            let local = listener.local_addr()?;
            let overrun = Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(accept(listener, server.clone(), overrun.clone()));
            relays.push(Relay {
                server: server.clone(),
                local,
                overrun,
                task,
            });
        }
        Ok(Relays { relays })
    }

    /// The connect string for the client: the relays, then `chroot`.
    pub fn connect_string(&self, chroot: &str) -> String {
        let hosts: Vec<String> = self.relays.iter().map(|r| r.local.to_string()).collect();
        format!("{}{chroot}", hosts.join(","))
    }

    /// The first server that sent a frame over the budget, if any.
    pub fn overrun(&self) -> Option<&str> {
        self.relays
            .iter()
            .find(|r| r.overrun.load(Ordering::Relaxed))
            .map(|r| r.server.as_str())
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        for r in &self.relays {
            r.task.abort();
        }
    }
}

/// Takes the client's connections to the relay of `server`, each relayed by a task
/// that ends with this one.
async fn accept(listener: TcpListener, server: String, overrun: Arc<AtomicBool>) {
    let mut conns = JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        // Reap the connections that ended, so the set does not grow.
        while conns.try_join_next().is_some() {}
        conns.spawn(relay(client, server.clone(), overrun.clone()));
    }
}

/// Relays one connection: the client's bytes as they come, the server's frame by
/// frame; either side's end (or an error, or a frame over the budget) closes both.
async fn relay(client: TcpStream, server: String, overrun: Arc<AtomicBool>) {
    let Ok(upstream) = TcpStream::connect(server.as_str()).await else {
        return;
    };
    let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = upstream.into_split();
    tokio::select! {
        _ = tokio::io::copy(&mut from_client, &mut to_server) => {}
        _ = frames(&mut from_server, &mut to_client, &overrun) => {}
    }
}

/// Passes the server's frames on (a 4-byte length, then as many bytes) until a frame
/// announces more than the budget: then notes it and stops.
async fn frames(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    overrun: &AtomicBool,
) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut len = [0u8; 4];
        from.read_exact(&mut len).await?;
        let Some(mut left) = usize::try_from(i32::from_be_bytes(len))
            .ok()
            .filter(|&n| n <= REPLY_BUDGET)
        else {
            overrun.store(true, Ordering::Relaxed);
            return Err(io::ErrorKind::InvalidData.into());
        };
        to.write_all(&len).await?;
        while left > 0 {
            let room = left.min(buf.len());
            let n = from.read(&mut buf[..room]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            to.write_all(&buf[..n]).await?;
            left -= n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_pass_whole_and_one_over_the_budget_stops_the_relay() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut input = Vec::new();
            for body in [&b"abc"[..], &[7u8; 70_000]] {
                input.extend_from_slice(&(body.len() as i32).to_be_bytes());
                input.extend_from_slice(body);
            }
            let expected = input.clone();
            input.extend_from_slice(&i32::MAX.to_be_bytes());
            input.extend_from_slice(b"never passed on");
            let over = AtomicBool::new(false);
            let mut out = Vec::new();
            let ended = frames(&mut input.as_slice(), &mut out, &over).await;
            assert!(ended.is_err());
            assert!(over.load(Ordering::Relaxed));
            assert_eq!(out, expected);
        });
    }
}
