//! Pipelined RPC over one TCP connection: many requests in flight, replies matched by id.
//! A writer task batches frames into few syscalls, and the phase-2 decisions queued meanwhile
//! into one frame; a reader task completes waiting callers. No lock is held across an
//! await, so concurrent callers never serialise on each other.

use crate::credentials::Credentials;
use crate::frame::{decode_envelope, encode_envelope, ONE_WAY};
use crate::message::{Decision, ErrorCode, Request, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

/// Requests in flight on one connection before a caller waits for room.
pub const IN_FLIGHT_MAX: usize = 4096;

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("no connection with {addr}: {reason}")]
    Handshake {
        addr: String,
        reason: crate::HandshakeError,
    },
    #[error("connection to {addr} closed before the reply arrived")]
    Closed { addr: String },
    /// The connection was closed before the request left: it was not delivered.
    #[error("connection to {addr} closed before the request was sent")]
    NotSent { addr: String },
    #[error("{addr} answered {code:?}: {message}")]
    Remote {
        addr: String,
        code: ErrorCode,
        message: String,
    },
    #[error("{addr} sent an unexpected reply")]
    Unexpected { addr: String },
    #[error("{addr} did not answer within {ms} ms")]
    Timeout { addr: String, ms: u64 },
    #[error("no manager of {addrs} leads (an election may be under way)")]
    NoLeader { addrs: String },
}

pub fn codec(frame_bytes_max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(frame_bytes_max)
        .new_codec()
}

/// Where a server sends `(request id, reply)` for one connection. Unbounded in type, so
/// that a state machine can reply from under its lock without awaiting, and bounded in
/// fact: a request is read only with one of the connection's `IN_FLIGHT_MAX` permits, which
/// its reply returns; one-way messages get no reply, and a bad frame one last error before
/// the connection closes. When every permit is out the connection is not read, and TCP
/// pushes back on the client.
pub type Replies = mpsc::UnboundedSender<(u64, Response)>;

type Pending = Arc<Mutex<FxHashMap<u64, oneshot::Sender<Response>>>>;

/// What the writer task is handed: an encoded frame, the cue to encode the decisions
/// queued so far as one frame, or a caller to tell once all before it is on the socket.
enum Outbound {
    Frame(Bytes),
    Decisions,
    Flushed(oneshot::Sender<()>),
}

/// A client end of a pipelined connection. Cheap to share behind an `Arc`.
pub struct Connection {
    addr: String,
    frames: mpsc::Sender<Outbound>,
    pending: Pending,
    /// Decisions not yet handed to the writer; a cue is queued iff this is non-empty.
    decisions: Arc<Mutex<Vec<Decision>>>,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
}

/// How a process reaches an address: directly, or through another address for some
/// (`--route FROM=VIA`: `tutti chaos` points each process at its own fault-injecting proxy
/// for every peer); and what it proves on each connection and asks of its peers (a cluster
/// token, TLS). Passed in each component's options; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Dialer {
    routes: Arc<HashMap<String, String>>,
    credentials: Credentials,
}

impl Dialer {
    /// Dials `from` at `via` instead, for each pair.
    pub fn with_routes(routes: HashMap<String, String>) -> Dialer {
        Dialer {
            routes: Arc::new(routes),
            credentials: Credentials::default(),
        }
    }

    /// This dialer, proving `credentials` on every connection (and asking peers for them).
    pub fn with_credentials(self, credentials: Credentials) -> Dialer {
        Dialer {
            credentials,
            ..self
        }
    }

    /// What this process proves to peers, which its servers also ask of theirs.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Where a connection to `addr` really goes.
    pub fn address<'a>(&'a self, addr: &'a str) -> &'a str {
        self.routes.get(addr).map_or(addr, String::as_str)
    }
}

