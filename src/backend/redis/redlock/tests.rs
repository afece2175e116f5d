//! Unit tests of [`super`] (`backend::redis::redlock`).

use super::*;
use crate::backend::url::testing::{ctx, options};
use crate::backend::url::UrlError;

#[test]
fn a_quorum_needs_three_plain_redis_servers() {
    let a = options();
    let urls = |u: &[&str]| u.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let t = parse(
        &urls(&["redis://a:1", "redis://b:2", "rediss://c:3"]),
        &ctx(&a, None),
    )
    .unwrap();
    assert_eq!(t.display(), "a:1,b:2,c:3");
    for bad in [
        urls(&["redis://a:1", "redis://b:2"]),
        urls(&["redis://a:1", "redis://b:2", "etcd://c:3"]),
        urls(&["redis://a:1", "redis://b:2", "redis+sentinel://c:3/m"]),
    ] {
        assert_eq!(
            parse(&bad, &ctx(&a, None)).unwrap_err(),
            UrlError::BadQuorum,
            "{bad:?}"
        );
    }
}

#[test]
fn per_server_timeouts_stay_far_below_the_ttl() {
    assert_eq!(
        node_timeout(Duration::from_secs(30)),
        Duration::from_secs(1)
    );
    assert_eq!(
        node_timeout(Duration::from_secs(2)),
        Duration::from_millis(200)
    );
    assert_eq!(
        node_timeout(Duration::from_millis(100)),
        Duration::from_millis(50)
    );
}
