//! The mirror: the backup copy of a logical memory node in `log-repl` mode (Sinfonia §4.9,
//! primary-copy replication). It holds the primary's redo log record for record, at the same
//! lsns, and applies each committed tid's writes to an image of its own once the records
//! saying so are durable here, so that taking over is an ordinary restart of a `log` node
//! over this data directory (stages 1–3 of Fig. 8). No I/O: `node` drives it.

use crate::log_record::{decode_record, encode_record, LogRecord, Lsn};
use crate::participant::{planted, Bug, Writes};
use crate::space::Space;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use tutti_wire::{ErrorCode, NodeId, Placement, Request, Response, Tid, PRIMARY_LEASE_MS};

/// Past the lease, how much longer a mirror waits before it takes over: the two clocks
/// may run at slightly different rates.
pub const TAKE_OVER_MARGIN_MS: u64 = 100;

/// What the driver must do, in this order: append `append` (first lsn, count, encoded
/// records) to the log and sync it, then call `on_synced`; send `replies` now.
pub struct MirrorActions<R> {
    pub append: Option<(Lsn, u64, Vec<u8>)>,
    pub replies: Vec<(R, u64, Response)>,
}

impl<R> Default for MirrorActions<R> {
    fn default() -> Self {
        MirrorActions {
            append: None,
            replies: Vec::new(),
        }
    }
}

/// Where a mirror-role process stands in a placement the manager answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Standing {
    /// Older than a configuration already acted on (answers can overtake each other).
    Stale,
    /// Named primary: take over.
    Primary,
    /// Named mirror (a join is complete).
    Mirror,
    /// Still the placement it joined under (no mirror): its primary has it named once it
    /// caught up.
    Joining,
    /// Neither: empty the data directory and join anew once the node has no mirror.
    Outside,
}

impl Standing {
    /// The standing of the process at `me`, which acted on configuration epoch
    /// `known_epoch` and, if `joined`, is a mirror seeded under that epoch and not named yet.
    pub fn of(p: &Placement, me: &str, known_epoch: u64, joined: Option<u64>) -> Standing {
        if p.config_epoch < known_epoch {
            Standing::Stale
        } else if p.primary == me {
            Standing::Primary
        } else if p.mirror.as_deref() == Some(me) {
            Standing::Mirror
        } else if joined.is_some_and(|e| p.config_epoch == e && p.mirror.is_none()) {
            Standing::Joining
        } else {
            Standing::Outside
        }
    }
}

/// Whether a mirror-role process holding no copy of the node (a `ram-repl` process
/// restarted: its copy died with its predecessor) is named primary or mirror by `p`. It
/// must not serve as either, which would serve or acknowledge without the node's data: it
/// waits for the manager to drop it (its primary reports it behind) or to fail the node over
/// to the other copy (a silent primary), then joins like any copy outside the placement.
pub fn named_but_empty(p: &Placement, me: &str, holds_copy: bool) -> bool {
    let named = p.primary == me || p.mirror.as_deref() == Some(me);
    named && !holds_copy && !planted(Bug::EmptyCopyServes)
}

/// Whether a copy outside the placement (a mirror no longer named, or a mirror-role process
/// started again over a copy the placement changed without) keeps it and asks the managers
/// whether the change left it out (`Request::FormerPrimary` as of the placement's epoch
/// less one), before it empties itself to join: the copy a stale report dropped, or a named
/// mirror replaced before it heard, may be the only one holding every committed record.
pub fn asks_before_giving_up() -> bool {
    !planted(Bug::OutsideCopyGivenUp)
}

/// What a `Request::Replicate` carries, but the node.
pub struct Replicate<'a> {
    pub session: u64,
    pub config_epoch: u64,
    pub first_lsn: Lsn,
    pub records: &'a [u8],
    pub truncate_below: Lsn,
    pub primary_synced: Lsn,
}

impl Replicate<'_> {
    /// What `req` carries, if it is a `Replicate`: the node it names, and the rest.
    pub fn of(req: &Request) -> Option<(NodeId, Replicate<'_>)> {
        let Request::Replicate {
            node,
            session,
            config_epoch,
            first_lsn,
            records,
            truncate_below,
            primary_synced,
            ..
        } = req
        else {
            return None;
        };
        let msg = Replicate {
            session: *session,
            config_epoch: *config_epoch,
            first_lsn: *first_lsn,
            records,
            truncate_below: *truncate_below,
            primary_synced: *primary_synced,
        };
        Some((*node, msg))
    }
}

