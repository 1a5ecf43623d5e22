//! The mirror's tokio driver (`tutti memnode --mode log-repl --role mirror`): joins a
//! primary that runs without a mirror (wiping its data directory and filling it from the
//! primary's seed), serves its primary's `Replicate` and `ReplicaTail`, writes and syncs
//! the records (one sync per round, on a thread of its own), flushes its image and
//! truncates its log behind the primary, heartbeats the manager, and once the manager
//! names it primary, waits out the old primary's lease and hands over to the ordinary node
//! driver on the same data directory. All decisions are the `Mirror`'s.

use crate::log_record::LogRecord;
use crate::mirror::{
    asks_before_giving_up, decode_records, named_but_empty, Mirror, Replicate, Standing,
};
use crate::node::{io, open_data_dir, rebind, NodeConfig, NodeError, IMAGE_FILE};
use crate::redo_log::{Lsn, RedoLog};
use crate::space::Space;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tutti_wire::{
    Backoff, Connection, ErrorCode, Managers, Placement, Replies, Request, Response, RpcError,
    SEED_READ_BYTES_MAX,
};

/// How often a mirror tells the manager it is alive (the manager fails a silent primary over
/// only to a mirror heard from since).
const MIRROR_HEARTBEAT: Duration = Duration::from_millis(100);

/// How long a promoted mirror's heartbeat may hold up its take-over.
const PROMOTED_BEAT_TIMEOUT: Duration = Duration::from_millis(20);

/// How the mirror's time as a mirror ended.
pub(crate) enum Ended {
    /// The manager named it primary under that configuration epoch, and the old primary's
    /// lease has run out.
    Promoted(u64),
    /// Shut down.
    Stopped,
}

/// How serving as the node's mirror ended.
enum Served {
    Ended(Ended),
    /// The placement, at configuration epoch E + 1, no longer names this mirror. If that
    /// change left this copy out (it was the node's mirror, named or promoted, under E),
    /// it holds every record its primary counted durable, and the managers may name it
    /// primary while that primary has not registered without it: they say which.
    Dropped(u64),
}

enum MirrorCmd {
    Append(Lsn, u64, Vec<u8>),
    Truncate(Lsn),
    /// Sync what came before and stop (promoted, or shutting down).
    Stop,
}

struct MirrorNode {
    cfg: NodeConfig,
    mirror: Mutex<Mirror<Replies>>,
    log: std::sync::mpsc::Sender<MirrorCmd>,
    start: Instant,
}

impl MirrorNode {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn on_request(&self, id: u64, req: Request, reply_to: Replies) {
        if let Some((_, msg)) = Replicate::of(&req).filter(|(node, _)| *node == self.cfg.id) {
            let replies = {
                let mut m = self.mirror.lock().expect("mirror poisoned");
                let now = self.now_ms();
                let acts = m.on_replicate(now, reply_to, id, msg);
                if let Some((first, count, bytes)) = acts.append {
                    // Under the lock: records reach the writer in lsn order.
                    let _ = self.log.send(MirrorCmd::Append(first, count, bytes));
                }
                acts.replies
            };
            for (to, id, resp) in replies {
                let _ = to.send((id, resp));
            }
            return;
        }
        let resp = match req {
            Request::ReplicaTail {
                node,
                session,
                config_epoch,
                from,
            } if node == self.cfg.id => {
                let replies = self.mirror.lock().expect("mirror poisoned").on_tail(
                    reply_to,
                    id,
                    session,
                    config_epoch,
                    from,
                );
                for (to, id, resp) in replies {
                    let _ = to.send((id, resp));
                }
                return;
            }
            _ => Response::Error {
                code: ErrorCode::NotReady,
                message: format!(
                    "this is node {}'s mirror: it serves its primary only",
                    self.cfg.id
                ),
            },
        };
        if id != tutti_wire::ONE_WAY {
            let _ = reply_to.send((id, resp));
        }
    }
}

