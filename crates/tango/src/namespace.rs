//! A ZooKeeper namespace as one object (Tango §5's TangoZK): znodes with data and versions,
//! sessions and their ephemeral nodes, and a journal of changes for watches. Every check
//! (does the node exist, is the version right, is it empty) happens in `apply`, in log
//! order, so every view agrees on which operations failed and why. Byte formats:
//! docs/objects.md, "Namespace".

use crate::codec::{Malformed, Reader, Writer};
use crate::object::{Applied, Object};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Longest path a namespace takes, in bytes.
pub const PATH_BYTES_MAX: usize = 1024;
/// Changes the journal keeps for watches; a watch set further back fires conservatively.
pub const JOURNAL_CHANGES_MAX: usize = 65_536;
/// A version condition that any version meets (ZooKeeper's -1).
pub const ANY_VERSION: i64 = -1;

/// Why a namespace operation failed, as ZooKeeper names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    NoNode,
    NodeExists,
    BadVersion,
    NotEmpty,
    NoChildrenForEphemerals,
    SessionExpired,
    BadArguments,
}

impl Code {
    const ALL: [Code; 7] = [
        Code::NoNode,
        Code::NodeExists,
        Code::BadVersion,
        Code::NotEmpty,
        Code::NoChildrenForEphemerals,
        Code::SessionExpired,
        Code::BadArguments,
    ];

    fn byte(self) -> u8 {
        Code::ALL.iter().position(|&c| c == self).unwrap() as u8 + 1
    }

    fn from_byte(b: u8) -> Option<Code> {
        Code::ALL.get(usize::from(b).checked_sub(1)?).copied()
    }

    /// The name the CLI prints (`{"error": "bad-version"}`).
    pub fn name(self) -> &'static str {
        match self {
            Code::NoNode => "no-node",
            Code::NodeExists => "node-exists",
            Code::BadVersion => "bad-version",
            Code::NotEmpty => "not-empty",
            Code::NoChildrenForEphemerals => "no-children-for-ephemerals",
            Code::SessionExpired => "session-expired",
            Code::BadArguments => "bad-arguments",
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One operation of a `multi` (a single operation is a multi of one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `session` is the owner of an ephemeral node (0: persistent).
    Create {
        path: String,
        data: Vec<u8>,
        session: u64,
        sequential: bool,
    },
    Delete {
        path: String,
        version: i64,
    },
    Set {
        path: String,
        data: Vec<u8>,
        version: i64,
    },
    Check {
        path: String,
        version: i64,
    },
}

impl Op {
    pub fn path(&self) -> &str {
        match self {
            Op::Create { path, .. }
            | Op::Delete { path, .. }
            | Op::Set { path, .. }
            | Op::Check { path, .. } => path,
        }
    }
}

/// What an operation of a successful multi gave back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The created node's path (with its sequence number, if sequential).
    Created(String),
    Deleted,
    /// The node's new data version.
    Set(u64),
    Checked,
}

/// Why a multi failed: its first failing operation and the code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub index: usize,
    pub code: Code,
    pub path: String,
}

const MULTI: u8 = 1;
const OPEN_SESSION: u8 = 2;
const BEAT: u8 = 3;
const CLOSE_SESSION: u8 = 4;
const EXPIRE: u8 = 5;

const CREATE: u8 = 1;
const DELETE: u8 = 2;
const SET: u8 = 3;
const CHECK: u8 = 4;

const EPHEMERAL_FLAG: u8 = 1;
const SEQUENTIAL_FLAG: u8 = 2;

/// The updates a namespace applies, and how to read their replies.
pub struct Update;

