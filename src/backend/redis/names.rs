//! `lockrun list` on Redis: the lock names under the key prefix, by `SCAN` on the one
//! server (the master, behind Sentinel), or on every master of a Cluster (a node's
//! `SCAN` sees its own keys only). Part of [`super`].

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::acl::glob_escape;
use super::cluster::{show, slot_ranges};
use super::conn;
use super::errors::{describe_in, Context};
use super::RedisBackend;
use crate::backend::keys::name_of;
use crate::backend::BackendError;

/// Keys asked for in one `SCAN` call: its reply stays far below the reply budget.
const SCAN_COUNT: &str = "500";

impl RedisBackend {
    /// Every lock name with a key under the prefix, on every master (repeats and
    /// names whose lock and record are gone included: the caller asks each).
    pub(super) async fn scan_names(&self) -> Result<Vec<String>, BackendError> {
        let pattern = format!("{}{{*", glob_escape(&self.key_prefix));
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
            // A user without `+cluster|slots` on a server not known to be a Cluster:
            // the one server's keys.
            (Err(e), _) if is_noperm(e) && !self.router.is_cluster() => Vec::new(),
            (Err(e), _) => return c.settle(Err(describe_in(e, &self.context_at(&at), None))),
        };
        masters.sort();
        masters.dedup();
        let mut keys = Vec::new();
        if masters.is_empty() {
            keys = scan(&mut here, &pattern, &self.context_at(&at)).await?;
            c.keep();
        } else {
            c.keep();
            for node in masters {
                let at = show(&node);
                let nc = conn::connect(&self.target.at(&node), &at).await?;
                let mut conn = nc.conn.clone();
                keys.extend(scan(&mut conn, &pattern, &self.context_at(&at)).await?);
            }
        }
        Ok(keys
            .iter()
            .filter_map(|k| name_of(&self.key_prefix, k))
            .collect())
    }
}

impl RedisBackend {
    /// What error lines need to know of a connection to `at`.
    fn context_at<'a>(&'a self, at: &'a str) -> Context<'a> {
        Context::new(&self.target, at, &self.key_prefix)
    }
}

/// The keys matching `pattern` on one server, `SCAN` to its end.
async fn scan(
    conn: &mut MultiplexedConnection,
    pattern: &str,
    ctx: &Context<'_>,
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
            .map_err(|e| describe_in(&e, ctx, None))?;
        keys.extend(batch);
        if next == "0" {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// The user may not run the command (an ACL without it).
fn is_noperm(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM")
}

/// A server that is no Cluster node answers `CLUSTER SLOTS` so.
fn is_no_cluster(e: &redis::RedisError) -> bool {
    e.detail()
        .is_some_and(|d| d.contains("cluster support disabled"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_matched_as_written() {
        assert_eq!(glob_escape("lockrun:"), "lockrun:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
