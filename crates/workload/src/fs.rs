//! The file system's workload, for the simulator (and later `tutti chaos`): clients run
//! tutti-fs operations (the real sans-I/O `ops`, each step a minitransaction) on a volume:
//! creates, unlinks, mkdirs, rmdirs, renames (across directories, NOREPLACE, EXCHANGE),
//! writes and truncates, each client in a directory of its own and all of them in a shared
//! one; now and then a client first grows the volume onto a spare node. The clients are
//! members of the volume as mounts are (docs/fs.md, "Coherent caching"): a write is
//! announced to the others before it runs, and a read that only compares trusted bytes is
//! answered without a minitransaction. Now and then a writer revokes another client (as
//! one whose callback it cannot reach), which then caches nothing until it takes its
//! callback back. The checks: every invariant fsck checks, on the final images; each
//! client's own directory holds exactly the names its operations' answers say it must; and every answer given on trust matched the memory nodes at that
//! instant (the simulator compares them: `take_trusted_reads`).

use crate::{Violation, Workload};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tutti_client::{ExecError, Minitx, Outcome};
use tutti_fs::coherence::{self, Stamp, Trust};
use tutti_fs::inode::{Inode, Time, S_IFDIR, S_IFREG};
use tutti_fs::layout::{get_u32, Geometry, Ino, Volume, INODE_BYTES};
use tutti_fs::ops::{self, Caller, Made, NewFile, SetAttr};
use tutti_fs::txn::{Cache, Effects, Fetch, OpResult, Plan, Txn};
use tutti_wire::NodeId;

/// Each node's part of the volume (the whole simulated space).
pub const BYTES_PER_NODE: u64 = 1 << 20;
pub const BLOCK_BYTES: u32 = 4096;
pub const BYTES_PER_INODE: u32 = 2048;
/// Names per directory: files f00.., subdirectories s0...
const FILES: u32 = 24;
const SUBDIRS: u32 = 3;
/// Largest write, in bytes.
const WRITE_BYTES_MAX: u32 = 9000;
/// Files grow to at most this (so that writes share blocks and cross them).
const FILE_BYTES_MAX: u64 = 40_000;
const NOW: Time = Time {
    s: 1_700_000_000,
    ns: 0,
};
const ROOT_USER: Caller = Caller { uid: 0, gid: 0 };

/// Long names, so that a directory's 4 KiB buckets fill and split.
pub fn file_name(i: u32) -> Vec<u8> {
    format!("f{i:02}-{}", "x".repeat(80)).into_bytes()
}

pub fn dir_name(i: u32) -> Vec<u8> {
    format!("s{i}").into_bytes()
}

/// Where an action happens: the client's own directory, or the one all clients share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Where {
    Own,
    Shared,
}

/// One file-system action of a client, on names `file_name(i)` and `dir_name(i)`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub enum Action {
    Create(Where, u32),
    Unlink(Where, u32),
    Mkdir(Where, u32),
    Rmdir(Where, u32),
    /// Renames file (or, with `dirs`, subdirectory) names.
    Rename {
        from: (Where, u32),
        to: (Where, u32),
        dirs: bool,
        flags: u32,
    },
    Write(Where, u32, u64, u32),
    Truncate(Where, u32, u64),
    /// Sets (true) or removes (false) this client's extended attribute of a file.
    Xattr(Where, u32, bool),
    /// Looks a file up (`stat`): a read, answered on trust when the client may.
    Stat(Where, u32),
}

impl Action {
    /// A random action: the mix both the simulator and `tutti chaos --workload fs` run.
    pub fn random(rng: &mut dyn RngCore) -> Action {
        let place = |rng: &mut dyn RngCore| {
            if rng.gen_bool(0.5) {
                Where::Own
            } else {
                Where::Shared
            }
        };
        let file = |rng: &mut dyn RngCore| rng.gen_range(0..FILES);
        let sub = |rng: &mut dyn RngCore| rng.gen_range(0..SUBDIRS);
        if rng.gen_ratio(1, 5) {
            return Action::Stat(place(rng), file(rng));
        }
        match rng.gen_range(0..100) {
            0..=24 => Action::Create(place(rng), file(rng)),
            25..=36 => Action::Unlink(place(rng), file(rng)),
            37..=44 => Action::Mkdir(place(rng), sub(rng)),
            45..=51 => Action::Rmdir(place(rng), sub(rng)),
            52..=71 => {
                let dirs = rng.gen_bool(0.25);
                let pick = |rng: &mut dyn RngCore| if dirs { sub(rng) } else { file(rng) };
                let flags = match rng.gen_range(0..10) {
                    0..=6 => 0,
                    7 | 8 => libc::RENAME_NOREPLACE,
                    _ => libc::RENAME_EXCHANGE,
                };
                Action::Rename {
                    from: (place(rng), pick(rng)),
                    to: (place(rng), pick(rng)),
                    dirs,
                    flags,
                }
            }
            72..=89 => {
                let off = rng.gen_range(0..FILE_BYTES_MAX);
                Action::Write(
                    place(rng),
                    file(rng),
                    off,
                    rng.gen_range(1..=WRITE_BYTES_MAX),
                )
            }
            90..=94 => Action::Truncate(place(rng), file(rng), rng.gen_range(0..FILE_BYTES_MAX)),
            _ => Action::Xattr(place(rng), file(rng), rng.gen_bool(0.6)),
        }
    }