/// Runs node `cfg.id`'s mirror on `listener` until the manager promotes it or `shutdown`
/// resolves. A process the placement names neither primary nor mirror joins the primary as
/// a new mirror, if the node has none, and again whenever the placement drops it.
pub(crate) async fn run(
    cfg: &NodeConfig,
    listener: TcpListener,
    managers: Managers,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Ended, NodeError> {
    let listening = listener.local_addr().map_err(io("local address"))?;
    let addr = listening.to_string();
    let data = cfg
        .data
        .clone()
        .ok_or_else(|| NodeError::Config("a mirror needs --data DIR".into()))?;
    let _lock = open_data_dir(&data, cfg)?;
    // A `ram-repl` copy dies with its process: what a predecessor left is not the node's,
    // unless it was a primary that stopped on being replaced and left its copy to this
    // process. A `log-repl` directory holds one unless marked empty (new, lost, or emptied
    // to join). A copy a replaced primary left is held while the managers may name it
    // primary again: the copy that replaced it may die or lose its disk before it serves.
    // So is a `log-repl` copy that served as the primary and was replaced while this
    // process was down, as of the configuration it last served under: what `node::run`
    // does for a primary-role process whose registration is refused. (And, below, a
    // mirror's copy the placement dropped or changed without, while the managers may name
    // it.)
    let mut former = former_marker(&data, cfg.volatile)
        .or_else(|| (!cfg.volatile).then(|| served(&data)).flatten());
    let mut holds_copy = if cfg.volatile {
        former.is_some()
    } else {
        crate::node::holds_copy(&data)
    };
    if !holds_copy {
        former = None;
        if cfg.volatile {
            empty_copy(&data)?;
        }
    }
    if let Some(config_epoch) = former {
        tracing::warn!(
            node = cfg.id,
            config_epoch,
            "holding the copy a replaced primary (or a dropped mirror) left here while the \
             managers may name it primary again"
        );
    }
    let mut listener = Some(listener);
    let mut told_empty = false;
    loop {
        let placement = match former {
            Some(config_epoch) => {
                let (placement, keep) = tokio::select! {
                    answer = ask_as_former(cfg, &managers, &addr, config_epoch) => answer,
                    () = shutdown.as_mut() => return Ok(Ended::Stopped),
                };
                if placement.primary == addr {
                    tracing::warn!(
                        node = cfg.id,
                        config_epoch = placement.config_epoch,
                        "named primary: serving the copy kept for the managers"
                    );
                    former = None;
                    remove_former_marker(&data)?;
                } else if keep {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                        () = shutdown.as_mut() => return Ok(Ended::Stopped),
                    }
                } else if placement.config_epoch > config_epoch + 1 {
                    // The placement changed since this copy knew it: the change may have
                    // left this copy out again (named, then replaced before it served).
                    former = Some(placement.config_epoch - 1);
                    continue;
                } else {
                    tracing::info!(
                        node = cfg.id,
                        "the managers no longer need this copy: letting it go"
                    );
                    former = None;
                    empty_copy(&data)?;
                    holds_copy = false;
                }
                placement
            }
            None => tokio::select! {
                p = placement_of(cfg, &managers) => p,
                () = shutdown.as_mut() => return Ok(Ended::Stopped),
            },
        };
        let named = placement.primary == addr || placement.mirror.as_deref() == Some(&addr);
        if named_but_empty(&placement, &addr, holds_copy) {
            // If the other copy is lost too, the node is: nothing is named then.
            if !std::mem::replace(&mut told_empty, true) {
                tracing::warn!(
                    node = cfg.id,
                    config_epoch = placement.config_epoch,
                    "the placement names this process, which holds no copy of the node \
                     (ram-repl, or a new or lost disk): waiting for the manager to name \
                     another copy, then joining"
                );
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                () = shutdown.as_mut() => return Ok(Ended::Stopped),
            }
        }
        // Seeded under this very placement before a restart: the primary may count this
        // mirror already, and ask the manager to name it; its data stays.
        let resumed = (read_join_marker(&data))
            .filter(|m| !named && m.config_epoch == placement.config_epoch)
            .filter(|m| m.primary == placement.primary && placement.mirror.is_none())
            .map(|m| Start::Resumed(m.config_epoch));
        let start = if named {
            Start::Named
        } else if let Some(resumed) = resumed {
            resumed
        } else if let Some(other) = &placement.mirror {
            tracing::info!(node = cfg.id, %other, "the node has another mirror; waiting");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = shutdown.as_mut() => return Ok(Ended::Stopped),
            }
        } else if holds_copy && asks_before_giving_up() {
            // A copy the placement changed without while this process was down: if that
            // change left it out (a mirror named primary, or dropped, before it heard), the
            // managers may still need it, and say so, before it empties itself to join.
            tracing::warn!(
                node = cfg.id,
                config_epoch = placement.config_epoch,
                "the placement changed without this copy while it was down: holding it \
                 while the managers may name it"
            );
            former = Some(placement.config_epoch - 1);
            continue;
        } else {
            // Nobody connects while the seed is read: the primary ships once it is in.
            drop(listener.take());
            let seeded = tokio::select! {
                seeded = seed(cfg, &data, &placement, &addr) => seeded,
                () = shutdown.as_mut() => return Ok(Ended::Stopped),
            };
            match seeded {
                Ok(seeded) => Start::Seeded(Box::new(seeded)),
                Err(SeedError::Local(e)) => return Err(e),
                Err(SeedError::Primary(why)) => {
                    tracing::warn!(primary = %placement.primary, "joining: {why}; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        () = shutdown.as_mut() => return Ok(Ended::Stopped),
                    }
                }
            }
        };
        let listener = match listener.take() {
            Some(listener) => listener,
            None => rebind(listening).await?,
        };
        match serve(
            cfg,
            &data,
            listener,
            &managers,
            &addr,
            start,
            shutdown.as_mut(),
        )
        .await?
        {
            Served::Ended(ended) => return Ok(ended),
            Served::Dropped(_) if !asks_before_giving_up() => {}
            // Its primary may die before it hears of the drop (the report that dropped
            // this copy may have been stale), or the copy serving in its place before it
            // registers: this copy is then the node's.
            Served::Dropped(config_epoch) => {
                tracing::warn!(
                    node = cfg.id,
                    config_epoch,
                    "the placement dropped this mirror: holding its copy while the managers \
                     may name it"
                );
                if !cfg.volatile {
                    leave_copy(&data, config_epoch);
                }
                former = Some(config_epoch);
                holds_copy = true;
            }
        }
    }
}