impl Update {
    pub fn multi(ops: &[Op]) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(MULTI).u32(ops.len() as u32);
        for op in ops {
            match op {
                Op::Create {
                    path,
                    data,
                    session,
                    sequential,
                } => {
                    let ephemeral = if *session != 0 { EPHEMERAL_FLAG } else { 0 };
                    let sequential = if *sequential { SEQUENTIAL_FLAG } else { 0 };
                    w.u8(CREATE).bytes(path.as_bytes()).bytes(data);
                    w.u8(ephemeral | sequential).u64(*session);
                }
                Op::Delete { path, version } => {
                    w.u8(DELETE).bytes(path.as_bytes()).i64(*version);
                }
                Op::Set {
                    path,
                    data,
                    version,
                } => {
                    w.u8(SET).bytes(path.as_bytes()).bytes(data).i64(*version);
                }
                Op::Check { path, version } => {
                    w.u8(CHECK).bytes(path.as_bytes()).i64(*version);
                }
            }
        }
        w.finish()
    }

    /// Opens a session that lives while its client beats at least every `timeout_ms`
    /// (by the clocks of the clients that watch it); its id is this update's position.
    pub fn open_session(timeout_ms: u64, now_ms: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(OPEN_SESSION).u64(timeout_ms).u64(now_ms);
        w.finish()
    }

    pub fn beat(session: u64, now_ms: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(BEAT).u64(session).u64(now_ms);
        w.finish()
    }

    pub fn close_session(session: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(CLOSE_SESSION).u64(session);
        w.finish()
    }

    /// Expires `session` if its last beat is still the one at `beat_position`: a beat
    /// that got into the log first keeps it alive.
    pub fn expire(session: u64, beat_position: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(EXPIRE).u64(session).u64(beat_position);
        w.finish()
    }

    /// A multi's reply: each operation's result, or the failure.
    pub fn multi_reply(reply: &[u8]) -> Result<Result<Vec<OpResult>, Failure>, Malformed> {
        let mut r = Reader::new(reply);
        let out = match r.u8("multi's status")? {
            0 => {
                let n = r.count("multi's results", 1)?;
                let mut results = Vec::with_capacity(n);
                for _ in 0..n {
                    results.push(match r.u8("result's operation")? {
                        CREATE => OpResult::Created(utf8(r.bytes("created path")?)?),
                        DELETE => OpResult::Deleted,
                        SET => OpResult::Set(r.u64("new version")?),
                        CHECK => OpResult::Checked,
                        other => return Err(Malformed(format!("result of operation {other}"))),
                    });
                }
                Ok(results)
            }
            1 => {
                let index = r.u32("failed operation")? as usize;
                let code = r.u8("failure code")?;
                let code = (Code::from_byte(code))
                    .ok_or_else(|| Malformed(format!("failure code {code}")))?;
                let path = utf8(r.bytes("failed path")?)?;
                Err(Failure { index, code, path })
            }
            other => return Err(Malformed(format!("multi status {other}"))),
        };
        r.end("multi's reply")?;
        Ok(out)
    }

    /// A beat's reply: whether the session was still alive.
    pub fn beat_reply(reply: &[u8]) -> bool {
        reply == [1]
    }
}

fn utf8(bytes: &[u8]) -> Result<String, Malformed> {
    String::from_utf8(bytes.to_vec()).map_err(|_| Malformed("a path that is not UTF-8".into()))
}

/// Checks a path as ZooKeeper does: absolute, no empty, `.` or `..` component, no trailing
/// slash (except the root), no NUL, at most `PATH_BYTES_MAX` bytes.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.len() > PATH_BYTES_MAX {
        return Err(format!("{} bytes; at most {PATH_BYTES_MAX}", path.len()));
    }
    if !path.starts_with('/') {
        return Err("a path starts with /".into());
    }
    if path == "/" {
        return Ok(());
    }
    if path.contains('\0') {
        return Err("a path has no NUL".into());
    }
    for part in path[1..].split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!("component {part:?}: empty, . and .. are not names"));
        }
    }
    Ok(())
}

/// The parent of a path other than the root, and the last component.
fn split(path: &str) -> (&str, &str) {
    let cut = path.rfind('/').unwrap_or(0);
    let parent = if cut == 0 { "/" } else { &path[..cut] };
    (parent, &path[cut + 1..])
}

/// A znode's metadata, as ZooKeeper's `Stat` has it (positions stand for zxids).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Data version: 0 at creation, one more for each successful set.
    pub version: u64,
    /// Children version: one more for each child created or deleted.
    pub cversion: u64,
    /// Position of the update that created the node.
    pub created: u64,
    /// Position of the update that last set its data (its creation's at first).
    pub modified: u64,
    /// The owning session of an ephemeral node; 0 for a persistent one.
    pub ephemeral_owner: u64,
    pub data_length: usize,
    pub num_children: usize,
}

#[derive(Clone, Debug, Default)]
struct Znode {
    data: Vec<u8>,
    version: u64,
    cversion: u64,
    created: u64,
    modified: u64,
    ephemeral_owner: u64,
    children: BTreeSet<String>,
}

