//! lockrun's own connect to PostgreSQL, as tokio-postgres' `Config::connect` does it
//! (each host of the URL in turn, or in random order with `load_balance_hosts=random`;
//! `hostaddr`, `connect_timeout`, `keepalives*`, `tcp_user_timeout`,
//! `target_session_attrs`), over sockets counted by the reply
//! [`budget`](crate::backend::budget): tokio-postgres would open its own, without a
//! bound on what the server sends (during the start-up it keeps every notice).
//! Part of [`super`].

use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, SimpleQueryMessage};

use crate::backend::budget::{Budgeted, Overrun, Stream};

/// A counted socket to a server.
pub type Counted = Budgeted<Pin<Box<dyn Stream>>>;

/// Why no connection was made.
pub enum ConnectError {
    /// The server (or the TLS handshake) refused, in tokio-postgres' words.
    Pg(tokio_postgres::Error),
    /// No socket could be opened.
    Socket(io::Error),
    /// The URL's hosts cannot be used as given.
    Config(String),
    /// The server is read-only, or not, against `target_session_attrs`.
    SessionAttrs(&'static str),
}

impl From<tokio_postgres::Error> for ConnectError {
    fn from(e: tokio_postgres::Error) -> Self {
        ConnectError::Pg(e)
    }
}

/// Connects as `config` says, with `tls` (sockets counted by `overrun`): the first
/// host that accepts and suits `target_session_attrs`, else the last host's error.
pub async fn connect<M>(
    config: &Config,
    mut tls: M,
    overrun: &Overrun,
) -> Result<(Client, Connection<Counted, M::Stream>), ConnectError>
where
    M: MakeTlsConnect<Counted>,
{
    let (hosts, ports) = (config.get_hosts(), config.get_ports());
    let mut order: Vec<usize> = (0..count(config)?).collect();
    if config.get_load_balance_hosts() == LoadBalanceHosts::Random {
        shuffle(&mut order);
    }
    let mut last = None;
    for i in order {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        // The host names the server for TLS; hostaddr, if given, is where to connect.
        let hostname = match hosts.get(i) {
            Some(Host::Tcp(name)) => name.clone(),
            _ => String::new(),
        };
        let stream = match open(config, i, port).await {
            Ok(stream) => Budgeted::new(stream, overrun),
            Err(e) => {
                last = Some(ConnectError::Socket(e));
                continue;
            }
        };
        let connector = tls
            .make_tls_connect(&hostname)
            .map_err(|e| ConnectError::Config(e.into().to_string()))?;
        match start(config, stream, connector).await {
            Ok(made) => return Ok(made),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ConnectError::Config("no host to connect to".into())))
}

/// How many hosts `config` names (with `host`, `hostaddr` or both), if it can be used.
fn count(config: &Config) -> Result<usize, ConnectError> {
    let (hosts, addrs, ports) = (
        config.get_hosts(),
        config.get_hostaddrs(),
        config.get_ports(),
    );
    let count = hosts.len().max(addrs.len());
    let bad = |why: &str| Err(ConnectError::Config(why.into()));
    if count == 0 {
        return bad("both host and hostaddr are missing");
    }
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return bad("as many hostaddr as hosts are needed");
    }
    if ports.len() > 1 && ports.len() != count {
        return bad("invalid number of ports");
    }
    Ok(count)
}

/// The socket of host `i` of `config` at `port`: its `hostaddr` if given, else its
/// name or Unix directory.
async fn open(config: &Config, i: usize, port: u16) -> io::Result<Pin<Box<dyn Stream>>> {
    match (config.get_hostaddrs().get(i), config.get_hosts().get(i)) {
        (Some(ip), _) => tcp(&ip.to_string(), port, config).await,
        (None, Some(Host::Tcp(name))) => tcp(name, port, config).await,
        (None, Some(Host::Unix(dir))) => unix(dir, port, config).await,
        (None, None) => Err(io::ErrorKind::InvalidInput.into()),
    }
}

/// The start-up on `stream`, then the `target_session_attrs` check.
async fn start<T>(
    config: &Config,
    stream: Counted,
    tls: T,
) -> Result<(Client, Connection<Counted, T::Stream>), ConnectError>
where
    T: tokio_postgres::tls::TlsConnect<Counted>,
{
    let (client, mut connection) = config.connect_raw(stream, tls).await?;
    let wanted = config.get_target_session_attrs();
    if wanted == TargetSessionAttrs::Any {
        return Ok((client, connection));
    }
    let read_only = tokio::select! {
        rows = client.simple_query("SHOW transaction_read_only") => rows?
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0).map(|v| v == "on"),
                _ => None,
            }),
        ended = &mut connection => {
            ended?;
            return Err(ConnectError::Socket(io::ErrorKind::UnexpectedEof.into()));
        }
    };
    match (wanted, read_only) {
        (TargetSessionAttrs::ReadWrite, Some(true)) => {
            Err(ConnectError::SessionAttrs("database does not allow writes"))
        }
        (TargetSessionAttrs::ReadOnly, Some(false)) => {
            Err(ConnectError::SessionAttrs("database is not read only"))
        }
        _ => Ok((client, connection)),
    }
}

/// TCP to `host:port`: each address in turn, within `connect_timeout` each.
async fn tcp(host: &str, port: u16, config: &Config) -> io::Result<Pin<Box<dyn Stream>>> {
    let addrs: Vec<_> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![(ip, port).into()],
        Err(_) => tokio::net::lookup_host((host, port)).await?.collect(),
    };
    let mut last = None;
    for addr in addrs {
        match within(config.get_connect_timeout(), TcpStream::connect(addr)).await {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                keepalives(&stream, config)?;
                return Ok(Box::pin(stream));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve any addresses",
        )
    }))
}

/// The Unix socket of `port` in `dir`, within `connect_timeout`.
async fn unix(dir: &Path, port: u16, config: &Config) -> io::Result<Pin<Box<dyn Stream>>> {
    let path = dir.join(format!(".s.PGSQL.{port}"));
    let stream = within(config.get_connect_timeout(), UnixStream::connect(path)).await?;
    Ok(Box::pin(stream))
}

/// `connecting`, within `timeout` if there is one.
async fn within<T>(
    timeout: Option<&Duration>,
    connecting: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    match timeout {
        None => connecting.await,
        Some(t) => tokio::time::timeout(*t, connecting)
            .await
            .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"))),
    }
}

/// The URL's `keepalives*` and `tcp_user_timeout` on `stream`.
fn keepalives(stream: &TcpStream, config: &Config) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let fd = stream.as_fd();
    let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    if let Some(t) = config.get_tcp_user_timeout() {
        let ms = u32::try_from(t.as_millis()).unwrap_or(u32::MAX);
        setsockopt(&fd, sockopt::TcpUserTimeout, &ms)?;
    }
    if !config.get_keepalives() {
        return Ok(());
    }
    setsockopt(&fd, sockopt::KeepAlive, &true)?;
    setsockopt(
        &fd,
        sockopt::TcpKeepIdle,
        &secs(config.get_keepalives_idle()),
    )?;
    if let Some(every) = config.get_keepalives_interval() {
        setsockopt(&fd, sockopt::TcpKeepInterval, &secs(every))?;
    }
    if let Some(count) = config.get_keepalives_retries() {
        setsockopt(&fd, sockopt::TcpKeepCount, &count)?;
    }
    Ok(())
}

/// Fisher-Yates with the OS's randomness.
fn shuffle(order: &mut [usize]) {
    for i in (1..order.len()).rev() {
        let j = (crate::token::random_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
}
