//! `lockrun list` on etcd: the lock names under the key prefix, from the keys in
//! `[PREFIX{, PREFIX|)` (`|` follows `{`), read without their values a page at a time.
//! Part of [`super`].

use super::EtcdBackend;
use crate::backend::keys::name_of;
use crate::backend::BackendError;

/// Keys read in one request.
const PAGE: i64 = 1000;

impl EtcdBackend {
    /// Every lock name with a key under the prefix (repeats, and names whose lock and
    /// record are gone, included: the caller asks each).
    pub(super) async fn names_under_prefix(&self) -> Result<Vec<String>, BackendError> {
        let prefix = &self.key_prefix;
        let end = format!("{prefix}|");
        let mut from = format!("{prefix}{{").into_bytes();
        let mut names = Vec::new();
        loop {
            let page = self
                .call(async |c| c.range_keys(&from, end.as_bytes(), PAGE).await)
                .await?;
            for kv in &page.kvs {
                if let Some(name) = std::str::from_utf8(&kv.key)
                    .ok()
                    .and_then(|k| name_of(prefix, k))
                {
                    names.push(name);
                }
            }
            match page.kvs.last() {
                Some(last) if page.kvs.len() as i64 >= PAGE => {
                    from = last.key.clone();
                    from.push(0);
                }
                _ => return Ok(names),
            }
        }
    }
}