impl Connection {
    /// Connects to `addr` (through `dialer`) and exchanges hellos; errors name `addr`.
    pub async fn connect(
        addr: &str,
        frame_bytes_max: usize,
        dialer: &Dialer,
    ) -> Result<Connection, RpcError> {
        let stream = TcpStream::connect(dialer.address(addr))
            .await
            .map_err(|e| RpcError::Connect {
                addr: addr.to_string(),
                reason: e.to_string(),
            })?;
        stream.set_nodelay(true).ok();
        let (rd, wr) = crate::handshake::connect(stream, addr, dialer.credentials())
            .await
            .map_err(|reason| RpcError::Handshake {
                addr: addr.to_string(),
                reason,
            })?;
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (frames, mut frames_rx) = mpsc::channel::<Outbound>(IN_FLIGHT_MAX);
        let mut sink = FramedWrite::new(wr, codec(frame_bytes_max));
        let writer_closed = closed.clone();
        let decisions: Arc<Mutex<Vec<Decision>>> = Arc::default();
        let queued = decisions.clone();
        let going_away = Arc::new(tokio::sync::Notify::new());
        let told_to_go = going_away.clone();
        tokio::spawn(async move {
            let mut flushed = Vec::new();
            let mut going = false;
            'write: loop {
                let first = tokio::select! {
                    first = frames_rx.recv() => first,
                    () = told_to_go.notified(), if !going => {
                        // Send what is queued, then nothing: the server reads to our end.
                        going = true;
                        frames_rx.close();
                        continue;
                    }
                };
                let Some(first) = first else { break };
                let mut next = Some(first);
                while let Some(out) = next.take().or_else(|| frames_rx.try_recv().ok()) {
                    let frame = match out {
                        Outbound::Frame(frame) => frame,
                        Outbound::Decisions => {
                            let decisions =
                                std::mem::take(&mut *queued.lock().expect("queue poisoned"));
                            encode_envelope(ONE_WAY, &Request::Decisions(decisions))
                        }
                        Outbound::Flushed(waiter) => {
                            flushed.push(waiter);
                            continue;
                        }
                    };
                    if sink.feed(frame).await.is_err() {
                        break 'write;
                    }
                }
                if SinkExt::<Bytes>::flush(&mut sink).await.is_err() {
                    break;
                }
                for waiter in flushed.drain(..) {
                    let _ = waiter.send(());
                }
            }
            writer_closed.store(true, Ordering::Release);
            let _ = SinkExt::<Bytes>::close(&mut sink).await;
        });
        let mut stream = FramedRead::new(rd, codec(frame_bytes_max));
        let reader_pending = pending.clone();
        let reader_closed = closed.clone();
        tokio::spawn(async move {
            while let Some(Ok(frame)) = stream.next().await {
                let Ok((id, resp)) = decode_envelope::<Response>(&frame) else {
                    break;
                };
                if id == ONE_WAY && matches!(resp, Response::GoingAway) {
                    // Later calls go to a new connection; replies still come on this one.
                    reader_closed.store(true, Ordering::Release);
                    going_away.notify_one();
                    continue;
                }
                let waiter = reader_pending
                    .lock()
                    .expect("pending map poisoned")
                    .remove(&id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(resp);
                }
            }
            reader_closed.store(true, Ordering::Release);
            // Dropping the senders wakes every waiting caller with `Closed`.
            reader_pending.lock().expect("pending map poisoned").clear();
        });
        Ok(Connection {
            addr: addr.to_string(),
            frames,
            pending,
            decisions,
            next_id: AtomicU64::new(1),
            closed,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.frames.is_closed()
    }

    /// Sends `req` and waits for its reply. An `Error` reply becomes `RpcError::Remote`.
    pub async fn call(&self, req: &Request) -> Result<Response, RpcError> {
        self.send_call(req).await?.await
    }

    /// Hands `req` to the connection's writer and returns its reply to await later: frames
    /// leave in the order of these calls, so a sender of ordered requests (a primary's
    /// records to its mirror) keeps several in flight without reordering them.
    pub async fn send_call(
        &self,
        req: &Request,
    ) -> Result<impl std::future::Future<Output = Result<Response, RpcError>>, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("pending map poisoned")
            .insert(id, tx);
        if self.is_closed() {
            self.pending
                .lock()
                .expect("pending map poisoned")
                .remove(&id);
            return Err(self.not_sent_error());
        }
        let frame = Outbound::Frame(encode_envelope(id, req));
        if self.frames.send(frame).await.is_err() {
            self.pending
                .lock()
                .expect("pending map poisoned")
                .remove(&id);
            return Err(self.not_sent_error());
        }
        let addr = self.addr.clone();
        let closed = self.closed_error();
        Ok(async move {
            match rx.await {
                Ok(Response::Error { code, message }) => Err(RpcError::Remote {
                    addr,
                    code,
                    message,
                }),
                Ok(resp) => Ok(resp),
                Err(_) => Err(closed),
            }
        })
    }