impl Znode {
    fn stat(&self) -> Stat {
        Stat {
            version: self.version,
            cversion: self.cversion,
            created: self.created,
            modified: self.modified,
            ephemeral_owner: self.ephemeral_owner,
            data_length: self.data.len(),
            num_children: self.children.len(),
        }
    }
}

/// A live session as the log has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub timeout_ms: u64,
    /// The clock reading its last beat (or its opening) carried.
    pub beat_ms: u64,
    /// Where its last beat (or its opening) is in the log.
    pub beat_position: u64,
    pub ephemerals: BTreeSet<String>,
}

/// What changed, for watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    Created,
    Deleted,
    DataChanged,
    ChildrenChanged,
}

impl ChangeKind {
    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Deleted => "deleted",
            ChangeKind::DataChanged => "data-changed",
            ChangeKind::ChildrenChanged => "children-changed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub position: u64,
    pub path: String,
    pub kind: ChangeKind,
}

/// A namespace's view.
#[derive(Debug)]
pub struct Namespace {
    nodes: BTreeMap<String, Znode>,
    sessions: BTreeMap<u64, Session>,
    /// Recent changes in log order; complete after `journal_from`.
    journal: VecDeque<Change>,
    journal_from: u64,
    /// Changes noted since the view was made (to take back a failed multi's).
    noted: u64,
    /// Position of the last update applied.
    applied: u64,
}

impl Default for Namespace {
    fn default() -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), Znode::default());
        Namespace {
            nodes,
            sessions: BTreeMap::new(),
            journal: VecDeque::new(),
            journal_from: 0,
            noted: 0,
            applied: 0,
        }
    }
}

/// Undoes `item`'s addition to `set` (or its removal, if it was not `added`).
fn take_back(set: &mut BTreeSet<String>, item: String, added: bool) {
    if added {
        set.remove(&item);
    } else {
        set.insert(item);
    }
}

/// What a multi takes back, last first, when a later operation fails: each step undoes one
/// change, without copying a parent's children.
enum Undo {
    /// The node was created: remove it.
    Created(String),
    /// The node (childless) was deleted: put it back.
    Deleted(String, Znode),
    /// The node's data was set: what it had.
    Set {
        path: String,
        data: Vec<u8>,
        version: u64,
        modified: u64,
    },
    /// A child was added to (or removed from) the parent, whose children version was this.
    Child {
        parent: String,
        name: String,
        added: bool,
        cversion: u64,
    },
    /// An ephemeral node was added to (or removed from) its session.
    Ephemeral {
        session: u64,
        path: String,
        added: bool,
    },
}

impl Namespace {
    pub fn get(&self, path: &str) -> Option<(Vec<u8>, Stat)> {
        self.nodes.get(path).map(|n| (n.data.clone(), n.stat()))
    }

    pub fn exists(&self, path: &str) -> Option<Stat> {
        self.nodes.get(path).map(Znode::stat)
    }

    /// The children's names, sorted.
    pub fn children(&self, path: &str) -> Option<Vec<String>> {
        (self.nodes.get(path)).map(|n| n.children.iter().cloned().collect())
    }

    /// Every path under `path` (itself included), parents before children.
    pub fn subtree(&self, path: &str) -> Vec<(String, Vec<u8>, Stat)> {
        let mut out = vec![];
        let mut stack = vec![path.to_string()];
        while let Some(p) = stack.pop() {
            let Some(node) = self.nodes.get(&p) else {
                continue;
            };
            for child in node.children.iter().rev() {
                stack.push(child_path(&p, child));
            }
            out.push((p, node.data.clone(), node.stat()));
        }
        out
    }

    pub fn sessions(&self) -> &BTreeMap<u64, Session> {
        &self.sessions
    }

    /// Sessions whose last beat is older than their timeout at `now_ms`.
    pub fn overdue(&self, now_ms: u64) -> Vec<(u64, u64)> {
        (self.sessions.iter())
            .filter(|(_, s)| now_ms > s.beat_ms.saturating_add(s.timeout_ms))
            .map(|(&id, s)| (id, s.beat_position))
            .collect()
    }

    /// Position of the last update applied to this view.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The changes after `position`, in log order; `None` when the journal no longer
    /// reaches back that far.
    pub fn changes_after(&self, position: u64) -> Option<impl Iterator<Item = &Change>> {
        // The journal is in log order: find where the changes after `position` begin
        // rather than filter all 65,536 on every poll.
        (position >= self.journal_from).then(|| {
            let first = self.journal.partition_point(|c| c.position <= position);
            self.journal.range(first..)
        })
    }

