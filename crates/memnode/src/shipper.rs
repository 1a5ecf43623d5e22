//! The primary's side of `log-repl` (docs/replication.md): the records its mirror does not
//! hold yet, what to send again after a gap or a reconnection, how far the participant may
//! count its records durable (on both disks), and the primary's lease, which holds back
//! the participant's replies while it has run out. No I/O: `node` drives it, and so does
//! the simulator.

use crate::log_record::Lsn;
use crate::participant::{planted, Bug};
use std::collections::VecDeque;
use std::sync::Arc;
use tutti_wire::{ErrorCode, NodeId, Placement, Request, Response, PRIMARY_LEASE_MS};

/// Records appended to the primary's log in one round of its writer, encoded.
struct Batch {
    first: Lsn,
    count: u64,
    bytes: Arc<Vec<u8>>,
    /// When it was handed over (the driver's clock).
    pushed_ms: u64,
}

/// What a mirror's reply means for the primary.
#[derive(Debug)]
pub enum Shipped {
    /// The mirror holds more (or the lease was renewed): the participant may count records
    /// below `durable_next` durable.
    Acknowledged { durable_next: Lsn },
    /// The mirror lacks records it must get first: send these again.
    Resend(Vec<Request>),
    /// The mirror lacks records this primary no longer has: it cannot catch up by
    /// shipping (the manager drops it from the placement once told).
    MirrorBehind { mirror_next: Lsn },
    /// The mirror knows a newer configuration (it was promoted, or the placement changed
    /// otherwise, say to name it mirror): ask the manager for the placement, which says
    /// whether this primary was replaced; until then nothing more is acknowledged.
    Stale(String),
    /// Nothing to act on (a transient error: the connection is retried).
    Nothing,
}

/// How long a joining mirror not counted yet may stay silent (no acknowledgement, no seed
/// read) before the primary gives up on it and stops keeping records for it.
pub const JOINER_PATIENCE_MS: u64 = 5_000;

/// The report of a primary not serving yet (`primary::adopt_mirror_tail`) that its mirror
/// has left it unanswered for `behind_ms`: the manager drops a mirror only on its primary's
/// report. A `Heartbeat` with nothing else to tell (an `applied_below` of 0 moves nothing:
/// the nodes keep the highest relayed).
pub fn mirror_unanswering(node: NodeId, behind_ms: u64) -> Request {
    Request::Heartbeat {
        node,
        uncertain: vec![],
        applied: vec![],
        applied_below: 0,
        mirror_behind_ms: behind_ms,
    }
}

/// A mirror joining a primary that runs without one (re-replication, docs/replication.md).
struct Joiner {
    addr: String,
    /// Names this join's seed (`Request::ReadSeed`).
    join: u64,
    /// The placement it joins: the manager names it mirror only if that still holds.
    config_epoch: u64,
    /// When it was last heard from (an acknowledgement or a seed read).
    heard_ms: u64,
    /// It held every record the participant had counted durable: from then on none is
    /// counted durable unless it holds it too, and the manager is asked to name it mirror.
    counted: bool,
}

/// What a primary tells a mirror joining it (`Response::JoinOffer`, less the seed's sizes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinTerms {
    pub join: u64,
    /// The seed holds every record below; shipping starts there.
    pub next_lsn: Lsn,
    pub config_epoch: u64,
    pub session: u64,
}

/// A reply the participant made: to whom, the request's id, the reply.
pub type Reply<R> = (R, u64, Response);

pub struct Shipper<R> {
    node: NodeId,
    /// This primary process, as its mirror knows it (`Request::Replicate`).
    session: u64,
    placement: Placement,
    /// In lsn order, sent or not, until the mirror acknowledges them.
    unacked: VecDeque<Batch>,
    /// How many of `unacked` were sent on the current connection.
    sent: usize,
    /// The mirror holds every record below.
    mirror_next: Lsn,
    /// Every record below is on this primary's disk.
    local_next: Lsn,
    truncate_below: Lsn,
    /// The gap the last resend answered: the messages in flight behind the one that found
    /// it report it too.
    resent_from: Option<Lsn>,
    /// Since when the mirror has lacked records this primary no longer holds.
    behind_since_ms: Option<u64>,
    /// When the first message since the mirror's latest acknowledgement was sent (or
    /// tried: the driver could not connect).
    unanswered_since_ms: Option<u64>,
    /// Replies may leave until then (the driver's clock); none before the first
    /// acknowledgement.
    lease_until_ms: u64,
    /// Replies made while the lease had run out, in order.
    held: Vec<Reply<R>>,
    /// Every record below was handed over (`push`).
    pushed_next: Lsn,
    joiner: Option<Joiner>,
    /// The last join's number.
    joins: u64,
    /// Raised whenever the records kept are dropped for a new mirror: replies to what was
    /// sent before are not that mirror's.
    generation: u64,
    /// `ram-repl`: this copy dies with its process, so a record handed over is as held here
    /// as it will ever be; the mirror's acknowledgement alone makes it durable.
    in_ram: bool,
    /// The placement dropped the mirror, and the managers have not yet confirmed that this
    /// primary serves alone under it (`confirm_alone`). Until they have, the dropped mirror
    /// may be named primary instead (this one may die before it hears of the drop), so
    /// nothing counts durable that the mirror did not acknowledge, and replies wait.
    alone_unconfirmed: bool,
}