    /// `call`, giving up after `timeout` (the request may still be executed).
    pub async fn call_within(
        &self,
        req: &Request,
        timeout: std::time::Duration,
    ) -> Result<Response, RpcError> {
        match tokio::time::timeout(timeout, self.call(req)).await {
            Ok(result) => result,
            Err(_) => Err(RpcError::Timeout {
                addr: self.addr.clone(),
                ms: timeout.as_millis() as u64,
            }),
        }
    }

    /// Sends `req` without waiting for (or expecting) a reply.
    pub async fn send_one_way(&self, req: &Request) -> Result<(), RpcError> {
        self.frames
            .send(Outbound::Frame(encode_envelope(ONE_WAY, req)))
            .await
            .map_err(|_| self.closed_error())
    }

    /// Sends a phase-2 outcome without a reply. The decisions queued until the writer gets
    /// to them leave as one `Decisions` frame, ahead of every frame sent after this call:
    /// a node releases a tid's locks before it sees the caller's next request.
    pub async fn send_decision(&self, decision: Decision) -> Result<(), RpcError> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let first = {
            let mut queued = self.decisions.lock().expect("queue poisoned");
            queued.push(decision);
            queued.len() == 1
        };
        if first {
            // The channel is fair: frames sent after this cue queue up behind it.
            (self.frames.send(Outbound::Decisions).await).map_err(|_| self.closed_error())?;
        }
        Ok(())
    }

    /// Waits until every request and decision handed to this connection before the call is
    /// written to the socket.
    pub async fn flush(&self) -> Result<(), RpcError> {
        let (tx, rx) = oneshot::channel();
        (self.frames.send(Outbound::Flushed(tx)).await).map_err(|_| self.closed_error())?;
        rx.await.map_err(|_| self.closed_error())
    }

    fn closed_error(&self) -> RpcError {
        RpcError::Closed {
            addr: self.addr.clone(),
        }
    }

    fn not_sent_error(&self) -> RpcError {
        RpcError::NotSent {
            addr: self.addr.clone(),
        }
    }
}