    fn note(&mut self, position: u64, path: &str, kind: ChangeKind) {
        if self.journal.len() == JOURNAL_CHANGES_MAX {
            let evicted = self.journal.pop_front().expect("a full journal");
            self.journal_from = evicted.position;
        }
        self.journal.push_back(Change {
            position,
            path: path.to_string(),
            kind,
        });
        self.noted += 1;
    }

    fn remember(undo: &mut Option<Vec<Undo>>, step: impl FnOnce() -> Undo) {
        if let Some(undo) = undo {
            undo.push(step());
        }
    }

    fn take_back(&mut self, step: Undo) {
        match step {
            Undo::Created(path) => {
                self.nodes.remove(&path);
            }
            Undo::Deleted(path, node) => {
                self.nodes.insert(path, node);
            }
            Undo::Set {
                path,
                data,
                version,
                modified,
            } => {
                if let Some(node) = self.nodes.get_mut(&path) {
                    (node.data, node.version, node.modified) = (data, version, modified);
                }
            }
            Undo::Child {
                parent,
                name,
                added,
                cversion,
            } => {
                if let Some(node) = self.nodes.get_mut(&parent) {
                    take_back(&mut node.children, name, added);
                    node.cversion = cversion;
                }
            }
            Undo::Ephemeral {
                session,
                path,
                added,
            } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    take_back(&mut s.ephemerals, path, added);
                }
            }
        }
    }

    fn version_ok(have: u64, want: i64) -> bool {
        want == ANY_VERSION || u64::try_from(want) == Ok(have)
    }

    /// One operation: checked in full before it changes anything.
    fn one(
        &mut self,
        op: &Op,
        position: u64,
        undo: &mut Option<Vec<Undo>>,
    ) -> Result<OpResult, Code> {
        check_path(op.path()).map_err(|_| Code::BadArguments)?;
        match op {
            Op::Create {
                path,
                data,
                session,
                sequential,
            } => {
                if path == "/" {
                    return Err(Code::NodeExists);
                }
                let (parent_path, _) = split(path);
                let parent = self.nodes.get(parent_path).ok_or(Code::NoNode)?;
                if parent.ephemeral_owner != 0 {
                    return Err(Code::NoChildrenForEphemerals);
                }
                let path = match sequential {
                    true => format!("{path}{:010}", parent.cversion),
                    false => path.clone(),
                };
                if *sequential {
                    check_path(&path).map_err(|_| Code::BadArguments)?;
                }
                if self.nodes.contains_key(&path) {
                    return Err(Code::NodeExists);
                }
                if *session != 0 && !self.sessions.contains_key(session) {
                    return Err(Code::SessionExpired);
                }
                let name = split(&path).1.to_string();
                let parent = self.nodes.get_mut(parent_path).expect("checked");
                Namespace::remember(undo, || Undo::Child {
                    parent: parent_path.to_string(),
                    name: name.clone(),
                    added: true,
                    cversion: parent.cversion,
                });
                Namespace::remember(undo, || Undo::Created(path.clone()));
                parent.children.insert(name);
                parent.cversion += 1;
                self.nodes.insert(
                    path.clone(),
                    Znode {
                        data: data.clone(),
                        created: position,
                        modified: position,
                        ephemeral_owner: *session,
                        ..Znode::default()
                    },
                );
                if *session != 0 {
                    let s = self.sessions.get_mut(session).expect("checked");
                    s.ephemerals.insert(path.clone());
                    Namespace::remember(undo, || Undo::Ephemeral {
                        session: *session,
                        path: path.clone(),
                        added: true,
                    });
                }
                self.note(position, &path, ChangeKind::Created);
                self.note(position, parent_path, ChangeKind::ChildrenChanged);
                Ok(OpResult::Created(path))
            }
            Op::Delete { path, version } => {
                if path == "/" {
                    return Err(Code::BadArguments);
                }
                let node = self.nodes.get(path).ok_or(Code::NoNode)?;
                if !Namespace::version_ok(node.version, *version) {
                    return Err(Code::BadVersion);
                }
                if !node.children.is_empty() {
                    return Err(Code::NotEmpty);
                }
                self.delete(path, position, undo);
                Ok(OpResult::Deleted)
            }
            Op::Set {
                path,
                data,
                version,
            } => {
                let node = self.nodes.get(path).ok_or(Code::NoNode)?;
                if !Namespace::version_ok(node.version, *version) {
                    return Err(Code::BadVersion);
                }
                let node = self.nodes.get_mut(path).expect("checked");
                Namespace::remember(undo, || Undo::Set {
                    path: path.clone(),
                    data: node.data.clone(),
                    version: node.version,
                    modified: node.modified,
                });
                node.data = data.clone();
                node.version += 1;
                node.modified = position;
                let version = node.version;
                self.note(position, path, ChangeKind::DataChanged);
                Ok(OpResult::Set(version))
            }
            Op::Check { path, version } => {
                let node = self.nodes.get(path).ok_or(Code::NoNode)?;
                match Namespace::version_ok(node.version, *version) {
                    true => Ok(OpResult::Checked),
                    false => Err(Code::BadVersion),
                }
            }
        }
    }

    /// Deletes a node known to exist and have no children.
    fn delete(&mut self, path: &str, position: u64, undo: &mut Option<Vec<Undo>>) {
        let (parent_path, name) = split(path);
        let node = self.nodes.remove(path).expect("a node to delete");
        if let Some(s) = self.sessions.get_mut(&node.ephemeral_owner) {
            s.ephemerals.remove(path);
            Namespace::remember(undo, || Undo::Ephemeral {
                session: node.ephemeral_owner,
                path: path.to_string(),
                added: false,
            });
        }
        if let Some(parent) = self.nodes.get_mut(parent_path) {
            Namespace::remember(undo, || Undo::Child {
                parent: parent_path.to_string(),
                name: name.to_string(),
                added: false,
                cversion: parent.cversion,
            });
            parent.children.remove(name);
            parent.cversion += 1;
        }
        Namespace::remember(undo, || Undo::Deleted(path.to_string(), node));
        self.note(position, path, ChangeKind::Deleted);
        self.note(position, parent_path, ChangeKind::ChildrenChanged);
    }

    /// All of `ops` or none: a failure rolls back what the earlier ones did.
    fn multi(&mut self, ops: &[Op], position: u64) -> Result<Vec<OpResult>, Failure> {
        let noted = self.noted;
        let mut undo = (ops.len() > 1).then(Vec::new);
        let mut results = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            match self.one(op, position, &mut undo) {
                Ok(result) => results.push(result),
                Err(code) => {
                    for step in undo.into_iter().flatten().rev() {
                        self.take_back(step);
                    }
                    // What the journal evicted meanwhile stays evicted: watches set
                    // before it fire conservatively.
                    for _ in noted..self.noted {
                        self.journal.pop_back();
                    }
                    self.noted = noted;
                    let path = op.path().to_string();
                    return Err(Failure { index, code, path });
                }
            }
        }
        Ok(results)
    }

    /// Deletes a session and its ephemeral nodes.
    fn end_session(&mut self, id: u64, position: u64) {
        let Some(session) = self.sessions.remove(&id) else {
            return;
        };
        for path in session.ephemerals.iter().rev() {
            if self.nodes.contains_key(path) {
                self.delete(path, position, &mut None);
            }
        }
    }
}