    fn places(&self) -> Vec<Where> {
        match *self {
            Action::Create(w, _)
            | Action::Unlink(w, _)
            | Action::Mkdir(w, _)
            | Action::Rmdir(w, _) => vec![w],
            Action::Write(w, ..)
            | Action::Truncate(w, ..)
            | Action::Xattr(w, ..)
            | Action::Stat(w, _) => vec![w],
            Action::Rename { from, to, .. } => vec![from.0, to.0],
        }
    }

    /// The names of the client's own directory this action may change: (name, is a dir).
    fn own_names(&self) -> Vec<(Vec<u8>, bool)> {
        let name = |i, dir| if dir { dir_name(i) } else { file_name(i) };
        let mut out = vec![];
        match *self {
            Action::Create(Where::Own, i) | Action::Unlink(Where::Own, i) => {
                out.push((file_name(i), false))
            }
            Action::Mkdir(Where::Own, i) | Action::Rmdir(Where::Own, i) => {
                out.push((dir_name(i), true))
            }
            Action::Rename { from, to, dirs, .. } => {
                for (w, i) in [from, to] {
                    if w == Where::Own {
                        out.push((name(i, dirs), dirs));
                    }
                }
            }
            _ => {}
        }
        out
    }
}

#[derive(Debug)]
enum Step {
    /// Grow the volume onto the next spare node (`tutti fs grow`), before the action.
    Grow,
    /// Look the client's own or the shared directory up in the root.
    Root(Where),
    /// Make it (it was not there).
    MakeRoot(Where),
    /// Look the file of a write or truncate up.
    Find,
    Act,
    /// Fence the client's writes whose outcome it does not know, before anything else.
    Fence,
    /// Take the client's callback back after a revocation, before the action.
    Retake,
}

#[derive(Debug)]
enum Answer {
    Ino(Ino),
    /// A bucket split or a part of a long truncate: run the step again.
    Again,
    Done,
}

#[derive(Debug)]
enum Pending {
    /// Reads, begun when the client's trust stood at the stamp.
    Fetch(Vec<Fetch>, Stamp),
    /// The grow's minitransaction, to the volume it makes; the position of its compare of
    /// the membership version.
    Grow(Volume, usize),
    /// Learning the membership version and the node count (a fence failed its compare);
    /// then the step again.
    Version,
    /// The client's writes whose outcome it does not know are fenced
    /// (`coherence::fence_minitx`) before their announcements end.
    Fence,
    /// The writer revokes this client (it did not acknowledge the announcement): the
    /// membership version goes up on every node, and then the write is planned again.
    Revoke(u64),
    /// The client takes its callback back (the version goes up on every node); then the
    /// reply of its reads that came before is handled (a fetch filled, a validated read
    /// settled, with the stamps they were sent under), as a mount's runtime may handle a
    /// reply after its renewal task's change.
    Retake(Option<Box<(Pending, Outcome)>>),
    Run {
        tx: Minitx,
        result: Result<Answer, i32>,
        effects: Box<Effects>,
        compared: Vec<(NodeId, u64)>,
        /// The announcement of a write, ended when its outcome is known.
        announced: Option<u64>,
        /// The position of a write's compare of the membership version.
        fence_at: Option<usize>,
        /// The client's trust after the write began (or when the read was planned), and
        /// its fill count then.
        own: Stamp,
        since: u64,
    },
}

/// One operation of a client, through its steps.
#[derive(Debug)]
pub struct FsOp {
    action: Action,
    step: Step,
    file: Option<Ino>,
    pending: Option<Pending>,
}

/// What the model knows of a name in a client's own directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Absent,
    Present,
    /// An operation on it ended with an unknown outcome.
    Uncertain,
}

/// What a client knows of the names in its own directory, from the answers its actions got
/// (no other client changes it): what the simulator and `tutti chaos --workload fs` check
/// its final listing against.
#[derive(Clone, Debug, Default)]
pub struct DirModel {
    names: BTreeMap<Vec<u8>, Known>,
}

impl DirModel {
    fn known(&self, name: &[u8]) -> Known {
        self.names.get(name).copied().unwrap_or(Known::Absent)
    }

