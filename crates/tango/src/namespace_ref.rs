//! A namespace's client side: `NamespaceRef`'s ZooKeeper calls over `Tango`'s helpers,
//! `Session` (opened, kept alive and closed through the log), `Watches` (one-shot, fired
//! in log order from the view's journal), and moving a subtree between two namespaces in
//! one transaction. The view and its checks are `namespace`'s.

use crate::client::Tango;
use crate::error::TangoError;
use crate::namespace::{
    check_path, Change, ChangeKind, Code, Failure, Namespace, Op, OpResult, Stat, Update,
    ANY_VERSION,
};
use crate::record::Oid;
use crate::runtime::Tx;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock in milliseconds: what beats carry and expiry compares them with, so
/// clients' clocks must agree to well within a session's timeout.
pub fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

fn failed(f: Failure) -> TangoError {
    TangoError::Namespace {
        code: f.code,
        path: f.path,
    }
}

fn no_node(path: &str) -> TangoError {
    failed(Failure {
        index: 0,
        code: Code::NoNode,
        path: path.into(),
    })
}

fn checked(path: &str) -> Result<(), TangoError> {
    check_path(path).map_err(|why| TangoError::BadPath {
        path: path.into(),
        why,
    })
}

fn checked_ops(ops: &[Op]) -> Result<(), TangoError> {
    ops.iter().try_for_each(|op| checked(op.path()))
}

#[derive(Clone, Copy, Debug)]
pub struct NamespaceRef(pub Oid);

impl NamespaceRef {
    /// Runs `ops` all or none (ZooKeeper's multi); a failure names the first operation
    /// that failed and why.
    pub async fn multi(&self, t: &Tango, ops: &[Op]) -> Result<Vec<OpResult>, TangoError> {
        checked_ops(ops)?;
        let (position, reply) = t.update_reply(self.0, None, Update::multi(ops)).await?;
        let results = Update::multi_reply(&reply)
            .map_err(|e| TangoError::Malformed { position, why: e.0 })?;
        results.map_err(failed)
    }

    async fn one(&self, t: &Tango, op: Op) -> Result<OpResult, TangoError> {
        let mut results = self.multi(t, &[op]).await?;
        Ok(results.pop().expect("one result per operation"))
    }

    /// Creates a node; returns its path (with the parent's counter appended if
    /// `sequential`). An ephemeral node belongs to `session` and goes when it does.
    pub async fn create(
        &self,
        t: &Tango,
        path: &str,
        data: &[u8],
        session: Option<&Session>,
        sequential: bool,
    ) -> Result<String, TangoError> {
        let op = Op::Create {
            path: path.into(),
            data: data.to_vec(),
            session: session.map_or(0, |s| s.id),
            sequential,
        };
        match self.one(t, op).await? {
            OpResult::Created(path) => Ok(path),
            other => unreachable!("a create answered {other:?}"),
        }
    }

    /// Sets a node's data if its version is `version` (`ANY_VERSION`: whatever it is);
    /// returns the new version.
    pub async fn set(
        &self,
        t: &Tango,
        path: &str,
        data: &[u8],
        version: i64,
    ) -> Result<u64, TangoError> {
        let op = Op::Set {
            path: path.into(),
            data: data.to_vec(),
            version,
        };
        match self.one(t, op).await? {
            OpResult::Set(version) => Ok(version),
            other => unreachable!("a set answered {other:?}"),
        }
    }

    /// Deletes a node without children if its version is `version`.
    pub async fn delete(&self, t: &Tango, path: &str, version: i64) -> Result<(), TangoError> {
        let op = Op::Delete {
            path: path.into(),
            version,
        };
        self.one(t, op).await.map(drop)
    }

    /// A node's data and stat (linearizable: the namespace is played to the tail first).
    pub async fn get(&self, t: &Tango, path: &str) -> Result<(Vec<u8>, Stat), TangoError> {
        checked(path)?;
        (t.query(self.0, |ns: &Namespace| ns.get(path)).await?).ok_or_else(|| no_node(path))
    }

    pub async fn exists(&self, t: &Tango, path: &str) -> Result<Option<Stat>, TangoError> {
        checked(path)?;
        t.query(self.0, |ns: &Namespace| ns.exists(path)).await
    }

    /// The children's names, sorted.
    pub async fn children(&self, t: &Tango, path: &str) -> Result<Vec<String>, TangoError> {
        checked(path)?;
        (t.query(self.0, |ns: &Namespace| ns.children(path)).await?).ok_or_else(|| no_node(path))
    }

    /// Expires every session whose last beat is older than its timeout by this client's
    /// clock; returns those the log agreed to expire (a beat that got in first wins).
    pub async fn expire_overdue(&self, t: &Tango) -> Result<Vec<u64>, TangoError> {
        let overdue = t
            .query(self.0, |ns: &Namespace| ns.overdue(now_ms()))
            .await?;
        let mut expired = vec![];
        for (id, beat_position) in overdue {
            let update = Update::expire(id, beat_position);
            if t.update_reply(self.0, None, update).await?.1 == [1] {
                expired.push(id);
            }
        }
        Ok(expired)
    }

