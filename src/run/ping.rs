//! `--ping URL`: a dead man's switch in the healthchecks.io style, pinged by the run
//! that holds the lock: `URL/start?rid=RID` as the command starts, `URL/STATUS?rid=RID`
//! when it ends (STATUS = lockrun's exit status, RID a UUID v4 of the run), each a POST
//! with a short JSON body (lock, host, fencing token, slot; the exit status and the
//! duration at the end). Busy, skipped and refused runs, and runs whose command never
//! started, ping nothing.
//!
//! A ping never waits in the way: the start ping is a task of its own on the runtime,
//! sent once the command runs; the lease machine never waits on it (the runtime has one
//! thread: what could block it, reading the system's roots and resolving names, runs on
//! tokio's blocking threads). The end ping is sent after the lock was released, after
//! the start ping is done (healthchecks pairs them by RID, in order), and both give up
//! [`PING_TIME`] after the command ended, or at once on a signal. A failed ping is one
//! warning line (`ping_failed`) showing `scheme://host:port/` and no more; it never
//! changes the exit status. Part of [`super`].

mod http;
mod proxy;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

use super::policy::Taken;
use crate::config::{PingUrl, RunConfig};
use crate::log::{emit, Event, Level};
use crate::supervisor::Signals;
use crate::units::ms;
use proxy::proxy_for;

/// How long a ping may take, and the end ping after the command ended.
pub(super) const PING_TIME: Duration = Duration::from_secs(10);

/// What both pings of a run share.
struct Shared {
    url: PingUrl,
    rid: String,
    /// The body's fields common to both pings.
    about: serde_json::Map<String, serde_json::Value>,
    /// The TLS client configuration, made once (off the runtime's thread).
    tls: OnceCell<Arc<rustls::ClientConfig>>,
}

/// The pings of one run whose command started.
pub(super) struct Pinger {
    shared: Arc<Shared>,
    start: JoinHandle<()>,
    started: Instant,
}

impl Pinger {
    /// Sends the start ping in a task of its own, if `--ping` was given; call it once
    /// the command runs (`started`: just before it was started).
    pub fn start(cfg: &RunConfig, taken: &Taken, started: Instant) -> Option<Pinger> {
        let url = cfg.ping.clone()?;
        let host = nix::unistd::gethostname()
            .map_or_else(|_| "unknown".into(), |h| h.to_string_lossy().into_owned());
        let mut about = serde_json::Map::new();
        about.insert("lock".into(), cfg.name.as_str().into());
        about.insert("host".into(), host.into());
        about.insert("fencing_token".into(), taken.fencing_token.into());
        about.insert("slot".into(), taken.slot.into());
        let shared = Arc::new(Shared {
            url,
            rid: uuid_v4(),
            about,
            tls: OnceCell::new(),
        });
        let body = serde_json::Value::Object(shared.about.clone());
        let task = shared.clone();
        let start = tokio::spawn(async move {
            let deadline = Instant::now() + PING_TIME;
            task.send("start", body, deadline).await;
        });
        Some(Pinger {
            shared,
            start,
            started,
        })
    }

    /// Sends the end ping with lockrun's exit status `code` (the start ping done
    /// first), giving up [`PING_TIME`] from now, or at once on a signal.
    pub async fn end(self, code: u8, signals: &mut Signals) {
        let deadline = Instant::now() + PING_TIME;
        let mut body = self.shared.about.clone();
        body.insert("exit_status".into(), code.into());
        let took = self.started.elapsed();
        body.insert("duration_ms".into(), (took.as_millis() as u64).into());
        let shared = self.shared.clone();
        let mut start = self.start;
        let pings = async move {
            if timeout_at(deadline, &mut start).await.is_err() {
                start.abort();
            }
            shared.send(&code.to_string(), body.into(), deadline).await;
        };
        tokio::select! {
            () = pings => {}
            _ = signals.recv_forwardable() => {
                let msg = format!(
                    "did not ping {} (exit status {code}): interrupted by a signal",
                    self.shared.url.origin()
                );
                warn(&msg, "end", "interrupted");
            }
        }
    }
}

impl Shared {
    /// Sends one ping, `what` being `start` or the exit status; a failure is logged.
    async fn send(&self, what: &str, body: serde_json::Value, deadline: Instant) {
        let target = self.url.target(what, &self.rid);
        let attempt = async {
            let proxy = proxy_for(&self.url, &|v| std::env::var(v).ok())?;
            let tls = match self.url.tls {
                true => Some(self.tls_config().await?),
                false => None,
            };
            http::post(
                &self.url,
                proxy.as_ref(),
                tls,
                &target,
                body.to_string().into_bytes(),
            )
            .await
        };
        let why = match timeout_at(deadline, attempt).await {
            Ok(Ok(())) => return,
            Ok(Err(why)) => why,
            Err(_) => format!("no answer within {}", ms(PING_TIME)),
        };
        let ping = if what == "start" { "start" } else { "end" };
        let msg = format!(
            "could not ping {} ({ping} of the run): {why}; the exit status is not changed",
            self.url.origin()
        );
        warn(&msg, ping, &why);
    }

    /// The TLS client configuration: the system's roots and `LOCKRUN_TLS_CA`'s CA.
    async fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let ca = self.url.ca.clone();
        self.tls
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || client_config(ca.as_deref()))
                    .await
                    .map_err(|e| format!("cannot set up TLS: {e}"))?
            })
            .await
            .cloned()
    }
}

/// A rustls client configuration (ring) trusting the system's roots and the CAs of
/// `ca` (PEM), checking the chain and the host name.
fn client_config(ca: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(pem) = ca {
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("the CA file (LOCKRUN_TLS_CA) is not PEM: {e}"))?;
            roots.add(cert).map_err(|e| {
                format!("the CA file (LOCKRUN_TLS_CA) holds an unusable certificate: {e}")
            })?;
        }
    }
    if roots.is_empty() {
        return Err("no root certificates (install ca-certificates, or set LOCKRUN_TLS_CA)".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// One `ping_failed` warning line.
fn warn(msg: &str, ping: &str, reason: &str) {
    let fields = [("ping", ping.into()), ("reason", reason.into())];
    emit(Level::Warn, Event::PingFailed, msg, &fields);
}

/// A random UUID (version 4, RFC 9562), from the system's random source; all zeros
/// (still one UUID healthchecks accepts) if it has none.
fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    let _ = crate::token::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rids_are_uuid_v4_and_differ() {
        let (a, b) = (uuid_v4(), uuid_v4());
        assert_ne!(a, b);
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "{a}");
        assert_eq!(&a[14..15], "4", "{a}");
        assert!("89ab".contains(&a[19..20]), "{a}");
    }
}
