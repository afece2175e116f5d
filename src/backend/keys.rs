//! The key layout Redis and etcd share: lock `NAME` under prefix `P` is `P{NAME}`, and
//! every other key of the lock starts with it (`P{NAME}#i`, `P{NAME}:last`, ...). A lock
//! name holds no brace, so the first `}` after `P{` closes the name. Pure; part of the
//! backend interface, for `lockrun list`.

/// The lock name of key `key` under `prefix`, if it is one of a lock's keys.
pub fn name_of(prefix: &str, key: &str) -> Option<String> {
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
        assert_eq!(name_of("a{b}*", "a{b}*{x}:fence").as_deref(), Some("x"));
        assert_eq!(name_of("lockrun:", "lockrun:job"), None);
        assert_eq!(name_of("lockrun:", "lockrun:{}"), None);
        assert_eq!(name_of("lockrun:", "other:{job}"), None);
    }
}
