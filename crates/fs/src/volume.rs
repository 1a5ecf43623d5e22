//! The driver: runs operations' plans against the cluster with the minitransaction client,
//! keeps the mount's cache, and creates (`mkfs`) and opens volumes. Everything it knows it
//! learns from memory nodes; it keeps no state another mount would need.

use crate::coherence;
use crate::dir::Entry;
use crate::inode::{Inode, Time, S_IFDIR};
use crate::layout::{
    self, Bitmap, BlockRef, Geometry, Ino, LayoutError, Volume, INODE_BYTES, REGION_KIND,
};
use crate::ops::{self, Caller, Found, Made, NewFile, Piece, SetAttr, Target, Unlinked};
use crate::txn::{Cache, Fetch, OpResult, Plan, Txn};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutti_client::{Cluster, ExecError, Minitx, Outcome};
use tutti_wire::{Backoff, ErrorCode, NodeId, Request, Response, RpcError};

/// Bytes of reads one fetch minitransaction carries at most.
const FETCH_BYTES_MAX: u64 = 8 << 20;
/// Items one fetch minitransaction carries at most.
const FETCH_ITEMS_MAX: usize = 1024;
/// Bytes one minitransaction writes when mkfs clears a reused region.
const CLEAR_BYTES_PER_TXN: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("cluster: {0}")]
    Cluster(String),
    #[error("volume {name:?} already holds a file system (made {created_unix_s} s after the epoch, id {volume_id:#x}); run mkfs with --force to overwrite it, which loses every file")]
    Exists {
        name: String,
        created_unix_s: u64,
        volume_id: u64,
    },
    #[error("no volume called {0:?} on this cluster: create it with `tutti fs mkfs`")]
    NoVolume(String),
    #[error("region {name:?} is a {kind}, not a file system")]
    NotAVolume { name: String, kind: String },
    #[error("region {name:?} exists with another shape ({what}); a region keeps its shape for good, so mkfs it with the same size and block size or under another --name")]
    Shape { name: String, what: String },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("no answer from the memory nodes within the deadline: {0}")]
    Deadline(String),
    #[error("{0}")]
    Members(String),
}

/// How mkfs shapes a volume.
#[derive(Clone, Debug)]
pub struct Shape {
    pub nodes: Vec<NodeId>,
    pub bytes_per_node: u64,
    pub block_bytes: u32,
    pub bytes_per_inode: u32,
}

/// A file as the kernel names it: its slot and the low bits of its `igeneration`
/// (`Volume::handle`). Without a generation, whatever file the slot holds (the root, fsck).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    pub ino: Ino,
    pub generation: Option<u64>,
}

impl Handle {
    /// The file in slot `ino`, whichever it is.
    pub fn any(ino: Ino) -> Handle {
        Handle {
            ino,
            generation: None,
        }
    }
}

/// Free space, as statfs reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub blocks: u64,
    pub blocks_free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub block_bytes: u32,
}

pub fn now() -> Time {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        s: d.as_secs() as i64,
        ns: d.subsec_nanos(),
    }
}

/// A mounted (opened) volume: the cluster, the volume's layout and this mount's cache.
pub struct FileSystem {
    pub(crate) cluster: Cluster,
    name: String,
    /// The layout as this mount last read it; a grow adds nodes (`refresh_volume`).
    vol: std::sync::RwLock<std::sync::Arc<Volume>>,
    cache: Mutex<Cache>,
    prefer: AtomicU16,
    pub(crate) deadline: Duration,
    /// The last `usage` read and when: statfs answers it for `USAGE_FRESH`.
    usage: Mutex<Option<(Instant, Usage)>>,
    pub(crate) coherent: crate::members::Coherent,
}

/// How long statfs answers free space it counted before (Sinfonia's SinfoniaFS answers
/// statfs from a cache too): counting reads every bitmap of every node.
pub const USAGE_FRESH: Duration = Duration::from_secs(1);

async fn region(cluster: &Cluster, name: &str) -> Result<tutti_wire::RegionInfo, FsError> {
    match cluster
        .ask_manager(&Request::Region { name: name.into() })
        .await
    {
        Ok(Response::Region(r)) if r.kind == REGION_KIND => Ok(*r),
        Ok(Response::Region(r)) => Err(FsError::NotAVolume {
            name: name.into(),
            kind: r.kind,
        }),
        Ok(other) => Err(FsError::Cluster(format!("the manager answered {other:?}"))),
        Err(RpcError::Remote {
            code: ErrorCode::NotFound,
            ..
        }) => Err(FsError::NoVolume(name.into())),
        Err(e) => Err(FsError::Cluster(e.to_string())),
    }
}

/// The region's name for volume `name`.
pub fn region_name(name: &str) -> String {
    format!("fs/{name}")
}

/// Runs `tx` until it has an outcome; retries what the client could not decide.
pub(crate) async fn exec(
    cluster: &Cluster,
    tx: &Minitx,
    until: Instant,
) -> Result<Outcome, FsError> {
    exec_noting(cluster, tx, until, &mut false).await
}

