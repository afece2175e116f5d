//! lockrun's own gRPC client of one etcd member: one HTTP/2 connection (a `tonic`
//! channel, no generated code; over TLS for `etcds://`), the etcd calls the backend
//! makes as typed methods over the messages of [`super::wire`], and the authentication
//! token. Part of [`super`];
//! depends on [`super::wire`], [`super::target`] and [`super::transport`].
//!
//! Every request carries the metadata `hasleader: true`: a member cut off from the
//! others answers "no leader" instead of serving a stale watch or a keep-alive it cannot
//! forward. With credentials, [`Client::connect`] authenticates (`Auth.Authenticate`
//! gives a token) and every later request carries the token as the `token` metadata.
//! Tokens expire (after 5 idle minutes with etcd's default simple tokens, or when the
//! user's password changes) while a long command runs: a call refused for its token
//! authenticates again, once for all the calls refused with that token, and is sent
//! once more.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use http::uri::PathAndQuery;
use prost::Message;
use tonic::client::Grpc;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;

use super::target::EtcdTarget;
use super::transport::TlsConnector;
use super::wire::{self, path};

/// How long to try a TCP connection to one member before calling it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// etcd's message for an expired or unknown token (etcd's `ErrGRPCInvalidAuthToken`).
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";

/// What went wrong with a call.
#[derive(Debug)]
pub enum RpcError {
    /// The connection could not be made or used (its cause is in the error's chain).
    Transport(tonic::transport::Error),
    /// The member, or the HTTP/2 stream to it, ended the call with this status.
    Status(Status),
    /// The call cannot be made as asked (a member address that is no URI, a token etcd
    /// gave that cannot be sent back).
    Invalid(String),
    /// The member answered outside etcd's protocol (a stream ended without its answer).
    Broken(String),
}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        RpcError::Status(status)
    }
}

/// A client of one member, made by [`Client::connect`].
pub struct Client {
    grpc: Grpc<Channel>,
    /// User and password, to authenticate again when the token expires.
    credentials: Option<(String, String)>,
    /// The token sent with every call (never locked across an await).
    token: Mutex<Option<AsciiMetadataValue>>,
    /// Held while authenticating again, so that calls refused together do it once.
    login: tokio::sync::Mutex<()>,
    /// The member has answered a call on this connection (see [`Client::answered`]).
    answered: AtomicBool,
}

/// The answers on a stream of one request; the request side stays open (the call
/// goes on) while this lives.
pub struct Replies<T> {
    stream: Streaming<T>,
    _open: tokio::sync::oneshot::Sender<()>,
}

impl<T> Replies<T> {
    /// The next answer; `None` when the member ended the stream.
    pub async fn message(&mut self) -> Result<Option<T>, RpcError> {
        Ok(self.stream.message().await?)
    }
}

/// How member `member` (`host:port`) is reached: HTTP/2 over plain TCP (`etcd://`) or
/// over TLS (`etcds://`, through [`TlsConnector`]), with the connect timeout (for TLS,
/// the handshake included). This is the one place that knows.
async fn channel(target: &EtcdTarget, member: &str) -> Result<Channel, RpcError> {
    let scheme = if target.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{member}"))
        .map_err(|e| RpcError::Invalid(format!("its address is not usable ({e})")))?
        .connect_timeout(CONNECT_TIMEOUT);
    let made = match &target.tls {
        None => endpoint.connect().await,
        Some(tls) => {
            endpoint
                .connect_with_connector(TlsConnector::new(tls.config.clone()))
                .await
        }
    };
    made.map_err(RpcError::Transport)
}

impl Client {
    /// Connects to `member` of `target` and, with credentials, authenticates.
    pub async fn connect(target: &EtcdTarget, member: &str) -> Result<Client, RpcError> {
        let channel = channel(target, member).await?;
        let client = Client {
            grpc: Grpc::new(channel),
            credentials: target.credentials.clone(),
            token: Mutex::new(None),
            login: tokio::sync::Mutex::new(()),
            answered: AtomicBool::new(false),
        };
        client.authenticate().await?;
        Ok(client)
    }

    /// `KV.Range` of the keys in `[key, range_end)` (`key` alone if `range_end` is
    /// empty).
    pub async fn range(
        &self,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<wire::RangeResponse, RpcError> {
        let req = wire::RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            ..Default::default()
        };
        self.unary(path::RANGE, req).await
    }