    /// Learns how `action` ended (`err`: its errno, if it failed); returns what contradicts
    /// what was known, if anything does.
    pub fn learn(&mut self, action: &Action, err: Option<i32>) -> Option<String> {
        let mut wrong = None;
        match (*action, err) {
            (Action::Create(Where::Own, i), None) => {
                if self.known(&file_name(i)) == Known::Present {
                    wrong = Some(String::from("created a name that was there"));
                }
                self.names.insert(file_name(i), Known::Present);
            }
            (Action::Mkdir(Where::Own, i), None) => {
                if self.known(&dir_name(i)) == Known::Present {
                    wrong = Some(String::from("made a directory that was there"));
                }
                self.names.insert(dir_name(i), Known::Present);
            }
            (Action::Create(Where::Own, i), Some(libc::EEXIST))
            | (Action::Mkdir(Where::Own, i), Some(libc::EEXIST)) => {
                let name = if matches!(action, Action::Create(..)) {
                    file_name(i)
                } else {
                    dir_name(i)
                };
                if self.known(&name) == Known::Absent {
                    wrong = Some(String::from("EEXIST for a name that was not there"));
                }
            }
            (Action::Unlink(Where::Own, i), None) | (Action::Rmdir(Where::Own, i), None) => {
                let name = if matches!(action, Action::Unlink(..)) {
                    file_name(i)
                } else {
                    dir_name(i)
                };
                if self.known(&name) == Known::Absent {
                    wrong = Some(String::from("removed a name that was not there"));
                }
                self.names.insert(name, Known::Absent);
            }
            (Action::Unlink(Where::Own, i), Some(libc::ENOENT))
            | (Action::Rmdir(Where::Own, i), Some(libc::ENOENT)) => {
                let name = if matches!(action, Action::Unlink(..)) {
                    file_name(i)
                } else {
                    dir_name(i)
                };
                if self.known(&name) == Known::Present {
                    wrong = Some(String::from("ENOENT for a name that was there"));
                }
            }
            (Action::Stat(Where::Own, i), None) if self.known(&file_name(i)) == Known::Absent => {
                wrong = Some(String::from("found a name that was not there"));
            }
            (Action::Stat(Where::Own, i), Some(libc::ENOENT))
                if self.known(&file_name(i)) == Known::Present =>
            {
                wrong = Some(String::from("stat: ENOENT for a name that was there"));
            }
            (
                Action::Rename {
                    from,
                    to,
                    dirs,
                    flags,
                },
                None,
            ) => {
                let name = |i| if dirs { dir_name(i) } else { file_name(i) };
                let same = from == to;
                if from.0 == Where::Own && !same && flags & libc::RENAME_EXCHANGE == 0 {
                    self.names.insert(name(from.1), Known::Absent);
                }
                if to.0 == Where::Own {
                    self.names.insert(name(to.1), Known::Present);
                }
            }
            (
                Action::Rename {
                    from: (Where::Own, i),
                    dirs,
                    flags,
                    ..
                },
                Some(libc::ENOENT),
            ) => {
                // With EXCHANGE, ENOENT may be the target's.
                let name = if dirs { dir_name(i) } else { file_name(i) };
                if self.known(&name) == Known::Present && flags & libc::RENAME_EXCHANGE == 0 {
                    wrong = Some(String::from("ENOENT for a source that was there"));
                }
            }
            (_, Some(e))
                if !matches!(
                    e,
                    libc::ENOENT
                        | libc::EEXIST
                        | libc::ENOTEMPTY
                        | libc::ESTALE
                        | libc::EISDIR
                        | libc::ENOTDIR
                        | libc::ENODATA
                ) =>
            {
                wrong = Some(format!("errno {e}"));
            }
            _ => {}
        }
        wrong
    }

    /// `action` ended with an unknown outcome: the names it may have changed are uncertain.
    pub fn unknown(&mut self, action: &Action) {
        for (name, _) in action.own_names() {
            self.names.insert(name, Known::Uncertain);
        }
    }

    /// Where the directory's `listed` names contradict the model.
    pub fn check(&self, listed: &std::collections::BTreeSet<Vec<u8>>) -> Vec<String> {
        let mut out = vec![];
        for (name, known) in &self.names {
            let there = listed.contains(name);
            let wrong = match known {
                Known::Present => !there,
                Known::Absent => there,
                Known::Uncertain => false,
            };
            if wrong {
                out.push(format!(
                    "{} is {} but the model says {known:?}",
                    String::from_utf8_lossy(name),
                    if there { "there" } else { "not there" }
                ));
            }
        }
        for name in listed {
            if !self.names.contains_key(name) {
                out.push(format!(
                    "{} is there, never made",
                    String::from_utf8_lossy(name)
                ));
            }
        }
        out
    }
}

struct Client {
    cache: Cache,
    trust: Trust,
    /// The membership version as this client last learned it: its writes compare it.
    version: u64,
    /// Its announced writes whose outcome it does not know: its next operation fences
    /// them, then ends their announcements (a real member's next write, or the members
    /// that revoke a dead one, do the same).
    unfenced: Vec<u64>,
    /// It takes invalidations: the others announce their writes to it. From when it sends
    /// the change that takes its callback back (announcing to it early costs it trust,
    /// nothing else) until another client revokes it.
    takes: bool,
    /// Operations it runs without its callback before it takes it back: before it handles
    /// the reply of its first fetch or validated read once due (as a mount's runtime may
    /// handle a reply after its renewal task's change), else at the start of an operation
    /// once `RETAKE_OVERDUE` more have gone by.
    until_retake: i32,
    own: Option<Ino>,
    shared: Option<Ino>,
    model: DirModel,
}

/// The simulated clients' lease never ends: renewals and revocations are the real
/// driver's (`tutti_fs::members`), and the simulator's clock is not theirs. They pass 0
/// as the time.
const LEASE_MS: u64 = u64::MAX / 4;

impl Client {
    fn new() -> Client {
        let mut trust = Trust::new(LEASE_MS);
        trust.renewed(0);
        Client {
            cache: Cache::default(),
            trust,
            version: 0,
            unfenced: vec![],
            takes: true,
            until_retake: 0,
            own: None,
            shared: None,
            model: DirModel::default(),
        }
    }

    /// Starts over, as a restarted process would: nothing cached, nothing trusted.
    fn forget(&mut self) {
        self.cache = Cache::default();
        self.trust.distrust();
    }
}

/// Bytes a client answered from its cache without a minitransaction, at the instant it
/// did: the simulator compares them with the memory node's committed bytes then.
#[derive(Debug)]
pub struct TrustedRead {
    pub client: u64,
    pub node: NodeId,
    pub addr: u64,
    pub bytes: Vec<u8>,
}

