//! A dead man's switch of the tests' own for `--ping`: an HTTP/1.1 server on a free
//! loopback port (plain, or TLS with a certificate of [`TlsFiles`]) that records every
//! request and answers 200, or accepts and never answers; and a CONNECT proxy that
//! records what it was asked and pipes the tunnel. Threads of std::net; every socket
//! closes when its owner is dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use super::{wait_until, TlsFiles};

/// One request the server read.
#[derive(Clone, Debug)]
pub struct PingRequest {
    /// `POST`.
    pub method: String,
    /// The request target as sent (origin or absolute form).
    pub target: String,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body, parsed as JSON (null if it is not).
    pub body: serde_json::Value,
}

impl PingRequest {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `rid` query parameter.
    pub fn rid(&self) -> &str {
        self.target.split("rid=").nth(1).unwrap_or_default()
    }
}

/// A recording HTTP server.
pub struct PingServer {
    port: u16,
    requests: Arc<Mutex<Vec<PingRequest>>>,
    /// Connections accepted (answered or not).
    accepted: Arc<Mutex<usize>>,
    /// Kept open (never answered) until the server is dropped.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

/// How the server answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `200 OK`.
    Ok,
    /// Read the request, then nothing, the connection left open.
    Never,
}

impl PingServer {
    /// A plain HTTP server.
    pub fn start(answer: Answer) -> PingServer {
        Self::start_with(answer, None)
    }

    /// A server over TLS with `tls`'s server certificate (for 127.0.0.1).
    pub fn start_tls(tls: &TlsFiles) -> PingServer {
        Self::start_with(Answer::Ok, Some(server_config(tls)))
    }

    fn start_with(answer: Answer, tls: Option<Arc<rustls::ServerConfig>>) -> PingServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the ping server");
        let port = listener.local_addr().unwrap().port();
        let server = PingServer {
            port,
            requests: Arc::default(),
            accepted: Arc::default(),
            held: Arc::default(),
        };
        let (requests, accepted, held) = (
            server.requests.clone(),
            server.accepted.clone(),
            server.held.clone(),
        );
        thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                *accepted.lock().unwrap() += 1;
                if answer == Answer::Never {
                    held.lock().unwrap().push(tcp);
                    continue;
                }
                let requests = requests.clone();
                let tls = tls.clone();
                thread::spawn(move || serve(tcp, tls, &requests));
            }
        });
        server
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The requests read so far.
    pub fn requests(&self) -> Vec<PingRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The connections accepted so far.
    pub fn accepted(&self) -> usize {
        *self.accepted.lock().unwrap()
    }

    /// Waits until `n` requests have been read; returns them.
    pub fn wait_requests(&self, n: usize) -> Vec<PingRequest> {
        wait_until(&format!("{n} pings"), Duration::from_secs(30), || {
            self.requests().len() >= n
        });
        self.requests()
    }
}

impl Drop for PingServer {
    fn drop(&mut self) {
        for tcp in self.held.lock().unwrap().drain(..) {
            let _ = tcp.shutdown(Shutdown::Both);
        }
        // Unblock the accept loop: it ends with the test process.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request on `tcp` (over TLS with `tls`), records it and answers 200.
fn serve(
    tcp: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    requests: &Mutex<Vec<PingRequest>>,
) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let mut stream: Box<dyn ReadWrite> = match tls {
        None => Box::new(tcp),
        Some(config) => {
            let conn = rustls::ServerConnection::new(config).expect("a TLS server connection");
            Box::new(rustls::StreamOwned::new(conn, tcp))
        }
    };
    let mut reader = BufReader::new(&mut stream);
    let Some(request) = read_request(&mut reader) else {
        return;
    };
    requests.lock().unwrap().push(request);
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK");
    let _ = stream.flush();
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

/// One request's head and body (by Content-Length).
fn read_request(reader: &mut impl BufRead) -> Option<PingRequest> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(PingRequest {
        method,
        target,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    })
}

/// A rustls server configuration with `tls`'s server certificate and key.
fn server_config(tls: &TlsFiles) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(tls.path("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls.path("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    Arc::new(config)
}

/// An HTTP CONNECT proxy that records each request's head and pipes the tunnel.
pub struct ConnectProxy {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    /// Starts it on a free loopback port.
    pub fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = heads.clone();
        thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let seen = seen.clone();
                thread::spawn(move || tunnel(tcp, &seen));
            }
        });
        ConnectProxy { port, heads }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The request heads received (request line and headers).
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// Serves one CONNECT: records the head, connects, answers 200 and pipes both ways.
fn tunnel(client: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    seen.lock().unwrap().push(head.clone());
    let to = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let Ok(mut upstream) = TcpStream::connect(&to) else {
        let _ = (&client).write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    let _ = (&client).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let mut up = upstream.try_clone().unwrap();
    let mut down = client.try_clone().unwrap();
    thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut up);
        let _ = up.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut upstream, &mut down);
    let _ = down.shutdown(Shutdown::Write);
}