    /// `KV.Range` of at most `limit` keys in `[key, range_end)`, without values.
    pub async fn range_keys(
        &self,
        key: &[u8],
        range_end: &[u8],
        limit: i64,
    ) -> Result<wire::RangeResponse, RpcError> {
        let req = wire::RangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit,
            keys_only: true,
        };
        self.unary(path::RANGE, req).await
    }

    /// `KV.Txn`.
    pub async fn txn(&self, txn: wire::TxnRequest) -> Result<wire::TxnResponse, RpcError> {
        self.unary(path::TXN, txn).await
    }

    /// `Lease.LeaseGrant` of lease `id` for `ttl` seconds; the TTL granted.
    pub async fn lease_grant(&self, id: i64, ttl: i64) -> Result<i64, RpcError> {
        let req = wire::LeaseGrantRequest { ttl, id };
        let reply: wire::LeaseGrantResponse = self.unary(path::LEASE_GRANT, req).await?;
        Ok(reply.ttl)
    }

    /// `Lease.LeaseRevoke` of lease `id`.
    pub async fn lease_revoke(&self, id: i64) -> Result<(), RpcError> {
        let req = wire::LeaseRevokeRequest { id };
        let _: wire::LeaseRevokeResponse = self.unary(path::LEASE_REVOKE, req).await?;
        Ok(())
    }

    /// `Lease.LeaseTimeToLive` of lease `id`: seconds left, -1 if it does not exist.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<i64, RpcError> {
        let req = wire::LeaseTimeToLiveRequest { id };
        let reply: wire::LeaseTimeToLiveResponse =
            self.unary(path::LEASE_TIME_TO_LIVE, req).await?;
        Ok(reply.ttl)
    }

    /// Lease `id`'s seconds left (-1 when it does not exist) and the seconds it was
    /// granted with.
    pub async fn lease_age(&self, id: i64) -> Result<(i64, i64), RpcError> {
        let req = wire::LeaseTimeToLiveRequest { id };
        let reply: wire::LeaseTimeToLiveResponse =
            self.unary(path::LEASE_TIME_TO_LIVE, req).await?;
        Ok((reply.ttl, reply.granted_ttl))
    }

    /// One keep-alive of lease `id` (one request, one answer on a new stream): the TTL
    /// restored, 0 or less if the lease does not exist.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<i64, RpcError> {
        let req = wire::LeaseKeepAliveRequest { id };
        self.with_token(async |token| {
            let mut replies: Replies<wire::LeaseKeepAliveResponse> = self
                .open(path::LEASE_KEEP_ALIVE, req.clone(), token)
                .await?;
            match replies.message().await? {
                Some(reply) => Ok(reply.ttl),
                None => Err(RpcError::Broken(
                    "the keep-alive stream ended without an answer".into(),
                )),
            }
        })
        .await
    }

    /// `Watch.Watch` with one watch, `create`; it ends when the answers are dropped.
    pub async fn watch(
        &self,
        create: wire::WatchCreateRequest,
    ) -> Result<Replies<wire::WatchResponse>, RpcError> {
        let req = wire::WatchRequest {
            request_union: Some(wire::RequestUnion::CreateRequest(create)),
        };
        self.with_token(async |token| self.open(path::WATCH, req.clone(), token).await)
            .await
    }

    /// True once the member has answered a call on this connection: the connection
    /// worked, so a later failure says nothing about the scheme or TLS files.
    pub fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    fn token(&self) -> Option<AsciiMetadataValue> {
        self.token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs `call` with the current token; if the member refuses the token, gets a new
    /// one and runs `call` once more.
    async fn with_token<T>(
        &self,
        call: impl AsyncFn(Option<AsciiMetadataValue>) -> Result<T, RpcError>,
    ) -> Result<T, RpcError> {
        let sent = self.token();
        match call(sent.clone()).await {
            Err(RpcError::Status(s)) if self.credentials.is_some() && token_refused(&s) => {
                let _one_login = self.login.lock().await;
                // Calls refused together: the first to get here logs in for all.
                if self.token() == sent {
                    self.authenticate().await?;
                }
                call(self.token()).await
            }
            other => other,
        }
    }

    /// `Auth.Authenticate` with our credentials (if any); keeps the token.
    async fn authenticate(&self) -> Result<(), RpcError> {
        let Some((name, password)) = &self.credentials else {
            return Ok(());
        };
        let req = wire::AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        };
        let reply: wire::AuthenticateResponse = self.send(path::AUTHENTICATE, req, None).await?;
        // Not named in the error: the token is as good as the password.
        let mut token = AsciiMetadataValue::try_from(reply.token)
            .map_err(|_| RpcError::Invalid("its authentication token cannot be sent".into()))?;
        token.set_sensitive(true);
        *self.token.lock().unwrap_or_else(PoisonError::into_inner) = Some(token);
        Ok(())
    }

    /// A unary call with the token (see [`Client::with_token`]).
    async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, RpcError>
    where
        Req: Message + Clone + 'static,
        Resp: Message + Default + 'static,
    {
        self.with_token(async |token| self.send(path, req.clone(), token).await)
            .await
    }

    /// Sends a unary call once.
    async fn send<Req, Resp>(
        &self,
        path: &'static str,
        req: Req,
        token: Option<AsciiMetadataValue>,
    ) -> Result<Resp, RpcError>
    where
        Req: Message + 'static,
        Resp: Message + Default + 'static,
    {
        let mut grpc = self.ready().await?;
        let request = request(req, token);
        let codec = ProstCodec::<Req, Resp>::default();
        let reply = grpc
            .unary(request, PathAndQuery::from_static(path), codec)
            .await?;
        self.answered.store(true, Ordering::Relaxed);
        Ok(reply.into_inner())
    }

    /// Opens a stream and sends `first` on it; the request side stays open until the
    /// answers are dropped (then the stream ends, and with it the call on the member).
    async fn open<Req, Resp>(
        &self,
        path: &'static str,
        first: Req,
        token: Option<AsciiMetadataValue>,
    ) -> Result<Replies<Resp>, RpcError>
    where
        Req: Message + 'static,
        Resp: Message + Default + 'static,
    {
        let (open, closed) = tokio::sync::oneshot::channel::<()>();
        let requests =
            futures_util::stream::unfold((Some(first), closed), |(next, closed)| async move {
                match next {
                    Some(req) => Some((req, (None, closed))),
                    None => {
                        let _ = closed.await;
                        None
                    }
                }
            });
        let mut grpc = self.ready().await?;
        let codec = ProstCodec::<Req, Resp>::default();
        let stream = grpc
            .streaming(
                request(requests, token),
                PathAndQuery::from_static(path),
                codec,
            )
            .await?
            .into_inner();
        self.answered.store(true, Ordering::Relaxed);
        Ok(Replies {
            stream,
            _open: open,
        })
    }

    /// The channel, once it can take a call.
    async fn ready(&self) -> Result<Grpc<Channel>, RpcError> {
        let mut grpc = self.grpc.clone();
        grpc.ready().await.map_err(RpcError::Transport)?;
        Ok(grpc)
    }
}