/// How the workload's operations ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct FsCounts {
    pub ops: u64,
    pub done: u64,
    pub errors: u64,
    pub unknown: u64,
    pub retries: u64,
    /// Steps answered on trust, without a minitransaction.
    pub trusted: u64,
    /// Clients revoked by a writer, and callbacks taken back.
    pub revoked: u64,
    pub retaken: u64,
}

pub struct FsWorkload {
    vol: Volume,
    /// Nodes the volume does not span yet, in the order grows add them.
    spare: Vec<NodeId>,
    /// Grows still to draw: each spare node is grown onto twice, the second time as an
    /// operator reruns `tutti fs grow` (which must then change nothing).
    grows_left: usize,
    clients: Vec<Client>,
    violations: Vec<Violation>,
    /// Announcements sent so far (each client's writes are numbered from one sequence).
    announcements: u64,
    trusted_reads: Vec<TrustedRead>,
    pub counts: FsCounts,
}

/// One in this many operations grows the volume first, while grows are left.
const GROW_ONE_IN: u32 = 24;
/// One in this many writes first revokes another client that takes invalidations.
const REVOKE_ONE_IN: u32 = 12;
/// A revoked client runs this many operations, at most, without its callback before it
/// is due to take it back.
const CALLBACKLESS_OPS_MAX: i32 = 3;
/// Operations a client due to take its callback back waits for a fetch or a validated read
/// to do it at.
const RETAKE_OVERDUE: i32 = 4;

impl FsWorkload {
    /// A volume over nodes 1..=`nodes` − `spare`; clients grow it onto the `spare` others
    /// during the run.
    pub fn new(nodes: NodeId, spare: NodeId, clients: u64) -> FsWorkload {
        let geometry =
            Geometry::new(BYTES_PER_NODE, BLOCK_BYTES, BYTES_PER_INODE).expect("a valid geometry");
        let spanned = nodes - spare.min(nodes - 1);
        let vol = Volume {
            geometry,
            nodes: (1..=spanned).map(|n| (n, 0)).collect(),
        };
        FsWorkload {
            vol,
            spare: (spanned + 1..=nodes).collect(),
            grows_left: 2 * (nodes - spanned) as usize,
            clients: (0..clients).map(|_| Client::new()).collect(),
            violations: vec![],
            announcements: 0,
            trusted_reads: vec![],
            counts: FsCounts::default(),
        }
    }

    pub fn volume(&self) -> &Volume {
        &self.vol
    }

    fn dir(&self, client: u64, w: Where) -> Option<Ino> {
        let c = &self.clients[client as usize];
        match w {
            Where::Own => c.own,
            Where::Shared => c.shared,
        }
    }

    fn root_name(client: u64, w: Where) -> Vec<u8> {
        match w {
            Where::Own => format!("c{client}").into_bytes(),
            Where::Shared => b"shared".to_vec(),
        }
    }

    /// The step an operation takes next: its directories first, then its file, then itself.
    fn first_step(&self, client: u64, op: &FsOp) -> Step {
        for w in op.action.places() {
            if self.dir(client, w).is_none() {
                return Step::Root(w);
            }
        }
        match op.action {
            Action::Write(..) | Action::Truncate(..) | Action::Xattr(..) if op.file.is_none() => {
                Step::Find
            }
            _ => Step::Act,
        }
    }

    /// Plans the operation's current step against the client's cache.
    fn plan(&self, client: u64, op: &FsOp, hint: u64) -> Plan<Answer> {
        let c = &self.clients[client as usize];
        let mut tx = Txn::new(&self.vol, &c.cache, hint);
        let root = self.vol.root();
        let prefer = self.vol.nodes[client as usize % self.vol.nodes.len()].0;
        let dir = |w| self.dir(client, w).expect("resolved before");
        let answer: OpResult<Answer> = match op.step {
            Step::Root(w) => {
                ops::lookup(&mut tx, root, &Self::root_name(client, w)).map(|(i, _)| Answer::Ino(i))
            }
            Step::MakeRoot(w) => {
                let new = NewFile::of(S_IFDIR | 0o755);
                ops::make(
                    &mut tx,
                    root,
                    &Self::root_name(client, w),
                    &new,
                    ROOT_USER,
                    prefer,
                    NOW,
                )
                .map(made)
            }
            Step::Find => match op.action {
                Action::Write(w, i, ..) | Action::Truncate(w, i, _) | Action::Xattr(w, i, _) => {
                    ops::lookup(&mut tx, dir(w), &file_name(i)).map(|(i, _)| Answer::Ino(i))
                }
                _ => unreachable!("only writes, truncates and attributes find a file"),
            },
            Step::Act => self.act(&mut tx, client, op, prefer),
            Step::Grow | Step::Fence | Step::Retake => {
                unreachable!("a grow, a fence or a retake is not planned")
            }
        };
        tx.finish(answer)
    }