pub struct Mirror<R> {
    node: NodeId,
    /// The newest configuration heard of (from a primary or the manager): a primary of an
    /// older one is refused.
    config_epoch: u64,
    /// Named primary: refuses every primary from now on.
    promoted: bool,
    space: Space,
    /// Every record below is appended to the log here.
    next_lsn: Lsn,
    /// Every record below is durable here.
    synced_next: Lsn,
    /// Appended, not yet durable: applied to the image once they are.
    unsynced: VecDeque<(Lsn, LogRecord)>,
    /// Multi-participant tids whose outcome is not in the log yet: their Prepare's lsn and
    /// writes.
    prepared: FxHashMap<Tid, (Lsn, Writes)>,
    /// `Replicated` replies waiting until every record below their lsn is durable.
    acks: VecDeque<(Lsn, R, u64)>,
    /// The records the primary may not have on its own disk (above the last point it said
    /// it synced), encoded, for a restarting primary to adopt (`ReplicaTail`).
    tail: VecDeque<(Lsn, Vec<u8>)>,
    /// `ReplicaTail` asks waiting until every record appended here is durable: a restarting
    /// primary adopts all of them, or a record still on its way to this disk would later
    /// sit at an lsn where the primary wrote another.
    tail_asks: Vec<(R, u64, Lsn)>,
    /// The primary process this mirror follows (0: none yet). Sessions grow with each
    /// primary process (its start time): a restarting primary's `ReplicaTail` names its
    /// own, and what an earlier process still had in flight is refused from then on.
    session: u64,
    /// The primary's truncation point: every record below it is dead.
    primary_truncated: Lsn,
    /// When the latest acknowledgement left (the driver's clock), or the mirror started.
    last_ack_ms: u64,
    /// `ram-repl`: a record is as durable as it gets once this process holds it.
    in_ram: bool,
}

impl<R> Mirror<R> {
    /// A mirror over `space` (its image) whose log holds every record below `next_lsn`,
    /// `records` being those read back from it at start (applied to the image here as
    /// stage 3 would: the image may lack what was not flushed before a crash), starting at
    /// `now_ms`. What it acknowledged before this start is not known, so it takes over no
    /// earlier than a lease after `now_ms`.
    pub fn new(
        node: NodeId,
        mut space: Space,
        next_lsn: Lsn,
        records: Vec<(Lsn, LogRecord)>,
        now_ms: u64,
    ) -> Self {
        let mut prepared = FxHashMap::default();
        // The primary may lack any of them (it said what it synced to the mirror's last
        // incarnation, not to this one): all are kept for a restarting primary.
        let mut tail = VecDeque::new();
        for (lsn, record) in records {
            let mut bytes = Vec::new();
            encode_record(lsn, &record, &mut bytes);
            tail.push_back((lsn, bytes));
            apply(node, &mut space, &mut prepared, lsn, record);
        }
        Mirror {
            node,
            config_epoch: 0,
            promoted: false,
            space,
            next_lsn,
            synced_next: next_lsn,
            unsynced: VecDeque::new(),
            prepared,
            acks: VecDeque::new(),
            tail,
            tail_asks: Vec::new(),
            session: 0,
            primary_truncated: 0,
            last_ack_ms: now_ms,
            in_ram: false,
        }
    }

    /// `ram-repl`: this copy lives in this process's memory only, and dies with it; a
    /// record is acknowledged as soon as it is received. The driver still writes it to the
    /// tmpfs, before any promotion reads the log, since promotion comes later in its queue.
    pub fn in_ram(mut self, in_ram: bool) -> Self {
        self.in_ram = in_ram;
        self
    }

    pub fn space(&self) -> &Space {
        &self.space
    }

    /// Every record below is durable here.
    pub fn synced_next(&self) -> Lsn {
        self.synced_next
    }

    /// When its latest acknowledgement left (or it started): a mirror still joining that no
    /// primary has shipped to for `shipper::JOINER_PATIENCE_MS` was given up, and joins anew.
    pub fn last_ack_ms(&self) -> u64 {
        self.last_ack_ms
    }

    pub fn config_epoch(&self) -> u64 {
        self.config_epoch
    }

    /// A configuration the manager committed: a primary of an older one is refused.
    pub fn set_config_epoch(&mut self, config_epoch: u64) {
        self.config_epoch = self.config_epoch.max(config_epoch);
    }

    /// The manager named this mirror primary under `config_epoch`: no primary gets an
    /// acknowledgement from now on. It may serve once `may_take_over` holds.
    pub fn promote(&mut self, config_epoch: u64) {
        self.set_config_epoch(config_epoch);
        self.promoted = true;
    }