/// The node's placement, asked of the manager until it answers (a question, not a
/// heartbeat: a process that cannot serve as the mirror named must not look alive as it).
async fn placement_of(cfg: &NodeConfig, managers: &Managers) -> Placement {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        match crate::node::placement(managers, cfg.id).await {
            Some(p) => return p,
            // Its primary has not registered yet (or the node is unreplicated).
            None => tracing::debug!(node = cfg.id, "no placement yet"),
        }
        backoff.pause().await;
    }
}

/// A former primary's question to the managers, asked until they answer: the placement,
/// and whether to keep the copy (`Request::FormerPrimary`).
async fn ask_as_former(
    cfg: &NodeConfig,
    managers: &Managers,
    addr: &str,
    config_epoch: u64,
) -> (Placement, bool) {
    let ask = Request::FormerPrimary {
        node: cfg.id,
        addr: addr.to_string(),
        config_epoch,
    };
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        match managers.call(&ask, Duration::from_secs(5)).await {
            Ok(Response::FormerCopy {
                placement: Some(p),
                keep,
            }) => return (p, keep),
            other => tracing::debug!(node = cfg.id, "asking as the former primary: {other:?}"),
        }
        backoff.pause().await;
    }
}

/// What `former.json` and `served.json` hold: a configuration epoch.
#[derive(serde::Serialize, serde::Deserialize)]
struct EpochMarker {
    config_epoch: u64,
}