fn child_path(parent: &str, name: &str) -> String {
    match parent {
        "/" => format!("/{name}"),
        _ => format!("{parent}/{name}"),
    }
}

fn read_ops(r: &mut Reader<'_>) -> Result<Vec<Op>, Malformed> {
    let n = r.count("multi's operations", 10)?;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let tag = r.u8("operation")?;
        let path = utf8(r.bytes("path")?)?;
        ops.push(match tag {
            CREATE => {
                let data = r.bytes("data")?.to_vec();
                let flags = r.u8("create's flags")?;
                let session = r.u64("create's session")?;
                if (flags & EPHEMERAL_FLAG != 0) != (session != 0) {
                    return Err(Malformed("an ephemeral create without its session".into()));
                }
                Op::Create {
                    path,
                    data,
                    session,
                    sequential: flags & SEQUENTIAL_FLAG != 0,
                }
            }
            DELETE => Op::Delete {
                path,
                version: r.i64("version")?,
            },
            SET => Op::Set {
                path,
                data: r.bytes("data")?.to_vec(),
                version: r.i64("version")?,
            },
            CHECK => Op::Check {
                path,
                version: r.i64("version")?,
            },
            other => return Err(Malformed(format!("namespace operation {other}"))),
        });
    }
    Ok(ops)
}

