//! The tutti client library: builds minitransactions and runs them as their coordinator
//! (Sinfonia Fig. 4), over pipelined connections shared by every concurrent caller. The
//! coordinator keeps no log. Its control flow is the sans-I/O `Coordinator`, which the
//! simulator drives too; this module does the I/O around it. Memory nodes are in
//! `tutti-memnode`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use tutti_client::{Cluster, ClientOptions, Minitx};
//! let cluster = Cluster::connect("127.0.0.1:7700", ClientOptions::default()).await?;
//! // Compare-and-swap 8 bytes at address 0 of node 1.
//! let tx = Minitx::new().compare(1, 0, vec![0; 8]).write(1, 0, 7u64.to_le_bytes().to_vec());
//! let outcome = cluster.exec_and_commit(&tx).await?;
//! println!("committed: {}", outcome.committed);
//! # Ok(()) }
//! ```

pub mod backup;
pub mod coordinator;
mod minitx;
mod plan;

pub use coordinator::{Coordinator, ExecuteAhead};
pub use minitx::{Minitx, Outcome};
pub use plan::NodeReply;

use coordinator::{Call, CallId, Next};
use futures::future::{Fuse, FusedFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use rand::Rng;
use std::borrow::Cow;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use tutti_wire::Limits;
use tutti_wire::{
    Backoff, Connection, Connections, Decision, Dialer, Directory, Managers, NodeId, NodeInfo,
    Request, Response, RpcError, StatsReport, Tid,
};

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long one `exec_and_commit` may take, retries included.
    pub deadline: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Checked before anything is sent; raise them together with the memory nodes'.
    pub limits: Limits,
    pub frame_bytes_max: usize,
    /// Pipelined connections to open in all, spread evenly over the memory nodes, at least
    /// one per node. Over a single connection this process and the node take turns: the
    /// replies and the requests they unblock go back and forth in whole batches. Two let
    /// both work at once; more only split the batches and add system calls.
    pub connections: usize,
    /// How it reaches the manager and the memory nodes (routes through a proxy under
    /// `tutti chaos`).
    pub dialer: Dialer,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Duration::from_secs(10),
            backoff_initial: Duration::from_micros(200),
            backoff_max: Duration::from_millis(100),
            limits: Limits::default(),
            frame_bytes_max: tutti_wire::FRAME_BYTES_MAX_DEFAULT,
            connections: 2,
            dialer: Dialer::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    #[error("cannot reach the manager at {addr} within the deadline: {reason}")]
    Manager { addr: String, reason: String },
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error("invalid minitransaction: {0}")]
    Invalid(String),
    #[error("node {0} is not in the cluster directory")]
    UnknownNode(NodeId),
    #[error("node {node} rejected the minitransaction: {message}")]
    Rejected { node: NodeId, message: String },
    #[error("no outcome within the deadline ({attempts} attempts); last: {last}")]
    Timeout { attempts: u32, last: String },
    #[error("minitransaction {tid} may or may not have committed: node {node}'s vote is unknown ({why})")]
    OutcomeUnknown { tid: Tid, node: NodeId, why: String },
    #[error("minitransaction {tid} committed but the reply carrying node {node}'s reads was lost")]
    ReadsLost { tid: Tid, node: NodeId },
    #[error("queued decisions not sent: {0}")]
    Flush(String),
}

struct Inner {
    managers: Managers,
    opts: ClientOptions,
    directory: Mutex<Directory>,
    conns: Connections,
    coordinator: u64,
    seq: AtomicU64,
    epoch: AtomicU64,
}

