//! `lockrun list` on etcd: the lock names under the key prefix, from the keys in
//! `[PREFIX{, PREFIX|)` (`|` follows `{`), read without their values a page at a time.
//! Part of [`super`].

use super::EtcdBackend;
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

    #[test]
    fn every_key_of_a_lock_gives_its_name() {
        assert_eq!(name_of("lockrun:", "lockrun:{job}").as_deref(), Some("job"));
        assert_eq!(
            name_of("lockrun:", "lockrun:{a/b}#2").as_deref(),
            Some("a/b")
        );
        assert_eq!(
            name_of("lockrun:", "lockrun:{j}:last").as_deref(),
            Some("j")
        );
        assert_eq!(name_of("lockrun:", "lockrun:job"), None);
        assert_eq!(name_of("lockrun:", "other:{job}"), None);
    }
}