impl<R> Shipper<R> {
    /// The shipper of a primary whose log holds every record below `next_lsn`, all on its
    /// disk; the mirror is taken to hold as much (a restarting primary first adopts the
    /// mirror's tail, `Request::ReplicaTail`; a gap is found by the first message).
    pub fn new(node: NodeId, session: u64, placement: Placement, next_lsn: Lsn) -> Shipper<R> {
        Shipper {
            node,
            session,
            placement,
            unacked: VecDeque::new(),
            sent: 0,
            mirror_next: next_lsn,
            local_next: next_lsn,
            truncate_below: 0,
            resent_from: None,
            behind_since_ms: None,
            unanswered_since_ms: None,
            lease_until_ms: 0,
            held: Vec::new(),
            pushed_next: next_lsn,
            joiner: None,
            joins: 0,
            generation: 0,
            in_ram: false,
            alone_unconfirmed: false,
        }
    }

    /// `ram-repl`: records count as held by this copy from their `push` on.
    pub fn in_ram(mut self, in_ram: bool) -> Self {
        self.in_ram = in_ram;
        self
    }

    /// The participant made `replies` at `now_ms`: those that may leave now, in order after
    /// any held before. While the lease has run out they wait: the mirror may be taking
    /// over, and this copy must not answer anyone meanwhile.
    pub fn replies(&mut self, now_ms: u64, replies: Vec<Reply<R>>) -> Vec<Reply<R>> {
        if self.held.is_empty() && self.lease_valid(now_ms) {
            return replies;
        }
        self.held.extend(replies);
        self.release(now_ms)
    }

