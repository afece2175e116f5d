//! `lockrun status` and `lockrun release --force`: look at a lock, or break it.

use std::time::Duration;

use serde_json::json;

use crate::backend::{Backend, Holder};
use crate::log::{emit, Event, Level};

/// The timeout of each request of these commands.
const TIMEOUT: Duration = Duration::from_secs(5);

/// `lockrun status`: prints who holds `name`; exit status 0 held, 1 free, 125 error.
pub async fn status<B: Backend>(backend: &B, name: &str, as_json: bool) -> u8 {
    let holder = match tokio::time::timeout(TIMEOUT, backend.inspect(name)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return error(&e.to_string()),
        Err(_) => return error("the backend did not answer within 5s"),
    };
    let line = match (&holder, as_json) {
        (Some(h), true) => json!({
            "name": name, "held": true, "fencing_token": h.fencing_token,
            "ttl_ms": h.ttl_left.as_millis() as u64, "host": h.host, "pid": h.pid,
            "since": h.since(), "since_ms": h.since_ms,
        })
        .to_string(),
        (None, true) => json!({
            "name": name, "held": false, "fencing_token": null, "ttl_ms": null,
            "host": null, "pid": null, "since": null, "since_ms": null,
        })
        .to_string(),
        (Some(h), false) => format!("{name}: held by {}", describe(h)),
        (None, false) => format!("{name}: free"),
    };
    println!("{line}");
    if holder.is_some() {
        0
    } else {
        1
    }
}

/// `lockrun release --force`: deletes `name` whoever holds it and says whose it was.
pub async fn force_release<B: Backend>(backend: &B, name: &str) -> u8 {
    match tokio::time::timeout(TIMEOUT, backend.force_release(name)).await {
        Ok(Ok(Some(h))) => {
            emit(
                Level::Warn,
                Event::ForceReleased,
                &format!("broke lock {name:?}, which was held by {}", describe(&h)),
                &[
                    ("holder_host", h.host.clone().into()),
                    ("holder_pid", h.pid.into()),
                    ("fencing_token", h.fencing_token.into()),
                ],
            );
            0
        }
        Ok(Ok(None)) => {
            emit(
                Level::Warn,
                Event::ForceReleased,
                &format!("lock {name:?} was not held; nothing to break"),
                &[],
            );
            0
        }
        Ok(Err(e)) => error(&e.to_string()),
        Err(_) => error("the backend did not answer within 5s"),
    }
}

fn error(msg: &str) -> u8 {
    emit(Level::Error, Event::Error, msg, &[]);
    125
}

fn describe(h: &Holder) -> String {
    format!(
        "{} pid {} since {}, fencing token {}, {} left",
        h.host,
        h.pid,
        h.since(),
        h.fencing_token,
        crate::run::ms(h.ttl_left)
    )
}
