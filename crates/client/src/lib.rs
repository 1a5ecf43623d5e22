//! The tutti client library: builds minitransactions and runs them as their coordinator
//! (Sinfonia Fig. 4), over pipelined connections shared by every concurrent caller. The
//! coordinator keeps no log. The decision rule lives in `coordinator` as pure functions;
//! this module does the I/O around it. Memory nodes are in `tutti-memnode`.
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

pub mod coordinator;
mod minitx;

pub use coordinator::Tally;
pub use minitx::{Minitx, Outcome};

use coordinator::{split, NodeReply};
use rand::Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
pub use tutti_wire::Limits;
use tutti_wire::{
    Connection, Connections, Decision, Directory, NodeId, NodeInfo, Request, Response, RpcError,
    StatsReport, Tid, Vote,
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
    #[error("minitransaction {tid} may or may not have committed: node {node} did not answer before the deadline")]
    OutcomeUnknown { tid: Tid, node: NodeId },
    #[error("minitransaction {tid} committed but the reply carrying node {node}'s reads was lost")]
    ReadsLost { tid: Tid, node: NodeId },
    #[error("queued decisions not sent: {0}")]
    Flush(String),
}

struct Inner {
    manager: String,
    opts: ClientOptions,
    directory: Mutex<Directory>,
    conns: Connections,
    coordinator: u64,
    seq: AtomicU64,
    epoch: AtomicU64,
}

/// How `Cluster::exec_and_commit_ahead` executes items before the commit protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecuteAhead {
    /// One request per item, one after the other (Sinfonia Fig. 17, System A).
    PerItem,
    /// One request per node, all at once (System B).
    PerNode,
}