    /// The held replies, if the lease is valid again at `now_ms`.
    pub fn release(&mut self, now_ms: u64) -> Vec<Reply<R>> {
        if self.lease_valid(now_ms) {
            std::mem::take(&mut self.held)
        } else {
            Vec::new()
        }
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The mirror holds every record handed over (or there is no mirror).
    pub fn caught_up(&self) -> bool {
        self.unacked.is_empty()
    }

    /// The placement's mirror, if it has one.
    pub fn mirror(&self) -> Option<&str> {
        self.placement.mirror.as_deref()
    }

    /// Where records go: the placement's mirror, or a mirror joining.
    pub fn target(&self) -> Option<&str> {
        (self.placement.mirror.as_deref()).or(self.joiner.as_ref().map(|j| j.addr.as_str()))
    }

    /// `target`, and a number that changes whenever it is another mirror (perhaps at the
    /// same address): a driver drops its connection, and the replies it still awaits.
    pub fn shipping_to(&self) -> Option<(&str, u64)> {
        self.target().map(|t| (t, self.generation))
    }

    /// Whether the participant counts records durable only once a mirror holds them: the
    /// placement has one, a joining mirror caught up, or the placement dropped the mirror
    /// and this primary has not registered alone yet.
    fn mirror_counted(&self) -> bool {
        self.placement.mirror.is_some()
            || self.joiner.as_ref().is_some_and(|j| j.counted)
            || self.alone_unconfirmed
    }

    /// Whether the placement dropped the mirror and this primary must register under it
    /// (`Request::Register`) before it counts anything durable on its own disk alone.
    pub fn confirming_alone(&self) -> bool {
        self.alone_unconfirmed
    }

    /// The managers committed that this primary serves `placement` (its registration's
    /// reply): if that is the current one, without a mirror, it serves alone from now on.
    pub fn confirm_alone(&mut self, placement: &Placement) {
        if *placement == self.placement && placement.mirror.is_none() {
            self.alone_unconfirmed = false;
        }
    }

    /// The mirror at `addr` asks to join this primary, which runs without one, at `now_ms`.
    /// From now on records go to it from the next one handed over (`JoinTerms::next_lsn`),
    /// below which the joiner gets every record and the image from a seed. A joiner not
    /// counted yet is given up for the new one (it may have restarted).
    pub fn join(&mut self, now_ms: u64, addr: &str) -> Result<JoinTerms, String> {
        if let Some(mirror) = &self.placement.mirror {
            return Err(format!("node {} has a mirror: {mirror}", self.node));
        }
        if self.alone_unconfirmed {
            return Err(format!(
                "node {}'s primary has not registered without its mirror yet",
                self.node
            ));
        }
        if let Some(j) = self.joiner.as_ref().filter(|j| j.counted) {
            return Err(format!(
                "node {}'s mirror {} is joining and caught up",
                self.node, j.addr
            ));
        }
        self.joins += 1;
        self.joiner = Some(Joiner {
            addr: addr.to_string(),
            join: self.joins,
            config_epoch: self.placement.config_epoch,
            heard_ms: now_ms,
            counted: planted(Bug::JoinBeforeCaughtUp),
        });
        self.forget_mirror(self.pushed_next);
        Ok(JoinTerms {
            join: self.joins,
            next_lsn: self.pushed_next,
            config_epoch: self.placement.config_epoch,
            session: self.session,
        })
    }

    /// The joiner of `join` read its seed at `now_ms`: it is alive. False for a join given up.
    pub fn joiner_heard(&mut self, now_ms: u64, join: u64) -> bool {
        match self.joiner.as_mut().filter(|j| j.join == join) {
            Some(j) => {
                j.heard_ms = now_ms;
                true
            }
            None => false,
        }
    }

    /// A joiner not counted yet and silent for `JOINER_PATIENCE_MS` is given up, and the
    /// records kept for it dropped. (A counted one is the manager's to drop: it may have
    /// named it mirror already.)
    pub fn give_up_silent_joiner(&mut self, now_ms: u64) {
        let silent = (self.joiner.as_ref())
            .is_some_and(|j| !j.counted && now_ms >= j.heard_ms + JOINER_PATIENCE_MS);
        if silent {
            self.joiner = None;
            self.forget_mirror(self.local_next);
        }
    }

    /// What to ask the manager (`Request::AddMirror`) once a joiner is counted: the
    /// configuration it joined under and its address.
    pub fn joiner_to_name(&self) -> Option<(u64, &str)> {
        (self.joiner.as_ref())
            .filter(|j| j.counted)
            .map(|j| (j.config_epoch, j.addr.as_str()))
    }

    /// No record is kept for a mirror any more; the next one holds every record below
    /// `mirror_next`.
    fn forget_mirror(&mut self, mirror_next: Lsn) {
        self.generation += 1;
        self.unacked.clear();
        self.sent = 0;
        self.resent_from = None;
        self.behind_since_ms = None;
        self.unanswered_since_ms = None;
        self.mirror_next = mirror_next;
    }

    /// A placement the manager committed. Without a mirror the primary relies on its own
    /// disk alone, once the managers confirmed it (`confirm_alone`); a placement naming
    /// another primary means this one was replaced.
    pub fn set_placement(&mut self, placement: Placement) -> Result<(), String> {
        if placement.config_epoch < self.placement.config_epoch {
            return Ok(());
        }
        if placement.primary != self.placement.primary {
            return Err(format!(
                "node {} is served by {} since configuration epoch {}",
                self.node, placement.primary, placement.config_epoch
            ));
        }
        let joined = placement.mirror.is_some()
            && (self.joiner.as_ref()).is_some_and(|j| Some(&j.addr) == placement.mirror.as_ref());
        if joined {
            // The joiner is the mirror now: what it was sent and acknowledged stands.
            self.joiner = None;
        } else {
            let moved_on =
                (self.joiner.as_ref()).is_some_and(|j| placement.config_epoch > j.config_epoch);
            if moved_on {
                // The placement moved on without the joiner.
                self.joiner = None;
            }
            let dropped = placement.config_epoch > self.placement.config_epoch
                && placement.mirror.is_none()
                && self.placement.mirror.is_some();
            if dropped && !planted(Bug::AloneUnconfirmed) {
                // What the mirror acknowledged stays the durable point until confirmed.
                self.alone_unconfirmed = true;
                self.forget_mirror(self.mirror_next.min(self.local_next));
            } else if moved_on || placement.mirror != self.placement.mirror {
                self.forget_mirror(self.local_next);
            }
        }
        self.placement = placement;
        Ok(())
    }

    /// The mirror lacks records this primary no longer holds (found at its start).
    pub fn mark_behind(&mut self, now_ms: u64) {
        self.behind_since_ms.get_or_insert(now_ms);
    }

    /// Records `first .. first + count` were handed to the log writer at `now_ms`.
    pub fn push(&mut self, now_ms: u64, first: Lsn, count: u64, bytes: Vec<u8>) {
        self.pushed_next = self.pushed_next.max(first + count);
        if self.in_ram {
            self.local_next = self.local_next.max(first + count);
        }
        if self.target().is_some() && count > 0 {
            let bytes = Arc::new(bytes);
            self.unacked.push_back(Batch {
                first,
                count,
                bytes,
                pushed_ms: now_ms,
            });
        }
    }

    /// How long the placement's mirror has failed this primary (0: it has not, or there is
    /// no mirror in the placement): since the oldest record it has not acknowledged was
    /// handed over, since it was found lacking records this primary no longer holds, or
    /// since the first message it left unanswered (an idle primary's lease renewals). The
    /// manager drops a mirror behind for its fail-over timeout, and only on this report.
    pub fn behind_ms(&self, now_ms: u64) -> u64 {
        if self.placement.mirror.is_none() {
            return 0;
        }
        let oldest = self.unacked.front().map(|b| b.pushed_ms);
        (oldest.into_iter())
            .chain(self.behind_since_ms)
            .chain(self.unanswered_since_ms)
            .min()
            .map_or(0, |t| now_ms.saturating_sub(t))
    }

    /// A message to the mirror is sent, or tried, at `now_ms`: unanswered until the mirror
    /// acknowledges one.
    pub fn sending(&mut self, now_ms: u64) {
        self.unanswered_since_ms.get_or_insert(now_ms);
    }

    /// Every record below `next` is on this primary's disk.
    pub fn on_local_synced(&mut self, next: Lsn) -> Lsn {
        self.local_next = self.local_next.max(next);
        self.durable_next()
    }

    /// The log writer deleted segments below `lsn`: the mirror may too.
    pub fn truncated(&mut self, lsn: Lsn) {
        self.truncate_below = self.truncate_below.max(lsn);
    }

    /// Records below are on every copy's disk: the participant counts them durable.
    pub fn durable_next(&self) -> Lsn {
        if self.mirror_counted() && !planted(Bug::VoteBeforeMirrorAck) {
            self.local_next.min(self.mirror_next)
        } else {
            self.local_next
        }
    }

    /// Whether replies may leave at `now_ms`: a mirror acknowledged a message sent less
    /// than `PRIMARY_LEASE_MS` ago, or there is no mirror to take over.
    pub fn lease_valid(&self, now_ms: u64) -> bool {
        !self.mirror_counted() || now_ms < self.lease_until_ms
    }

    /// A new connection to the mirror: everything unacknowledged goes again.
    pub fn reconnected(&mut self) {
        self.sent = 0;
        self.resent_from = None;
    }

    fn request(&self, batch: Option<&Batch>) -> Request {
        let (first_lsn, count, records) = match batch {
            Some(b) => (b.first, b.count, b.bytes.as_ref().clone()),
            None => (self.mirror_next.max(self.local_next), 0, Vec::new()),
        };
        Request::Replicate {
            node: self.node,
            session: self.session,
            config_epoch: self.placement.config_epoch,
            first_lsn,
            count,
            records,
            truncate_below: self.truncate_below,
            primary_synced: self.local_next,
        }
    }

    /// The messages not sent on this connection yet, sent at `now_ms`; with none, an empty
    /// one when `heartbeat` (it renews the lease and carries the truncation point).
    pub fn to_send(&mut self, now_ms: u64, heartbeat: bool) -> Vec<Request> {
        let mut out: Vec<Request> = (self.unacked.iter().skip(self.sent))
            .map(|b| self.request(Some(b)))
            .collect();
        self.sent = self.unacked.len();
        if out.is_empty() && heartbeat && self.target().is_some() {
            out.push(self.request(None));
        }
        if !out.is_empty() {
            self.sending(now_ms);
        }
        out
    }

    /// The mirror's reply to a `Replicate` sent at `sent_ms`.
    pub fn on_reply(
        &mut self,
        sent_ms: u64,
        reply: Result<Response, (ErrorCode, String)>,
    ) -> Shipped {
        match reply {
            Ok(Response::Replicated { next_lsn }) => {
                self.mirror_next = self.mirror_next.max(next_lsn);
                let before = self.unacked.len();
                while (self.unacked.front()).is_some_and(|b| b.first + b.count <= self.mirror_next)
                {
                    self.unacked.pop_front();
                }
                self.sent = self.sent.saturating_sub(before - self.unacked.len());
                self.unanswered_since_ms = None;
                self.lease_until_ms = self.lease_until_ms.max(sent_ms + PRIMARY_LEASE_MS);
                if let Some(j) = &mut self.joiner {
                    j.heard_ms = j.heard_ms.max(sent_ms);
                    // It holds every record the participant was told durable: counting
                    // it from now on keeps that so.
                    j.counted |= self.mirror_next >= self.local_next;
                }
                Shipped::Acknowledged {
                    durable_next: self.durable_next(),
                }
            }
            Ok(Response::ReplicaGap { next_lsn }) => {
                let held_from = self.unacked.front().map_or(self.local_next, |b| b.first);
                if next_lsn < held_from.min(self.mirror_next) {
                    self.behind_since_ms.get_or_insert(sent_ms);
                    return Shipped::MirrorBehind {
                        mirror_next: next_lsn,
                    };
                }
                // Everything from the gap on goes again, in order; what was in flight
                // behind it is refused as a gap too, and ignored as such.
                if self.resent_from == Some(next_lsn) {
                    return Shipped::Nothing;
                }
                self.resent_from = Some(next_lsn);
                self.sent = 0;
                Shipped::Resend(self.to_send(sent_ms, false))
            }
            Err((ErrorCode::StaleConfig, message)) => Shipped::Stale(message),
            Ok(_) | Err(_) => Shipped::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_record::LogRecord;
    use crate::mirror::{encode_records, Mirror, Replicate};
    use crate::space::Space;

    fn placement(mirror: Option<&str>) -> Placement {
        Placement {
            config_epoch: 1,
            primary: "p".into(),
            mirror: mirror.map(str::to_string),
        }
    }

    fn prepare(seq: u64, participants: Vec<NodeId>, addr: u64, byte: u8) -> LogRecord {
        LogRecord::Prepare {
            tid: tutti_wire::Tid {
                epoch: 1,
                coordinator: 9,
                seq,
            },
            participants,
            writes: vec![(addr, vec![byte; 4])],
        }
    }

    /// Delivers `req` to `m` and syncs at once; returns the reply.
    fn deliver(m: &mut Mirror<u32>, now: u64, req: &Request) -> Response {
        let (_, msg) = Replicate::of(req).expect("a Replicate");
        let acts = m.on_replicate(now, 0, 1, msg);
        let mut replies = acts.replies;
        if let Some((first, count, _)) = acts.append {
            replies.extend(m.on_synced(now, first + count));
        }
        replies.pop().expect("a reply").2
    }

    #[test]
    fn an_idle_primary_reports_a_mirror_that_stops_answering_behind() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        assert_eq!(s.behind_ms(1_000), 0, "nothing asked of it yet");
        let renewal = s.to_send(100, true);
        assert_eq!(s.behind_ms(150), 50, "a renewal unanswered");
        let reply = deliver(&mut m, 100, &renewal[0]);
        s.on_reply(100, Ok(reply));
        assert_eq!(s.behind_ms(150), 0, "answered");
        let lost = s.to_send(200, true);
        assert_eq!(lost.len(), 1);
        s.to_send(300, true);
        assert_eq!(
            s.behind_ms(700),
            500,
            "silent since the first unanswered renewal"
        );
        s.sending(800);
        assert_eq!(s.behind_ms(900), 700, "nor reached since");
    }

    #[test]
    fn records_count_durable_only_once_on_both_disks_and_reach_the_mirrors_image() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        let records = vec![
            (1, prepare(1, vec![1], 0, 7)),
            (2, prepare(2, vec![1, 2], 8, 9)),
        ];
        s.push(0, 1, 2, encode_records(&records));
        assert_eq!(s.on_local_synced(3), 1, "not on the mirror yet");
        assert!(!s.lease_valid(0), "no lease before an acknowledgement");
        let sent = s.to_send(0, true);
        assert_eq!(sent.len(), 1);
        let reply = deliver(&mut m, 5, &sent[0]);
        assert!(matches!(
            s.on_reply(5, Ok(reply)),
            Shipped::Acknowledged { durable_next: 3 }
        ));
        assert!(s.lease_valid(5 + PRIMARY_LEASE_MS - 1));
        assert!(!s.lease_valid(5 + PRIMARY_LEASE_MS));
        assert_eq!(m.space().read(0, 4), &[7; 4], "one participant: committed");
        assert_eq!(m.space().read(8, 4), &[0; 4], "two: waits for its outcome");
        let decided = LogRecord::Decided {
            tid: tutti_wire::Tid {
                epoch: 1,
                coordinator: 9,
                seq: 2,
            },
            commit: true,
        };
        s.push(0, 3, 1, encode_records(&[(3, decided)]));
        let sent = s.to_send(0, true);
        let _ = deliver(&mut m, 6, &sent[0]);
        assert_eq!(m.space().read(8, 4), &[9; 4]);
    }

    #[test]
    fn a_primary_left_alone_counts_nothing_more_durable_until_it_registered_so() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        s.push(0, 1, 1, encode_records(&[(1, prepare(1, vec![1], 0, 7))]));
        s.on_local_synced(2);
        let reply = deliver(&mut m, 5, &s.to_send(0, true)[0]);
        s.on_reply(5, Ok(reply));
        s.push(10, 2, 1, encode_records(&[(2, prepare(2, vec![1], 4, 8))]));
        assert_eq!(s.on_local_synced(3), 2, "record 2 is not on the mirror");
        let alone = Placement {
            config_epoch: 2,
            mirror: None,
            ..placement(None)
        };
        s.set_placement(alone.clone()).expect("still the primary");
        assert!(s.confirming_alone());
        assert_eq!(
            s.durable_next(),
            2,
            "the dropped mirror may be named instead"
        );
        let lease_out = 5 + PRIMARY_LEASE_MS;
        assert!(
            !s.lease_valid(lease_out),
            "replies wait once the lease ran out"
        );
        assert!(
            s.join(20, "j").is_err(),
            "no join before it registered alone"
        );
        assert!(
            s.to_send(20, true).is_empty(),
            "nothing goes to the dropped mirror"
        );
        s.confirm_alone(&placement(None));
        assert!(s.confirming_alone(), "not the placement it serves");
        s.confirm_alone(&alone);
        assert!(!s.confirming_alone());
        assert_eq!(s.durable_next(), 3, "its own disk alone from now on");
        assert!(s.lease_valid(lease_out));
    }