    /// Every change to `path` and to its children list after `position`, in log order,
    /// and the position the view was at; `None` for the changes when the journal no longer
    /// reaches back to `position` (a continuous watch, as `tutti ns watch` prints).
    pub async fn changes_after(
        &self,
        t: &Tango,
        path: &str,
        position: u64,
    ) -> Result<(Option<Vec<Change>>, u64), TangoError> {
        checked(path)?;
        t.query(self.0, |ns: &Namespace| {
            let changes = (ns.changes_after(position))
                .map(|changes| changes.filter(|c| c.path == path).cloned().collect());
            (changes, ns.applied())
        })
        .await
    }

    /// A node's data as played, recorded in `tx`'s read set.
    pub fn get_in(
        &self,
        t: &Tango,
        tx: &mut Tx,
        path: &str,
    ) -> Result<Option<(Vec<u8>, Stat)>, TangoError> {
        checked(path)?;
        t.query_in(tx, self.0, None, |ns: &Namespace| ns.get(path))
    }

    /// Buffers `ops` in `tx`: they run all or none when it commits, and `tx`'s replies
    /// carry their results (`Update::multi_reply`).
    pub fn multi_in(&self, tx: &mut Tx, ops: &[Op]) -> Result<(), TangoError> {
        checked_ops(ops)?;
        tx.write(self.0, None, Update::multi(ops));
        Ok(())
    }

    /// Moves the subtree at `from_path` of `from` to `to_path` of `to` in one transaction
    /// (Tango §5's move across namespaces): either every node is in `to` with its data and
    /// none is left in `from`, or nothing changed. Versions start again at 0 in `to`.
    /// Both namespaces must be hosted here. `Ok(false)`: a concurrent change to either
    /// namespace aborted it; try again.
    pub async fn move_subtree(
        t: &Tango,
        (from, from_path): (NamespaceRef, &str),
        (to, to_path): (NamespaceRef, &str),
    ) -> Result<bool, TangoError> {
        checked(from_path)?;
        checked(to_path)?;
        if from_path == "/" || to_path == "/" {
            return Err(TangoError::BadPath {
                path: "/".into(),
                why: "the root does not move".into(),
            });
        }
        t.sync().await?;
        let mut tx = t.begin();
        let nodes = t.query_in(&mut tx, from.0, None, |ns: &Namespace| {
            ns.subtree(from_path)
        })?;
        if nodes.is_empty() {
            return Err(no_node(from_path));
        }
        if let Some((path, ..)) = nodes.iter().find(|(_, _, s)| s.ephemeral_owner != 0) {
            return Err(TangoError::BadPath {
                path: path.clone(),
                why: "an ephemeral node belongs to its session and does not move".into(),
            });
        }
        let target = t.query_in(&mut tx, to.0, None, |ns: &Namespace| ns.exists(to_path))?;
        if target.is_some() {
            return Err(failed(Failure {
                index: 0,
                code: Code::NodeExists,
                path: to_path.into(),
            }));
        }
        let creates: Vec<Op> = (nodes.iter())
            .map(|(path, data, _)| Op::Create {
                path: format!("{to_path}{}", &path[from_path.len()..]),
                data: data.clone(),
                session: 0,
                sequential: false,
            })
            .collect();
        let deletes: Vec<Op> = (nodes.iter().rev())
            .map(|(path, _, stat)| Op::Delete {
                path: path.clone(),
                version: stat.version as i64,
            })
            .collect();
        to.multi_in(&mut tx, &creates)?;
        from.multi_in(&mut tx, &deletes)?;
        let outcome = t.end(tx).await?;
        if outcome.committed {
            for reply in &outcome.replies {
                let result = Update::multi_reply(reply).map_err(|e| TangoError::Malformed {
                    position: outcome.position.unwrap_or_default(),
                    why: e.0,
                })?;
                result.map_err(failed)?;
            }
        }
        Ok(outcome.committed)
    }
}

/// A session: its id is the position of the update that opened it. Its ephemeral nodes
/// last while it beats; any client that sees it overdue expires it through the log.
#[derive(Clone, Debug)]
pub struct Session {
    pub id: u64,
    pub timeout: Duration,
    alive: Arc<AtomicBool>,
}