    fn act(&self, tx: &mut Txn<'_>, client: u64, op: &FsOp, prefer: NodeId) -> OpResult<Answer> {
        let dir = |w| self.dir(client, w).expect("resolved before");
        let file = NewFile::of(S_IFREG | 0o644);
        let subdir = NewFile::of(S_IFDIR | 0o755);
        let never_open = |_: Ino, _: u64| false;
        match op.action {
            Action::Create(w, i) => {
                ops::make(tx, dir(w), &file_name(i), &file, ROOT_USER, prefer, NOW).map(made)
            }
            Action::Mkdir(w, i) => {
                ops::make(tx, dir(w), &dir_name(i), &subdir, ROOT_USER, prefer, NOW).map(made)
            }
            Action::Unlink(w, i) => {
                ops::unlink(tx, dir(w), &file_name(i), &never_open, NOW).map(|_| Answer::Done)
            }
            Action::Rmdir(w, i) => ops::rmdir(tx, dir(w), &dir_name(i), NOW).map(|_| Answer::Done),
            Action::Stat(w, i) => ops::lookup(tx, dir(w), &file_name(i)).map(|_| Answer::Done),
            Action::Rename {
                from,
                to,
                dirs,
                flags,
            } => {
                let name = |i| if dirs { dir_name(i) } else { file_name(i) };
                let made = ops::rename(
                    tx,
                    dir(from.0),
                    &name(from.1),
                    dir(to.0),
                    &name(to.1),
                    flags,
                    &never_open,
                    NOW,
                )?;
                Ok(match made {
                    Made::Done(_) => Answer::Done,
                    Made::Split => Answer::Again,
                })
            }
            Action::Write(_, _, off, len) => {
                let data: Vec<u8> = (0..len)
                    .map(|k| (k as u8).wrapping_add(client as u8))
                    .collect();
                let ino = op.file.expect("found before");
                ops::write(tx, ino, &[(off, data)], false, true, NOW).map(|_| Answer::Done)
            }
            Action::Xattr(_, _, set) => {
                let ino = op.file.expect("found before");
                let name = format!("user.c{client}").into_bytes();
                let r = if set {
                    // Values of several sizes, so that blocks fill unevenly.
                    let value = vec![client as u8; 1 + (prefer as usize * 700) % 1500];
                    tutti_fs::xattr::set(tx, ino, &name, &value, 0, NOW)
                } else {
                    tutti_fs::xattr::remove(tx, ino, &name, NOW)
                };
                r.map(|()| Answer::Done)
            }
            Action::Truncate(_, _, size) => {
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                let ino = op.file.expect("found before");
                ops::setattr(tx, ino, &set, true, NOW).map(|(_, done)| {
                    if done {
                        Answer::Done
                    } else {
                        Answer::Again
                    }
                })
            }
        }
    }

    /// Plans until there is a minitransaction to run; `None` when the operation is over.
    fn advance(&mut self, client: u64, op: &mut FsOp, rng: &mut dyn RngCore) -> Option<Minitx> {
        if let Step::Fence = op.step {
            op.pending = Some(Pending::Fence);
            return Some(coherence::fence_minitx(&self.vol));
        }
        if let Step::Retake = op.step {
            return Some(self.retake(client, op, None));
        }
        if let Step::Grow = op.step {
            // Onto the node after the volume's last (the volume as this client knows it),
            // or, once every spare is in, onto the last again: a rerun.
            let spans = self.vol.nodes.len();
            let (mut old, mut new) = (self.vol.clone(), self.vol.clone());
            match self.spare.iter().find(|n| !self.vol.holds(**n)) {
                Some(&node) => new.nodes.push((node, 0)),
                None => old.nodes.truncate(spans - 1),
            }
            let superblock = self.vol.header(0, 1, NOW.s as u64);
            let version = self.clients[client as usize].version;
            let tx = tutti_fs::volume::grow_minitx(&old, &new, &superblock, version);
            let (first, base) = self.vol.nodes[0];
            let fence_at = (tx.items().iter())
                .position(|(n, item)| {
                    *n == first
                        && matches!(item, tutti_wire::Item::Compare { addr, .. }
                            if *addr == base + coherence::MEMBERSHIP_AT)
                })
                .expect("a grow compares the version");
            op.pending = Some(Pending::Grow(new, fence_at));
            return Some(tx);
        }
        loop {
            let stamp = self.clients[client as usize].trust.stamp();
            match self.plan(client, op, rng.next_u64()) {
                Plan::Fetch(fetches) => {
                    let tx = fetches
                        .iter()
                        .fold(Minitx::new(), |tx, f| tx.read(f.node, f.addr, f.len));
                    op.pending = Some(Pending::Fetch(fetches, stamp));
                    return Some(tx);
                }
                Plan::Run { tx, result, .. } if self.answers_on_trust(client, &tx) => {
                    self.counts.trusted += 1;
                    if !self.step_done(client, op, result) {
                        return None;
                    }
                }
                Plan::Run { tx, .. }
                    if !coherence::written(&tx).is_empty() && rng.gen_ratio(1, REVOKE_ONE_IN) =>
                {
                    // A member this write's announcement did not reach in time: revoked
                    // (`FileSystem::revoke`), and the write goes again.
                    let takers: Vec<u64> = (0..self.clients.len() as u64)
                        .filter(|&o| o != client && self.clients[o as usize].takes)
                        .collect();
                    if let Some(&other) = takers.get(rng.gen_range(0..takers.len().max(1))) {
                        op.pending = Some(Pending::Revoke(other));
                        return Some(coherence::fence_minitx(&self.vol));
                    }
                }
                Plan::Run {
                    tx,
                    result,
                    effects,
                    compared,
                } => {
                    let writes = coherence::written(&tx);
                    // Fenced as the real members' writes are (`FileSystem::run_for`).
                    let (tx, fence_at) = match writes.first() {
                        None => (tx, None),
                        Some(&(node, _, _)) => {
                            let version = self.clients[client as usize].version;
                            let (node, addr, bytes) = coherence::fence(&self.vol, node, version);
                            let at = tx.items().len();
                            (tx.compare(node, addr, bytes), Some(at))
                        }
                    };
                    let (announced, own, since) = match writes.is_empty() {
                        true => (None, stamp, u64::MAX),
                        false => {
                            let announced = (coherence::must_announce(&writes))
                                .then(|| self.announce(client, &writes));
                            let c = &mut self.clients[client as usize];
                            c.trust.moved(&writes);
                            (announced, c.trust.stamp(), c.cache.fills())
                        }
                    };
                    op.pending = Some(Pending::Run {
                        tx: tx.clone(),
                        result,
                        effects,
                        compared,
                        announced,
                        fence_at,
                        own,
                        since,
                    });
                    return Some(tx);
                }
                Plan::Done(result) => {
                    if !self.step_done(client, op, result) {
                        return None;
                    }
                }
            }
        }
    }