    #[test]
    fn in_ram_a_record_is_durable_once_the_mirror_received_it() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1).in_ram(true);
        let mut m: Mirror<u32> =
            Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0).in_ram(true);
        s.push(0, 1, 1, encode_records(&[(1, prepare(1, vec![1], 0, 7))]));
        assert_eq!(s.durable_next(), 1, "not on the mirror yet");
        let sent = s.to_send(0, true);
        let (_, msg) = Replicate::of(&sent[0]).expect("a Replicate");
        let acts = m.on_replicate(5, 0, 1, msg);
        assert!(acts.append.is_some(), "still written to the tmpfs");
        let reply = acts
            .replies
            .last()
            .expect("acknowledged on receipt")
            .2
            .clone();
        assert!(
            matches!(
                s.on_reply(5, Ok(reply)),
                Shipped::Acknowledged { durable_next: 2 }
            ),
            "held by this copy since the push: no wait for its own writer"
        );
        assert_eq!(m.space().read(0, 4), &[7; 4]);
    }

    #[test]
    fn a_gap_is_filled_by_sending_again_and_a_replaced_primary_learns_it() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        s.push(0, 1, 1, encode_records(&[(1, prepare(1, vec![1], 0, 1))]));
        s.push(0, 2, 1, encode_records(&[(2, prepare(2, vec![1], 0, 2))]));
        let sent = s.to_send(0, false);
        // The first message is lost: the second finds a gap.
        let gap = deliver(&mut m, 1, &sent[1]);
        assert!(matches!(gap, Response::ReplicaGap { next_lsn: 1 }));
        let Shipped::Resend(again) = s.on_reply(1, Ok(gap)) else {
            panic!("resend")
        };
        assert_eq!(again.len(), 2);
        for req in &again {
            let reply = deliver(&mut m, 2, req);
            s.on_reply(2, Ok(reply));
        }
        s.on_local_synced(3);
        assert_eq!(s.durable_next(), 3);
        assert_eq!(m.space().read(0, 4), &[2; 4], "applied in lsn order");
        m.promote(2);
        let refused = deliver(&mut m, 3, &s.to_send(0, true)[0]);
        let Response::Error { code, message } = refused else {
            panic!("{refused:?}")
        };
        assert!(matches!(
            s.on_reply(3, Err((code, message))),
            Shipped::Stale(_)
        ));
        assert!(
            !m.may_take_over(2 + PRIMARY_LEASE_MS),
            "the last acknowledgement's lease still runs"
        );
        assert!(m.may_take_over(2 + PRIMARY_LEASE_MS + crate::mirror::TAKE_OVER_MARGIN_MS));
    }

    #[test]
    fn a_restarting_primary_adopts_the_records_only_its_mirror_holds() {
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        m.set_config_epoch(1);
        let records = vec![
            (1, prepare(1, vec![1], 0, 1)),
            (2, prepare(2, vec![1], 4, 2)),
        ];
        let req = Request::Replicate {
            node: 1,
            session: 5,
            config_epoch: 1,
            first_lsn: 1,
            count: 2,
            records: encode_records(&records),
            truncate_below: 0,
            primary_synced: 2,
        };
        let _ = deliver(&mut m, 1, &req);
        let Some((
            _,
            _,
            Response::ReplicaTail {
                first_lsn,
                count,
                records: tail,
            },
        )) = m.on_tail(0, 1, 6, 1, 2).pop()
        else {
            panic!("a tail")
        };
        assert_eq!(
            (first_lsn, count),
            (2, 1),
            "the primary said it synced lsn 1"
        );
        assert_eq!(tail, encode_records(&records[1..]));
        assert!(matches!(
            m.on_tail(0, 2, 6, 0, 2).pop(),
            Some((
                _,
                _,
                Response::Error {
                    code: ErrorCode::StaleConfig,
                    ..
                }
            ))
        ));
        let stale = deliver(&mut m, 2, &req);
        assert!(
            matches!(
                stale,
                Response::Error {
                    code: ErrorCode::NotReady,
                    ..
                }
            ),
            "the earlier primary process is refused once a new one asked: {stale:?}"
        );
    }

    #[test]
    fn a_tail_is_answered_only_once_every_record_appended_is_durable() {
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 1, vec![], 0);
        let records = vec![(1, prepare(1, vec![1], 0, 1))];
        let msg = Replicate {
            session: 5,
            config_epoch: 1,
            first_lsn: 1,
            records: &encode_records(&records),
            truncate_below: 0,
            primary_synced: 1,
        };
        let acts = m.on_replicate(0, 0, 1, msg);
        assert!(acts.append.is_some() && acts.replies.is_empty());
        // The primary restarts without lsn 1: the record on its way to the mirror's disk
        // must be in the tail it adopts, or it would write another at lsn 1.
        assert!(m.on_tail(0, 2, 6, 1, 1).is_empty(), "waits for the sync");
        let replies = m.on_synced(1, 2);
        let tail = replies.iter().find(|r| r.1 == 2).expect("the tail");
        assert!(matches!(
            tail.2,
            Response::ReplicaTail {
                first_lsn: 1,
                count: 1,
                ..
            }
        ));
    }

    #[test]
    fn replies_wait_while_the_lease_has_run_out_and_leave_in_order() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        let reply = |id| (7, id, Response::Released { held: true });
        assert!(s.replies(0, vec![reply(1)]).is_empty(), "no lease yet");
        let _ = s.on_reply(10, Ok(Response::Replicated { next_lsn: 1 }));
        let out = s.replies(20, vec![reply(2)]);
        assert_eq!(out.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s.replies(30, vec![reply(3)]).len(), 1);
        assert!(s.replies(10 + PRIMARY_LEASE_MS, vec![reply(4)]).is_empty());
        assert!(s.release(10 + PRIMARY_LEASE_MS).is_empty());
        let _ = s.on_reply(600, Ok(Response::Replicated { next_lsn: 1 }));
        assert_eq!(s.release(601).len(), 1);
    }

    #[test]
    fn a_joining_mirror_is_counted_once_it_holds_what_the_primary_counted_durable() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(None), 1);
        s.push(0, 1, 2, encode_records(&[(1, prepare(1, vec![1], 0, 1))]));
        assert_eq!(s.on_local_synced(3), 3, "alone: its own disk");
        let terms = s.join(10, "j").unwrap();
        let join = terms.join;
        assert_eq!(
            terms.next_lsn, 3,
            "the seed holds every record below the next one handed over"
        );
        assert_eq!(s.target(), Some("j"));
        assert_eq!(s.mirror(), None, "not in the placement yet");
        s.push(11, 3, 1, encode_records(&[(3, prepare(2, vec![1], 4, 2))]));
        assert_eq!(s.on_local_synced(4), 4, "not counted yet");
        assert!(s.lease_valid(12) && s.joiner_to_name().is_none());
        // Seeded with the records below 3 (and the image), the joiner is a mirror.
        let mut m: Mirror<u32> = Mirror::new(1, Space::anonymous(1 << 16).unwrap(), 3, vec![], 20);
        assert!(s.joiner_heard(15, join));
        let sent = s.to_send(0, true);
        let reply = deliver(&mut m, 20, &sent[0]);
        assert!(matches!(
            s.on_reply(20, Ok(reply)),
            Shipped::Acknowledged { durable_next: 4 }
        ));
        assert_eq!(
            s.joiner_to_name(),
            Some((1, "j")),
            "it holds all the primary counted"
        );
        s.push(21, 4, 1, encode_records(&[(4, prepare(3, vec![1], 4, 3))]));
        assert_eq!(s.on_local_synced(5), 4, "counted: records wait for it");
        assert!(
            !s.lease_valid(20 + PRIMARY_LEASE_MS),
            "and replies for its lease"
        );
        s.set_placement(Placement {
            config_epoch: 2,
            primary: "p".into(),
            mirror: Some("j".into()),
        })
        .unwrap();
        assert!(s.joiner_to_name().is_none());
        let sent = s.to_send(0, false);
        assert_eq!(sent.len(), 1, "what was in flight stands: only lsn 4 goes");
        let reply = deliver(&mut m, 30, &sent[0]);
        assert!(matches!(
            s.on_reply(30, Ok(reply)),
            Shipped::Acknowledged { durable_next: 5 }
        ));
        assert!(s.join(31, "k").is_err(), "a node has one mirror");
    }

    #[test]
    fn a_joiner_that_falls_silent_before_it_is_counted_is_given_up() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(None), 1);
        let join = s.join(0, "j").unwrap().join;
        s.push(1, 1, 1, vec![0; 8]);
        s.give_up_silent_joiner(JOINER_PATIENCE_MS - 1);
        assert_eq!(s.target(), Some("j"));
        s.give_up_silent_joiner(JOINER_PATIENCE_MS);
        assert_eq!(s.target(), None);
        assert!(s.caught_up(), "nothing kept for it");
        assert!(!s.joiner_heard(JOINER_PATIENCE_MS, join));
        let again = s.join(JOINER_PATIENCE_MS + 1, "j").unwrap().join;
        assert!(again > join);
    }

    #[test]
    fn a_placement_that_moved_on_drops_the_joiner_and_what_was_kept_for_it() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(None), 1);
        s.join(0, "j").unwrap();
        s.push(1, 1, 1, vec![0; 8]);
        assert!(!s.caught_up());
        s.set_placement(Placement {
            config_epoch: 2,
            primary: "p".into(),
            mirror: None,
        })
        .unwrap();
        assert_eq!(s.target(), None);
        assert!(s.caught_up(), "nothing kept for a joiner given up");
    }

    #[test]
    fn without_a_mirror_the_primary_relies_on_its_disk_alone() {
        let mut s: Shipper<u32> = Shipper::new(1, 5, placement(Some("m")), 1);
        s.push(0, 1, 1, vec![0; 8]);
        assert_eq!(s.on_local_synced(2), 1);
        let alone = Placement {
            config_epoch: 2,
            primary: "p".into(),
            mirror: None,
        };
        s.set_placement(alone.clone()).unwrap();
        assert_eq!(s.durable_next(), 1, "until it registered alone");
        s.confirm_alone(&alone);
        assert_eq!(s.durable_next(), 2);
        assert!(s.lease_valid(0));
        assert!(s.to_send(0, true).is_empty());
        let replaced = s.set_placement(Placement {
            config_epoch: 3,
            primary: "m".into(),
            mirror: None,
        });
        assert!(replaced.is_err());
    }
}
