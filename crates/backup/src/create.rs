//! `create`: drives the cut's state machine (`tutti_client::backup::BackupRun`) over the
//! cluster's connections and stores what it reads, one file per node, then the manifest.

use crate::format::{read_manifest, write_manifest, Base, ImageWriter, Manifest, FORMAT};
use crate::Error;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};
use tutti_client::backup::{BackupConfig, BackupError, BackupRun, CutImage};
use tutti_client::Cluster;
use tutti_wire::{NodeId, Request, Response};

#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// How long the cut waits for locks to drain at the nodes, per attempt.
    pub lock_timeout: Duration,
    /// Attempts before giving up: an attempt ends without a backup when locks do not drain,
    /// another backup holds a node, or a node is lost under it (a restart loses its cut).
    pub attempts: u32,
    /// How long an attempt waits for every memory node to be up and answering (a node
    /// restarting, or failing over to its mirror) before the backup gives up.
    pub node_wait: Duration,
    /// How long one request to a node may take.
    pub call_timeout: Duration,
    /// Print progress to standard error every few seconds.
    pub progress: bool,
    /// Bytes stored per second at most (`None`: as fast as it goes). The copy competes with
    /// the cluster for the disk and the CPUs; a slower one takes longer, and the pages
    /// written ahead of it while it runs cost the nodes memory.
    pub max_bytes_per_s: Option<u64>,
    /// Make an incremental backup from this one (a backup's directory): each node whose
    /// last completed backup it is gives only the pages written since; others give all.
    pub since: Option<std::path::PathBuf>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            lock_timeout: Duration::from_secs(5),
            attempts: 3,
            node_wait: Duration::from_secs(20),
            call_timeout: Duration::from_secs(10),
            progress: false,
            max_bytes_per_s: None,
            since: None,
        }
    }
}

/// Pause between two attempts at a cut.
const ATTEMPT_PAUSE: Duration = Duration::from_secs(1);
/// Pause after another backup was found holding a node: long enough for the cut of one
/// that went away to lapse.
const BUSY_PAUSE: Duration = Duration::from_millis(tutti_wire::BACKUP_CUT_LEASE_MS + 1_000);
/// How often a node that is down is looked at again.
const NODE_POLL: Duration = Duration::from_millis(250);
/// How long a node that is up has to answer.
const NODE_PING: Duration = Duration::from_secs(1);
/// How often progress is printed.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Backs up every memory node of `cluster` into `dest` (a new or empty directory) while
/// it serves. On failure, removes what it wrote.
pub async fn create(
    cluster: &Cluster,
    dest: &Path,
    opts: &CreateOptions,
) -> Result<Manifest, Error> {
    let base = match &opts.since {
        Some(path) => Some(base_of(path)?),
        None => None,
    };
    let claimed = crate::Destination::claim(dest, "a backup goes into a new or empty directory")?;
    let result = attempts(cluster, &claimed, opts, base).await;
    if result.is_err() {
        claimed.undo();
    }
    result
}

/// The backup in `path` as the base of an incremental one, and the id its nodes knew it by.
fn base_of(path: &Path) -> Result<(u64, Base), Error> {
    let manifest = read_manifest(path)?;
    let id = manifest.id().ok_or_else(|| Error::Damaged {
        path: path.join(crate::format::MANIFEST),
        reason: format!("backup id {:?} is not hex", manifest.backup),
    })?;
    let path = path.canonicalize().map_err(|source| Error::Io {
        what: format!("resolve {}", path.display()),
        source,
    })?;
    let base = Base {
        backup: manifest.backup,
        path,
    };
    Ok((id, base))
}

async fn attempts(
    cluster: &Cluster,
    dest: &crate::Destination<'_>,
    opts: &CreateOptions,
    base: Option<(u64, Base)>,
) -> Result<Manifest, Error> {
    let mut attempt = 1;
    loop {
        let ids = every_node_up(cluster, opts.node_wait).await?;
        let pause = match attempt_once(cluster, dest.dir, &ids, opts, base.clone()).await {
            Ok(manifest) => return Ok(manifest),
            Err(Attempt::Failed(e)) => return Err(e),
            Err(Attempt::Again(e)) if attempt == opts.attempts => {
                let tries = opts.attempts;
                return Err(Error::Cluster(match e {
                    BackupError::NoCut(_) | BackupError::Busy(_) => format!("{e} ({tries} tries)"),
                    BackupError::Failed(_) => format!("backup failed: {e} ({tries} tries)"),
                }));
            }
            Err(Attempt::Again(e @ BackupError::Busy(_))) => {
                eprintln!("backup: {e}; waiting {BUSY_PAUSE:?} for it to end or lapse");
                BUSY_PAUSE
            }
            Err(Attempt::Again(e)) => {
                eprintln!("backup: {e}; trying again in {ATTEMPT_PAUSE:?}");
                ATTEMPT_PAUSE
            }
        };
        dest.empty();
        tokio::time::sleep(pause).await;
        attempt += 1;
    }
}