    /// Whether `client` may answer `tx`'s step without running it (every byte it compares
    /// is trusted, no write is announced): if so, the bytes go to the simulator's check.
    fn answers_on_trust(&mut self, client: u64, tx: &Minitx) -> bool {
        let c = &self.clients[client as usize];
        let trusted = (c.cache).answers_on_trust(tx, &c.trust.grant(c.trust.stamp(), 0));
        if trusted {
            for (node, item) in tx.items() {
                if let tutti_wire::Item::Compare { addr, bytes, .. } = item {
                    self.trusted_reads.push(TrustedRead {
                        client,
                        node: *node,
                        addr: *addr,
                        bytes: bytes.clone(),
                    });
                }
            }
        }
        trusted
    }

    /// Announces `client`'s write of `ranges` to every other client that takes
    /// invalidations, before it runs (the real members' `Invalidate`, delivered and
    /// acknowledged at once); returns its number.
    fn announce(&mut self, client: u64, ranges: &[(NodeId, u64, u32)]) -> u64 {
        self.announcements += 1;
        let seq = self.announcements;
        for (i, other) in self.clients.iter_mut().enumerate() {
            if i as u64 != client && other.takes {
                let (trust, cache) = (&mut other.trust, &mut other.cache);
                coherence::take_announcement(trust, cache, client, seq, ranges, 0);
            }
        }
        seq
    }

    /// `client`'s announced write `seq` has its outcome: the others' windows close.
    fn end_announcement(&mut self, client: u64, seq: Option<u64>) {
        let Some(seq) = seq else { return };
        for (i, other) in self.clients.iter_mut().enumerate() {
            if i as u64 != client {
                other.trust.ended(client, seq);
            }
        }
    }

    /// `client` takes its callback back: from now on the others announce to it; its trust
    /// starts again once the change commits. `reply`: the reply to a read of its own, handled
    /// after the change.
    fn retake(&mut self, client: u64, op: &mut FsOp, reply: Option<(Pending, Outcome)>) -> Minitx {
        self.clients[client as usize].takes = true;
        op.pending = Some(Pending::Retake(reply.map(Box::new)));
        coherence::fence_minitx(&self.vol)
    }

    /// Whether `client` takes its callback back before it handles the reply to `pending`:
    /// a fetch, or a validated read that wrote nothing, once it is due.
    fn retakes_at(&self, client: u64, pending: &Pending) -> bool {
        let c = &self.clients[client as usize];
        let read = match pending {
            Pending::Fetch(..) => true,
            Pending::Run { tx, .. } => coherence::written(tx).is_empty(),
            _ => false,
        };
        read && !c.takes && c.until_retake <= 0
    }

    /// Reads the member table, for the membership version.
    fn version_read(&self) -> Minitx {
        let (node, addr, len) = coherence::table_read(&self.vol);
        Minitx::new().read(node, addr, len).class("fs-members")
    }

    /// What clients answered on trust since the last call, for the simulator to compare
    /// with the memory nodes now.
    pub fn take_trusted_reads(&mut self) -> Vec<TrustedRead> {
        std::mem::take(&mut self.trusted_reads)
    }

    /// The simulator found an answer given on trust that the memory nodes contradict.
    pub fn stale(&mut self, read: &TrustedRead, committed: &[u8]) {
        let detail = format!(
            "client {} answered on trust {} bytes at {} of node {} as {:?}, committed {:?}",
            read.client,
            read.bytes.len(),
            read.addr,
            read.node,
            read.bytes,
            committed
        );
        self.violations.push(Violation::new("stale", detail));
    }

    /// The current step answered `result`: moves to the next step (true) or ends the
    /// operation (false), feeding the model with what the operation itself answered.
    fn step_done(&mut self, client: u64, op: &mut FsOp, result: Result<Answer, i32>) -> bool {
        let c = &mut self.clients[client as usize];
        match (&op.step, result) {
            (_, Ok(Answer::Again)) => {
                self.counts.retries += 1;
                return true;
            }
            (Step::Root(w), Ok(Answer::Ino(i))) | (Step::MakeRoot(w), Ok(Answer::Ino(i))) => {
                match w {
                    Where::Own => c.own = Some(i),
                    Where::Shared => c.shared = Some(i),
                }
            }
            (Step::Root(w), Err(libc::ENOENT)) => {
                op.step = Step::MakeRoot(*w);
                return true;
            }
            (Step::MakeRoot(w), Err(libc::EEXIST)) => {
                op.step = Step::Root(*w);
                return true;
            }
            (Step::Find, Ok(Answer::Ino(i))) => op.file = Some(i),
            (Step::Act, result) => {
                self.learn(client, &op.action, result.err());
                return false;
            }
            (step, Err(e)) => {
                // A file another client removed between its lookup and the write: fine.
                if !matches!(e, libc::ENOENT | libc::ESTALE) || !matches!(step, Step::Find) {
                    let detail = format!(
                        "client {client}: {step:?} of {:?} answered errno {e}",
                        op.action
                    );
                    self.violations.push(Violation::new("protocol", detail));
                }
                self.counts.errors += 1;
                return false;
            }
            (step, Ok(a)) => panic!("step {step:?} answered {a:?}"),
        }
        op.step = self.first_step(client, op);
        true
    }