    /// Whether the lease of every acknowledgement sent has run out, so that the replaced
    /// primary no longer answers anyone.
    pub fn may_take_over(&self, now_ms: u64) -> bool {
        planted(Bug::TakeOverWithinLease)
            || now_ms >= self.last_ack_ms + PRIMARY_LEASE_MS + TAKE_OVER_MARGIN_MS
    }

    /// Where the log may be truncated once the image is flushed: below the primary's
    /// truncation point, what the image holds, and every Prepare whose outcome has not
    /// reached this log yet. The primary may have collected such a tid (its `Decided`
    /// record, written lazily, is past the truncation point): its writes are only in
    /// memory here until that record is durable, and its Prepare must stay on disk.
    pub fn truncation_point(&self) -> Lsn {
        let undecided = self.prepared.values().map(|(lsn, _)| *lsn).min();
        (self.primary_truncated.min(self.synced_next)).min(undecided.unwrap_or(Lsn::MAX))
    }

    fn later_session(&self) -> Response {
        Response::Error {
            code: ErrorCode::NotReady,
            message: format!(
                "node {}'s mirror follows a later primary process",
                self.node
            ),
        }
    }

    fn refuse(&self, reply_to: R, id: u64) -> MirrorActions<R> {
        let message = if self.promoted {
            format!("node {}'s mirror was promoted to primary", self.node)
        } else {
            format!(
                "node {}'s mirror is at configuration epoch {}",
                self.node, self.config_epoch
            )
        };
        MirrorActions {
            append: None,
            replies: vec![(
                reply_to,
                id,
                Response::Error {
                    code: ErrorCode::StaleConfig,
                    message,
                },
            )],
        }
    }

    /// `Request::Replicate`.
    pub fn on_replicate(
        &mut self,
        now_ms: u64,
        reply_to: R,
        id: u64,
        msg: Replicate<'_>,
    ) -> MirrorActions<R> {
        let Replicate {
            session,
            config_epoch,
            first_lsn,
            records,
            truncate_below,
            primary_synced,
        } = msg;
        if session < self.session {
            return MirrorActions {
                append: None,
                replies: vec![(reply_to, id, self.later_session())],
            };
        }
        self.session = session;
        if self.promoted || config_epoch < self.config_epoch {
            return self.refuse(reply_to, id);
        }
        self.config_epoch = self.config_epoch.max(config_epoch);
        if first_lsn > self.next_lsn {
            let gap = Response::ReplicaGap {
                next_lsn: self.next_lsn,
            };
            return MirrorActions {
                append: None,
                replies: vec![(reply_to, id, gap)],
            };
        }
        self.primary_truncated = self.primary_truncated.max(truncate_below);
        self.forget_tail_below(primary_synced);
        let mut acts = MirrorActions::default();
        let (mut at, mut new_from, mut count) = (0, None, 0);
        while at < records.len() {
            let Some((lsn, record, used)) = decode_record(&records[at..]) else {
                let bad = Response::Error {
                    code: ErrorCode::BadRequest,
                    message: "Replicate: records do not decode".into(),
                };
                acts.replies.push((reply_to, id, bad));
                return acts;
            };
            if lsn >= self.next_lsn {
                if lsn != self.next_lsn {
                    let bad = Response::Error {
                        code: ErrorCode::BadRequest,
                        message: format!("Replicate: lsn {lsn} where {} was next", self.next_lsn),
                    };
                    acts.replies.push((reply_to, id, bad));
                    return acts;
                }
                new_from.get_or_insert(at);
                self.tail.push_back((lsn, records[at..at + used].to_vec()));
                self.unsynced.push_back((lsn, record));
                self.next_lsn += 1;
                count += 1;
            }
            at += used;
        }
        if let Some(from) = new_from {
            let first = self.next_lsn - count;
            acts.append = Some((first, count, records[from..].to_vec()));
            if self.in_ram {
                acts.replies.extend(self.on_synced(now_ms, self.next_lsn));
            }
        }
        // Every record of the message is below `next_lsn` now: acknowledged once durable.
        if self.synced_next >= self.next_lsn {
            self.last_ack_ms = now_ms;
            let ack = Response::Replicated {
                next_lsn: self.synced_next,
            };
            acts.replies.push((reply_to, id, ack));
        } else {
            self.acks.push_back((self.next_lsn, reply_to, id));
        }
        acts
    }