/// A handle on a tutti cluster. Clone it freely: clones share connections.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Cluster {
    /// Fetches the directory from the manager (retrying until the deadline) and caches it.
    pub async fn connect(manager: &str, opts: ClientOptions) -> Result<Cluster, ConnectError> {
        let until = Instant::now() + opts.deadline;
        let mut delay = Duration::from_millis(20);
        let directory = loop {
            match fetch_directory(manager, opts.frame_bytes_max).await {
                Ok(d) => break d,
                Err(e) if Instant::now() + delay >= until => {
                    return Err(ConnectError::Manager {
                        addr: manager.to_string(),
                        reason: e.to_string(),
                    })
                }
                Err(_) => tokio::time::sleep(delay).await,
            }
            delay = (delay * 2).min(Duration::from_millis(500));
        };
        let epoch = AtomicU64::new(directory.epoch);
        let conns = Connections::with_per_node(
            opts.frame_bytes_max,
            CONNECT_TIMEOUT,
            opts.connections.div_ceil(directory.nodes.len().max(1)),
        );
        Ok(Cluster {
            inner: Arc::new(Inner {
                manager: manager.to_string(),
                opts,
                directory: Mutex::new(directory),
                conns,
                coordinator: rand::thread_rng().gen(),
                seq: AtomicU64::new(1),
                epoch,
            }),
        })
    }

    /// The manager this handle fetches its directory from.
    pub fn manager(&self) -> &str {
        &self.inner.manager
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
                    Ok(Response::Stats(s)) => Ok(s),
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
        let plan = split(tx);
        {
            let dir = self.inner.directory.lock().expect("directory poisoned");
            if let Some(&n) = plan
                .nodes()
                .iter()
                .find(|n| !dir.nodes.iter().any(|i| i.id == **n))
            {
                return Err(ExecError::UnknownNode(n));
            }
        }
        let opts = &self.inner.opts;
        let until = Instant::now() + opts.deadline;
        let mut backoff = opts.backoff_initial;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let tid = self.next_tid();
            let last = match self.attempt(tid, &plan, ahead, until).await? {
                Ok(outcome) => return Ok(outcome),
                Err(reason) => reason,
            };
            let pause = rand::thread_rng().gen_range(backoff / 2..=backoff);
            if Instant::now() + pause >= until {
                return Err(ExecError::Timeout { attempts, last });
            }
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(opts.backoff_max);
        }
    }

    fn next_tid(&self) -> Tid {
        Tid {
            epoch: self.inner.epoch.load(Ordering::Relaxed),
            coordinator: self.inner.coordinator,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// One try: `Ok(Ok(outcome))` decided, `Ok(Err(reason))` aborted and worth retrying.
    async fn attempt(
        &self,
        tid: Tid,
        plan: &coordinator::Plan<'_>,
        ahead: Option<ExecuteAhead>,
        until: Instant,
    ) -> Result<Result<Outcome, String>, ExecError> {
        let requests = match ahead {
            None => plan.requests(tid),
            Some(ahead) => {
                if let Some(aborted) = self.execute_ahead(tid, plan, ahead, until).await {
                    return aborted;
                }
                plan.requests_after_execute_ahead(tid)
            }
        };
        let replies = self
            .call_all(requests.iter().map(|(node, req)| (*node, req)), until)
            .await;
        let mut tally = coordinator::tally(plan.nodes(), &replies);
        if let Tally::Unknown { .. } = tally {
            tally = self.resolve_unknown(tid, plan, &replies, until).await;
        }
        let multi = plan.nodes().len() > 1;
        match tally {
            Tally::Commit => {
                if multi && plan.read_only() {
                    let releases = coordinator::releases(plan, tid);
                    let answers: Vec<Option<Response>> = self
                        .call_all(releases.iter().map(|(node, req)| (*node, req)), until)
                        .await
                        .into_iter()
                        .map(|r| match r {
                            NodeReply::Other(resp) => Some(resp),
                            _ => None,
                        })
                        .collect();
                    if let Tally::Retry(reason) = coordinator::released(&answers) {
                        return Ok(Err(reason));
                    }
                } else if multi {
                    let lsns = coordinator::commit_lsns(&replies);
                    let decision = Decision {
                        tid,
                        commit: true,
                        lsns,
                    };
                    self.decide(plan, decision).await;
                }
                plan.outcome(tid, &replies, true)
            }
            Tally::AbortCompare => {
                if multi {
                    self.decide(plan, Decision::abort(tid)).await;
                }
                plan.outcome(tid, &replies, false)
            }
            Tally::Retry(reason) => {
                if multi {
                    self.decide(plan, Decision::abort(tid)).await;
                }
                Ok(Err(reason))
            }
            Tally::Rejected { node, message } => {
                if multi {
                    self.decide(plan, Decision::abort(tid)).await;
                }
                Err(ExecError::Rejected { node, message })
            }
            Tally::Unknown { node } => Err(ExecError::OutcomeUnknown { tid, node }),
        }
    }

    /// Executes the items ahead of the commit protocol. `None` when all did; otherwise the
    /// attempt is over (aborted everywhere) and this is its result.
    async fn execute_ahead(
        &self,
        tid: Tid,
        plan: &coordinator::Plan<'_>,
        ahead: ExecuteAhead,
        until: Instant,
    ) -> Option<Result<Result<Outcome, String>, ExecError>> {
        let requests = plan.execute_ahead_requests(tid, ahead == ExecuteAhead::PerItem);
        let nodes: Vec<NodeId> = requests.iter().map(|(node, _, _)| *node).collect();
        let mut replies = Vec::with_capacity(requests.len());
        if ahead == ExecuteAhead::PerItem {
            for (node, req, _) in &requests {
                let reply = self.call_until(*node, req, until).await;
                let executed = matches!(&reply, NodeReply::Vote(v) if v.vote == Vote::CommitOk);
                replies.push(reply);
                if !executed {
                    break;
                }
            }
        } else {
            replies = self
                .call_all(requests.iter().map(|(node, req, _)| (*node, req)), until)
                .await;
        }
        let tally = coordinator::tally_execute_ahead(&nodes[..replies.len()], &replies)?;
        self.decide(plan, Decision::abort(tid)).await;
        Some(match tally {
            Tally::AbortCompare => {
                let mut failed: Vec<usize> = Vec::new();
                for ((_, _, positions), reply) in requests.iter().zip(&replies) {
                    if let NodeReply::Vote(v) = reply {
                        let found = v.failed_compares.iter();
                        failed.extend(found.filter_map(|&k| positions.get(k as usize).copied()));
                    }
                }
                failed.sort_unstable();
                Ok(Ok(Outcome {
                    committed: false,
                    reads: Vec::new(),
                    failed_compares: failed,
                }))
            }
            Tally::Rejected { node, message } => Err(ExecError::Rejected { node, message }),
            Tally::Retry(reason) => Ok(Err(reason)),
            Tally::Commit | Tally::Unknown { .. } => {
                unreachable!("tally_execute_ahead returns neither")
            }
        })
    }

    /// A node's vote was lost with its connection. The outcome is then fixed by the votes
    /// on record, so ask the node as a recovery coordinator would (REQUEST-ABORT).
    async fn resolve_unknown(
        &self,
        tid: Tid,
        plan: &coordinator::Plan<'_>,
        replies: &[NodeReply],
        until: Instant,
    ) -> Tally {
        let queries = match coordinator::lost_vote_queries(plan, tid, replies, |n| self.durable(n))
        {
            Ok(queries) => queries,
            Err(tally) => return tally,
        };
        let mut answers = Vec::new();
        for (node, query) in queries {
            match self.call_until(node, &query, until).await {
                NodeReply::Other(Response::Votes(votes)) => answers.extend(votes),
                _ => return Tally::Unknown { node },
            }
        }
        coordinator::resolve(plan, replies, &answers)
    }

    fn durable(&self, node: NodeId) -> bool {
        let dir = self.inner.directory.lock().expect("directory poisoned");
        dir.nodes.iter().any(|n| n.id == node && n.durable)
    }

    async fn decide(&self, plan: &coordinator::Plan<'_>, decision: Decision) {
        for &node in plan.nodes() {
            if let Ok(conn) = self.conn(node).await {
                let _ = conn.send_decision(decision.clone()).await;
            }
        }
    }

    /// Calls `node`, reconnecting until `until`. Tells apart "not delivered" (safe to treat
    /// as no vote) from "delivered, reply lost".
    async fn call_until(&self, node: NodeId, req: &Request, until: Instant) -> NodeReply {
        let mut replies = self.call_all([(node, req)], until).await;
        replies.pop().expect("one reply per request")
    }

    /// Calls every node at once, reconnecting until `until`; one timer bounds them all. A
    /// node that has not answered by then counts as lost if its request went out, as
    /// unreachable if it never did. Votes teach this client the current epoch.
    async fn call_all<'r>(
        &self,
        requests: impl IntoIterator<Item = (NodeId, &'r Request)>,
        until: Instant,
    ) -> Vec<NodeReply> {
        let requests: Vec<(NodeId, &Request)> = requests.into_iter().collect();
        let mut replies: Vec<(Option<NodeReply>, bool)> =
            requests.iter().map(|_| (None, false)).collect();
        let calls =
            (requests.iter().zip(replies.iter_mut())).map(|(&(node, req), slot)| async move {
                slot.0 = Some(self.call_reconnecting(node, req, until, &mut slot.1).await);
            });
        let deadline = tokio::time::Instant::from_std(until);
        let _ = tokio::time::timeout_at(deadline, futures::future::join_all(calls)).await;
        (requests.iter().zip(replies))
            .map(|(&(node, _), (reply, sent))| match reply {
                Some(reply) => reply,
                None if sent => {
                    NodeReply::Lost(format!("node {node} did not answer before the deadline"))
                }
                None => NodeReply::Unreachable(format!(
                    "node {node}: no connection before the deadline"
                )),
            })
            .collect()
    }

    /// `sent` turns true once `req` is handed to a connection.
    async fn call_reconnecting(
        &self,
        node: NodeId,
        req: &Request,
        until: Instant,
        sent: &mut bool,
    ) -> NodeReply {
        let mut delay = Duration::from_millis(5);
        loop {
            let conn = match self.conn(node).await {
                Ok(c) => c,
                Err(e) => {
                    if Instant::now() + delay >= until {
                        return NodeReply::Unreachable(e.to_string());
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                    self.refresh_directory().await;
                    continue;
                }
            };
            *sent = true;
            return match conn.call(req).await {
                Ok(resp) => {
                    if let Response::Vote(v) = &resp {
                        self.inner.epoch.fetch_max(v.epoch, Ordering::Relaxed);
                    }
                    NodeReply::from_response(resp)
                }
                Err(RpcError::Remote { code, message, .. }) => NodeReply::Refused(code, message),
                Err(e) => NodeReply::Lost(e.to_string()),
            };
        }
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
        let fetch = fetch_directory(&self.inner.manager, self.inner.opts.frame_bytes_max);
        if let Ok(Ok(d)) = tokio::time::timeout(Duration::from_millis(500), fetch).await {
            self.inner.epoch.fetch_max(d.epoch, Ordering::Relaxed);
            *self.inner.directory.lock().expect("directory poisoned") = d;
        }
    }
}

/// How long a connection attempt to a memory node may take before it counts as a failure.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one directory request may take.
const DIRECTORY_TIMEOUT: Duration = Duration::from_secs(2);

async fn fetch_directory(manager: &str, frame_bytes_max: usize) -> Result<Directory, RpcError> {
    let connect = tokio::time::timeout(
        DIRECTORY_TIMEOUT,
        Connection::connect(manager, frame_bytes_max),
    );
    let conn = connect.await.map_err(|_| RpcError::Timeout {
        addr: manager.to_string(),
        ms: DIRECTORY_TIMEOUT.as_millis() as u64,
    })??;
    match conn
        .call_within(&Request::Directory, DIRECTORY_TIMEOUT)
        .await?
    {
        Response::Directory(d) => Ok(d),
        _ => Err(RpcError::Unexpected {
            addr: manager.to_string(),
        }),
    }
}