    /// Feeds the client's model with how an action ended.
    fn learn(&mut self, client: u64, action: &Action, err: Option<i32>) {
        match err {
            None => self.counts.done += 1,
            Some(_) => self.counts.errors += 1,
        }
        let c = &mut self.clients[client as usize];
        if let Some(what) = c.model.learn(action, err) {
            self.violations.push(Violation::new(
                "model",
                format!("client {client}: {action:?}: {what}"),
            ));
        }
    }

    /// An unknown outcome: the names the action may have changed are uncertain now.
    fn unknown(&mut self, client: u64, action: &Action) {
        self.counts.unknown += 1;
        self.clients[client as usize].model.unknown(action);
    }
}

fn made(m: Made<(Ino, Inode)>) -> Answer {
    match m {
        Made::Done((i, _)) => Answer::Ino(i),
        Made::Split => Answer::Again,
    }
}

impl Workload for FsWorkload {
    type Op = FsOp;

    fn setup(&self) -> Minitx {
        let zero = Inode::decode(&[0u8; INODE_BYTES as usize]);
        tutti_fs::volume::format_minitx(&self.vol, &zero, 1, NOW)
    }

    fn next(&mut self, client: u64, rng: &mut dyn RngCore) -> (FsOp, Minitx) {
        let c = &mut self.clients[client as usize];
        let first = if !c.unfenced.is_empty() {
            Some(Step::Fence)
        } else {
            c.until_retake -= 1;
            (!c.takes && c.until_retake <= -RETAKE_OVERDUE).then_some(Step::Retake)
        };
        if let Some(step) = first {
            // A step of the client's own before any action: a fence, or its callback back.
            let mut op = FsOp {
                action: Action::random(rng),
                step,
                file: None,
                pending: None,
            };
            let tx = self
                .advance(client, &mut op, rng)
                .expect("a fence or a retake to run");
            return (op, tx);
        }
        loop {
            let action = Action::random(rng);
            let mut op = FsOp {
                action,
                step: Step::Act,
                file: None,
                pending: None,
            };
            op.step = self.first_step(client, &op);
            if self.grows_left > 0 && rng.gen_ratio(1, GROW_ONE_IN) {
                self.grows_left -= 1;
                op.step = Step::Grow;
            }
            self.counts.ops += 1;
            if let Some(tx) = self.advance(client, &mut op, rng) {
                return (op, tx);
            }
        }
    }