/// What a replaced primary leaves in its data directory as it stops (and a `log-repl` mirror
/// the placement dropped): the configuration epoch it served under. The process started
/// next in its place keeps the copy instead of emptying it (`ram-repl`) or joining the new
/// primary (`log-repl`), and tells the managers (`Request::FormerPrimary`). A `ram-repl`
/// marker is read once: the copy then dies with that process. A `log-repl` one stays with
/// the copy on disk until the copy is emptied or named primary again.
const FORMER_MARKER: &str = "former.json";

/// What a `log-repl` primary keeps with its copy (`served.json`, as `former.json`): the
/// latest configuration epoch it served under, rewritten as it rises. Started again and
/// refused by the managers (replaced while it was down), it leaves its copy as of that
/// epoch. A lagging epoch is safe: the managers name a former primary again only if the
/// placement is the one right after its epoch.
const SERVED: &str = "served.json";

/// Leaves the copy in `data` to the process started next on it (the marker above, made
/// durable: a `log-repl` copy outlives a power loss), as of `config_epoch`; a failure is
/// logged (that process then holds an ordinary copy, or none in RAM).
pub(crate) fn leave_copy(data: &Path, config_epoch: u64) {
    if let Err(e) = write_durably(data, FORMER_MARKER, &EpochMarker { config_epoch }) {
        tracing::error!("leaving this copy for the next process: {e}");
    }
}

/// Records in `data` that its copy serves under `config_epoch` (`SERVED`); a failure is
/// logged (the copy is then not offered again past the epoch recorded before).
pub(crate) fn record_served(data: &Path, config_epoch: u64) {
    if let Err(e) = write_durably(data, SERVED, &EpochMarker { config_epoch }) {
        tracing::error!("recording the configuration served: {e}");
    }
}

/// The configuration epoch the copy in `data` last served under, if recorded.
pub(crate) fn served(data: &Path) -> Option<u64> {
    read_epoch(data, SERVED)
}

/// The epoch in `data/name` (`former.json`, `served.json`), if it is there and reads.
fn read_epoch(data: &Path, name: &str) -> Option<u64> {
    let marker: EpochMarker = serde_json::from_slice(&std::fs::read(data.join(name)).ok()?).ok()?;
    Some(marker.config_epoch)
}

/// Writes `value` as JSON to `data/name` durably: a temporary file synced, renamed over
/// `name`, the directory synced.
fn write_durably(data: &Path, name: &str, value: &impl serde::Serialize) -> Result<(), NodeError> {
    let tmp = data.join(format!("{name}.tmp"));
    let bytes = serde_json::to_vec(value).map_err(|e| NodeError::Config(e.to_string()))?;
    std::fs::write(&tmp, bytes).map_err(io(format!("write {name}")))?;
    (std::fs::File::open(&tmp).and_then(|f| f.sync_all())).map_err(io(format!("sync {name}")))?;
    std::fs::rename(&tmp, data.join(name)).map_err(io(format!("rename {name}")))?;
    Ok(crate::redo_log::sync_dir(data)?)
}

/// The former primary's configuration epoch, if one left its copy here; with `once` (a
/// copy in RAM), the marker goes.
fn former_marker(data: &Path, once: bool) -> Option<u64> {
    let config_epoch = read_epoch(data, FORMER_MARKER);
    if once {
        let _ = std::fs::remove_file(data.join(FORMER_MARKER));
    }
    config_epoch
}

pub(crate) fn remove_former_marker(data: &Path) -> Result<(), NodeError> {
    match std::fs::remove_file(data.join(FORMER_MARKER)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove former.json")(e)),
        _ => Ok(()),
    }
}

/// How a mirror process starts serving as one.
enum Start {
    /// The placement names it mirror (or primary: it is promoted at once).
    Named,
    /// Just filled from its primary's seed, under that configuration epoch.
    Seeded(Box<Seeded>),
    /// Filled from a seed under that epoch before a restart; not named yet.
    Resumed(u64),
}

