//! The messages of etcd's v3 gRPC API that lockrun sends and reads, written by hand as
//! `prost` messages, so that building lockrun needs no `protoc` and no generated code.
//! Part of [`super`]; depends on nothing else in the crate.
//!
//! Field numbers and types are those of etcd's `api/etcdserverpb/rpc.proto` and
//! `api/mvccpb/kv.proto` (github.com/etcd-io/etcd; unchanged since etcd 3.3, the
//! version that added the `LEASE` compare target). Only the fields lockrun uses are
//! declared: a field left out is one lockrun never sets (the server reads it as its
//! default, as it would from any client that leaves it unset) or never reads (decoding
//! skips unknown fields, as protobuf requires). The tests below encode each family of
//! messages and compare the bytes with encodings worked out by hand, so a wrong field
//! number or type fails here rather than against a server.
//!
//! gRPC method paths ([`path`]) are `/<proto package>.<service>/<method>`.

use prost::{Enumeration, Message, Oneof};

/// The gRPC method paths lockrun calls.
pub mod path {
    /// `KV.Range`: read keys.
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    /// `KV.Txn`: compares, then operations, atomically.
    pub const TXN: &str = "/etcdserverpb.KV/Txn";
    /// `Lease.LeaseGrant`.
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    /// `Lease.LeaseRevoke`: also deletes the keys on the lease.
    pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    /// `Lease.LeaseKeepAlive`: a bidirectional stream.
    pub const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
    /// `Lease.LeaseTimeToLive`.
    pub const LEASE_TIME_TO_LIVE: &str = "/etcdserverpb.Lease/LeaseTimeToLive";
    /// `Watch.Watch`: a bidirectional stream.
    pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
    /// `Auth.Authenticate`: a user and password for a token.
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

// ---- mvccpb (kv.proto) ----

/// `mvccpb.KeyValue`: a key as stored.
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The revision of the put that created the key: lockrun's fencing token.
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    /// The lease the key is attached to (0: none).
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `mvccpb.Event`: one change seen by a watch.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
}

/// `mvccpb.Event.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum EventType {
    Put = 0,
    Delete = 1,
}

// ---- etcdserverpb (rpc.proto): KV ----

/// `ResponseHeader`, part of every answer.
#[derive(Clone, PartialEq, Message)]
pub struct ResponseHeader {
    /// The store's revision when the request was served.
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// `RangeRequest` of one key (no `range_end`).
#[derive(Clone, PartialEq, Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

/// `RangeResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
}

/// `PutRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
    /// Keep the key's current value (only the lease changes).
    #[prost(bool, tag = "5")]
    pub ignore_value: bool,
}

/// `DeleteRangeRequest` of one key.
#[derive(Clone, PartialEq, Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

/// `Compare`: one condition of a transaction, on one key.
#[derive(Clone, PartialEq, Message)]
pub struct Compare {
    #[prost(enumeration = "CompareResult", tag = "1")]
    pub result: i32,
    #[prost(enumeration = "CompareTarget", tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    /// The value compared with; its variant must match `target`.
    #[prost(oneof = "TargetUnion", tags = "5, 6, 8")]
    pub target_union: Option<TargetUnion>,
}

/// `Compare.CompareResult` (only the comparison lockrun makes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum CompareResult {
    Equal = 0,
}

/// `Compare.CompareTarget`. Every enum here starts with its 0 value, even unused:
/// prost takes the first variant as the default and leaves a field holding the default
/// out, so without `Version` a CREATE target would not be sent (and mean VERSION).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum CompareTarget {
    Version = 0,
    Create = 1,
    Mod = 2,
    Lease = 4,
}

/// `Compare.target_union`. A oneof member is sent even when it is 0 ("the key does
/// not exist" is `create_revision == 0`).
#[derive(Clone, PartialEq, Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

/// `RequestOp`: one operation of a transaction.
#[derive(Clone, PartialEq, Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

/// `RequestOp.request`.
#[derive(Clone, PartialEq, Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

/// `ResponseOp`: the answer to one operation (only reads are looked at).
#[derive(Clone, PartialEq, Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1")]
    pub response: Option<Response>,
}

/// `ResponseOp.response`.
#[derive(Clone, PartialEq, Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
}

/// `TxnRequest`: if every compare holds, `success`, else `failure`.
#[derive(Clone, PartialEq, Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `TxnResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// True if every compare held (the `success` branch ran).
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