impl Object for Namespace {
    fn apply(
        &mut self,
        _: Option<&[u8]>,
        update: &[u8],
        position: u64,
    ) -> Result<Applied, Malformed> {
        let mut r = Reader::new(update);
        let mut w = Writer::new();
        match r.u8("namespace update")? {
            MULTI => {
                let ops = read_ops(&mut r)?;
                r.end("multi")?;
                match self.multi(&ops, position) {
                    Ok(results) => {
                        w.u8(0).u32(results.len() as u32);
                        for result in results {
                            match result {
                                OpResult::Created(path) => w.u8(CREATE).bytes(path.as_bytes()),
                                OpResult::Deleted => w.u8(DELETE),
                                OpResult::Set(version) => w.u8(SET).u64(version),
                                OpResult::Checked => w.u8(CHECK),
                            };
                        }
                    }
                    Err(f) => {
                        w.u8(1).u32(f.index as u32).u8(f.code.byte());
                        w.bytes(f.path.as_bytes());
                    }
                }
            }
            OPEN_SESSION => {
                let timeout_ms = r.u64("session timeout")?;
                let beat_ms = r.u64("clock")?;
                r.end("session opening")?;
                let session = Session {
                    timeout_ms,
                    beat_ms,
                    beat_position: position,
                    ephemerals: BTreeSet::new(),
                };
                self.sessions.insert(position, session);
            }
            BEAT => {
                let id = r.u64("session")?;
                let beat_ms = r.u64("clock")?;
                r.end("beat")?;
                let alive = match self.sessions.get_mut(&id) {
                    Some(s) => {
                        s.beat_ms = s.beat_ms.max(beat_ms);
                        s.beat_position = position;
                        true
                    }
                    None => false,
                };
                w.u8(u8::from(alive));
            }
            CLOSE_SESSION => {
                let id = r.u64("session")?;
                r.end("session closing")?;
                self.end_session(id, position);
            }
            EXPIRE => {
                let id = r.u64("session")?;
                let beat_position = r.u64("beat position")?;
                r.end("expiry")?;
                let current = self.sessions.get(&id).map(|s| s.beat_position);
                let expired = current == Some(beat_position);
                if expired {
                    self.end_session(id, position);
                }
                w.u8(u8::from(expired));
            }
            other => return Err(Malformed(format!("namespace update {other}"))),
        }
        self.applied = position;
        Ok(Applied::reply(w.finish()))
    }