    /// The primary holds every record below `primary_synced` on its own disk: a restarting
    /// primary needs none of them from here.
    fn forget_tail_below(&mut self, primary_synced: Lsn) {
        while self
            .tail
            .front()
            .is_some_and(|(lsn, _)| *lsn < primary_synced)
        {
            self.tail.pop_front();
        }
    }

    /// Every record below `next` is durable: applies them, acknowledges what waited.
    pub fn on_synced(&mut self, now_ms: u64, next: Lsn) -> Vec<(R, u64, Response)> {
        self.synced_next = self.synced_next.max(next);
        while self
            .unsynced
            .front()
            .is_some_and(|(lsn, _)| *lsn < self.synced_next)
        {
            let (lsn, record) = self.unsynced.pop_front().expect("front");
            apply(self.node, &mut self.space, &mut self.prepared, lsn, record);
        }
        let mut replies = Vec::new();
        if self.synced_next >= self.next_lsn {
            for (to, id, from) in std::mem::take(&mut self.tail_asks) {
                let tail = self.tail_from(from);
                replies.push((to, id, tail));
            }
        }
        while self
            .acks
            .front()
            .is_some_and(|(upto, _, _)| *upto <= self.synced_next)
        {
            let (_, to, id) = self.acks.pop_front().expect("front");
            if !self.promoted {
                self.last_ack_ms = now_ms;
                let ack = Response::Replicated {
                    next_lsn: self.synced_next,
                };
                replies.push((to, id, ack));
            }
        }
        replies
    }

    /// `Request::ReplicaTail` from the primary process `session`: the records from `from`
    /// on, once every record appended here is durable; a restarting primary of the current
    /// configuration adopts them. A mirror that holds less answers from where its log ends
    /// (`first_lsn` below `from`, no records): the primary sends it the rest. From now on
    /// only `session` is followed.
    pub fn on_tail(
        &mut self,
        reply_to: R,
        id: u64,
        session: u64,
        config_epoch: u64,
        from: Lsn,
    ) -> Vec<(R, u64, Response)> {
        if self.promoted || config_epoch < self.config_epoch {
            let stale = Response::Error {
                code: ErrorCode::StaleConfig,
                message: format!("node {}'s mirror is past that configuration", self.node),
            };
            return vec![(reply_to, id, stale)];
        }
        if session < self.session {
            return vec![(reply_to, id, self.later_session())];
        }
        self.session = session;
        if self.synced_next < self.next_lsn {
            self.tail_asks.push((reply_to, id, from));
            return Vec::new();
        }
        vec![(reply_to, id, self.tail_from(from))]
    }

    fn tail_from(&self, from: Lsn) -> Response {
        let first_lsn = from.min(self.synced_next);
        let mut records = Vec::new();
        let mut count = 0;
        for (lsn, bytes) in &self.tail {
            if *lsn >= first_lsn && *lsn < self.synced_next {
                records.extend_from_slice(bytes);
                count += 1;
            }
        }
        if count != self.synced_next - first_lsn {
            return Response::Error {
                code: ErrorCode::NotFound,
                message: format!(
                    "node {}'s mirror no longer keeps records from {from}: the primary said \
                     it had synced them",
                    self.node
                ),
            };
        }
        Response::ReplicaTail {
            first_lsn,
            count,
            records,
        }
    }
}

/// Applies a durable record to the image: a one-participant Prepare commits with it (as in
/// recovery), a multi-participant one waits for its Decided record.
fn apply(
    node: NodeId,
    space: &mut Space,
    prepared: &mut FxHashMap<Tid, (Lsn, Writes)>,
    lsn: Lsn,
    record: LogRecord,
) {
    match record {
        LogRecord::Prepare {
            tid,
            participants,
            writes,
        } => {
            if participants == [node] {
                for (addr, bytes) in &writes {
                    space.write(*addr, bytes);
                }
            } else {
                prepared.insert(tid, (lsn, writes));
            }
        }
        LogRecord::Decided { tid, commit } => {
            if let Some((_, writes)) = prepared.remove(&tid) {
                if commit {
                    for (addr, bytes) in &writes {
                        space.write(*addr, bytes);
                    }
                }
            }
        }
        LogRecord::ForcedAbort { .. } | LogRecord::Epoch { .. } => {}
    }
}