/// A handle on a tutti cluster. Clone it freely: clones share connections.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Cluster {
    /// Fetches the directory from the manager (retrying until the deadline) and caches it.
    pub async fn connect(manager: &str, opts: ClientOptions) -> Result<Cluster, ConnectError> {
        let managers = Managers::parse(manager, opts.frame_bytes_max, opts.dialer.clone())
            .map_err(|reason| ConnectError::Manager {
                addr: manager.to_string(),
                reason,
            })?;
        let until = Instant::now() + opts.deadline;
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
        let directory = loop {
            match fetch_directory(&managers, MANAGER_TIMEOUT).await {
                Ok(d) => break d,
                Err(e) => {
                    let permanent =
                        matches!(&e, RpcError::Handshake { reason, .. } if reason.is_permanent());
                    if permanent || !backoff.pause_before(until).await {
                        return Err(ConnectError::Manager {
                            addr: manager.to_string(),
                            reason: e.to_string(),
                        });
                    }
                }
            }
        };
        let epoch = AtomicU64::new(directory.epoch);
        let conns = Connections::with_per_node(
            opts.frame_bytes_max,
            CONNECT_TIMEOUT,
            opts.connections.div_ceil(directory.nodes.len().max(1)),
            opts.dialer.clone(),
        );
        Ok(Cluster {
            inner: Arc::new(Inner {
                managers,
                opts,
                directory: Mutex::new(directory),
                conns,
                coordinator: rand::thread_rng().gen(),
                seq: AtomicU64::new(1),
                epoch,
            }),
        })
    }

    /// The options this handle was made with (the layers above reach their own servers
    /// with the same dialer and frame limit).
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// The managers this handle fetches its directory from, as `connect` took them.
    pub fn manager(&self) -> String {
        self.inner.managers.list()
    }

    /// Sends `req` to the manager over a connection of its own and returns the reply: for
    /// the rare requests of the layers above (regions). Bounded by 2 s to connect and 2 s
    /// to answer; the manager's errors come back as `RpcError::Remote`.
    pub async fn ask_manager(&self, req: &Request) -> Result<Response, RpcError> {
        self.inner.managers.call(req, MANAGER_TIMEOUT).await
    }

    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.inner
            .directory
            .lock()
            .expect("directory poisoned")
            .nodes
            .clone()
    }

    /// Writes out every decision still queued, waiting at most the deadline. Decisions are
    /// one-way and leave in batches after `exec_and_commit` returns: call this before the
    /// process exits, or a decision lost with it leaves the minitransaction's locks held
    /// until the manager's recovery coordinator settles it (2 s by default).
    pub async fn flush(&self) -> Result<(), ExecError> {
        let conns = self.inner.conns.all();
        let flushes = futures::future::join_all(conns.iter().map(|c| c.flush()));
        match tokio::time::timeout(self.inner.opts.deadline, flushes).await {
            Ok(results) => results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), |e| Err(ExecError::Flush(e.to_string()))),
            Err(_) => Err(ExecError::Flush(format!(
                "decisions not written within {} ms",
                self.inner.opts.deadline.as_millis()
            ))),
        }
    }

    /// Load statistics of every memory node in the directory.
    pub async fn stats(&self) -> Vec<(NodeId, Result<StatsReport, RpcError>)> {
        let mut out = Vec::new();
        for node in self.nodes() {
            let result = match self.conn(node.id).await {
                Ok(c) => match c
                    .call_within(&Request::Stats, self.inner.opts.deadline)
                    .await
                {
                    Ok(Response::Stats(s)) => Ok(*s),
                    Ok(_) => Err(RpcError::Unexpected {
                        addr: node.addr.clone(),
                    }),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            out.push((node.id, result));
        }
        out
    }

    /// Sends `req` to memory node `node` and waits at most `timeout` for its reply: for
    /// requests outside minitransactions (a backup's). A node's error comes back as
    /// `Ok(Response::Error { .. })`.
    pub async fn call_node(
        &self,
        node: NodeId,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, RpcError> {
        let conn = match self.conn(node).await {
            Ok(conn) => conn,
            Err(e) => {
                // The node may be served at another address now (a fail-over): the next
                // call looks it up again.
                self.refresh_directory().await;
                return Err(e);
            }
        };
        match conn.call_within(req, timeout).await {
            Err(RpcError::Remote { code, message, .. }) => Ok(Response::Error { code, message }),
            other => other,
        }
    }

    /// Executes and commits `tx` (Sinfonia Fig. 4). Lock-busy, forced and stale-epoch aborts
    /// are retried with a new tid after randomized exponential backoff until the deadline;
    /// a failed compare returns `committed: false` with the failed items, never retried.
    pub async fn exec_and_commit(&self, tx: &Minitx) -> Result<Outcome, ExecError> {
        self.exec_and_commit_with(tx, None).await
    }

    /// `exec_and_commit` the traditional way that Sinfonia's minitransactions improve on
    /// (Systems A and B of its Fig. 17): the items are first executed and locked at their
    /// nodes, one request per item or per node, and only then committed with two-phase
    /// commit whose first phase carries no items. For comparisons; it costs round trips.
    /// A failed compare stops it there: the outcome lists the failed compares found so far
    /// (per item: the first one) and no reads.
    pub async fn exec_and_commit_ahead(
        &self,
        tx: &Minitx,
        ahead: ExecuteAhead,
    ) -> Result<Outcome, ExecError> {
        self.exec_and_commit_with(tx, Some(ahead)).await
    }

    async fn exec_and_commit_with(
        &self,
        tx: &Minitx,
        ahead: Option<ExecuteAhead>,
    ) -> Result<Outcome, ExecError> {
        tx.check(&self.inner.opts.limits)?;
        let durable = match self.first_node_durable(tx) {
            Err(ExecError::UnknownNode(_)) => {
                // A node that registered since this handle fetched its directory.
                self.refresh_directory().await;
                self.first_node_durable(tx)?
            }
            known => known?,
        };
        let clock = Instant::now();
        let now_us = || clock.elapsed().as_micros() as u64;
        let instant = |us: u64| tokio::time::Instant::from_std(clock + Duration::from_micros(us));
        let until = clock + self.inner.opts.deadline;
        let tid = self.next_tid();
        let jitter_seed = tid.coordinator ^ tid.seq.rotate_left(32);
        let cfg = self.coordinator_config(ahead);
        let mut co = Coordinator::new(Cow::Borrowed(tx), cfg, 0, |_| durable, jitter_seed);
        let unsent = Unsent::default();
        // Calls in flight. Most minitransactions wait on one or two at a time: those are
        // polled in place, and only more go to a `FuturesUnordered` (which allocates per
        // call and per minitransaction: 5 % of a one-phase commit's CPU when it held all).
        let mut a = pin!(Fuse::terminated());
        let mut b = pin!(Fuse::terminated());
        let mut more = None::<FuturesUnordered<_>>;
        let mut acts = co.begin(0, tid);
        // One timer for the whole minitransaction, moved only when the coordinator's moves.
        let timer_at = |co: &Coordinator<'_>| {
            instant(
                co.timer_at_us()
                    .expect("a waiting coordinator has a timer set"),
            )
        };
        let timer = tokio::time::sleep_until(timer_at(&co));
        tokio::pin!(timer);
        loop {
            let epoch = &self.inner.epoch;
            epoch.fetch_max(acts.epoch_seen, Ordering::Relaxed);
            for (node, decision) in acts.decisions {
                self.send_decision(node, decision).await;
            }
            for call in acts.calls {
                unsent.add(call.id);
                let call = self.call(call, until, &unsent).fuse();
                if a.is_terminated() {
                    a.set(call);
                } else if b.is_terminated() {
                    b.set(call);
                } else {
                    more.get_or_insert_with(FuturesUnordered::new).push(call);
                }
            }
            match acts.next {
                Next::Done(result) => return result,
                Next::Retry { at_us } => {
                    a.set(Fuse::terminated());
                    b.set(Fuse::terminated());
                    more = None;
                    unsent.clear();
                    tokio::time::sleep_until(instant(at_us)).await;
                    acts = co.begin(now_us(), self.next_tid());
                    continue;
                }
                Next::Wait => {}
            }
            let at = timer_at(&co);
            if at != timer.deadline() {
                timer.as_mut().reset(at);
            }
            let more_pending = more.as_ref().is_some_and(|m| !m.is_empty());
            let (id, reply) = tokio::select! {
                biased;
                reply = &mut a, if !a.is_terminated() => reply,
                reply = &mut b, if !b.is_terminated() => reply,
                Some(reply) = async { more.as_mut().expect("pending").next().await }, if more_pending => reply,
                () = &mut timer => {
                    // At the deadline, a call that has not left never will: it was not
                    // delivered, and its vote is no vote rather than a lost one. (The
                    // timer stays expired until every such call is told.)
                    acts = match unsent.take_at(until) {
                        Some(id) => co.on_reply(now_us(), id, NodeReply::Unreachable(
                            "not sent before the deadline".into(),
                        )),
                        None => co.on_timer(now_us()),
                    };
                    continue;
                }
            };
            acts = co.on_reply(now_us(), id, reply);
        }
    }

    /// Whether the node of `tx`'s first item keeps a redo log (the coordinator asks this of
    /// one-participant minitransactions only); an item on a node the directory does not
    /// know is an error.
    fn first_node_durable(&self, tx: &Minitx) -> Result<bool, ExecError> {
        let dir = self.inner.directory.lock().expect("directory poisoned");
        let known = |n: &NodeId| dir.nodes.iter().find(|i| i.id == *n);
        if let Some((n, _)) = tx.items.iter().find(|(n, _)| known(n).is_none()) {
            return Err(ExecError::UnknownNode(*n));
        }
        let first = tx.items.first().and_then(|(n, _)| known(n));
        Ok(first.is_none_or(|i| i.durable))
    }

    fn coordinator_config(&self, ahead: Option<ExecuteAhead>) -> coordinator::Config {
        let opts = &self.inner.opts;
        coordinator::Config {
            deadline_us: opts.deadline.as_micros() as u64,
            reply_timeout_us: None,
            backoff_initial_us: opts.backoff_initial.as_micros() as u64,
            backoff_max_us: opts.backoff_max.as_micros() as u64,
            ahead,
        }
    }

    fn next_tid(&self) -> Tid {
        Tid {
            epoch: self.inner.epoch.load(Ordering::Relaxed),
            coordinator: self.inner.coordinator,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// One call of a coordinator, reconnecting until `until`. Tells apart "not delivered"
    /// (safe to treat as no vote) from "delivered, reply lost"; a call still awaiting its
    /// reply at the deadline is the coordinator's timer's business.
    async fn call(&self, call: Call, until: Instant, unsent: &Unsent) -> (CallId, NodeReply) {
        let Call { id, node, request } = call;
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
        let reply = loop {
            let failed = match self.conn(node).await {
                // Told undelivered at the deadline: it must not leave now.
                Ok(_) if !unsent.remove(id) => {
                    break NodeReply::Unreachable("not sent before the deadline".into())
                }
                Ok(conn) => match conn.call(&request).await {
                    Ok(resp) => break NodeReply::from_response(resp),
                    Err(RpcError::Remote { code, message, .. }) => {
                        break NodeReply::Refused(code, message)
                    }
                    // The connection closed under a call that had not left: not delivered.
                    Err(e @ RpcError::NotSent { .. }) => {
                        unsent.add(id);
                        e
                    }
                    Err(e) => break NodeReply::Lost(e.to_string()),
                },
                Err(e) => {
                    let permanent =
                        matches!(&e, RpcError::Handshake { reason, .. } if reason.is_permanent());
                    if permanent {
                        break NodeReply::Unreachable(e.to_string());
                    }
                    e
                }
            };
            if !backoff.pause_before(until).await {
                break NodeReply::Unreachable(failed.to_string());
            }
            self.refresh_directory().await;
        };
        unsent.remove(id);
        (id, reply)
    }

    /// Best effort, one-way: on the node's open connection, or else on a new one from a
    /// task of its own, since connecting may take `CONNECT_TIMEOUT` (a node down or cut
    /// off), which is not the minitransaction's to wait. A node that cannot be reached
    /// learns the outcome from recovery.
    async fn send_decision(&self, node: NodeId, decision: Decision) {
        if let Some(conn) = self.inner.conns.cached(node) {
            let _ = conn.send_decision(decision).await;
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Ok(conn) = this.conn(node).await {
                let _ = conn.send_decision(decision).await;
            }
        });
    }

    async fn conn(&self, node: NodeId) -> Result<Arc<Connection>, RpcError> {
        if let Some(c) = self.inner.conns.cached(node) {
            return Ok(c);
        }
        let addr = {
            let dir = self.inner.directory.lock().expect("directory poisoned");
            dir.nodes
                .iter()
                .find(|n| n.id == node)
                .map(|n| n.addr.clone())
        };
        let addr = addr.ok_or_else(|| RpcError::Connect {
            addr: format!("node {node}"),
            reason: "not in the directory".into(),
        })?;
        self.inner.conns.get(node, &addr).await
    }

    /// Best effort: keeps the cached directory if the manager is down.
    async fn refresh_directory(&self) {
        let fetch = fetch_directory(&self.inner.managers, Duration::from_millis(500));
        if let Ok(d) = fetch.await {
            self.inner.epoch.fetch_max(d.epoch, Ordering::Relaxed);
            *self.inner.directory.lock().expect("directory poisoned") = d;
        }
    }
}

/// The calls of one minitransaction not handed to a connection yet. A call leaves only
/// after taking itself out of here, so one the driver takes out at the deadline (to tell
/// the coordinator it was not delivered) never leaves.
#[derive(Default)]
struct Unsent(Mutex<Vec<CallId>>);

impl Unsent {
    fn add(&self, id: CallId) {
        self.0.lock().expect("unsent poisoned").push(id);
    }

    /// Whether `id` was here (and may leave now).
    fn remove(&self, id: CallId) -> bool {
        let mut unsent = self.0.lock().expect("unsent poisoned");
        let at = unsent.iter().position(|&u| u == id);
        at.map(|at| unsent.swap_remove(at)).is_some()
    }

    /// Their calls dropped (the attempt is over).
    fn clear(&self) {
        self.0.lock().expect("unsent poisoned").clear();
    }

    /// One call still here, once `until` has passed.
    fn take_at(&self, until: Instant) -> Option<CallId> {
        let passed = Instant::now() >= until;
        passed.then(|| self.0.lock().expect("unsent poisoned").pop())?
    }
}

/// How long a connection attempt to a memory node may take before it counts as a failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one directory request may take.
const MANAGER_TIMEOUT: Duration = Duration::from_secs(2);

async fn fetch_directory(managers: &Managers, timeout: Duration) -> Result<Directory, RpcError> {
    match managers.call(&Request::Directory, timeout).await? {
        Response::Directory(d) => Ok(d),
        _ => Err(RpcError::Unexpected {
            addr: managers.list(),
        }),
    }
}
