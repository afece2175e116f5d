//! Tests of [`super`]: each family of messages encoded (or decoded) and compared with
//! bytes worked out by hand from etcd's field numbers.

use super::*;

/// Each field is (tag << 3 | wire type) then its value: wire type 0 is a varint,
/// 2 a length and that many bytes.
fn bytes<M: Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

#[test]
fn kv_requests_have_etcds_field_numbers() {
    // key = 1 (0x0a), value = 2 (0x12), lease = 3 (0x18), ignore_value = 5 (0x28).
    let put = PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 5,
        ignore_value: true,
    };
    assert_eq!(
        bytes(&put),
        [0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 5, 0x28, 1]
    );
    let put_bytes = [0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 5];
    // target = 2 (0x10) CREATE = 1, key = 3 (0x1a), create_revision = 5 (0x28)
    // sent although 0; result EQUAL = 0 is the default and not sent.
    let absent = Compare::created_at("k", 0);
    assert_eq!(bytes(&absent), [0x10, 1, 0x1a, 1, b'k', 0x28, 0]);
    // LEASE = 4; lease = 8 (0x40); 300 is the varint 0xac 0x02.
    let on_lease = Compare::on_lease("k", 300);
    assert_eq!(bytes(&on_lease), [0x10, 4, 0x1a, 1, b'k', 0x40, 0xac, 0x02]);
    // MOD = 2; mod_revision = 6 (0x30).
    let mod_rev = Compare::modified_at("k", 9);
    assert_eq!(bytes(&mod_rev), [0x10, 2, 0x1a, 1, b'k', 0x30, 9]);
    // compare = 1, success = 2 (request_put = 2 inside), failure = 3
    // (request_range = 1 inside).
    let txn = TxnRequest {
        compare: vec![absent],
        success: vec![RequestOp::put("k", "v", 5)],
        failure: vec![RequestOp::range_of("k", "")],
    };
    let mut want = vec![0x0a, 7, 0x10, 1, 0x1a, 1, b'k', 0x28, 0];
    want.extend([0x12, 10, 0x12, 8]);
    want.extend(put_bytes);
    want.extend([0x1a, 5, 0x0a, 3, 0x0a, 1, b'k']);
    assert_eq!(bytes(&txn), want);
    // request_delete_range = 3.
    assert_eq!(bytes(&RequestOp::delete("k")), [0x1a, 3, 0x0a, 1, b'k']);
}

#[test]
fn ranges_have_etcds_field_numbers() {
    // RangeRequest: range_end = 2 (0x12), inside request_range = 1.
    assert_eq!(
        bytes(&RequestOp::range_of("k", "l")),
        [0x0a, 6, 0x0a, 1, b'k', 0x12, 1, b'l']
    );
    // Compare.range_end = 64: the tag (64 << 3 | 2 = 514) is the varint 0x82 0x04.
    let none = Compare::none_in("k", "l");
    assert_eq!(
        bytes(&none),
        [0x10, 1, 0x1a, 1, b'k', 0x28, 0, 0x82, 0x04, 1, b'l']
    );
    // result = 1 (0x08) LESS = 2; MOD = 2; mod_revision = 6 (0x30).
    let unchanged = Compare::unchanged_in("k", "l", 9);
    assert_eq!(
        bytes(&unchanged),
        [0x08, 2, 0x10, 2, 0x1a, 1, b'k', 0x30, 9, 0x82, 0x04, 1, b'l']
    );
    // WatchCreateRequest: range_end = 2 (0x12).
    let watch = WatchCreateRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        start_revision: 5,
        filters: vec![],
    };
    assert_eq!(bytes(&watch), [0x0a, 1, b'k', 0x12, 1, b'l', 0x18, 5]);
}