impl Compare {
    /// `key` was created at `revision` (0: the key does not exist).
    pub fn created_at(key: impl AsRef<[u8]>, revision: i64) -> Compare {
        Compare::equal(
            key,
            CompareTarget::Create,
            TargetUnion::CreateRevision(revision),
        )
    }

    /// `key` was last changed at `revision`.
    pub fn modified_at(key: impl AsRef<[u8]>, revision: i64) -> Compare {
        Compare::equal(key, CompareTarget::Mod, TargetUnion::ModRevision(revision))
    }

    /// `key` is attached to lease `lease`.
    pub fn on_lease(key: impl AsRef<[u8]>, lease: i64) -> Compare {
        Compare::equal(key, CompareTarget::Lease, TargetUnion::Lease(lease))
    }

    fn equal(key: impl AsRef<[u8]>, target: CompareTarget, value: TargetUnion) -> Compare {
        Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.as_ref().to_vec(),
            target_union: Some(value),
        }
    }
}

impl RequestOp {
    /// Reads `key`.
    pub fn range(key: impl AsRef<[u8]>) -> RequestOp {
        let key = key.as_ref().to_vec();
        RequestOp::from(Request::Range(RangeRequest { key }))
    }

    /// Writes `value` to `key`, attached to lease `lease`.
    pub fn put(key: impl AsRef<[u8]>, value: &str, lease: i64) -> RequestOp {
        RequestOp::from(Request::Put(PutRequest {
            key: key.as_ref().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ignore_value: false,
        }))
    }

    /// Deletes `key`.
    pub fn delete(key: impl AsRef<[u8]>) -> RequestOp {
        let key = key.as_ref().to_vec();
        RequestOp::from(Request::DeleteRange(DeleteRangeRequest { key }))
    }
}

impl From<Request> for RequestOp {
    fn from(request: Request) -> Self {
        RequestOp {
            request: Some(request),
        }
    }
}

// ---- etcdserverpb (rpc.proto): Lease ----

/// `LeaseGrantRequest` of a lease whose ID lockrun chose.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantRequest {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `LeaseGrantResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseGrantResponse {
    /// The TTL granted, in seconds (the server may raise it, or lower it to its maximum).
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `LeaseRevokeRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `LeaseRevokeResponse` (nothing in it is read).
#[derive(Clone, PartialEq, Message)]
pub struct LeaseRevokeResponse {}

/// `LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `LeaseKeepAliveResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseKeepAliveResponse {
    /// The TTL restored, in seconds; 0 or less when the lease does not exist.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `LeaseTimeToLiveRequest` (without the keys).
#[derive(Clone, PartialEq, Message)]
pub struct LeaseTimeToLiveRequest {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `LeaseTimeToLiveResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct LeaseTimeToLiveResponse {
    /// Seconds left; -1 when the lease does not exist.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

// ---- etcdserverpb (rpc.proto): Watch ----

/// `WatchRequest` (lockrun only creates watches; one ends with its stream).
#[derive(Clone, PartialEq, Message)]
pub struct WatchRequest {
    #[prost(oneof = "RequestUnion", tags = "1")]
    pub request_union: Option<RequestUnion>,
}

/// `WatchRequest.request_union`.
#[derive(Clone, PartialEq, Oneof)]
pub enum RequestUnion {
    #[prost(message, tag = "1")]
    CreateRequest(WatchCreateRequest),
}

/// `WatchCreateRequest` of one key.
#[derive(Clone, PartialEq, Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The first revision to report (inclusive).
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    /// Kinds of events the server leaves out (packed, as proto3 encodes it).
    #[prost(enumeration = "FilterType", repeated, tag = "5")]
    pub filters: Vec<i32>,
}

/// `WatchCreateRequest.FilterType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum FilterType {
    NoPut = 0,
}

/// `WatchResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct WatchResponse {
    /// True if the watch ended (its start revision was compacted away, or it was
    /// refused): no more events come.
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

// ---- etcdserverpb (rpc.proto): Auth ----

/// `AuthenticateRequest`. No `Debug`: it holds the password.
#[derive(Clone, PartialEq, Message)]
#[prost(skip_debug)]
pub struct AuthenticateRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

/// `AuthenticateResponse`. No `Debug`: the token stands for the password.
#[derive(Clone, PartialEq, Message)]
#[prost(skip_debug)]
pub struct AuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

#[cfg(test)]
mod tests {
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
            failure: vec![RequestOp::range("k")],
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
}
