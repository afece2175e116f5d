//! twemproxy (Debian's `nutcracker`) of the test's own in front of its `redis-server`s:
//! a proxy that speaks RESP2 only, refuses `HELLO` and pub/sub, and sends each `EVAL`
//! to the server of its first key. Its YAML configuration is written in the test's
//! scratch directory; it listens on a free 127.0.0.1 port (and its statistics on
//! another, so that tests can run side by side).

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{free_port, serial, RedisServer, WAIT};

/// Where Debian installs the binary (`/usr/sbin`, often not on a test's `PATH`).
const BINARIES: [&str; 2] = ["/usr/sbin/nutcracker", "nutcracker"];

/// A running `nutcracker`; killed on drop.
pub struct Nutcracker {
    port: u16,
    child: Child,
}

impl Nutcracker {
    /// Starts one pool over `servers` (hashing on the `{...}` hash tag, as lockrun's
    /// keys need when there are several), its configuration and log in `dir`, and
    /// waits until it answers `PING`.
    pub fn start(servers: &[&RedisServer], dir: &Path) -> Nutcracker {
        serial::side_by_side();
        let binary = BINARIES
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("nutcracker is not installed: apt-get install nutcracker");
        let mut last_err = String::new();
        // A free port can be taken by someone else before nutcracker binds it.
        for _ in 0..10 {
            let port = free_port();
            let config = dir.join(format!("nutcracker-{port}.yml"));
            fs::write(&config, yaml(port, servers)).expect("write nutcracker.yml");
            let mut child = Command::new(binary)
                .arg("--conf-file")
                .arg(&config)
                .arg("--output")
                .arg(dir.join(format!("nutcracker-{port}.log")))
                .arg("--stats-addr")
                .arg("127.0.0.1")
                .arg("--stats-port")
                .arg(free_port().to_string())
                .arg("--pid-file")
                .arg(dir.join(format!("nutcracker-{port}.pid")))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
            let start = Instant::now();
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let log = fs::read_to_string(dir.join(format!("nutcracker-{port}.log")));
                    last_err = format!("exited ({status}): {}", log.unwrap_or_default());
                    break;
                }
                if answers_ping(port) {
                    return Nutcracker { port, child };
                }
                if start.elapsed() > WAIT {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("nutcracker on port {port} did not answer PING");
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("could not start nutcracker: {last_err}");
    }

    /// `redis://127.0.0.1:PORT`: lockrun's URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One pool listening on `port` over `servers`, keys hashed on their `{...}` tag.
fn yaml(port: u16, servers: &[&RedisServer]) -> String {
    let mut y = format!(
        "lockrun:\n  listen: 127.0.0.1:{port}\n  hash: fnv1a_64\n  hash_tag: \"{{}}\"\n  \
         distribution: ketama\n  redis: true\n  auto_eject_hosts: false\n  servers:\n"
    );
    for (i, s) in servers.iter().enumerate() {
        y.push_str(&format!("   - 127.0.0.1:{}:1 server{i}\n", s.port()));
    }
    y
}

/// True when the proxy on `port` answers `PING` with `+PONG` (its backends are up).
fn answers_ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}