impl Session {
    pub async fn open(
        t: &Tango,
        ns: NamespaceRef,
        timeout: Duration,
    ) -> Result<Session, TangoError> {
        let update = Update::open_session(timeout.as_millis() as u64, now_ms());
        let (id, _) = t.update_reply(ns.0, None, update).await?;
        Ok(Session {
            id,
            timeout,
            alive: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Beats once; `false` once the session has expired (it never comes back).
    pub async fn beat(&self, t: &Tango, ns: NamespaceRef) -> Result<bool, TangoError> {
        let (_, reply) = (t.update_reply(ns.0, None, Update::beat(self.id, now_ms()))).await?;
        if !Update::beat_reply(&reply) {
            self.alive.store(false, Ordering::SeqCst);
        }
        Ok(self.is_alive())
    }

    /// Beats every third of the timeout until the session expires or the task is aborted.
    pub fn keep_alive(&self, t: &Tango, ns: NamespaceRef) -> tokio::task::JoinHandle<()> {
        let (session, t) = (self.clone(), t.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(session.timeout / 3);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Ok(false) = session.beat(&t, ns).await {
                    return;
                }
            }
        })
    }

    /// As far as this client has heard: a beat answered "expired" ends it.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Ends the session now: its ephemeral nodes go.
    pub async fn close(&self, t: &Tango, ns: NamespaceRef) -> Result<(), TangoError> {
        self.alive.store(false, Ordering::SeqCst);
        t.update_reply(ns.0, None, Update::close_session(self.id))
            .await?;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchKind {
    /// The node's creation, data or deletion (ZooKeeper's getData/exists watch).
    Data,
    /// Its children list or its deletion (getChildren's).
    Children,
}

/// A watch that fired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The change's position, or where this client's view was when the journal no longer
    /// reached back to the watch (then `kind` is the watch's own, a conservative event).
    pub position: u64,
    pub path: String,
    pub kind: ChangeKind,
    /// The watch that fired (a deletion fires both kinds set on the node).
    pub watch: WatchKind,
}

struct Watch {
    path: String,
    kind: WatchKind,
    /// Changes after this position fire it.
    from: u64,
}

/// One-shot watches on one namespace, kept by this client and fired in log order.
pub struct Watches {
    ns: NamespaceRef,
    set: Vec<Watch>,
}

impl Watches {
    pub fn new(ns: NamespaceRef) -> Watches {
        Watches { ns, set: vec![] }
    }

    /// Sets a watch that changes after `position` fire, such as the position of the event
    /// it follows: a watch loop that re-arms this way misses no change.
    pub fn watch_after(&mut self, path: &str, kind: WatchKind, position: u64) {
        self.set.push(Watch {
            path: path.into(),
            kind,
            from: position,
        });
    }

    /// Sets a watch as of the namespace played to the tail; returns the node's stat then.
    pub async fn watch(
        &mut self,
        t: &Tango,
        path: &str,
        kind: WatchKind,
    ) -> Result<Option<Stat>, TangoError> {
        checked(path)?;
        let (stat, from) = t
            .query(self.ns.0, |ns: &Namespace| (ns.exists(path), ns.applied()))
            .await?;
        self.watch_after(path, kind, from);
        Ok(stat)
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Plays the namespace to the tail and fires (and drops) every watch a change reached,
    /// in log order.
    pub async fn poll(&mut self, t: &Tango) -> Result<Vec<Event>, TangoError> {
        let set = std::mem::take(&mut self.set);
        let (events, left) = t.query(self.ns.0, |ns: &Namespace| fire(ns, set)).await?;
        self.set = left;
        Ok(events)
    }
}

fn reaches(w: &Watch, path: &str, kind: ChangeKind) -> bool {
    w.path == path
        && match w.kind {
            WatchKind::Data => kind != ChangeKind::ChildrenChanged,
            WatchKind::Children => {
                matches!(kind, ChangeKind::ChildrenChanged | ChangeKind::Deleted)
            }
        }
}

fn fire(ns: &Namespace, set: Vec<Watch>) -> (Vec<Event>, Vec<Watch>) {
    let mut events = vec![];
    let mut left: Vec<Option<Watch>> = set.into_iter().map(Some).collect();
    for slot in &mut left {
        let w = slot.as_ref().expect("not fired yet");
        if ns.changes_after(w.from).is_none() {
            let kind = match w.kind {
                WatchKind::Data => ChangeKind::DataChanged,
                WatchKind::Children => ChangeKind::ChildrenChanged,
            };
            let w = slot.take().expect("a watch");
            events.push(Event {
                position: ns.applied(),
                path: w.path,
                kind,
                watch: w.kind,
            });
        }
    }
    let from = left.iter().flatten().map(|w| w.from).min();
    if let Some(changes) = from.and_then(|from| ns.changes_after(from)) {
        for change in changes {
            for slot in &mut left {
                let fired = slot
                    .take_if(|w| w.from < change.position && reaches(w, &change.path, change.kind));
                if let Some(w) = fired {
                    events.push(Event {
                        position: change.position,
                        path: change.path.clone(),
                        kind: change.kind,
                        watch: w.kind,
                    });
                }
            }
        }
    }
    events.sort_by_key(|e| e.position);
    (events, left.into_iter().flatten().collect())
}

/// The version condition a CLI or caller passes: none means any version.
pub fn version_or_any(version: Option<u64>) -> i64 {
    version.map_or(ANY_VERSION, |v| v as i64)
}