    fn checkpoint(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u64(self.applied).u32(self.nodes.len() as u32);
        for (path, n) in &self.nodes {
            w.bytes(path.as_bytes()).bytes(&n.data);
            w.u64(n.version)
                .u64(n.cversion)
                .u64(n.created)
                .u64(n.modified);
            w.u64(n.ephemeral_owner);
        }
        w.u32(self.sessions.len() as u32);
        for (id, s) in &self.sessions {
            w.u64(*id)
                .u64(s.timeout_ms)
                .u64(s.beat_ms)
                .u64(s.beat_position);
        }
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        let applied = r.u64("checkpoint's position")?;
        let mut nodes: BTreeMap<String, Znode> = BTreeMap::new();
        for _ in 0..r.count("znodes", 48)? {
            let path = utf8(r.bytes("znode's path")?)?;
            check_path(&path).map_err(|why| Malformed(format!("znode {path:?}: {why}")))?;
            let node = Znode {
                data: r.bytes("znode's data")?.to_vec(),
                version: r.u64("version")?,
                cversion: r.u64("children version")?,
                created: r.u64("created")?,
                modified: r.u64("modified")?,
                ephemeral_owner: r.u64("ephemeral owner")?,
                children: BTreeSet::new(),
            };
            nodes.insert(path, node);
        }
        let mut sessions = BTreeMap::new();
        for _ in 0..r.count("sessions", 32)? {
            let id = r.u64("session")?;
            let session = Session {
                timeout_ms: r.u64("session timeout")?,
                beat_ms: r.u64("clock")?,
                beat_position: r.u64("beat position")?,
                ephemerals: BTreeSet::new(),
            };
            sessions.insert(id, session);
        }
        r.end("namespace's checkpoint")?;
        let paths: Vec<(String, u64)> = (nodes.iter())
            .map(|(p, n)| (p.clone(), n.ephemeral_owner))
            .collect();
        for (path, owner) in paths {
            if path == "/" {
                continue;
            }
            let (parent, name) = split(&path);
            let parent = (nodes.get_mut(parent))
                .ok_or_else(|| Malformed(format!("znode {path:?} without its parent")))?;
            parent.children.insert(name.to_string());
            if let Some(s) = sessions.get_mut(&owner) {
                s.ephemerals.insert(path);
            }
        }
        if !nodes.contains_key("/") {
            return Err(Malformed("a namespace without its root".into()));
        }
        *self = Namespace {
            nodes,
            sessions,
            journal: VecDeque::new(),
            journal_from: applied,
            noted: 0,
            applied,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ns: &mut Namespace, position: u64, ops: &[Op]) -> Result<Vec<OpResult>, Failure> {
        let reply = ns.apply(None, &Update::multi(ops), position).unwrap().reply;
        Update::multi_reply(&reply).unwrap()
    }

    fn create(path: &str) -> Op {
        Op::Create {
            path: path.into(),
            data: path.as_bytes().to_vec(),
            session: 0,
            sequential: false,
        }
    }

    fn code(r: Result<Vec<OpResult>, Failure>) -> Code {
        r.unwrap_err().code
    }

    #[test]
    fn versions_start_at_zero_and_each_set_adds_one() {
        let mut ns = Namespace::default();
        run(&mut ns, 1, &[create("/a")]).unwrap();
        assert_eq!(ns.exists("/a").unwrap().version, 0);
        let set = |version| Op::Set {
            path: "/a".into(),
            data: b"x".to_vec(),
            version,
        };
        assert_eq!(run(&mut ns, 2, &[set(0)]).unwrap(), [OpResult::Set(1)]);
        assert_eq!(code(run(&mut ns, 3, &[set(0)])), Code::BadVersion);
        assert_eq!(
            run(&mut ns, 4, &[set(ANY_VERSION)]).unwrap(),
            [OpResult::Set(2)]
        );
        let stat = ns.exists("/a").unwrap();
        assert_eq!((stat.version, stat.created, stat.modified), (2, 1, 4));
        let delete = |version| Op::Delete {
            path: "/a".into(),
            version,
        };
        assert_eq!(code(run(&mut ns, 5, &[delete(1)])), Code::BadVersion);
        run(&mut ns, 6, &[delete(2)]).unwrap();
        assert_eq!(code(run(&mut ns, 7, &[delete(ANY_VERSION)])), Code::NoNode);
    }

    #[test]
    fn errors_are_zookeepers() {
        let mut ns = Namespace::default();
        assert_eq!(code(run(&mut ns, 1, &[create("/a/b")])), Code::NoNode);
        run(&mut ns, 2, &[create("/a"), create("/a/b")]).unwrap();
        assert_eq!(code(run(&mut ns, 3, &[create("/a")])), Code::NodeExists);
        let delete = Op::Delete {
            path: "/a".into(),
            version: ANY_VERSION,
        };
        assert_eq!(code(run(&mut ns, 4, &[delete])), Code::NotEmpty);
        assert_eq!(code(run(&mut ns, 5, &[create("a")])), Code::BadArguments);
        assert_eq!(code(run(&mut ns, 6, &[create("/a/")])), Code::BadArguments);
        let ephemeral = Op::Create {
            path: "/e".into(),
            data: vec![],
            session: 99,
            sequential: false,
        };
        assert_eq!(code(run(&mut ns, 7, &[ephemeral])), Code::SessionExpired);
    }

    #[test]
    fn sequential_names_carry_the_parents_ten_digit_counter() {
        let mut ns = Namespace::default();
        run(&mut ns, 1, &[create("/q")]).unwrap();
        let seq = Op::Create {
            path: "/q/item-".into(),
            data: vec![],
            session: 0,
            sequential: true,
        };
        let names: Vec<_> = (2..5)
            .map(|p| run(&mut ns, p, std::slice::from_ref(&seq)).unwrap())
            .collect();
        assert_eq!(names[0], [OpResult::Created("/q/item-0000000000".into())]);
        assert_eq!(names[2], [OpResult::Created("/q/item-0000000002".into())]);
        run(
            &mut ns,
            6,
            &[Op::Delete {
                path: "/q/item-0000000002".into(),
                version: 0,
            }],
        )
        .unwrap();
        let next = run(&mut ns, 7, &[seq]).unwrap();
        assert_eq!(next, [OpResult::Created("/q/item-0000000004".into())]);
    }

    #[test]
    fn a_multi_that_fails_changes_nothing() {
        let mut ns = Namespace::default();
        ns.apply(None, &Update::open_session(1000, 0), 1).unwrap();
        let ephemeral = |path: &str| Op::Create {
            path: path.into(),
            data: vec![],
            session: 1,
            sequential: false,
        };
        run(&mut ns, 2, &[create("/a"), ephemeral("/e")]).unwrap();
        let before = ns.checkpoint();
        let (journal, ephemerals) = (ns.journal.len(), ns.sessions()[&1].ephemerals.clone());
        let ops = [
            create("/b"),
            create("/b/c"),
            Op::Set {
                path: "/a".into(),
                data: b"new".to_vec(),
                version: 0,
            },
            Op::Delete {
                path: "/b/c".into(),
                version: 0,
            },
            Op::Delete {
                path: "/e".into(),
                version: 0,
            },
            ephemeral("/f"),
            Op::Check {
                path: "/a".into(),
                version: 0,
            },
        ];
        let failure = run(&mut ns, 3, &ops).unwrap_err();
        assert_eq!((failure.index, failure.code), (6, Code::BadVersion));
        assert_eq!(ns.checkpoint()[8..], before[8..]);
        assert_eq!(ns.journal.len(), journal);
        assert_eq!(ns.sessions()[&1].ephemerals, ephemerals);
        assert!(ns.exists("/b").is_none());
        assert_eq!(ns.children("/").unwrap(), ["a", "e"]);
        assert_eq!(ns.exists("/").unwrap().cversion, 2);
    }

    #[test]
    fn an_expired_session_takes_its_ephemerals_but_a_later_beat_saves_it() {
        let mut ns = Namespace::default();
        ns.apply(None, &Update::open_session(1000, 10_000), 1)
            .unwrap();
        let eph = Op::Create {
            path: "/e".into(),
            data: vec![],
            session: 1,
            sequential: false,
        };
        run(&mut ns, 2, &[eph]).unwrap();
        assert_eq!(
            code(run(&mut ns, 3, &[create("/e/child")])),
            Code::NoChildrenForEphemerals
        );
        assert_eq!(ns.overdue(10_500), []);
        assert_eq!(ns.overdue(11_001), [(1, 1)]);
        let beat = ns.apply(None, &Update::beat(1, 11_500), 4).unwrap();
        assert!(Update::beat_reply(&beat.reply));
        let stale = ns.apply(None, &Update::expire(1, 1), 5).unwrap();
        assert_eq!(stale.reply, [0]);
        assert!(ns.exists("/e").is_some());
        let expired = ns.apply(None, &Update::expire(1, 4), 6).unwrap();
        assert_eq!(expired.reply, [1]);
        assert!(ns.exists("/e").is_none());
        let late = ns.apply(None, &Update::beat(1, 12_000), 7).unwrap();
        assert!(!Update::beat_reply(&late.reply));
        let kinds: Vec<_> = ns
            .changes_after(5)
            .unwrap()
            .map(|c| (c.path.as_str(), c.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("/e", ChangeKind::Deleted),
                ("/", ChangeKind::ChildrenChanged)
            ]
        );
    }

    #[test]
    fn a_checkpoint_restores_nodes_sessions_and_ephemerals() {
        let mut ns = Namespace::default();
        ns.apply(None, &Update::open_session(1000, 0), 1).unwrap();
        let eph = Op::Create {
            path: "/a/e".into(),
            data: b"d".to_vec(),
            session: 1,
            sequential: false,
        };
        run(&mut ns, 2, &[create("/a"), eph]).unwrap();
        let mut restored = Namespace::default();
        restored.restore(&ns.checkpoint()).unwrap();
        assert_eq!(restored.checkpoint(), ns.checkpoint());
        assert_eq!(restored.children("/a").unwrap(), ["e"]);
        assert_eq!(restored.sessions()[&1].ephemerals.len(), 1);
        assert!(restored.changes_after(1).is_none());
        let bytes = ns.checkpoint();
        assert!(Namespace::default()
            .restore(&bytes[..bytes.len() - 1])
            .is_err());
    }

    #[test]
    fn malformed_updates_change_nothing() {
        let mut ns = Namespace::default();
        assert!(ns.apply(None, &[9], 1).is_err());
        assert!(ns.apply(None, &[MULTI, 1, 0, 0, 0, 7], 2).is_err());
        assert_eq!(ns.applied(), 0);
        assert_eq!(ns.subtree("/").len(), 1);
    }
}
