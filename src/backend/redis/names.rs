//! `lockrun list` on Redis: the lock names under the key prefix, by `SCAN` on the one
//! server (the master, behind Sentinel), or on every master of a Cluster (a node's
//! `SCAN` sees its own keys only). Part of [`super`].

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::cluster::{show, slot_ranges};
use super::conn;
use super::errors::describe;
use super::RedisBackend;
use crate::backend::BackendError;

/// Keys asked for in one `SCAN` call: its reply stays far below the reply budget.
const SCAN_COUNT: &str = "500";

impl RedisBackend {
    /// Every lock name with a key under the prefix, on every master (repeats and
    /// names whose lock and record are gone included: the caller asks each).
    pub(super) async fn scan_names(&self) -> Result<Vec<String>, BackendError> {
        let pattern = format!("{}{{*", glob_escaped(&self.key_prefix));
        let c = self.conn("").await?;
        let at = self.server();
        let mut here = c.conn.clone();
        let slots = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async::<Value>(&mut here)
            .await;
        let mut masters = match (&slots, c.node()) {
            (Ok(reply), Some(from)) => slot_ranges(reply, &from)
                .into_iter()
                .map(|r| r.master)
                .collect(),
            (Ok(_), None) => Vec::new(),
            (Err(e), _) if is_no_cluster(e) => Vec::new(),
            (Err(e), _) => return c.settle(Err(describe(e, &at))),
        };
        masters.sort();
        masters.dedup();
        let mut keys = Vec::new();
        if masters.is_empty() {
            keys = scan(&mut here, &pattern, &at).await?;
            c.keep();
        } else {
            c.keep();
            for node in masters {
                let at = show(&node);
                let nc = conn::connect(&self.target.at(&node), &at).await?;
                let mut conn = nc.conn.clone();
                keys.extend(scan(&mut conn, &pattern, &at).await?);
            }
        }
        Ok(keys
            .iter()
            .filter_map(|k| name_of(&self.key_prefix, k))
            .collect())
    }
}

/// The keys matching `pattern` on one server, `SCAN` to its end.
async fn scan(
    conn: &mut MultiplexedConnection,
    pattern: &str,
    at: &str,
) -> Result<Vec<String>, BackendError> {
    let mut cursor = "0".to_owned();
    let mut keys = Vec::new();
    loop {
        let (next, batch): (String, Vec<String>) = redis::cmd("SCAN")
            .arg(&cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(conn)
            .await
            .map_err(|e| describe(&e, at))?;
        keys.extend(batch);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// A server that is no Cluster node answers `CLUSTER SLOTS` so.
fn is_no_cluster(e: &redis::RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.contains("cluster support disabled"))
}

/// `prefix` as a `SCAN MATCH` pattern that matches it only: `*`, `?`, `[`, `]` and
/// `\` escaped.
fn glob_escaped(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name of key `key` under `prefix` (`P{NAME}`, `P{NAME}#i`, `P{NAME}:...`:
/// a name holds no brace, so the first `}` closes it), if it is one.
fn name_of(prefix: &str, key: &str) -> Option<String> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (name, _) = rest.split_once('}')?;
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::scripts::Keys;

    #[test]
    fn every_key_of_a_lock_gives_its_name() {
        for (prefix, name) in [("lockrun:", "job"), ("a{b}*", "x/y:z"), ("", "j")] {
            let k = Keys::new(prefix, name);
            for key in [k.lock.clone(), k.slot(2), k.fence, k.queue, k.last, k.limit] {
                assert_eq!(name_of(prefix, &key).as_deref(), Some(name), "{key}");
            }
        }
        assert_eq!(name_of("lockrun:", "lockrun:job"), None);
        assert_eq!(name_of("lockrun:", "other:{job}"), None);
    }

    #[test]
    fn the_prefix_is_matched_as_written() {
        assert_eq!(glob_escaped("lockrun:"), "lockrun:");
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