/// What a joining mirror records in its data directory (`join.json`) once its seed is
/// durable: the placement it joined. Removed first whenever the directory is emptied.
#[derive(serde::Serialize, serde::Deserialize)]
struct JoinMarker {
    config_epoch: u64,
    primary: String,
}

const JOIN_MARKER: &str = "join.json";

fn read_join_marker(data: &Path) -> Option<JoinMarker> {
    serde_json::from_slice(&std::fs::read(data.join(JOIN_MARKER)).ok()?).ok()
}

/// A data directory filled from a primary's seed.
struct Seeded {
    space: Space,
    log: RedoLog,
    records: Vec<(Lsn, LogRecord)>,
    next_lsn: Lsn,
    config_epoch: u64,
}

enum SeedError {
    /// The primary went away or refused: ask the placement again.
    Primary(String),
    /// This mirror's own disk failed.
    Local(NodeError),
}

impl From<NodeError> for SeedError {
    fn from(e: NodeError) -> Self {
        SeedError::Local(e)
    }
}

impl From<crate::redo_log::LogError> for SeedError {
    fn from(e: crate::redo_log::LogError) -> Self {
        SeedError::Local(e.into())
    }
}

impl From<RpcError> for SeedError {
    fn from(e: RpcError) -> Self {
        SeedError::Primary(e.to_string())
    }
}