/// `message` with the metadata every call carries.
fn request<T>(message: T, token: Option<AsciiMetadataValue>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("hasleader", AsciiMetadataValue::from_static("true"));
    if let Some(token) = token {
        metadata.insert("token", token);
    }
    request
}

/// True when `status` says the token is expired or unknown. etcd answers
/// UNAUTHENTICATED; services that etcd serves through its own client internally lose
/// the code and answer UNKNOWN with the message.
fn token_refused(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message() == INVALID_TOKEN,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_expired_or_unknown_token_is_refreshed() {
        let refused = |code, msg: &str| token_refused(&Status::new(code, msg));
        assert!(refused(Code::Unauthenticated, INVALID_TOKEN));
        assert!(refused(Code::Unknown, INVALID_TOKEN));
        assert!(!refused(Code::Unknown, "etcdserver: request timed out"));
        let bad_password = "etcdserver: authentication failed, invalid user ID or password";
        assert!(!refused(Code::InvalidArgument, bad_password));
        assert!(!refused(
            Code::PermissionDenied,
            "etcdserver: permission denied"
        ));
    }

    #[test]
    fn every_request_asks_for_a_leader_and_carries_the_token() {
        let token = AsciiMetadataValue::from_static("tok.1");
        let r = request((), Some(token));
        assert_eq!(r.metadata().get("hasleader").unwrap(), "true");
        assert_eq!(r.metadata().get("token").unwrap(), "tok.1");
        let r = request((), None);
        assert!(r.metadata().get("token").is_none());
    }
}
