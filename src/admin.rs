//! `lockrun status` and `lockrun release --force`: look at a lock, or break it. The
//! holder is shown by [`crate::holder`].

use std::time::Duration;

use crate::backend::Backend;
use crate::holder::{status_json, Known};
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
        (_, true) => status_json(name, holder.as_ref()).to_string(),
        (Some(h), false) => format!("{name}: {}", Known::of(h).summary()),
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
            let known = Known::of(&h);
            emit(
                Level::Warn,
                Event::ForceReleased,
                &format!("broke lock {name:?}, which was {}", known.summary()),
                &[
                    ("holder_host", known.host.into()),
                    ("holder_pid", known.pid.into()),
                    ("fencing_token", known.fencing_token.into()),
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