/// Serves one accepted connection: opens it with `credentials` (TLS, hellos, token proofs; a
/// peer of another protocol version, or without what is asked, is refused and the refusal
/// logged), then decodes requests and hands
/// each to `handle` with the id to reply to; replies sent on the returned channel are
/// written back in batches. A frame that does not decode gets an error reply and closes
/// the connection. At most
/// `IN_FLIGHT_MAX` requests await their reply: past that the connection is not read until
/// replies drain, so a client that never reads cannot grow the server's memory.
///
/// Once `stop` is cancelled no request reaches `handle` any more: the client is told
/// `GoingAway`, every request read after that is refused unexecuted, and the connection
/// closes when the client has closed its side (or `GOING_AWAY_GRACE` later), so that no
/// request is left without an answer that says whether it ran.
pub async fn serve_connection<H>(
    stream: TcpStream,
    frame_bytes_max: usize,
    credentials: Credentials,
    stop: CancellationToken,
    mut handle: H,
) where
    H: FnMut(u64, Request, Replies),
{
    stream.set_nodelay(true).ok();
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let (rd, wr) = match crate::handshake::accept(stream, &credentials).await {
        Ok(halves) => halves,
        Err(e) if e.is_permanent() => {
            tracing::warn!(%peer, "refused a connection: {e}");
            return;
        }
        Err(e) => {
            // A peer killed or cut off while connecting: nothing to refuse.
            tracing::debug!(%peer, "a connection ended during the handshake: {e}");
            return;
        }
    };
    let (replies, mut replies_rx) = mpsc::unbounded_channel::<(u64, Response)>();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_MAX));
    let released = in_flight.clone();
    let writer = tokio::spawn(async move {
        let mut sink = FramedWrite::new(wr, codec(frame_bytes_max));
        while let Some((id, resp)) = replies_rx.recv().await {
            if sink.feed(encode_envelope(id, &resp)).await.is_err() {
                return;
            }
            let mut answered = usize::from(id != ONE_WAY);
            while let Ok((id, resp)) = replies_rx.try_recv() {
                if sink.feed(encode_envelope(id, &resp)).await.is_err() {
                    return;
                }
                answered += usize::from(id != ONE_WAY);
            }
            released.add_permits(answered);
            if SinkExt::<Bytes>::flush(&mut sink).await.is_err() {
                return;
            }
        }
    });
    let mut frames = FramedRead::new(rd, codec(frame_bytes_max));
    let mut going_away = None;
    loop {
        let frame = tokio::select! {
            biased;
            () = stop.cancelled(), if going_away.is_none() => {
                going_away = Some(tokio::time::Instant::now() + GOING_AWAY_GRACE);
                let _ = replies.send((ONE_WAY, Response::GoingAway));
                continue;
            }
            () = grace_over(going_away) => break,
            frame = frames.next() => frame,
        };
        let frame = match frame {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                let _ = replies.send((ONE_WAY, bad_request(format!("bad frame: {e}"))));
                break;
            }
            None => break,
        };
        match decode_envelope::<Request>(&frame) {
            Ok((id, req)) => {
                if id != ONE_WAY {
                    let permit = tokio::select! {
                        permit = in_flight.acquire() => permit,
                        () = grace_over(going_away) => break,
                    };
                    match permit {
                        Ok(permit) => permit.forget(),
                        Err(_) => break,
                    }
                }
                match going_away {
                    None => handle(id, req, replies.clone()),
                    Some(_) if id == ONE_WAY => {}
                    Some(_) => {
                        let refusal = Response::Error {
                            code: ErrorCode::NotReady,
                            message: "the server stopped serving this connection before \
                                      reading the request; ask again on a new one"
                                .into(),
                        };
                        let _ = replies.send((id, refusal));
                    }
                }
            }
            Err(e) => {
                let _ = replies.send((ONE_WAY, bad_request(e.to_string())));
                break;
            }
        }
    }
    drop(replies);
    let _ = writer.await;
}

/// Resolves at `at`; never without one.
async fn grace_over(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub fn bad_request(message: String) -> Response {
    Response::Error {
        code: ErrorCode::BadRequest,
        message,
    }
}

/// The next connection on `listener`. Accepting fails only for a passing condition (out of
/// descriptors, a connection reset before it was taken): it is retried after a pause.
pub async fn accept(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

/// How long a connection told `GoingAway` waits for its client to close its side before
/// the server closes it anyway.
pub const GOING_AWAY_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Accepts connections on `listener` forever and serves each with `handle`
/// (see `serve_connection`). The connections are this future's: dropping it (aborting its
/// task) closes every one at once.
pub async fn serve<H>(
    listener: tokio::net::TcpListener,
    frame_bytes_max: usize,
    credentials: Credentials,
    handle: H,
) where
    H: Fn(u64, Request, Replies) + Send + Sync + 'static,
{
    let never = CancellationToken::new();
    serve_until(listener, frame_bytes_max, credentials, never, handle).await
}

/// `serve` until `stop` is cancelled; then the listener closes and every connection goes
/// away (`serve_connection`): a process that changes what it is (a mirror promoted to
/// primary) or stops leaves no connection served the old way, and no client request
/// without an answer. Returns once every connection closed, `GOING_AWAY_GRACE` at most.
pub async fn serve_until<H>(
    listener: tokio::net::TcpListener,
    frame_bytes_max: usize,
    credentials: Credentials,
    stop: CancellationToken,
    handle: H,
) where
    H: Fn(u64, Request, Replies) + Send + Sync + 'static,
{
    let handle = Arc::new(handle);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => break,
            stream = accept(&listener) => stream,
            Some(_) = connections.join_next() => continue,
        };
        let handle = handle.clone();
        connections.spawn(serve_connection(
            stream,
            frame_bytes_max,
            credentials.clone(),
            stop.clone(),
            move |id, req, replies| handle(id, req, replies),
        ));
    }
    drop(listener);
    let all_closed = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(GOING_AWAY_GRACE, all_closed).await;
}

