//! Unit tests of [`super`] (`backend::redis::cluster`).

use super::key_slot::crc16;
use super::*;

fn n(h: &str, p: u16) -> Node {
    (h.to_owned(), p)
}

#[test]
fn key_slots_are_those_of_redis() {
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(key_slot("foo"), 12182);
    assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
    assert_eq!(key_slot("lockrun:{job}"), key_slot("job"));
    assert_eq!(key_slot("lockrun:{job}:fence"), key_slot("job"));
    assert_eq!(key_slot("lockrun:{job}#3"), key_slot("job"));
    // An empty tag hashes the whole key.
    assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
}

#[test]
fn redirections_name_a_node() {
    let from = n("10.0.0.1", 7000);
    assert_eq!(
        redirected("127.0.0.1:7003", None),
        Some(n("127.0.0.1", 7003))
    );
    assert_eq!(redirected(":7003", Some(&from)), Some(n("10.0.0.1", 7003)));
    assert_eq!(redirected("?:7003", Some(&from)), Some(n("10.0.0.1", 7003)));
    assert_eq!(redirected("::1:7003", None), Some(n("::1", 7003)));
    for bad in ["", "h", "h:0", "h:x", ":7003"] {
        assert_eq!(redirected(bad, None), None, "{bad}");
    }
    let moved = redis::RedisError::from((
        ErrorKind::Server(ServerErrorKind::Moved),
        "moved",
        "15098 127.0.0.1:17003".to_owned(),
    ));
    assert!(matches!(
        redirect_of(&moved, None),
        Some(Ok(Redirect::Moved(node))) if node == n("127.0.0.1", 17003)
    ));
}

#[test]
fn cluster_slots_answers_give_each_range_its_master() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let node = |h: &str, p: i64| Value::Array(vec![bulk(h), Value::Int(p), bulk("id")]);
    let reply = Value::Array(vec![
        Value::Array(vec![
            Value::Int(0),
            Value::Int(5460),
            node("127.0.0.1", 7000),
            node("127.0.0.1", 7004),
        ]),
        Value::Array(vec![Value::Int(5461), Value::Int(16383), node("", 7001)]),
        Value::Array(vec![bulk("junk")]),
    ]);
    let ranges = slot_ranges(&reply, &n("10.0.0.9", 7009));
    assert_eq!(
        ranges,
        vec![
            Range {
                first: 0,
                last: 5460,
                master: n("127.0.0.1", 7000),
                nodes: vec![n("127.0.0.1", 7000), n("127.0.0.1", 7004)],
            },
            Range {
                first: 5461,
                last: 16383,
                master: n("10.0.0.9", 7001),
                nodes: vec![n("10.0.0.9", 7001)],
            },
        ]
    );
    assert!(slot_ranges(&Value::Nil, &n("h", 1)).is_empty());
}

#[test]
fn the_owner_is_tried_first_then_every_node_heard_of() {
    let seeds = Seeds {
        nodes: vec![n("a", 1), n("b", 2)],
        declared: true,
    };
    let r = Router::new(Some(&seeds));
    assert_eq!(r.candidates(), vec![n("a", 1), n("b", 2)]);
    r.moved(&n("c", 3));
    assert_eq!(r.candidates(), vec![n("c", 3), n("a", 1), n("b", 2)]);
    r.moved(&n("b", 2));
    assert_eq!(r.candidates(), vec![n("b", 2), n("a", 1), n("c", 3)]);
    assert!(!Router::new(None).follows());
}
