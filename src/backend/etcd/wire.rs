//! The messages of etcd's v3 gRPC API that lockrun sends and reads, written by hand as
//! `prost` messages, so that building lockrun needs no `protoc` and no generated code.
//! Part of [`super`]; depends on nothing else in the crate.
//!
//! Field numbers and types are those of etcd's `api/etcdserverpb/rpc.proto` and
//! `api/mvccpb/kv.proto` (github.com/etcd-io/etcd, main of 2026; etcd 3.4 has the same
//! numbers for every field here, in `etcdserver/etcdserverpb/rpc.proto` and
//! `mvcc/mvccpb/kv.proto`; the newest of them, the `LEASE` compare target and the
//! `range_end` of a compare, came with etcd 3.3, so 3.3 is the oldest etcd lockrun can
//! use). Only the fields lockrun uses are declared: a field left out is one lockrun
//! never sets (the server reads it as its default, as it would from any client that
//! leaves it unset) or never reads (decoding skips unknown fields, as protobuf
//! requires). The tests below encode each family of
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

/// `RangeRequest` of one key, or of the keys in `[key, range_end)`.
#[derive(Clone, PartialEq, Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The end of the range, excluded; empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// At most this many keys (0: no limit).
    #[prost(int64, tag = "3")]
    pub limit: i64,
    /// The keys only, without their values.
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
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
    /// With it, the condition must hold for every key in `[key, range_end)`; a range
    /// holding no key compares as one absent key (revisions 0). Empty: `key` alone.
    #[prost(bytes = "vec", tag = "64")]
    pub range_end: Vec<u8>,
}

/// `Compare.CompareResult` (only the comparisons lockrun makes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum CompareResult {
    Equal = 0,
    Less = 2,
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

    /// No key in `[key, range_end)` exists.
    pub fn none_in(key: impl AsRef<[u8]>, range_end: impl AsRef<[u8]>) -> Compare {
        Compare {
            range_end: range_end.as_ref().to_vec(),
            ..Compare::created_at(key, 0)
        }
    }

    /// Every key in `[key, range_end)` was last changed before `revision` (none was
    /// created or changed since a read at `revision - 1`).
    pub fn unchanged_in(
        key: impl AsRef<[u8]>,
        range_end: impl AsRef<[u8]>,
        revision: i64,
    ) -> Compare {
        Compare {
            result: CompareResult::Less as i32,
            range_end: range_end.as_ref().to_vec(),
            ..Compare::modified_at(key, revision)
        }
    }

    fn equal(key: impl AsRef<[u8]>, target: CompareTarget, value: TargetUnion) -> Compare {
        Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.as_ref().to_vec(),
            target_union: Some(value),
            range_end: Vec::new(),
        }
    }
}

impl RequestOp {
    /// Reads the keys in `[key, range_end)` (`key` alone if `range_end` is empty).
    pub fn range_of(key: impl AsRef<[u8]>, range_end: impl AsRef<[u8]>) -> RequestOp {
        RequestOp::from(Request::Range(RangeRequest {
            key: key.as_ref().to_vec(),
            range_end: range_end.as_ref().to_vec(),
            ..Default::default()
        }))
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
    /// The seconds it was granted with.
    #[prost(int64, tag = "4")]
    pub granted_ttl: i64,
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

/// `WatchCreateRequest` of one key, or of the keys in `[key, range_end)`.
#[derive(Clone, PartialEq, Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The end of the range, excluded; empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
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
mod tests;