#[test]
fn kv_answers_are_read_from_etcds_field_numbers() {
    // KeyValue: key = 1, create_revision = 2, mod_revision = 3, version = 4 (not
    // declared: skipped), value = 5, lease = 6.
    let kv = [
        0x0a, 1, b'k', 0x10, 7, 0x18, 8, 0x20, 1, 0x2a, 1, b'v', 0x30, 9,
    ];
    // RangeResponse: header = 1 (revision = 3), kvs = 2, count = 4 (skipped).
    let mut range = vec![0x0a, 2, 0x18, 11, 0x12, kv.len() as u8];
    range.extend(kv);
    range.extend([0x20, 1]);
    let r = RangeResponse::decode(range.as_slice()).unwrap();
    assert_eq!(r.header.map(|h| h.revision), Some(11));
    let want = KeyValue {
        key: b"k".to_vec(),
        create_revision: 7,
        mod_revision: 8,
        value: b"v".to_vec(),
        lease: 9,
    };
    assert_eq!(r.kvs.first(), Some(&want));
    // TxnResponse: header = 1, succeeded = 2, responses = 3 holding a
    // ResponseOp whose response_range = 1.
    let mut txn = vec![0x0a, 2, 0x18, 12, 0x10, 1, 0x1a, range.len() as u8 + 2];
    txn.extend([0x0a, range.len() as u8]);
    txn.extend(&range);
    let t = TxnResponse::decode(txn.as_slice()).unwrap();
    assert!(t.succeeded);
    assert_eq!(t.header.as_ref().map(|h| h.revision), Some(12));
    let Some(Response::Range(read)) = &t.responses[0].response else {
        panic!("no range answer in {t:?}")
    };
    assert_eq!(read.kvs.first(), Some(&want));
}

#[test]
fn lease_messages_have_etcds_field_numbers() {
    // TTL = 1, ID = 2; the ID alone is field 1 elsewhere.
    let grant = LeaseGrantRequest { ttl: 30, id: 7 };
    assert_eq!(bytes(&grant), [0x08, 30, 0x10, 7]);
    assert_eq!(bytes(&LeaseRevokeRequest { id: 7 }), [0x08, 7]);
    assert_eq!(bytes(&LeaseKeepAliveRequest { id: 7 }), [0x08, 7]);
    assert_eq!(bytes(&LeaseTimeToLiveRequest { id: 7 }), [0x08, 7]);
    // Answers: header = 1, ID = 2, TTL = 3 (grantedTTL = 4 is skipped).
    let answer = [0x0a, 2, 0x18, 5, 0x10, 7, 0x18, 30, 0x20, 40];
    assert_eq!(LeaseGrantResponse::decode(&answer[..]).unwrap().ttl, 30);
    assert_eq!(LeaseKeepAliveResponse::decode(&answer[..]).unwrap().ttl, 30);
    assert_eq!(
        LeaseTimeToLiveResponse::decode(&answer[..]).unwrap().ttl,
        30
    );
    // -1 is a 10-byte varint.
    let gone = [
        0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];
    assert_eq!(LeaseTimeToLiveResponse::decode(&gone[..]).unwrap().ttl, -1);
    assert!(LeaseRevokeResponse::decode(&answer[..4]).is_ok());
}

#[test]
fn watch_messages_have_etcds_field_numbers() {
    // create_request = 1 holding key = 1, start_revision = 3 and the packed
    // filters = 5 (NOPUT = 0).
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"k".to_vec(),
            range_end: Vec::new(),
            start_revision: 5,
            filters: vec![FilterType::NoPut as i32],
        })),
    };
    assert_eq!(
        bytes(&create),
        [0x0a, 8, 0x0a, 1, b'k', 0x18, 5, 0x2a, 1, 0]
    );
    // header = 1, created = 3, canceled = 4, events = 11 (0x5a) each with
    // type = 1 (DELETE = 1) and kv = 2.
    let answer = [
        0x0a, 2, 0x18, 5, 0x18, 1, 0x20, 1, 0x5a, 7, 0x08, 1, 0x12, 3, 0x0a, 1, b'k',
    ];
    let w = WatchResponse::decode(&answer[..]).unwrap();
    assert!(w.canceled);
    assert_eq!(w.events.len(), 1);
    assert_eq!(w.events[0].r#type(), EventType::Delete);
    let put = WatchResponse::decode(&[0x5a, 0][..]).unwrap();
    assert_eq!(put.events[0].r#type(), EventType::Put);
}

#[test]
fn auth_messages_have_etcds_field_numbers() {
    let login = AuthenticateRequest {
        name: "u".into(),
        password: "p".into(),
    };
    assert_eq!(bytes(&login), [0x0a, 1, b'u', 0x12, 1, b'p']);
    // header = 1, token = 2.
    let answer = [0x0a, 2, 0x18, 5, 0x12, 3, b't', b'o', b'k'];
    let token = AuthenticateResponse::decode(&answer[..]).unwrap().token;
    assert_eq!(token, "tok");
}
