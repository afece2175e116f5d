//! Taking the lock: try, wait for a release, retry after transient errors, give up
//! when `--wait` runs out or a signal arrives. Part of [`crate::run`].

use std::time::Duration;

use super::{fail, millis, ms, request_timeout, Taken};
use crate::backend::{Acquire, AcquireRequest, Backend, BackendError, Holder, Release};
use crate::clock::Instant;
use crate::config::RunConfig;
use crate::lease::Params;
use crate::log::{emit, Level};
use crate::outcome::Outcome;
use crate::supervisor::Signals;

/// Tries to take the lock until it is ours, `--wait` runs out, or the backend fails
/// for good. A signal meanwhile gives up (releasing whatever may have been taken).
/// On success `req.token` is the token the lock is held with: an attempt that may have
/// been applied unseen is given back and its token never used again.
pub(super) async fn acquire<B: Backend>(
    cfg: &RunConfig,
    backend: &B,
    req: &mut AcquireRequest,
    signals: &mut Signals,
) -> Result<Taken, Outcome> {
    let name = cfg.name.as_str();
    let started = tokio::time::Instant::now();
    let give_up_at = started + cfg.wait;
    let params = Params::new(cfg.ttl, cfg.renew_every, cfg.kill_after);
    loop {
        let sent_at = Instant::now();
        let reply = tokio::select! {
            r = tokio::time::timeout(request_timeout(cfg.ttl), backend.acquire(name, &*req)) => r,
            sig = signals.recv_forwardable() => {
                abandon(cfg, backend, &req.token).await;
                emit(Level::Error, "interrupted", &format!("interrupted by {sig} while acquiring; the command was not started"), &[]);
                return Err(Outcome::Interrupted(sig as i32));
            }
        };
        let error = match reply {
            Ok(Ok(Acquire::Acquired { fencing_token })) => {
                if Instant::now() < params.deadline_from(sent_at) - params.grace() {
                    return Ok(Taken {
                        sent_at,
                        fencing_token,
                        waited: started.elapsed(),
                    });
                }
                // The answer came so late that most of the lease is gone.
                BackendError::Unavailable(format!(
                    "{} answered too slowly to use the lease",
                    cfg.backend.display
                ))
            }
            Ok(Ok(Acquire::Busy(holder))) => {
                let now = tokio::time::Instant::now();
                if now >= give_up_at {
                    let _ =
                        tokio::time::timeout(request_timeout(cfg.ttl), backend.stop_waiting(name))
                            .await;
                    return Err(busy(cfg, &holder, started.elapsed()));
                }
                tokio::select! {
                    r = backend.wait_for_release(name, &holder, give_up_at - now) => {
                        if let Err(e) = r {
                            emit(Level::Debug, "wait_error", &e.to_string(), &[]);
                        }
                    }
                    sig = signals.recv_forwardable() => {
                        abandon(cfg, backend, &req.token).await;
                        emit(Level::Error, "interrupted", &format!("interrupted by {sig} while waiting; the command was not started"), &[]);
                        return Err(Outcome::Interrupted(sig as i32));
                    }
                }
                continue;
            }
            Ok(Err(e)) => e,
            Err(_elapsed) => BackendError::Unavailable(format!(
                "the backend at {} did not answer within {}",
                cfg.backend.display,
                ms(request_timeout(cfg.ttl))
            )),
        };
        if error.is_transient() {
            // The attempt may have been applied on the server with its answer lost or
            // late: give back whatever it may have taken, and never use its token
            // again. A release of the old token that arrives late (it may be stuck in
            // the network too) then cannot remove a lock a later attempt takes.
            abandon(cfg, backend, &req.token).await;
            req.token = crate::token::lock_token();
        }
        let retry_in = Duration::from_millis(100 + crate::token::random_u64() % 400);
        if !error.is_transient() || tokio::time::Instant::now() + retry_in >= give_up_at {
            return Err(fail(&format!("{error}; the command was not started")));
        }
        emit(
            Level::Warn,
            "acquire_failed",
            &format!("{error}; retrying"),
            &[],
        );
        tokio::time::sleep(retry_in).await;
    }
}

/// Best-effort cleanup when giving up: leave the queue and delete the lock if (and
/// only if) it holds our token. Bounded by one request timeout in all: if it fails,
/// the lease expires within the TTL anyway.
pub(super) async fn abandon<B: Backend>(cfg: &RunConfig, backend: &B, token: &str) {
    let name = cfg.name.as_str();
    let cleanup = async {
        let _ = backend.stop_waiting(name).await;
        let _ = backend.release(name, token, Release::Now).await;
    };
    let _ = tokio::time::timeout(request_timeout(cfg.ttl), cleanup).await;
}

fn busy(cfg: &RunConfig, holder: &Holder, waited: Duration) -> Outcome {
    let since = holder.since();
    emit(
        Level::Warn,
        "busy",
        &format!(
            "lock {:?} is held by {} pid {} since {since} ({} left); the command was not started",
            cfg.name.as_str(),
            holder.host,
            holder.pid,
            ms(holder.ttl_left)
        ),
        &[
            ("holder_host", holder.host.clone().into()),
            ("holder_pid", holder.pid.into()),
            ("fencing_token", holder.fencing_token.into()),
            ("wait_ms", millis(waited)),
        ],
    );
    Outcome::Busy(cfg.conflict_exit_code)
}