    fn record(
        &mut self,
        client: u64,
        op: &mut FsOp,
        ended: Result<&Outcome, &ExecError>,
        rng: &mut dyn RngCore,
    ) -> Option<Minitx> {
        let pending = op.pending.take().expect("a minitransaction was pending");
        if let Ok(outcome) = ended {
            if self.retakes_at(client, &pending) {
                return Some(self.retake(client, op, Some((pending, outcome.clone()))));
            }
        }
        let c = &mut self.clients[client as usize];
        match (pending, ended) {
            (Pending::Fetch(fetches, stamp), Ok(outcome)) => {
                let grant = c.trust.grant(stamp, 0);
                for (f, bytes) in fetches.iter().zip(&outcome.reads) {
                    c.cache.fill_trusting(f, bytes.clone(), &grant);
                }
            }
            (Pending::Revoke(other), Ok(outcome)) => {
                if outcome.committed {
                    // The real writer then waits out a lease, past which the revoked
                    // member trusts nothing (its renewals fail); it learns it is revoked
                    // and runs without its callback for a while.
                    self.counts.revoked += 1;
                    let o = &mut self.clients[other as usize];
                    o.takes = false;
                    o.trust.lapse();
                    o.until_retake = rng.gen_range(1..=CALLBACKLESS_OPS_MAX);
                } else {
                    // The volume grew: learn it (the write is planned again after).
                    op.pending = Some(Pending::Version);
                    return Some(self.version_read());
                }
            }
            (Pending::Revoke(_), Err(_)) => {
                // Not known to have moved the version: nobody is revoked (a version that
                // moved anyway only makes writers read the table again). An unknown outcome
                // ends the operation.
                return None;
            }
            (Pending::Retake(reply), ended) => {
                let c = &mut self.clients[client as usize];
                match ended {
                    // Unless a writer revoked it meanwhile (its slot would be gone).
                    Ok(outcome) if outcome.committed && c.takes => {
                        self.counts.retaken += 1;
                        c.trust.took_invalidations(0);
                    }
                    // Not taken (the volume grew, or the outcome is unknown): it stays
                    // without its callback and tries again a few operations later.
                    _ => {
                        c.takes = false;
                        c.until_retake = CALLBACKLESS_OPS_MAX;
                    }
                }
                match (reply, ended) {
                    // The reply that came before the change, handled now.
                    (Some(reply), Ok(_)) => {
                        let (pending, outcome) = *reply;
                        op.pending = Some(pending);
                        return self.record(client, op, Ok(&outcome), rng);
                    }
                    // A retake of its own ends its operation; an unknown outcome (the
                    // client crashed) ends it with the reply unhandled, as the process's
                    // end would.
                    _ => return None,
                }
            }
            (Pending::Fetch(..), Err(_)) => {}
            (Pending::Grow(_, fence_at), Ok(outcome))
                if outcome.failed_compares.contains(&fence_at) =>
            {
                op.pending = Some(Pending::Version);
                return Some(self.version_read());
            }
            (Pending::Grow(new, _), Ok(outcome)) => {
                // A failed compare means the volume spans `new` already (this grow is a
                // rerun, or another client's came first; the only grows are these).
                let spans = outcome.committed || !outcome.failed_compares.is_empty();
                if spans && new.nodes.len() > self.vol.nodes.len() {
                    self.vol = new;
                }
                op.step = self.first_step(client, op);
            }
            (Pending::Grow(..), Err(_)) => {
                // Unknown: the next grow finds out (its compares fail if this one committed).
                // The operation ends here, its action not run.
                self.grows_left += 1;
                return None;
            }
            (
                Pending::Run {
                    tx,
                    result,
                    effects,
                    compared,
                    announced,
                    fence_at,
                    own,
                    since,
                },
                Ok(outcome),
            ) => {
                self.end_announcement(client, announced);
                let c = &mut self.clients[client as usize];
                let committed = outcome.committed;
                let fenced = fence_at.is_some_and(|at| outcome.failed_compares.contains(&at));
                let failed: Vec<usize> = (outcome.failed_compares.iter().copied())
                    .filter(|&i| Some(i) != fence_at)
                    .collect();
                let grant = c.trust.grant(own, 0);
                let ended = (committed, failed.as_slice());
                (c.cache).settle_run(&tx, ended, &compared, *effects, since, &grant);
                let writes = coherence::written(&tx);
                if !writes.is_empty() {
                    // Reads that began before this write ended may hold either side of it.
                    c.trust.moved(&writes);
                }
                if fenced {
                    op.pending = Some(Pending::Version);
                    return Some(self.version_read());
                }
                if committed && !self.step_done(client, op, result) {
                    return None;
                }
            }
            (Pending::Run { announced, .. }, Err(_)) => {
                // It may or may not have committed: start this client's cache over, and
                // end the operation with its names uncertain. Its announcement ends once
                // the client's next operation has fenced it.
                let c = &mut self.clients[client as usize];
                c.forget();
                c.unfenced.extend(announced);
                if matches!(op.step, Step::Act) {
                    self.unknown(client, &op.action);
                }
                return None;
            }
            (Pending::Fence, Ok(outcome)) if outcome.committed => {
                let unfenced = std::mem::take(&mut self.clients[client as usize].unfenced);
                for seq in unfenced {
                    self.end_announcement(client, Some(seq));
                }
                return None;
            }
            (Pending::Fence, Ok(_)) => {
                // The volume grew: learn it, and fence again.
                op.pending = Some(Pending::Version);
                return Some(self.version_read());
            }
            (Pending::Fence, Err(_)) => {
                // Not known to have moved the version: the next operation fences again
                // (twice is harmless).
                return None;
            }
            (Pending::Version, Ok(outcome)) => {
                let header = &outcome.reads[0];
                let version = coherence::Members::decode(header).version;
                self.clients[client as usize].version = version;
                // A grow whose outcome its client did not learn: the volume spans more.
                let nodes = get_u32(header, tutti_fs::layout::field::NODES) as usize;
                while self.vol.nodes.len() < nodes {
                    let spare = self.spare.iter().find(|n| !self.vol.holds(**n));
                    let &node = spare.expect("the nodes grown onto are spares");
                    self.vol.nodes.push((node, 0));
                }
            }
            (Pending::Version, Err(_)) => {
                op.pending = Some(Pending::Version);
                return Some(self.version_read());
            }
        }
        self.advance(client, op, rng)
    }

    fn snapshot(&self) -> Minitx {
        self.vol.nodes.iter().fold(Minitx::new(), |tx, &(node, _)| {
            tx.read(node, 0, BYTES_PER_NODE as u32)
        })
    }

    fn check(&self, snapshot: &[Vec<u8>]) -> Vec<Violation> {
        let images: BTreeMap<NodeId, &Vec<u8>> = self
            .vol
            .nodes
            .iter()
            .map(|(n, _)| *n)
            .zip(snapshot)
            .collect();
        let read = |node: NodeId, addr: u64, len: u32| {
            images[&node][addr as usize..addr as usize + len as usize].to_vec()
        };
        let mut out = self.violations.clone();
        let report = tutti_fs::fsck::check_image(&self.vol, &read);
        for p in &report.problems {
            out.push(Violation::new("fsck", format!("{p:?}")));
        }
        for (client, c) in self.clients.iter().enumerate() {
            let Some(own) = c.own else { continue };
            let Some(entries) = tutti_fs::fsck::list_image(&self.vol, &read, own) else {
                out.push(Violation::new(
                    "model",
                    format!("client {client}: its directory is gone"),
                ));
                continue;
            };
            let listed: std::collections::BTreeSet<Vec<u8>> =
                entries.into_iter().map(|e| e.name).collect();
            for what in c.model.check(&listed) {
                out.push(Violation::new("model", format!("client {client}: {what}")));
            }
        }
        out
    }

    fn check_node(&self, _node: NodeId, _read: &crate::ReadNode<'_>) -> Vec<Violation> {
        // A node's part of a volume has no invariant of its own; `check` walks them all.
        vec![]
    }
}