/// `exec`, setting `uncertain` if an attempt may have committed before the one that
/// answered (so that a retry's failed compares may be the first attempt's own writes).
async fn exec_noting(
    cluster: &Cluster,
    tx: &Minitx,
    until: Instant,
    uncertain: &mut bool,
) -> Result<Outcome, FsError> {
    let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(500));
    loop {
        let last = match cluster.exec_and_commit(tx).await {
            Ok(outcome) => return Ok(outcome),
            Err(
                e
                @ (ExecError::Invalid(_) | ExecError::UnknownNode(_) | ExecError::Rejected { .. }),
            ) => return Err(FsError::Cluster(e.to_string())),
            Err(e @ (ExecError::OutcomeUnknown { .. } | ExecError::ReadsLost { .. })) => {
                *uncertain = true;
                e.to_string()
            }
            Err(e) => e.to_string(),
        };
        if !backoff.pause_before(until).await {
            return Err(FsError::Deadline(last));
        }
    }
}

/// Reads `fetches` in as few minitransactions as the limits allow.
async fn fetch(
    cluster: &Cluster,
    fetches: &[Fetch],
    until: Instant,
) -> Result<Vec<Vec<u8>>, FsError> {
    let mut out = Vec::with_capacity(fetches.len());
    let mut at = 0;
    while at < fetches.len() {
        let (mut tx, mut bytes, start) = (Minitx::new(), 0u64, at);
        while at < fetches.len()
            && at - start < FETCH_ITEMS_MAX
            && (bytes == 0 || bytes + fetches[at].len as u64 <= FETCH_BYTES_MAX)
        {
            let f = &fetches[at];
            tx = tx.read(f.node, f.addr, f.len);
            bytes += f.len as u64;
            at += 1;
        }
        out.extend(exec(cluster, &tx.class("fs"), until).await?.reads);
    }
    Ok(out)
}

impl FileSystem {
    /// Creates volume `name` on the cluster: allocates its region on every node of `shape`
    /// and writes the headers, empty bitmaps and the root directory. Refuses a region that
    /// holds a file system already unless `force`.
    pub async fn mkfs(
        cluster: &Cluster,
        name: &str,
        shape: &Shape,
        force: bool,
        deadline: Duration,
    ) -> Result<Volume, FsError> {
        let geometry = Geometry::new(
            shape.bytes_per_node,
            shape.block_bytes,
            shape.bytes_per_inode,
        )?;
        let create = Request::CreateRegion {
            name: region_name(name),
            kind: REGION_KIND.into(),
            nodes: shape.nodes.clone(),
            bytes_per_node: shape.bytes_per_node,
            params: geometry.params(),
        };
        let info = match cluster.ask_manager(&create).await {
            Ok(Response::Region(r)) => *r,
            Ok(other) => return Err(FsError::Cluster(format!("the manager answered {other:?}"))),
            Err(RpcError::Remote {
                code: ErrorCode::Conflict,
                message,
                ..
            }) => {
                return Err(FsError::Shape {
                    name: name.into(),
                    what: message,
                })
            }
            Err(e) => return Err(FsError::Cluster(e.to_string())),
        };
        let vol = Volume {
            geometry,
            nodes: info.nodes,
        };
        let until = Instant::now() + deadline;
        let headers = read_headers(cluster, &vol, until).await?;
        let formatted = headers
            .iter()
            .enumerate()
            .find(|(_, h)| layout::get_u64(h, layout::field::MAGIC) != 0);
        if let Some((_, h)) = formatted {
            if !force {
                return Err(FsError::Exists {
                    name: name.into(),
                    created_unix_s: layout::get_u64(h, layout::field::CREATED_UNIX_S),
                    volume_id: layout::get_u64(h, layout::field::VOLUME_ID),
                });
            }
            clear(cluster, &vol, until).await?;
        }
        format(cluster, &vol, until).await?;
        Ok(vol)
    }

    /// Opens volume `name`, checking every node's header.
    pub async fn open(
        cluster: &Cluster,
        name: &str,
        deadline: Duration,
    ) -> Result<FileSystem, FsError> {
        let (vol, _) = current(cluster, name, Instant::now() + deadline).await?;
        let prefer = vol.nodes[rand::random::<usize>() % vol.nodes.len()].0;
        Ok(FileSystem {
            cluster: cluster.clone(),
            name: name.into(),
            vol: std::sync::RwLock::new(std::sync::Arc::new(vol)),
            cache: Mutex::default(),
            prefer: AtomicU16::new(prefer),
            deadline,
            usage: Mutex::new(None),
            coherent: crate::members::Coherent::new(crate::coherence::LEASE_MS_DEFAULT),
        })
    }

    /// The layout as this mount knows it now (a grow adds nodes to the next one).
    pub fn volume(&self) -> std::sync::Arc<Volume> {
        self.vol.read().expect("volume poisoned").clone()
    }

    /// Extends volume `name` onto `nodes` (memory nodes it does not span yet): their share
    /// of the volume's region, then one minitransaction that writes every node's header with
    /// the new node count, comparing the old headers. Bitmaps and inode tables of the new
    /// nodes are zero, as mkfs leaves them: regions are new space, never reused. A grow
    /// that stopped between the two steps leaves the region longer than the volume; the
    /// next one finishes it. Returns the volume as it is after.
    pub async fn grow(
        cluster: &Cluster,
        name: &str,
        nodes: &[NodeId],
        deadline: Duration,
    ) -> Result<Volume, FsError> {
        let until = Instant::now() + deadline;
        loop {
            let (old, headers) = current(cluster, name, until).await?;
            let extend = Request::ExtendRegion {
                name: region_name(name),
                nodes: nodes.to_vec(),
            };
            let info = match cluster.ask_manager(&extend).await {
                Ok(Response::Region(r)) => *r,
                Ok(other) => {
                    return Err(FsError::Cluster(format!("the manager answered {other:?}")))
                }
                Err(e) => return Err(FsError::Cluster(e.to_string())),
            };
            let new = Volume {
                geometry: old.geometry.clone(),
                nodes: info.nodes,
            };
            if new.nodes.len() == old.nodes.len() {
                return Ok(old);
            }
            let (first, base) = old.nodes[0];
            let read = Minitx::new().read(first, base + coherence::MEMBERSHIP_AT, 8);
            let version = layout::get_u64(&exec(cluster, &read, until).await?.reads[0], 0);
            let tx = grow_minitx(&old, &new, &headers[0], version);
            if exec(cluster, &tx, until).await?.committed {
                return Ok(new);
            }
            // Another grow went first: start over from what it left.
        }
    }