/// The memory nodes' ids, once the managers list every node alive and each says it serves:
/// a node restarting, recovering or failing over is waited for, up to `wait`.
async fn every_node_up(cluster: &Cluster, wait: Duration) -> Result<Vec<NodeId>, Error> {
    let deadline = Instant::now() + wait;
    let mut waiting_for = None;
    loop {
        let down = match cluster.ask_manager(&Request::Directory).await {
            Ok(Response::Directory(d)) => match d.nodes.iter().find(|n| !n.alive) {
                Some(n) => format!("memory node {} is down", n.id),
                None => {
                    let ids: Vec<NodeId> = d.nodes.iter().map(|n| n.id).collect();
                    match first_silent(cluster, &ids).await {
                        Some(why) => why,
                        None => return Ok(ids),
                    }
                }
            },
            Ok(other) => format!("the manager answered {other:?}"),
            Err(e) => format!("the managers: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(Error::Cluster(format!(
                "{down} (waited {wait:?}): a backup needs every node"
            )));
        }
        if waiting_for.as_ref() != Some(&down) {
            eprintln!("backup: {down}; waiting up to {wait:?}");
            waiting_for = Some(down);
        }
        tokio::time::sleep(NODE_POLL).await;
    }
}

/// Why the first of `ids` that does not serve (does not answer, or is recovering) does not.
async fn first_silent(cluster: &Cluster, ids: &[NodeId]) -> Option<String> {
    for &id in ids {
        match cluster.call_node(id, &Request::Stats, NODE_PING).await {
            Ok(Response::Stats(s)) if s.serving => {}
            Ok(Response::Stats(_)) => return Some(format!("memory node {id} is recovering")),
            Ok(other) => return Some(format!("memory node {id} answered {other:?}")),
            Err(e) => return Some(format!("memory node {id} does not answer: {e}")),
        }
    }
    None
}

/// How an attempt at a backup failed.
enum Attempt {
    /// Nothing was kept that a later attempt could use, and one may succeed: no cut (locks
    /// that did not drain, another backup), or a node lost under the backup.
    Again(BackupError),
    /// What another attempt would not change (the destination's disk).
    Failed(Error),
}

impl From<Error> for Attempt {
    fn from(e: Error) -> Attempt {
        Attempt::Failed(e)
    }
}

async fn attempt_once(
    cluster: &Cluster,
    dest: &Path,
    ids: &[NodeId],
    opts: &CreateOptions,
    base: Option<(u64, Base)>,
) -> Result<Manifest, Attempt> {
    let id: u64 = rand::random();
    let cfg = BackupConfig {
        lock_timeout_us: opts.lock_timeout.as_micros() as u64,
        read_bytes: read_bytes(opts.max_bytes_per_s, ids.len()),
        ..BackupConfig::default()
    };
    let since = base.as_ref().map(|(id, _)| *id);
    let mut run = BackupRun::new(id, ids.to_vec(), cfg, since);
    let start = Instant::now();
    let now_us = || start.elapsed().as_micros() as u64;
    let mut acts = run.start(now_us());
    let mut writers: BTreeMap<NodeId, ImageWriter> = BTreeMap::new();
    let (mut regions, mut fenced_ms, mut cut_at) = (Vec::new(), 0, start);
    let mut progress = Progress::new(opts.progress);
    loop {
        if let Some((node, runs)) = acts.chunk.take() {
            let writer = writers.get_mut(&node).expect("a writer per node");
            let mut stored = 0;
            for (offset, bytes) in runs {
                if let Err(e) = writer.append(offset, &bytes) {
                    end_everywhere(cluster, ids, id, opts.call_timeout).await;
                    return Err(e.into());
                }
                stored += bytes.len() as u64;
            }
            progress.stored(node, stored);
            throttle(opts.max_bytes_per_s, progress.bytes, cut_at).await;
        }
        if acts.cut_taken {
            (fenced_ms, cut_at) = (start.elapsed().as_millis() as u64, Instant::now());
            match cut_taken(cluster, dest, id, run.images()).await {
                Ok((r, w)) => (regions, writers) = (r, w),
                Err(e) => {
                    end_everywhere(cluster, ids, id, opts.call_timeout).await;
                    return Err(e);
                }
            }
        }
        if let Some(done) = acts.done.take() {
            match done {
                Ok(_) => break,
                Err(e) => return Err(Attempt::Again(e)),
            }
        }
        let (node, req) = acts.call.take().expect("a call until done");
        let wait = Duration::from_micros(acts.at_us.saturating_sub(now_us()));
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let reply = cluster.call_node(node, &req, opts.call_timeout).await;
        acts = run.on_reply(now_us(), reply.map_err(|e| e.to_string()));
    }
    let copy_ms = cut_at.elapsed().as_millis() as u64;
    let mut images = Vec::new();
    for writer in writers.into_values() {
        images.push(writer.finish()?);
    }
    let manifest = Manifest {
        format: FORMAT,
        backup: format!("{id:#018x}"),
        created_unix_ms: (SystemTime::now().duration_since(SystemTime::UNIX_EPOCH))
            .map_or(0, |d| d.as_millis() as u64),
        tutti_version: env!("CARGO_PKG_VERSION").into(),
        nodes: images,
        regions,
        fenced_ms,
        copy_ms,
        base: base.map(|(_, b)| b),
    };
    write_manifest(dest, &manifest)?;
    Ok(manifest)
}