/// Encodes `records` as a `Replicate` or `ReplicaTail` carries them.
pub fn encode_records(records: &[(Lsn, LogRecord)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (lsn, record) in records {
        encode_record(*lsn, record, &mut out);
    }
    out
}

/// The unit a seed's image is scanned and sent in: a run of pages none of which is all
/// zeros.
const SEED_PAGE_BYTES: usize = 4096;

/// A primary's answer to `ReadSeed { offset, len }` for a seed of `records` and an image of
/// `image_bytes`, whose range `from .. from + len` `read_image` gives: the range's part in
/// the records as bytes, and in the image only the pages that are not all zeros.
pub fn seed_part(
    records: &[u8],
    image_bytes: u64,
    offset: u64,
    len: u64,
    read_image: impl FnOnce(u64, u64) -> Vec<u8>,
) -> Response {
    let records_end = records.len() as u64;
    let end = offset.saturating_add(len).min(records_end + image_bytes);
    let offset = offset.min(end);
    let in_records = match offset < records_end {
        true => records[offset as usize..end.min(records_end) as usize].to_vec(),
        false => Vec::new(),
    };
    let image_from = offset.max(records_end) - records_end;
    let image_to = end.max(records_end) - records_end;
    let mut pages: Vec<(u64, Vec<u8>)> = Vec::new();
    if image_from < image_to {
        let image = read_image(image_from, image_to - image_from);
        let mut run: Option<(u64, Vec<u8>)> = None;
        for (i, page) in image.chunks(SEED_PAGE_BYTES).enumerate() {
            if page.iter().all(|&b| b == 0) {
                pages.extend(run.take());
                continue;
            }
            match &mut run {
                Some((_, bytes)) => bytes.extend_from_slice(page),
                None => run = Some((image_from + (i * SEED_PAGE_BYTES) as u64, page.to_vec())),
            }
        }
        pages.extend(run);
    }
    Response::SeedPart {
        len: end - offset,
        records: in_records,
        pages,
    }
}

/// The records `bytes` holds, encoded as in a segment, up to the first that does not
/// decode, and how many bytes they took.
pub fn decode_records(bytes: &[u8]) -> (Vec<(Lsn, LogRecord)>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some((lsn, record, used)) = decode_record(&bytes[at..]) {
        records.push((lsn, record));
        at += used;
    }
    (records, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed read in parts of any length gives back its records and its image, and the
    /// image's pages of zeros travel as nothing.
    #[test]
    fn a_seed_read_in_parts_is_the_records_then_the_image_without_its_zero_pages() {
        let records: Vec<u8> = (0..5_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut image = vec![0u8; 64 * 1024];
        image[4096..4100].copy_from_slice(&[1, 2, 3, 4]);
        image[8192 + 4095] = 9;
        image[40_000] = 7;
        let total = records.len() as u64 + image.len() as u64;
        for part in [1_000u64, 4096, 10_000, total] {
            let (mut got_records, mut got_image, mut sent) = (Vec::new(), vec![0u8; 65536], 0);
            let mut offset = 0;
            while offset < total {
                let Response::SeedPart {
                    len,
                    records: r,
                    pages,
                } = seed_part(&records, image.len() as u64, offset, part, |from, len| {
                    image[from as usize..(from + len) as usize].to_vec()
                })
                else {
                    panic!("a seed part")
                };
                assert_eq!(len, part.min(total - offset));
                got_records.extend(r);
                for (at, run) in pages {
                    sent += run.len();
                    got_image[at as usize..at as usize + run.len()].copy_from_slice(&run);
                }
                offset += len;
            }
            assert_eq!(got_records, records, "parts of {part}");
            assert_eq!(got_image, image, "parts of {part}");
            assert!(
                sent <= 5 * 4096,
                "{sent} image bytes sent in parts of {part}"
            );
        }
    }

    #[test]
    fn a_mirror_reads_its_standing_in_a_placement() {
        let p = |config_epoch, primary: &str, mirror: Option<&str>| Placement {
            config_epoch,
            primary: primary.into(),
            mirror: mirror.map(str::to_string),
        };
        let of = Standing::of;
        assert_eq!(of(&p(3, "m", None), "m", 3, None), Standing::Primary);
        assert_eq!(of(&p(3, "p", Some("m")), "m", 3, Some(2)), Standing::Mirror);
        assert_eq!(of(&p(2, "p", None), "m", 2, Some(2)), Standing::Joining);
        assert_eq!(of(&p(2, "p", None), "m", 3, None), Standing::Stale);
        assert_eq!(
            of(&p(3, "p", None), "m", 2, Some(2)),
            Standing::Outside,
            "the join was abandoned, or the placement moved on"
        );
        assert_eq!(
            of(&p(2, "p", None), "m", 2, None),
            Standing::Outside,
            "dropped"
        );
    }
}