    /// Reads the superblock's node count and, if a grow raised it, learns the new nodes.
    /// Returns whether the volume grew.
    pub async fn refresh_volume(&self) -> Result<bool, FsError> {
        let vol = self.volume();
        let (known, (first, base)) = (vol.nodes.len(), vol.nodes[0]);
        let until = Instant::now() + self.deadline;
        let read = Minitx::new().read(first, base, layout::field::END as u32);
        let header = exec(&self.cluster, &read, until).await?.reads.remove(0);
        if layout::get_u32(&header, layout::field::NODES) as usize <= known {
            return Ok(false);
        }
        let (vol, _) = current(&self.cluster, &self.name, until).await?;
        let grew = vol.nodes.len() > known;
        if grew {
            tracing::info!(nodes = vol.nodes.len(), "the volume grew");
            *self.vol.write().expect("volume poisoned") = std::sync::Arc::new(vol);
        }
        Ok(grew)
    }
    /// The cluster this volume is on.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn root(&self) -> Ino {
        self.volume().root()
    }

    /// The node new files go to (Sinfonia §5.3); `set_preferred` moves it.
    pub fn preferred(&self) -> NodeId {
        self.prefer.load(Ordering::Relaxed)
    }
    pub fn set_preferred(&self, node: NodeId) {
        if self.volume().holds(node) {
            self.prefer.store(node, Ordering::Relaxed);
        }
    }

    /// Runs `op` until its minitransaction commits; answers its result and its reads.
    pub async fn run<T>(
        &self,
        op: impl Fn(&mut Txn<'_>) -> OpResult<T>,
    ) -> Result<(T, Vec<Vec<u8>>), i32> {
        self.run_for(&[], op).await
    }

    /// `run` for an operation on files the kernel named by `handles`: ESTALE (ENOENT for a
    /// directory) if a slot now holds another file.
    pub async fn run_for<T>(
        &self,
        handles: &[Handle],
        op: impl Fn(&mut Txn<'_>) -> OpResult<T>,
    ) -> Result<(T, Vec<Vec<u8>>), i32> {
        let until = Instant::now() + self.deadline;
        let mut backoff = Backoff::new(Duration::from_micros(200), Duration::from_millis(50));
        let mut conflicts = 0u32;
        // Set when an attempt may have committed without our learning it (see below).
        let mut uncertain = false;
        let mut fetch_rounds = 0u32;
        loop {
            // What this member knew before it read: what it reads may be trusted later
            // only if no other member announced a write meanwhile.
            let stamp = self.stamp();
            let vol = self.volume();
            let (plan, trusted) = self.plan(&vol, handles, &op, stamp);
            match plan {
                // A reference to a node this mount does not know is what another mount
                // leaves on nodes a grow added: learn them and go again. It answers EIO
                // where it is validated, and elsewhere looks like a stale cached block,
                // fetched again and again (so a third round of fetches looks too).
                Plan::Done(Err(libc::EIO)) if matches!(self.refresh_volume().await, Ok(true)) => {}
                Plan::Done(result) => return result.map(|t| (t, vec![])),
                Plan::Fetch(fetches) => {
                    fetch_rounds += 1;
                    if fetch_rounds == 3 {
                        self.refresh_volume().await.map_err(|e| self.failed(e))?;
                    }
                    if Instant::now() >= until {
                        // A bounded wait even if an operation kept missing what it fetched.
                        let why = "the operation kept missing what it fetched".to_string();
                        return Err(self.failed(FsError::Deadline(why)));
                    }
                    let data = fetch(&self.cluster, &fetches, until)
                        .await
                        .map_err(|e| self.failed(e))?;
                    let mut cache = self.cache();
                    // Under the cache's hold, as announcements open their windows.
                    self.granted(stamp, |grant| {
                        for (f, bytes) in fetches.iter().zip(data) {
                            cache.fill_trusting(f, bytes, grant);
                        }
                    });
                }
                Plan::Run {
                    tx,
                    result,
                    effects,
                    compared,
                } => {
                    let writes = coherence::written(&tx);
                    if trusted {
                        // Nothing another member changed since this member validated it: the
                        // answer stands without a minitransaction.
                        return result.map(|t| (t, vec![]));
                    }
                    // A write is fenced by the membership version: it commits only if this
                    // member knows every member there is, so that it announces to them all.
                    let (tx, fence_at) = if writes.is_empty() {
                        (tx, None)
                    } else {
                        let (version, _) = self.member().await.map_err(|e| self.failed(e))?;
                        let (node, addr, bytes) = coherence::fence(&vol, writes[0].0, version);
                        let at = tx.items().len();
                        (tx.compare(node, addr, bytes), Some(at))
                    };
                    let announced = match coherence::must_announce(&writes) {
                        false => None,
                        true => {
                            (self.announce(writes.clone()).await).map_err(|e| self.failed(e))?
                        }
                    };
                    // This mount's own write is announced to its other operations: a read
                    // of what it writes that began before it ends is not trusted, and the
                    // write trusts what it commits only where no other write came meanwhile.
                    let (own, since) = match writes.is_empty() {
                        true => (stamp, u64::MAX),
                        false => {
                            let cache = self.cache();
                            (self.own_write(&writes), cache.fills())
                        }
                    };
                    let outcome = exec_noting(&self.cluster, &tx, until, &mut uncertain).await;
                    let unknown = !writes.is_empty() && (outcome.is_err() || uncertain);
                    if unknown {
                        // It may have committed unseen: nothing cached is sure any more.
                        self.distrust_all();
                    }
                    if let Some((seq, took)) = announced {
                        // A write that may still commit is fenced before the others
                        // trust what it writes again (or they revoke this member).
                        if !unknown || self.fence_unknown().await.is_ok() {
                            self.end_announcement(seq, took);
                        }
                    }
                    let outcome = outcome.map_err(|e| self.failed(e))?;
                    let committed = outcome.committed;
                    let fenced = fence_at.is_some_and(|at| outcome.failed_compares.contains(&at));
                    let failed: Vec<usize> = (outcome.failed_compares.iter().copied())
                        .filter(|&i| Some(i) != fence_at)
                        .collect();
                    {
                        let mut cache = self.cache();
                        let outcome = (committed, failed.as_slice());
                        self.granted(own, |grant| {
                            cache.settle_run(&tx, outcome, &compared, *effects, since, grant);
                        });
                        if !writes.is_empty() {
                            // Under the cache's lock: a read that fetched the old bytes and
                            // fills them after this settles must not trust them.
                            self.own_write(&writes);
                        }
                    }
                    if committed {
                        return result.map(|t| (t, outcome.reads));
                    }
                    if fenced && failed.is_empty() {
                        if Instant::now() >= until {
                            let why = "the volume's members kept changing".to_string();
                            return Err(self.failed(FsError::Deadline(why)));
                        }
                        // Members joined or left: learn who, and announce to them.
                        self.refresh_members().await.map_err(|e| self.failed(e))?;
                        continue;
                    }
                    if uncertain {
                        // An earlier attempt of this minitransaction may have committed, and
                        // every writing operation changes a byte it compares: the compares
                        // that failed may be its own writes. Running the operation again
                        // could answer from its own effect (ENOENT for a rename that
                        // happened) or do it twice (an O_APPEND write): "may or may not have
                        // happened" is EIO.
                        return Err(self.failed(FsError::Deadline(
                            "an attempt may have committed and the next one found changes".into(),
                        )));
                    }
                    // A first failed compare is another mount's change: fetch and go again at
                    // once. Only repeated failures back off, so that mounts racing for one
                    // bucket or bitmap word spread out.
                    conflicts += 1;
                    if conflicts > 1 && !backoff.pause_before(until).await {
                        return Err(self.failed(FsError::Deadline("compares kept failing".into())));
                    }
                }
            }
        }
    }

    /// `op`'s answer if the cache holds it and every object it relied on is trusted (no
    /// minitransaction needed); `None` otherwise, for `run_for`. It never waits, so the
    /// mount answers such requests on the thread that read them.
    pub fn trusted<T>(
        &self,
        handles: &[Handle],
        op: impl Fn(&mut Txn<'_>) -> OpResult<T>,
    ) -> Option<Result<T, i32>> {
        let stamp = self.stamp();
        match self.plan(&self.volume(), handles, &op, stamp) {
            (Plan::Run { result, .. }, true) => Some(result),
            _ => None,
        }
    }

    pub fn trusted_getattr(&self, h: Handle) -> Option<Result<Inode, i32>> {
        self.trusted(&[h], |tx| ops::inode(tx, h.ino))
    }

    pub fn trusted_lookup(&self, parent: Handle, name: &[u8]) -> Option<Result<Found, i32>> {
        self.trusted(&[parent], |tx| ops::find(tx, parent.ino, name))
    }

    /// One run of `op` against the cache, on files the kernel named by `handles`, and
    /// whether its answer stands without a minitransaction: it only compares, every object
    /// it compared is trusted and trust has held since `stamp`. Decided under the same hold
    /// of the cache as the plan, so that no fill replaces what the plan read meanwhile.
    fn plan<T>(
        &self,
        vol: &Volume,
        handles: &[Handle],
        op: &impl Fn(&mut Txn<'_>) -> OpResult<T>,
        stamp: crate::coherence::Stamp,
    ) -> (Plan<T>, bool) {
        let cache = self.cache();
        let mut tx = Txn::new(vol, &cache, rand::random());
        for h in handles {
            if let Some(g) = h.generation {
                tx.expect_generation(h.ino, g);
            }
        }
        let answer = op(&mut tx);
        let plan = tx.finish(answer);
        let trusted = match &plan {
            Plan::Run { tx, .. } => self.granted(stamp, |grant| cache.answers_on_trust(tx, grant)),
            _ => false,
        };
        (plan, trusted)
    }

    /// The mount's cache. An operation that panicked while planning (a bug) leaves it
    /// poisoned and perhaps half changed: it starts over empty, which is always safe since
    /// nothing in it is trusted without a compare, so that one bad operation does not fail
    /// every later one.
    pub(crate) fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| {
            tracing::error!(volume = %self.name, "an operation panicked; the mount's cache starts over");
            self.cache.clear_poison();
            let mut cache = poisoned.into_inner();
            *cache = Cache::default();
            cache
        })
    }

    fn failed(&self, e: FsError) -> i32 {
        tracing::warn!(volume = %self.name, "operation failed: {e}");
        libc::EIO
    }

    pub async fn getattr(&self, h: Handle) -> Result<Inode, i32> {
        Ok(self.run_for(&[h], |tx| ops::inode(tx, h.ino)).await?.0)
    }

    pub async fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Found, i32> {
        Ok(self
            .run_for(&[parent], |tx| ops::find(tx, parent.ino, name))
            .await?
            .0)
    }

    /// Creates a file, directory, symlink or special file (EEXIST if `name` is taken).
    pub async fn make(
        &self,
        parent: Handle,
        name: &[u8],
        new: &NewFile,
        who: Caller,
    ) -> Result<(Ino, Inode), i32> {
        // A file goes to its directory's node, so that creating it is a one-node (one-phase)
        // minitransaction; a directory goes to the preferred node, which spreads the tree.
        let prefer = match new.mode & crate::inode::S_IFMT {
            S_IFDIR => self.preferred(),
            _ => parent.ino.node(),
        };
        loop {
            let made = self
                .run_for(&[parent], |tx| {
                    ops::make(tx, parent.ino, name, new, who, prefer, now())
                })
                .await?
                .0;
            if let Made::Done(r) = made {
                return Ok(r);
            }
        }
    }

    pub async fn unlink(
        &self,
        parent: Handle,
        name: &[u8],
        is_open: &(dyn Fn(Ino, u64) -> bool + Sync),
    ) -> Result<Option<(Ino, u64)>, i32> {
        let (gone, _) = self
            .run_for(&[parent], |tx| {
                ops::unlink(tx, parent.ino, name, is_open, now())
            })
            .await?;
        self.after_unlink(gone, is_open).await
    }

    /// Frees an orphan the unlink left unless it is open here; returns the one kept open.
    async fn after_unlink(
        &self,
        gone: Unlinked,
        is_open: &(dyn Fn(Ino, u64) -> bool + Sync),
    ) -> Result<Option<(Ino, u64)>, i32> {
        match gone {
            Unlinked::Orphan(ino, g) if is_open(ino, g) => Ok(Some((ino, g))),
            Unlinked::Orphan(ino, g) => self.reclaim(ino, Some(g)).await.map(|()| None),
            Unlinked::Done => Ok(None),
        }
    }

    /// Frees orphan `ino` (no links left, no longer open here), a bounded number of blocks
    /// per minitransaction; if `generation` is given, only while the slot holds that file. A
    /// file linked again meanwhile is left alone.
    pub async fn reclaim(&self, ino: Ino, generation: Option<u64>) -> Result<(), i32> {
        let mask = self.volume().handle_generation_mask();
        let h = Handle {
            ino,
            generation: generation.map(|g| g & mask),
        };
        while !self.run_for(&[h], |tx| ops::reclaim(tx, ino)).await?.0 {}
        Ok(())
    }

    pub async fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<(), i32> {
        self.run_for(&[parent], |tx| ops::rmdir(tx, parent.ino, name, now()))
            .await?;
        Ok(())
    }

    pub async fn link(&self, h: Handle, parent: Handle, name: &[u8]) -> Result<Inode, i32> {
        loop {
            if let Made::Done(i) = self
                .run_for(&[h, parent], |tx| {
                    ops::link(tx, h.ino, parent.ino, name, now())
                })
                .await?
                .0
            {
                return Ok(i);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn rename(
        &self,
        sp: Handle,
        sname: &[u8],
        dp: Handle,
        dname: &[u8],
        flags: u32,
        is_open: &(dyn Fn(Ino, u64) -> bool + Sync),
    ) -> Result<Option<(Ino, u64)>, i32> {
        loop {
            let made = self
                .run_for(&[sp, dp], |tx| {
                    ops::rename(tx, sp.ino, sname, dp.ino, dname, flags, is_open, now())
                })
                .await?
                .0;
            if let Made::Done(gone) = made {
                return self.after_unlink(gone, is_open).await;
            }
        }
    }

    pub async fn setattr(&self, h: Handle, set: &SetAttr, privileged: bool) -> Result<Inode, i32> {
        loop {
            let (inode, done) = self
                .run_for(&[h], |tx| ops::setattr(tx, h.ino, set, privileged, now()))
                .await?
                .0;
            if done {
                return Ok(inode);
            }
        }
    }

    pub async fn read(&self, h: Handle, offset: u64, len: u32) -> Result<Vec<u8>, i32> {
        let (pieces, reads) = self
            .run_for(&[h], |tx| ops::read(tx, h.ino, offset, len))
            .await?;
        let mut data = Vec::with_capacity(len as usize);
        for p in pieces {
            match p {
                Piece::Zeros(n) => data.resize(data.len() + n, 0),
                Piece::Read(i) => data.extend_from_slice(&reads[i]),
            }
        }
        Ok(data)
    }

    /// Writes `extents` in one minitransaction; returns the new size.
    pub async fn write(
        &self,
        h: Handle,
        extents: &[(u64, Vec<u8>)],
        append: bool,
        privileged: bool,
    ) -> Result<u64, i32> {
        Ok(self
            .run_for(&[h], |tx| {
                ops::write(tx, h.ino, extents, append, privileged, now())
            })
            .await?
            .0)
    }

    /// fallocate(2): `mode` is Linux's (KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE); a long range
    /// takes several minitransactions.
    pub async fn fallocate(&self, h: Handle, offset: u64, len: u64, mode: i32) -> Result<(), i32> {
        let end = offset.checked_add(len).ok_or(libc::EFBIG)?;
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let mut at = offset;
        while at < end {
            at = self
                .run_for(&[h], |tx| ops::fallocate(tx, h.ino, at, end, mode, now()))
                .await?
                .0;
        }
        Ok(())
    }

    pub async fn readlink(&self, h: Handle) -> Result<Vec<u8>, i32> {
        let (target, reads) = self.run_for(&[h], |tx| ops::readlink(tx, h.ino)).await?;
        Ok(match target {
            Target::Inline(t) => t,
            Target::Read(i) => reads[i].clone(),
        })
    }

    /// The value of extended attribute `name` of `h`.
    pub async fn getxattr(&self, h: Handle, name: &[u8]) -> Result<Vec<u8>, i32> {
        Ok(self
            .run_for(&[h], |tx| crate::xattr::get(tx, h.ino, name))
            .await?
            .0)
    }

    /// The names of `h`'s extended attributes, each followed by a NUL.
    pub async fn listxattr(&self, h: Handle) -> Result<Vec<u8>, i32> {
        Ok(self
            .run_for(&[h], |tx| crate::xattr::list(tx, h.ino))
            .await?
            .0)
    }

    pub async fn setxattr(
        &self,
        h: Handle,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<(), i32> {
        self.run_for(&[h], |tx| {
            crate::xattr::set(tx, h.ino, name, value, flags, now())
        })
        .await?;
        Ok(())
    }

    pub async fn removexattr(&self, h: Handle, name: &[u8]) -> Result<(), i32> {
        self.run_for(&[h], |tx| crate::xattr::remove(tx, h.ino, name, now()))
            .await?;
        Ok(())
    }

    /// Directory `h` and its entries, with the `igeneration` of its parent (for `..`).
    pub async fn list(&self, h: Handle) -> Result<(Inode, Vec<Entry>, u64), i32> {
        Ok(self.run_for(&[h], |tx| ops::list(tx, h.ino)).await?.0)
    }

    /// Free inodes and blocks, counted at most `USAGE_FRESH` ago.
    pub async fn usage(&self) -> Result<Usage, i32> {
        let last = *self.usage.lock().expect("usage poisoned");
        if let Some((_, u)) = last.filter(|(at, _)| at.elapsed() < USAGE_FRESH) {
            return Ok(u);
        }
        let u = self.count_usage().await?;
        *self.usage.lock().expect("usage poisoned") = Some((Instant::now(), u));
        Ok(u)
    }

    /// Counts free inodes and blocks from every node's bitmaps, read now.
    pub async fn count_usage(&self) -> Result<Usage, i32> {
        let vol = self.volume();
        let mut fetches = vec![];
        for &(node, _) in &vol.nodes {
            for kind in [Bitmap::Inodes, Bitmap::Blocks] {
                let (at, bytes) = (vol.bitmap_addr(node, kind), vol.bitmap_bytes(kind));
                for page in (0..bytes).step_by(crate::txn::BITMAP_PAGE_BYTES as usize) {
                    let len = (bytes - page).min(crate::txn::BITMAP_PAGE_BYTES) as u32;
                    fetches.push((kind, Fetch::object(node, at + page, len)));
                }
            }
        }
        let only: Vec<Fetch> = fetches.iter().map(|(_, f)| f.clone()).collect();
        let until = Instant::now() + self.deadline;
        let data = fetch(&self.cluster, &only, until)
            .await
            .map_err(|e| self.failed(e))?;
        let (mut used_inodes, mut used_blocks) = (0u64, 0u64);
        for ((kind, _), bytes) in fetches.iter().zip(data) {
            let ones: u64 = bytes.iter().map(|b| b.count_ones() as u64).sum();
            match kind {
                Bitmap::Inodes => used_inodes += ones,
                Bitmap::Blocks => used_blocks += ones,
            }
        }
        let g = &vol.geometry;
        let n = vol.nodes.len() as u64;
        Ok(Usage {
            blocks: g.blocks_per_node * n,
            blocks_free: g.blocks_per_node * n - used_blocks,
            inodes: g.inodes_per_node * n,
            inodes_free: g.inodes_per_node * n - used_inodes,
            block_bytes: g.block_bytes,
        })
    }
}

/// A node's recent load: minitransactions committed and 16 KiB units written in its
/// shortest window.
fn load(r: &tutti_wire::StatsReport) -> u64 {
    r.classes
        .iter()
        .filter_map(|c| c.windows.first())
        .map(|w| w.committed + w.bytes_written / (16 << 10))
        .sum()
}

/// Volume `name` as its superblock says it is now: the region's nodes up to the node count
/// in the first node's header (a grow that stopped half-way leaves the region spanning
/// nodes the volume does not), with their headers, each checked.
async fn current(
    cluster: &Cluster,
    name: &str,
    until: Instant,
) -> Result<(Volume, Vec<Vec<u8>>), FsError> {
    let info = region(cluster, &region_name(name)).await?;
    let geometry = Geometry::from_params(info.bytes_per_node, &info.params)?;
    let mut vol = Volume {
        geometry,
        nodes: info.nodes,
    };
    let mut headers = read_headers(cluster, &vol, until).await?;
    let spans = layout::get_u32(&headers[0], layout::field::NODES) as usize;
    vol.nodes.truncate(spans.clamp(1, vol.nodes.len()));
    headers.truncate(vol.nodes.len());
    for (i, h) in headers.iter().enumerate() {
        vol.check_header(i, h)?;
    }
    Ok((vol, headers))
}

async fn read_headers(
    cluster: &Cluster,
    vol: &Volume,
    until: Instant,
) -> Result<Vec<Vec<u8>>, FsError> {
    let tx = vol.nodes.iter().fold(Minitx::new(), |tx, (node, base)| {
        tx.read(*node, *base, layout::field::END as u32)
    });
    Ok(exec(cluster, &tx, until).await?.reads)
}

/// Zeroes a reused region's bitmaps and inode tables (mkfs --force).
async fn clear(cluster: &Cluster, vol: &Volume, until: Instant) -> Result<(), FsError> {
    let g = &vol.geometry;
    for &(node, base) in &vol.nodes {
        let (from, to) = (base, base + g.data_at);
        let mut at = from;
        while at < to {
            let n = (to - at).min(CLEAR_BYTES_PER_TXN);
            exec(
                cluster,
                &Minitx::new()
                    .write(node, at, vec![0; n as usize])
                    .class("fs"),
                until,
            )
            .await?;
            at += n;
        }
    }
    Ok(())
}

/// Writes the headers, the root directory and its blocks, guarded by a compare that the
/// first node's header is still blank (two concurrent mkfs cannot both format).
async fn format(cluster: &Cluster, vol: &Volume, until: Instant) -> Result<(), FsError> {
    let (first, _) = vol.nodes[0];
    let read = Minitx::new().read(first, vol.inode_addr(vol.root()), INODE_BYTES as u32);
    let old_root = Inode::decode(&exec(cluster, &read, until).await?.reads[0]);
    let tx = format_minitx(vol, &old_root, rand::random::<u64>() | 1, now());
    if !exec(cluster, &tx, until).await?.committed {
        return Err(FsError::Cluster(
            "another mkfs formatted the volume at the same time".into(),
        ));
    }
    Ok(())
}

/// The minitransaction that formats `vol` (its bitmaps and inode tables zero): every node's
/// header and the root directory with its table and bucket (blocks 0 and 1 of the first
/// node). `old_root` is the root's slot as it is: a reused slot continues its `iversion`.
pub fn format_minitx(vol: &Volume, old_root: &Inode, volume_id: u64, t: Time) -> Minitx {
    let bs = vol.geometry.block_bytes;
    let (first, _) = vol.nodes[0];
    let root = vol.root();
    let (table_ref, bucket_ref) = (BlockRef::new(first, 0), BlockRef::new(first, 1));
    let mut inode = Inode::fresh(old_root, S_IFDIR | 0o755, 0, 0, t);
    // Nothing stages the root's inode: its new iversion is written here.
    inode.iversion += 1;
    (inode.parent, inode.root, inode.blocks) = (root, table_ref, 2);
    let (table, bucket) = crate::dir::empty_directory(root, inode.igeneration, bucket_ref);
    let mut tx = Minitx::new().compare(first, vol.header_addr(first), vec![0; 8]);
    for (i, &(node, _)) in vol.nodes.iter().enumerate() {
        tx = tx.write(
            node,
            vol.header_addr(node),
            vol.header(i, volume_id, t.s as u64),
        );
    }
    tx.write(
        first,
        vol.bitmap_addr(first, Bitmap::Inodes),
        1u64.to_le_bytes().to_vec(),
    )
    .write(
        first,
        vol.bitmap_addr(first, Bitmap::Blocks),
        3u64.to_le_bytes().to_vec(),
    )
    .write(first, vol.inode_addr(root), inode.encode())
    .write(first, vol.block_addr(table_ref), table.encode(bs))
    .write(first, vol.block_addr(bucket_ref), bucket.encode(bs))
    .class("fs")
}

/// The minitransaction that makes volume `old` (whose superblock is `superblock`) span
/// `new`'s nodes too: it compares every old header as it is and each new node's first header
/// word to zero, and writes every node's header with the new node count; the membership
/// version (`version`, compared on the first node) goes to the new nodes, where members'
/// writes compare it.
pub fn grow_minitx(old: &Volume, new: &Volume, superblock: &[u8], version: u64) -> Minitx {
    let (id, created) = (
        layout::get_u64(superblock, layout::field::VOLUME_ID),
        layout::get_u64(superblock, layout::field::CREATED_UNIX_S),
    );
    let planted = crate::planted(crate::Bug::GrowNotValidated);
    let mut tx = Minitx::new();
    for (i, &(node, base)) in new.nodes.iter().enumerate() {
        let known = i < old.nodes.len();
        tx = match (planted, known) {
            (true, true) => tx,
            (true, false) => [Bitmap::Inodes, Bitmap::Blocks]
                .iter()
                .fold(tx, |tx, &kind| {
                    let len = new.bitmap_bytes(kind) as usize;
                    tx.write(node, new.bitmap_addr(node, kind), vec![0; len])
                }),
            (false, true) => tx.compare(node, base, old.header(i, id, created)),
            (false, false) => tx.compare(node, base, vec![0; 8]),
        };
        tx = tx.write(node, base, new.header(i, id, created));
        let at = base + coherence::MEMBERSHIP_AT;
        tx = match i {
            0 => tx.compare(node, at, version.to_le_bytes().to_vec()),
            _ if !known => tx.write(node, at, version.to_le_bytes().to_vec()),
            _ => tx,
        };
    }
    tx.class("fs")
}

/// How often a mount looks at the memory nodes' load to move its preferred node.
pub const PLACEMENT_EVERY: Duration = Duration::from_secs(5);
/// The chance that a look moves the preferred node to the least loaded one (Sinfonia §5.3:
/// small, so that mounts do not all move at once).
pub const PLACEMENT_CHANGE_PROBABILITY: f64 = 0.25;

/// The least loaded node of `loads` (node, load), ties to the lowest id.
pub fn least_loaded(loads: &[(NodeId, u64)]) -> Option<NodeId> {
    loads
        .iter()
        .min_by_key(|(n, load)| (*load, *n))
        .map(|(n, _)| *n)
}

impl FileSystem {
    /// Every `PLACEMENT_EVERY`, learns nodes a grow added and, with
    /// `PLACEMENT_CHANGE_PROBABILITY`, moves this mount's preferred node to the volume's
    /// least loaded node (minitransactions committed and bytes written in the nodes'
    /// shortest window), until the file system is dropped.
    pub fn spawn_placement(self: &std::sync::Arc<Self>) {
        let fs = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PLACEMENT_EVERY).await;
                let Some(fs) = fs.upgrade() else { return };
                if let Err(e) = fs.refresh_volume().await {
                    tracing::warn!("reading the volume's node count: {e}");
                }
                let loads: Vec<(NodeId, u64)> = (fs.cluster.stats().await.into_iter())
                    .filter(|(n, _)| fs.volume().holds(*n))
                    .filter_map(|(n, r)| r.ok().map(|r| (n, load(&r))))
                    .collect();
                if rand::random::<f64>() < PLACEMENT_CHANGE_PROBABILITY {
                    if let Some(node) = least_loaded(&loads) {
                        fs.set_preferred(node);
                    }
                }
            }
        });
    }

    /// Reads the volume's bitmaps, inode tables and every block the walk needs, and checks
    /// every invariant. The volume should be quiet: a snapshot read while mounts write may
    /// report what is only in flight.
    pub async fn fsck(&self) -> Result<crate::fsck::Report, FsError> {
        let until = Instant::now() + self.deadline.max(Duration::from_secs(600));
        let mut snap = crate::fsck::Snapshot::default();
        let vol = self.volume();
        let g = &vol.geometry;
        for &(node, _) in &vol.nodes {
            let ib = self
                .read_range(
                    node,
                    vol.bitmap_addr(node, Bitmap::Inodes),
                    g.inode_bitmap_bytes(),
                    until,
                )
                .await?;
            let bb = self
                .read_range(
                    node,
                    vol.bitmap_addr(node, Bitmap::Blocks),
                    g.block_bitmap_bytes(),
                    until,
                )
                .await?;
            let table_at = vol.inode_addr(Ino::new(node, 0));
            let it = self
                .read_range(node, table_at, g.inodes_per_node * INODE_BYTES, until)
                .await?;
            snap.inode_bitmaps.insert(node, ib);
            snap.block_bitmaps.insert(node, bb);
            snap.inode_tables.insert(node, it);
        }
        loop {
            match crate::fsck::check(&vol, &snap) {
                Ok(report) => return Ok(report),
                Err(need) => {
                    let fetches: Vec<Fetch> = need
                        .iter()
                        .map(|b| Fetch::object(b.node(), vol.block_addr(*b), g.block_bytes))
                        .collect();
                    let data = fetch(&self.cluster, &fetches, until).await?;
                    for (b, bytes) in need.into_iter().zip(data) {
                        snap.blocks.insert(b, bytes);
                    }
                }
            }
        }
    }

    /// Frees what fsck found a crash left: orphan inodes (with their blocks) and leaked
    /// blocks, each as ordinary operations. Returns how many problems it repaired.
    pub async fn repair(&self, problems: &[crate::fsck::Problem]) -> Result<usize, i32> {
        let mut repaired = 0;
        for p in problems {
            match p {
                crate::fsck::Problem::Orphan(ino) => self.reclaim(*ino, None).await?,
                crate::fsck::Problem::LeakedBlock(b) => {
                    self.run(|tx| ops::free_leaked(tx, *b)).await?.0
                }
                crate::fsck::Problem::Broken(_) => continue,
            }
            repaired += 1;
        }
        Ok(repaired)
    }

    async fn read_range(
        &self,
        node: NodeId,
        addr: u64,
        bytes: u64,
        until: Instant,
    ) -> Result<Vec<u8>, FsError> {
        let item = 1u64 << 20;
        let fetches: Vec<Fetch> = (0..bytes)
            .step_by(item as usize)
            .map(|at| Fetch::object(node, addr + at, (bytes - at).min(item) as u32))
            .collect();
        Ok(fetch(&self.cluster, &fetches, until).await?.concat())
    }
}