type Writers = BTreeMap<NodeId, ImageWriter>;

/// Every node took its cut: reads the manager's regions (each region whose bytes are in the
/// cut is among them) and opens the image files.
async fn cut_taken(
    cluster: &Cluster,
    dest: &Path,
    id: u64,
    images: Vec<CutImage>,
) -> Result<(Vec<tutti_wire::RegionInfo>, Writers), Attempt> {
    // The managers may be failing over: another attempt may find them.
    let regions = match cluster.ask_manager(&Request::Regions).await {
        Ok(Response::Regions(r)) => r,
        Ok(other) => {
            let why = format!("the manager answered {other:?}");
            return Err(Attempt::Again(BackupError::Failed(why)));
        }
        Err(e) => {
            let why = format!("reading the regions: {e}");
            return Err(Attempt::Again(BackupError::Failed(why)));
        }
    };
    let mut writers = BTreeMap::new();
    for i in images {
        let writer = ImageWriter::create(dest, i.node, i.size_bytes, id, i.incremental)?;
        writers.insert(i.node, writer);
    }
    Ok((regions, writers))
}

/// Bytes per read: 1 MiB, less when a slow `max_bytes_per_s` would otherwise leave a node
/// unread for half its cut's lease (reads go round robin over the `nodes`).
fn read_bytes(max_bytes_per_s: Option<u64>, nodes: usize) -> u64 {
    const PAGE: u64 = 4096;
    let full = BackupConfig::default().read_bytes;
    let Some(rate) = max_bytes_per_s else {
        return full;
    };
    let within_lease =
        rate.saturating_mul(tutti_wire::BACKUP_CUT_LEASE_MS) / 1000 / (2 * nodes as u64);
    (within_lease / PAGE * PAGE).clamp(PAGE, full)
}

/// Sleeps until storing `stored` bytes since `since` keeps to `max_bytes_per_s`.
async fn throttle(max_bytes_per_s: Option<u64>, stored: u64, since: Instant) {
    if let Some(rate) = max_bytes_per_s.filter(|&r| r > 0) {
        let due = Duration::from_secs_f64(stored as f64 / rate as f64);
        if let Some(ahead) = due.checked_sub(since.elapsed()) {
            tokio::time::sleep(ahead).await;
        }
    }
}

/// Tells every node that the backup is over, so that none keeps its cut until the lease.
async fn end_everywhere(cluster: &Cluster, ids: &[NodeId], backup: u64, timeout: Duration) {
    for &node in ids {
        let _ = cluster
            .call_node(
                node,
                &Request::BackupEnd {
                    backup,
                    completed: false,
                },
                timeout,
            )
            .await;
    }
}

/// Bytes stored so far, printed to standard error every `PROGRESS_EVERY`.
struct Progress {
    on: bool,
    bytes: u64,
    last: Instant,
}

impl Progress {
    fn new(on: bool) -> Progress {
        Progress {
            on,
            bytes: 0,
            last: Instant::now(),
        }
    }

    fn stored(&mut self, node: NodeId, bytes: u64) {
        self.bytes += bytes;
        if self.on && self.last.elapsed() >= PROGRESS_EVERY {
            self.last = Instant::now();
            eprintln!(
                "backup: {} MiB stored, reading node {node}",
                self.bytes >> 20
            );
        }
    }
}
