//! One ping: an HTTP/1.1 POST on a connection of its own, over TLS for `https://`,
//! through a proxy if one applies (CONNECT for `https://`, the absolute form for
//! `http://`). hyper's HTTP/1 client connection over tokio's TCP and tokio-rustls: all
//! already in the tree for tonic and redis (no second TLS stack, no OpenSSL, no
//! connection pool: two requests per run). Errors are words without the URL's path or
//! any password. Part of [`super`].

use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::proxy::Proxy;
use crate::config::PingUrl;

/// Sends `body` (JSON) to `target` (path and query) of `url`, through `proxy`, with
/// `tls` for an `https://` URL; `Ok` for a 2xx answer.
pub async fn post(
    url: &PingUrl,
    proxy: Option<&Proxy>,
    tls: Option<Arc<rustls::ClientConfig>>,
    target: &str,
    body: Vec<u8>,
) -> Result<(), String> {
    let (host, port) = match proxy {
        Some(p) => (p.host.as_str(), p.port),
        None => (url.bare_host(), url.port),
    };
    let via = || {
        proxy
            .map(|p| format!(" (proxy {})", p.origin()))
            .unwrap_or_default()
    };
    let mut tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect{}: {e}", via()))?;
    let _ = tcp.set_nodelay(true);
    let uri = match (proxy, url.tls) {
        // The absolute form, to an HTTP proxy.
        (Some(_), false) => format!("http://{}:{}{target}", url.host, url.port),
        _ => target.to_owned(),
    };
    let request = request(url, proxy, uri, body)?;
    let Some(config) = tls else {
        return exchange(tcp, request).await;
    };
    if let Some(p) = proxy {
        connect_tunnel(&mut tcp, url, p).await?;
    }
    let name = ServerName::try_from(url.bare_host().to_owned())
        .map_err(|_| "the host is not a name a certificate can have".to_owned())?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    exchange(stream, request).await
}

/// The POST of `body` to `uri`, with the headers `url` and `proxy` call for.
fn request(
    url: &PingUrl,
    proxy: Option<&Proxy>,
    uri: String,
    body: Vec<u8>,
) -> Result<hyper::Request<Full<Bytes>>, String> {
    let mut request = hyper::Request::post(uri)
        .header("host", host_header(url))
        .header("user-agent", concat!("lockrun/", env!("CARGO_PKG_VERSION")))
        .header("content-type", "application/json")
        .header("connection", "close");
    if let Some(basic) = &url.basic {
        request = request.header(
            "authorization",
            format!("Basic {}", base64(basic.as_bytes())),
        );
    }
    if let (Some(p), false) = (proxy, url.tls) {
        if let Some(basic) = &p.basic {
            request = request.header(
                "proxy-authorization",
                format!("Basic {}", base64(basic.as_bytes())),
            );
        }
    }
    request
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| "the URL makes no valid HTTP request".to_owned())
}

/// The `Host` header: the port only when it is not the scheme's.
fn host_header(url: &PingUrl) -> String {
    match (url.tls, url.port) {
        (true, 443) | (false, 80) => url.host.clone(),
        _ => format!("{}:{}", url.host, url.port),
    }
}

/// Sends `request` on `io` and reads the answer's status.
async fn exchange<S>(io: S, request: hyper::Request<Full<Bytes>>) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP error: {e}"))?;
    let answer = sender.send_request(request);
    tokio::pin!(conn, answer);
    // The connection may end (the server closing it) before the answer is taken.
    let response = tokio::select! {
        r = &mut answer => r,
        c = &mut conn => match c {
            Ok(()) => answer.await,
            Err(e) => return Err(format!("HTTP error: {e}")),
        },
    }
    .map_err(|e| format!("HTTP error: {e}"))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the server answered {status}"))
    }
}

/// Opens a tunnel through `proxy` to `url`'s host and port with CONNECT.
async fn connect_tunnel(tcp: &mut TcpStream, url: &PingUrl, proxy: &Proxy) -> Result<(), String> {
    let to = format!("{}:{}", url.host, url.port);
    let mut head = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n");
    if let Some(basic) = &proxy.basic {
        head.push_str(&format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64(basic.as_bytes())
        ));
    }
    head.push_str("\r\n");
    let who = proxy.origin();
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("proxy {who}: {e}"))?;
    // The answer's head, a byte at a time so that nothing of the tunnel is read.
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() > 8192 {
            return Err(format!("proxy {who}: an answer to CONNECT without end"));
        }
        match tcp.read_u8().await {
            Ok(b) => answer.push(b),
            Err(e) => return Err(format!("proxy {who} closed the connection: {e}")),
        }
    }
    let line = String::from_utf8_lossy(&answer);
    let status = line.split_whitespace().nth(1).unwrap_or_default();
    if status.starts_with('2') && line.starts_with("HTTP/1.") {
        Ok(())
    } else {
        let first = line
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .take(80)
            .collect::<String>();
        Err(format!("proxy {who} refused CONNECT: {first}"))
    }
}

/// Standard base64 with padding (RFC 4648), for Basic credentials.
fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:p@ss", "dXNlcjpwQHNz"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain}");
        }
    }
}