/// Open connections to memory nodes by id, made on first use and replaced once closed.
/// With several per node, each task keeps to one of them: while a node works through one
/// connection's batch of requests, the caller can be handling another's replies, where a
/// single connection makes the two sides take turns.
pub struct Connections {
    frame_bytes_max: usize,
    connect_timeout: std::time::Duration,
    per_node: usize,
    turn: std::sync::atomic::AtomicUsize,
    open: Mutex<FxHashMap<crate::NodeId, Vec<Arc<Connection>>>>,
    dialer: Dialer,
}

impl Connections {
    pub fn new(
        frame_bytes_max: usize,
        connect_timeout: std::time::Duration,
        dialer: Dialer,
    ) -> Self {
        Self::with_per_node(frame_bytes_max, connect_timeout, 1, dialer)
    }

    /// Up to `per_node` (at least 1) connections to each node.
    pub fn with_per_node(
        frame_bytes_max: usize,
        connect_timeout: std::time::Duration,
        per_node: usize,
        dialer: Dialer,
    ) -> Self {
        Connections {
            frame_bytes_max,
            connect_timeout,
            dialer,
            per_node: per_node.max(1),
            turn: std::sync::atomic::AtomicUsize::new(0),
            open: Mutex::default(),
        }
    }

    /// The calling task's connection to `node`, if `node` has all its connections open.
    pub fn cached(&self, node: crate::NodeId) -> Option<Arc<Connection>> {
        let mut open = self.open.lock().expect("connections poisoned");
        let conns = open.get_mut(&node)?;
        if conns.len() == self.per_node {
            let conn = &conns[self.slot() % conns.len()];
            if !conn.is_closed() {
                return Some(conn.clone());
            }
        }
        conns.retain(|c| !c.is_closed());
        None
    }

    /// Drops the cached connections to `node` (it is served at another address now).
    pub fn forget(&self, node: crate::NodeId) {
        self.open
            .lock()
            .expect("connections poisoned")
            .remove(&node);
    }

    /// Every open connection, for `Connection::flush`.
    pub fn all(&self) -> Vec<Arc<Connection>> {
        let open = self.open.lock().expect("connections poisoned");
        open.values().flatten().cloned().collect()
    }

    /// A task keeps to one connection, so that each connection carries the requests of a
    /// fixed set of tasks and its batches stay whole; calls outside a task take turns.
    fn slot(&self) -> usize {
        match tokio::task::try_id() {
            Some(id) => {
                // Task ids count up from 1: tasks spawned one after another alternate.
                use std::hash::{Hash, Hasher};
                let mut number = TaskNumber(0);
                id.hash(&mut number);
                number.finish() as usize
            }
            None => self.turn.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The calling task's connection to `node`, or a new one to `addr` while `node` has
    /// fewer than its share.
    pub async fn get(&self, node: crate::NodeId, addr: &str) -> Result<Arc<Connection>, RpcError> {
        if let Some(c) = self.cached(node) {
            return Ok(c);
        }
        let timeout = self.connect_timeout;
        let conn = match tokio::time::timeout(
            timeout,
            Connection::connect(addr, self.frame_bytes_max, &self.dialer),
        )
        .await
        {
            Ok(conn) => Arc::new(conn?),
            Err(_) => {
                return Err(RpcError::Timeout {
                    addr: addr.to_string(),
                    ms: timeout.as_millis() as u64,
                })
            }
        };
        let mut open = self.open.lock().expect("connections poisoned");
        let conns = open.entry(node).or_default();
        // Callers racing on a node's first use each connect; the surplus serves one call.
        if conns.len() < self.per_node {
            conns.push(conn.clone());
        }
        Ok(conn)
    }
}

/// Reads the number a task id hashes as (the id is opaque, its `Hash` writes the number).
struct TaskNumber(u64);

impl std::hash::Hasher for TaskNumber {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