/// Removes the copy of the node that `data` holds (marked empty first, then its join
/// marker, the image and the log), leaving the directory's lock and `node.json`.
pub(crate) fn empty_copy(data: &Path) -> Result<(), NodeError> {
    crate::node::mark_empty(data)?;
    for stale in [
        data.join(JOIN_MARKER),
        data.join(FORMER_MARKER),
        data.join(SERVED),
        data.join(IMAGE_FILE),
        data.join(crate::node::LOG_DIR),
    ] {
        let removed = if stale.is_dir() {
            std::fs::remove_dir_all(&stale)
        } else {
            std::fs::remove_file(&stale)
        };
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(format!("remove {}", stale.display()))(e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// How long one seed call to the primary may take.
const SEED_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Empties `data` (what it holds is of no use to a mirror the placement does not name) and
/// fills it from `primary`'s seed: the image, written and flushed, then a log holding the
/// seed's records, synced. The primary ships the records from the seed's end on. What
/// `data` holds goes only once the primary offers the join: a replaced primary whose
/// successor never serves keeps the node's data meanwhile.
async fn seed(
    cfg: &NodeConfig,
    data: &Path,
    placement: &Placement,
    addr: &str,
) -> Result<Seeded, SeedError> {
    let primary = placement.primary.as_str();
    let conn = tokio::time::timeout(
        SEED_CALL_TIMEOUT,
        Connection::connect(primary, cfg.frame_bytes_max, &cfg.dialer),
    )
    .await
    .map_err(|_| SeedError::Primary(format!("connecting to {primary} timed out")))??;
    let ask = Request::JoinMirror {
        node: cfg.id,
        addr: addr.to_string(),
    };
    let Response::JoinOffer {
        join,
        config_epoch,
        session,
        first_lsn,
        next_lsn,
        records_bytes,
        image_bytes,
    } = conn.call_within(&ask, SEED_CALL_TIMEOUT).await?
    else {
        return Err(SeedError::Primary(
            "JoinMirror: an unexpected answer".into(),
        ));
    };
    if config_epoch < placement.config_epoch {
        return Err(SeedError::Primary(format!(
            "the primary offers a join under configuration epoch {config_epoch} and the \
             placement is at {}",
            placement.config_epoch
        )));
    }
    if image_bytes != cfg.size_bytes {
        return Err(NodeError::Config(format!(
            "the primary's image is {image_bytes} bytes and this mirror's {}",
            cfg.size_bytes
        ))
        .into());
    }
    empty_copy(data)?;
    tracing::info!(join, session, first_lsn, next_lsn, records_bytes, image_bytes, %primary, "joining: reading the seed");
    let started = Instant::now();
    let mut space =
        Space::image(&data.join(IMAGE_FILE), cfg.size_bytes).map_err(io("create the image"))?;
    let mut records = Vec::with_capacity(records_bytes as usize);
    let total = records_bytes + image_bytes;
    let (mut offset, mut reported) = (0, 0);
    while offset < total {
        let len = SEED_READ_BYTES_MAX.min(total - offset);
        let read = Request::ReadSeed {
            node: cfg.id,
            join,
            offset,
            len,
        };
        let Response::SeedPart {
            len: got,
            records: in_records,
            pages,
        } = conn.call_within(&read, SEED_CALL_TIMEOUT).await?
        else {
            return Err(SeedError::Primary("ReadSeed: an unexpected answer".into()));
        };
        let records_part = records_bytes.saturating_sub(offset).min(len);
        let pages_fit = (pages.iter()).all(|(at, run)| at + run.len() as u64 <= image_bytes);
        if got != len || in_records.len() as u64 != records_part || !pages_fit {
            return Err(SeedError::Primary(format!(
                "ReadSeed: {got} bytes ({} of records) where {len} ({records_part}) were \
                 asked for, or pages beyond the image",
                in_records.len()
            )));
        }
        records.extend_from_slice(&in_records);
        // What the primary left out is zeros, which stay holes: the image file is sparse.
        for (at, run) in pages {
            space.write(at, &run);
        }
        offset += len;
        if offset - reported >= 256 << 20 {
            reported = offset;
            tracing::info!(read = offset, of = total, "joining: reading the seed");
        }
    }
    let flusher = space.flusher();
    tokio::task::spawn_blocking(move || flusher.flush())
        .await
        .map_err(|e| NodeError::Config(e.to_string()))?
        .map_err(io("flush the seeded image"))?;
    let (decoded, at) = decode_records(&records);
    let count = next_lsn - first_lsn;
    if at != records.len() || decoded.len() as u64 != count {
        return Err(SeedError::Primary(format!(
            "the seed's records do not decode to lsns {first_lsn} .. {next_lsn}"
        )));
    }
    let mut log = RedoLog::create_at(
        &data.join(crate::node::LOG_DIR),
        first_lsn,
        cfg.log_segment_bytes,
    )?
    .log;
    if count > 0 {
        log.append(first_lsn, count, &records)?;
        log.sync()?;
    }
    let marker = JoinMarker {
        config_epoch,
        primary: primary.to_string(),
    };
    write_durably(data, JOIN_MARKER, &marker)?;
    crate::node::mark_whole(data)?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        bytes = total,
        "joining: seeded; the primary ships from here on"
    );
    Ok(Seeded {
        space,
        log,
        records: decoded,
        next_lsn,
        config_epoch,
    })
}

/// Serves as node `cfg.id`'s mirror over `data` (just seeded, or as left by an earlier
/// start) until promoted (`Ended::Promoted`), stopped, or dropped from the placement
/// (`Served::Dropped`).
async fn serve(
    cfg: &NodeConfig,
    data: &Path,
    listener: TcpListener,
    managers: &Managers,
    addr: &str,
    how: Start,
    shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Served, NodeError> {
    let start = Instant::now();
    let (mirror, log, flusher, joined) = match how {
        Start::Seeded(s) => {
            let s = *s;
            let flusher = s.space.flusher();
            let mut mirror =
                Mirror::new(cfg.id, s.space, s.next_lsn, s.records, 0).in_ram(cfg.volatile);
            mirror.set_config_epoch(s.config_epoch);
            (mirror, s.log, flusher, Some(s.config_epoch))
        }
        Start::Named | Start::Resumed(_) => {
            let space = Space::image(&data.join(IMAGE_FILE), cfg.size_bytes)
                .map_err(io("open the image"))?;
            let flusher = space.flusher();
            let recovered = crate::node::open_log(data, cfg)?;
            let next = recovered.log.next_lsn();
            tracing::info!(
                records = recovered.records.len(),
                next,
                "mirror: read the redo log"
            );
            let mut mirror =
                Mirror::new(cfg.id, space, next, recovered.records, 0).in_ram(cfg.volatile);
            let joined = match how {
                Start::Resumed(config_epoch) => {
                    mirror.set_config_epoch(config_epoch);
                    Some(config_epoch)
                }
                _ => None,
            };
            (mirror, recovered.log, flusher, joined)
        }
    };
    let (log_tx, log_rx) = std::sync::mpsc::channel();
    let node = Arc::new(MirrorNode {
        cfg: cfg.clone(),
        mirror: Mutex::new(mirror),
        log: log_tx,
        start,
    });
    let writer = {
        let node = node.clone();
        std::thread::Builder::new()
            .name(format!("mirror-log-{}", cfg.id))
            .spawn(move || mirror_writer(node, log, log_rx))
            .expect("spawn the mirror's log writer")
    };
    let stop = tutti_wire::CancellationToken::new();
    {
        let node = node.clone();
        tokio::spawn(tutti_wire::serve_until(
            listener,
            cfg.frame_bytes_max,
            cfg.dialer.credentials().clone(),
            stop.clone(),
            move |id, req, replies| node.on_request(id, req, replies),
        ));
    }
    let checkpoints = tokio::spawn(checkpoint_loop(node.clone(), flusher));
    tracing::info!(id = cfg.id, %addr, "mirror listening");
    let ended = tokio::select! {
        ended = heartbeat_until_promoted(&node, managers, addr, joined) => ended,
        () = shutdown => Ok(Served::Ended(Ended::Stopped)),
    };
    // Every connection goes away: no request reaches the mirror's handler from here on,
    // and the clients retrying on it hear which of their requests it answered. The
    // listener closes at once, so the node driver can listen on the address again.
    stop.cancel();
    checkpoints.abort();
    let _ = node.log.send(MirrorCmd::Stop);
    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
    ended
}

/// Heartbeats the manager until its placement names this mirror primary; then waits out
/// the old primary's lease (no acknowledgement leaves from the promotion on). `joined`: a
/// mirror just seeded under that configuration epoch, which the placement does not name
/// until its primary says it caught up. `Served::Dropped` once the placement has dropped it.
async fn heartbeat_until_promoted(
    node: &MirrorNode,
    managers: &Managers,
    addr: &str,
    mut joined: Option<u64>,
) -> Result<Served, NodeError> {
    loop {
        tokio::time::sleep(MIRROR_HEARTBEAT).await;
        let (next_lsn, last_ack_ms) = {
            let m = node.mirror.lock().expect("mirror poisoned");
            (m.synced_next(), m.last_ack_ms())
        };
        // Nothing shipped here for long: the primary gave this join up (or is gone). The
        // epoch goes up before the data directory is emptied to join anew.
        let given_up = (joined
            .filter(|_| node.now_ms() >= last_ack_ms + crate::shipper::JOINER_PATIENCE_MS))
        .map(|config_epoch| Request::AbandonJoin {
            node: node.cfg.id,
            config_epoch,
            mirror: addr.to_string(),
        });
        let req = given_up.unwrap_or_else(|| Request::MirrorHeartbeat {
            node: node.cfg.id,
            addr: addr.to_string(),
            next_lsn,
        });
        let placement = match managers.call(&req, Duration::from_secs(2)).await {
            Ok(Response::Placement(p)) => p,
            Ok(other) => {
                tracing::warn!("manager answered a mirror heartbeat with {other:?}");
                continue;
            }
            Err(e) => {
                tracing::debug!("mirror heartbeat: {e}");
                continue;
            }
        };
        let Some(p) = placement else { continue };
        let known_epoch = node.mirror.lock().expect("mirror poisoned").config_epoch();
        match Standing::of(&p, addr, known_epoch, joined) {
            // From a manager that had not heard of the newer one yet.
            Standing::Stale => continue,
            Standing::Primary => {
                (node.mirror.lock().expect("mirror poisoned")).promote(p.config_epoch);
                tracing::warn!(
                    node = node.cfg.id,
                    config_epoch = p.config_epoch,
                    "named primary: waiting out the old primary's lease"
                );
                let beat = Request::MirrorHeartbeat {
                    node: node.cfg.id,
                    addr: addr.to_string(),
                    next_lsn,
                };
                let mut next_beat = Instant::now();
                while !node
                    .mirror
                    .lock()
                    .expect("mirror poisoned")
                    .may_take_over(node.now_ms())
                {
                    // Heard alive meanwhile: the managers name the copy this one replaced
                    // again only if it falls silent before it registers.
                    if Instant::now() >= next_beat {
                        next_beat = Instant::now() + MIRROR_HEARTBEAT;
                        let call = managers.call(&beat, PROMOTED_BEAT_TIMEOUT);
                        let _ = tokio::time::timeout(PROMOTED_BEAT_TIMEOUT, call).await;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                return Ok(Served::Ended(Ended::Promoted(p.config_epoch)));
            }
            Standing::Mirror => {
                if joined.take().is_some() {
                    tracing::info!(config_epoch = p.config_epoch, "named the node's mirror");
                }
            }
            Standing::Joining => {}
            Standing::Outside => {
                tracing::warn!(
                    node = node.cfg.id,
                    config_epoch = p.config_epoch,
                    primary = %p.primary,
                    mirror = ?p.mirror,
                    "the placement does not name this mirror"
                );
                return Ok(Served::Dropped(p.config_epoch - 1));
            }
        }
        node.mirror
            .lock()
            .expect("mirror poisoned")
            .set_config_epoch(p.config_epoch);
    }
}

/// Appends and syncs what the mirror hands over, a round at a time, then lets the mirror
/// apply and acknowledge it; truncates the log head as told.
fn mirror_writer(
    node: Arc<MirrorNode>,
    mut log: RedoLog,
    rx: std::sync::mpsc::Receiver<MirrorCmd>,
) {
    let mut stop = false;
    while !stop {
        let Ok(first) = rx.recv() else { break };
        let mut truncate = None;
        let result = (|| {
            for cmd in std::iter::once(first).chain(rx.try_iter()) {
                match cmd {
                    MirrorCmd::Append(lsn, count, bytes) => {
                        debug_assert_eq!(lsn, log.next_lsn());
                        log.append(lsn, count, &bytes)?;
                    }
                    MirrorCmd::Truncate(lsn) => truncate = Some(lsn),
                    MirrorCmd::Stop => stop = true,
                }
            }
            log.sync()?;
            if let Some(lsn) = truncate {
                log.truncate_head(lsn)?;
            }
            Ok::<(), crate::redo_log::LogError>(())
        })();
        if let Err(e) = result {
            // A mirror that cannot write must not acknowledge: stop; the manager drops it.
            tracing::error!("mirror's redo log failed: {e}; stopping");
            std::process::exit(70);
        }
        let replies = node
            .mirror
            .lock()
            .expect("mirror poisoned")
            .on_synced(node.now_ms(), log.next_lsn());
        for (to, id, resp) in replies {
            let _ = to.send((id, resp));
        }
    }
}

/// Every checkpoint interval: flushes the image, then truncates the log below what both
/// the image and the primary's truncation allow.
async fn checkpoint_loop(node: Arc<MirrorNode>, flusher: crate::space::Flusher) {
    loop {
        tokio::time::sleep(Duration::from_millis(node.cfg.checkpoint_interval_ms)).await;
        let below = node
            .mirror
            .lock()
            .expect("mirror poisoned")
            .truncation_point();
        let flusher = flusher.clone();
        match tokio::task::spawn_blocking(move || flusher.flush()).await {
            Ok(Ok(())) => {}
            other => {
                tracing::error!("flushing the mirror's image failed: {other:?}; stopping");
                std::process::exit(70);
            }
        }
        if below > 0 {
            let _ = node.log.send(MirrorCmd::Truncate(below));
        }
    }
}
