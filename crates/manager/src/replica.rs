//! One manager of a Raft group (tikv's `raft` crate, driven through `RawNode` like our
//! participant: no I/O here). The group holds the manager's durable state (`Persisted`: the
//! directory, the epoch, the regions, the sequencer's address); each entry is that state
//! whole, after a change. Only the leader serves: it runs the `ManagerState` over the state
//! as of its log's last entry, proposes every change, and holds each reply until the log is
//! committed as far as it was when the reply was made, so no reply tells of a state the
//! group could still lose. The others answer `NotLeader`.

use crate::raft_store::RaftStore;
use crate::state::{ManagerState, Persisted, RecoveryBatch};
use protobuf::Message as _;
use raft::eraftpb::{Entry, EntryType, Message};
use raft::{RawNode, StateRole, Storage};
use std::collections::VecDeque;
use tutti_wire::{ErrorCode, ManagerStatus, Request, Response};

/// Entries kept after the snapshot before they are folded into it: each is the whole
/// state, so a longer log only costs disk and time at start.
const COMPACT_AFTER_ENTRIES: usize = 64;

#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This manager's Raft id: its place in `peers`, from 1.
    pub id: u64,
    /// Every manager's address, in Raft id order.
    pub peers: Vec<String>,
    pub failure_timeout_ms: u64,
    /// A replicated node's primary silent this long is replaced by its mirror; a mirror
    /// its primary reports failing it this long is dropped.
    pub failover_timeout_ms: u64,
    /// Ticks without a leader before a follower stands (raft randomizes it up to twice
    /// this, unless `fixed_election` holds).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// An election timeout of exactly `election_ticks`: the simulator varies it per
    /// replica from its seed instead, since raft draws from a random generator of its own.
    pub fixed_election: bool,
}

/// What the driver must do, in this order: write `persist` (replacing what it wrote before)
/// and sync it; send `messages` to the peers (by Raft id) and `replies`; run `recoveries`.
pub struct Actions<R> {
    pub persist: Option<Vec<u8>>,
    pub messages: Vec<(u64, Vec<u8>)>,
    pub replies: Vec<(R, u64, Response)>,
    pub recoveries: Vec<RecoveryBatch>,
}

impl<R> Default for Actions<R> {
    fn default() -> Self {
        Actions {
            persist: None,
            messages: Vec::new(),
            replies: Vec::new(),
            recoveries: Vec::new(),
        }
    }
}

/// A reply held back: until the log is applied up to `index`, and for a read (`read`: its
/// batch), until a ReadIndex confirmed that this replica still led after it was made.
struct Waiting<R> {
    index: u64,
    read: Option<u64>,
    reply_to: R,
    id: u64,
    resp: Response,
}

pub struct Replica<R> {
    cfg: ReplicaConfig,
    raw: RawNode<RaftStore>,
    /// The state machine, while this replica leads.
    leading: Option<ManagerState>,
    /// The state as of the last entry of the log (what a new leader starts from).
    latest: Persisted,
    /// The state as of `applied` (what a snapshot holds).
    applied_data: Vec<u8>,
    applied: u64,
    /// Replies waiting for the log to be committed up to their index, and those of reads
    /// for the leadership they were made under to be confirmed.
    pending: VecDeque<Waiting<R>>,
    /// The next batch of reads to confirm with a ReadIndex (a round of heartbeats that a
    /// majority answers), whether any waits in it, and the last batch confirmed.
    read_batch: u64,
    read_wanted: bool,
    read_confirmed: u64,
}

fn decode_state(bytes: &[u8]) -> Result<Persisted, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("a state in the Raft log: {e}"))
}

fn encode_state(state: &Persisted) -> Vec<u8> {
    serde_json::to_vec(state).expect("the state serializes")
}

/// The state as of the last entry of `store`.
fn last_state(store: &RaftStore) -> Result<Persisted, String> {
    let last = store
        .entries_after_snapshot()
        .iter()
        .rev()
        .find_map(carried);
    decode_state(last.unwrap_or(store.snapshot_data()))
}

/// The state an entry carries, if it carries one (a new leader's first entry is empty).
fn carried(e: &Entry) -> Option<&[u8]> {
    (e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty()).then_some(&e.data[..])
}

impl<R> Replica<R> {
    /// The replica over what it stored last (`stored`), or, at its first start, a group
    /// whose state begins as `initial` (the same on every replica).
    pub fn open(
        cfg: ReplicaConfig,
        stored: Option<&[u8]>,
        initial: &Persisted,
    ) -> Result<Replica<R>, String> {
        let n = cfg.peers.len() as u64;
        if cfg.id == 0 || cfg.id > n {
            return Err(format!("manager id {} is not one of 1..={n}", cfg.id));
        }
        let voters: Vec<u64> = (1..=n).collect();
        let store = match stored {
            Some(bytes) => RaftStore::decode(bytes)?,
            None => RaftStore::bootstrap(&voters, encode_state(initial)),
        };
        let group = store.initial_state().map_err(|e| e.to_string())?.conf_state;
        if group.voters != voters {
            return Err(format!(
                "the stored group has managers {:?}, not the {n} given",
                group.voters
            ));
        }
        let applied_data = store.snapshot_data().to_vec();
        let latest = last_state(&store)?;
        let applied = store.first_index().map_err(|e| e.to_string())? - 1;
        let mut config = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied,
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 64,
            ..Default::default()
        };
        if cfg.fixed_election {
            config.min_election_tick = cfg.election_ticks;
            config.max_election_tick = cfg.election_ticks + 1;
        }
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&config, store, &logger).map_err(|e| e.to_string())?;
        if n == 1 {
            // Alone, it needs no election timeout to learn that it leads.
            raw.campaign().map_err(|e| e.to_string())?;
        }
        Ok(Replica {
            cfg,
            raw,
            leading: None,
            latest,
            applied_data,
            applied,
            pending: VecDeque::new(),
            read_batch: 1,
            read_wanted: false,
            read_confirmed: 0,
        })
    }

    pub fn is_leader(&self) -> bool {
        self.leading.is_some()
    }

    /// The leader's address, as far as this replica knows.
    pub fn leader(&self) -> Option<&str> {
        let id = self.raw.raft.leader_id;
        (id != 0).then(|| self.cfg.peers.get(id as usize - 1).map(String::as_str))?
    }

    /// The durable state as of the last entry of this replica's log.
    pub fn latest(&self) -> &Persisted {
        &self.latest
    }

    /// Where this replica stands in its group.
    pub fn status(&self) -> ManagerStatus {
        let raft = &self.raw.raft;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        ManagerStatus {
            id: self.cfg.id,
            managers: self.cfg.peers.len() as u64,
            role: role.into(),
            term: raft.term,
            leader: self.leader().map(str::to_string),
            last_index: raft.raft_log.last_index(),
            commit: raft.raft_log.committed,
            applied: self.applied,
            epoch: self.latest.epoch(),
        }
    }

    /// Advances the Raft clock by one tick (elections, heartbeats); the leader looks for
    /// replicated nodes that lost a copy.
    pub fn tick(&mut self, now_ms: u64) -> Actions<R> {
        let mut acts = Actions::default();
        self.raw.tick();
        let timeout_ms = self.cfg.failover_timeout_ms;
        let failed_over = (self.leading.as_mut()).and_then(|s| s.fail_over(now_ms, timeout_ms));
        if let Some(state) = failed_over {
            self.propose(&state);
        }
        self.drain(&mut acts, now_ms);
        acts
    }

    /// Starts the next epoch, if this replica leads.
    pub fn advance_epoch(&mut self, now_ms: u64) -> Actions<R> {
        let mut acts = Actions::default();
        if let Some(state) = &mut self.leading {
            let written = state.advance_epoch();
            self.propose(&written);
        }
        self.drain(&mut acts, now_ms);
        acts
    }

    pub fn recovery_done(&mut self, batch: &RecoveryBatch) {
        if let Some(state) = &mut self.leading {
            state.recovery_done(batch);
        }
    }

    pub fn on_request(&mut self, now_ms: u64, reply_to: R, id: u64, req: Request) -> Actions<R> {
        let mut acts = Actions::default();
        if let Request::Raft(bytes) = req {
            match Message::parse_from_bytes(&bytes) {
                // A message of an old term or from a stranger is dropped by raft itself.
                Ok(msg) => {
                    let _ = self.raw.step(msg);
                }
                Err(e) => tracing::warn!("an undecodable Raft message: {e}"),
            }
            self.drain(&mut acts, now_ms);
            return acts;
        }
        if let Request::ManagerStatus = req {
            let status = self.status();
            acts.replies
                .push((reply_to, id, Response::ManagerStatus(Box::new(status))));
            return acts;
        }
        let Some(state) = &mut self.leading else {
            let leader = self.leader().map(str::to_string);
            acts.replies
                .push((reply_to, id, Response::NotLeader { leader }));
            return acts;
        };
        let (resp, written) = match req {
            Request::Register {
                node,
                addr,
                size_bytes,
                durable,
                rebooted,
                mirror,
            } => state.register(now_ms, node, addr, size_bytes, durable, rebooted, mirror),
            Request::AddMirror {
                node,
                config_epoch,
                primary,
                mirror,
            } => state.add_mirror(now_ms, node, config_epoch, &primary, mirror),
            Request::AbandonJoin {
                node,
                config_epoch,
                mirror,
            } => state.abandon_join(node, config_epoch, &mirror),
            Request::Placement { node } => (Response::Placement(state.placement(node)), None),
            Request::FormerPrimary {
                node,
                addr,
                config_epoch,
            } => (state.former_primary(now_ms, node, addr, config_epoch), None),
            Request::MirrorHeartbeat { node, addr, .. } => {
                (state.mirror_heartbeat(now_ms, node, &addr), None)
            }
            Request::Directory => {
                let directory = state.directory(now_ms, self.cfg.failure_timeout_ms);
                (Response::Directory(directory), None)
            }
            Request::Heartbeat {
                node,
                uncertain,
                applied,
                applied_below,
                mirror_behind_ms,
            } => {
                let (resp, batch) = state.heartbeat(
                    now_ms,
                    node,
                    uncertain,
                    applied,
                    applied_below,
                    mirror_behind_ms,
                );
                acts.recoveries.extend(batch);
                (resp, None)
            }
            other => state.region_request(other).unwrap_or_else(|| {
                let message = "the manager serves Register, Directory, Heartbeat, regions and the sequencer's address";
                let refused = Response::Error {
                    code: ErrorCode::Unsupported,
                    message: message.into(),
                };
                (refused, None)
            }),
        };
        // A change proves the leadership it was made under by committing; a read needs a
        // ReadIndex: a deposed leader that has not heard of it yet must not answer.
        let read = match written {
            Some(written) if !self.propose(&written) => {
                let leader = self.leader().map(str::to_string);
                acts.replies
                    .push((reply_to, id, Response::NotLeader { leader }));
                self.drain(&mut acts, now_ms);
                return acts;
            }
            Some(_) => None,
            None => {
                self.read_wanted = true;
                Some(self.read_batch)
            }
        };
        let index = self.raw.raft.raft_log.last_index();
        if crate::planted(crate::Bug::ReplyBeforeCommit) {
            acts.replies.push((reply_to, id, resp));
        } else {
            self.pending.push_back(Waiting {
                index,
                read,
                reply_to,
                id,
                resp,
            });
        }
        self.drain(&mut acts, now_ms);
        acts
    }

    /// Proposes `state` as the group's next state; false if raft refused (no longer the
    /// leader), and the state machine then starts again from the log's last state.
    fn propose(&mut self, state: &Persisted) -> bool {
        if self.raw.propose(vec![], encode_state(state)).is_ok() {
            return true;
        }
        let incarnation = self.incarnation();
        if let Some(s) = &mut self.leading {
            *s = ManagerState::new(self.latest.clone(), incarnation);
        }
        false
    }

    /// Differs for each term this replica leads in, so that the nodes tell a new leader's
    /// GC relay (which holds none of their earlier reports) from the one before.
    fn incarnation(&self) -> u64 {
        self.raw.raft.term << 8 | self.cfg.id
    }

    /// Takes every `Ready` raft has: stores what it says to (into `acts.persist`), sends its
    /// messages, applies committed entries and releases the replies they were holding.
    fn drain(&mut self, acts: &mut Actions<R>, now_ms: u64) {
        let mut stored = false;
        loop {
            self.ask_read_index();
            if !self.raw.has_ready() {
                break;
            }
            let mut rd = self.raw.ready();
            acts.messages.extend(encode(rd.take_messages()));
            for rs in rd.take_read_states() {
                self.read_confirmed(rs.index, &rs.request_ctx);
            }
            if !rd.snapshot().is_empty() {
                let snapshot = rd.snapshot().clone();
                match decode_state(&snapshot.data) {
                    Ok(state) => self.latest = state,
                    Err(e) => tracing::error!("the leader's snapshot: {e}"),
                }
                self.applied = snapshot.get_metadata().index;
                self.applied_data = snapshot.data.to_vec();
                self.raw.mut_store().apply_snapshot(snapshot);
                stored = true;
            }
            if !rd.entries().is_empty() {
                self.raw.mut_store().append(rd.entries());
                // The entries may have replaced a tail of an old leader's that carried a state.
                match last_state(self.raw.store()) {
                    Ok(state) => self.latest = state,
                    Err(e) => tracing::error!("{e}"),
                }
                stored = true;
            }
            if let Some(hs) = rd.hs() {
                self.raw.mut_store().set_hard_state(hs.clone());
                stored = true;
            }
            if let Some(ss) = rd.ss() {
                let leads = ss.raft_state == StateRole::Leader;
                self.role_changed(acts, now_ms, leads);
            }
            acts.messages.extend(encode(rd.take_persisted_messages()));
            self.apply(rd.take_committed_entries());
            let mut light = self.raw.advance(rd);
            if let Some(commit) = light.commit_index() {
                self.raw.mut_store().set_commit(commit);
                stored = true;
            }
            acts.messages.extend(encode(light.take_messages()));
            self.apply(light.take_committed_entries());
            self.raw.advance_apply();
        }
        self.release(acts);
        if stored {
            let kept = self.raw.store().entries_after_snapshot().len();
            if kept > COMPACT_AFTER_ENTRIES {
                let data = self.applied_data.clone();
                self.raw.mut_store().compact(self.applied, data);
            }
            acts.persist = Some(self.raw.store().encode());
        }
    }

    fn role_changed(&mut self, acts: &mut Actions<R>, now_ms: u64, leads: bool) {
        match (leads, self.leading.is_some()) {
            (true, false) => {
                let mut state = ManagerState::new(self.latest.clone(), self.incarnation());
                // The nodes have been heard from, by the leader before.
                state.presume_alive(now_ms);
                self.leading = Some(state);
                tracing::info!(term = self.raw.raft.term, "leading the manager group");
            }
            (false, true) => {
                self.leading = None;
                self.read_wanted = false;
                let leader = self.leader().map(str::to_string);
                for w in self.pending.drain(..) {
                    let leader = leader.clone();
                    acts.replies
                        .push((w.reply_to, w.id, Response::NotLeader { leader }));
                }
            }
            _ => {}
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for e in &entries {
            if let Some(bytes) = carried(e) {
                self.applied_data = bytes.to_vec();
            }
            self.applied = e.index;
        }
    }

    /// Sends the replies whose index is applied and whose read, if any, was confirmed.
    fn release(&mut self, acts: &mut Actions<R>) {
        while self.pending.front().is_some_and(|w| {
            w.index <= self.applied && w.read.is_none_or(|b| b <= self.read_confirmed)
        }) {
            let w = self.pending.pop_front().expect("present");
            acts.replies.push((w.reply_to, w.id, w.resp));
        }
    }

    /// Asks raft to confirm the reads waiting since the last ReadIndex, once this leader has
    /// committed an entry of its term (raft drops a ReadIndex before that).
    fn ask_read_index(&mut self) {
        let log = &self.raw.raft.raft_log;
        let committed_in_term = log.term(log.committed).ok() == Some(self.raw.raft.term);
        if self.read_wanted && self.leading.is_some() && committed_in_term {
            self.raw.read_index(self.read_batch.to_le_bytes().to_vec());
            self.read_batch += 1;
            self.read_wanted = false;
        }
    }

    /// A ReadIndex came back: this replica led when the reads of its batch were made, and
    /// they may be answered once the log is applied up to `index`.
    fn read_confirmed(&mut self, index: u64, ctx: &[u8]) {
        let Ok(batch) = <[u8; 8]>::try_from(ctx).map(u64::from_le_bytes) else {
            return;
        };
        for w in &mut self.pending {
            if w.read.is_some_and(|b| b <= batch) {
                w.index = w.index.max(index);
            }
        }
        self.read_confirmed = self.read_confirmed.max(batch);
    }
}

fn encode(messages: Vec<Message>) -> impl Iterator<Item = (u64, Vec<u8>)> {
    messages.into_iter().map(|m| {
        let bytes = m.write_to_bytes().expect("a Raft message encodes");
        (m.to, bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_wire::NodeId;

    /// Three replicas over a perfect network; `down` ones neither send nor receive. Each
    /// keeps only what it persisted when it is restarted.
    struct Group {
        replicas: Vec<Option<Replica<u32>>>,
        disks: Vec<Option<Vec<u8>>>,
        replies: Vec<(u32, Response)>,
        now_ms: u64,
        /// A replica paused and cut off from the others (a stopped process): it gets no
        /// ticks, and messages to and from it are lost.
        isolated: Option<usize>,
    }

    fn config(id: u64) -> ReplicaConfig {
        ReplicaConfig {
            id,
            peers: vec!["m1".into(), "m2".into(), "m3".into()],
            failure_timeout_ms: 3000,
            failover_timeout_ms: 1000,
            election_ticks: 10 + id as usize * 3,
            heartbeat_ticks: 2,
            fixed_election: true,
        }
    }

    impl Group {
        fn new() -> Group {
            let mut g = Group {
                replicas: vec![],
                disks: vec![None, None, None],
                replies: vec![],
                now_ms: 0,
                isolated: None,
            };
            for id in 1..=3 {
                g.replicas.push(Some(g.open(id)));
            }
            g
        }

        fn open(&self, id: u64) -> Replica<u32> {
            let disk = self.disks[id as usize - 1].as_deref();
            Replica::open(config(id), disk, &Persisted::fresh()).unwrap()
        }

        fn take(&mut self, from: usize, acts: Actions<u32>, inbox: &mut Vec<(u64, Vec<u8>)>) {
            if let Some(bytes) = acts.persist {
                self.disks[from] = Some(bytes);
            }
            let cut = |i: usize| self.isolated == Some(i);
            let sent = acts.messages.into_iter();
            inbox.extend(sent.filter(|(to, _)| !cut(from) && !cut(*to as usize - 1)));
            self.replies
                .extend(acts.replies.into_iter().map(|(r, _, resp)| (r, resp)));
        }

        /// Ticks every replica `ticks` times, delivering every message between ticks.
        fn run(&mut self, ticks: usize) {
            for _ in 0..ticks {
                self.now_ms += 50;
                let mut inbox = vec![];
                for i in 0..3 {
                    if self.isolated == Some(i) {
                        continue;
                    }
                    if let Some(r) = &mut self.replicas[i] {
                        let acts = r.tick(self.now_ms);
                        self.take(i, acts, &mut inbox);
                    }
                }
                while !inbox.is_empty() {
                    for (to, bytes) in std::mem::take(&mut inbox) {
                        let i = to as usize - 1;
                        if let Some(r) = &mut self.replicas[i] {
                            let acts = r.on_request(self.now_ms, 0, 0, Request::Raft(bytes));
                            self.take(i, acts, &mut inbox);
                        }
                    }
                }
            }
        }

        fn leader(&self) -> Option<usize> {
            (0..3).find(|&i| self.replicas[i].as_ref().is_some_and(|r| r.is_leader()))
        }

        fn ask(&mut self, i: usize, tag: u32, req: Request) {
            let now_ms = self.now_ms;
            let acts = self.replicas[i]
                .as_mut()
                .unwrap()
                .on_request(now_ms, tag, 1, req);
            let mut inbox = vec![];
            self.take(i, acts, &mut inbox);
            while !inbox.is_empty() {
                for (to, bytes) in std::mem::take(&mut inbox) {
                    let j = to as usize - 1;
                    if let Some(r) = &mut self.replicas[j] {
                        let acts = r.on_request(now_ms, 0, 0, Request::Raft(bytes));
                        self.take(j, acts, &mut inbox);
                    }
                }
            }
        }
    }

    fn register(node: NodeId) -> Request {
        Request::Register {
            node,
            addr: format!("127.0.0.1:{node}"),
            size_bytes: 4096,
            durable: true,
            rebooted: false,
            mirror: None,
        }
    }

    #[test]
    fn a_change_is_answered_once_committed_and_survives_its_leader() {
        let mut g = Group::new();
        g.run(40);
        let leader = g.leader().expect("a leader within 40 ticks");
        let follower = (leader + 1) % 3;
        g.ask(follower, 7, Request::Directory);
        assert!(
            matches!(
                &g.replies[..],
                [(7, Response::NotLeader { leader: Some(_) })]
            ),
            "{:?}",
            g.replies
        );
        g.ask(leader, 8, register(5));
        assert!(
            matches!(g.replies.last(), Some((8, Response::Registered { .. }))),
            "{:?}",
            g.replies
        );
        // The leader dies, and comes back from its disk after another one leads.
        g.replicas[leader] = None;
        g.run(80);
        let next = g.leader().expect("a new leader");
        assert_ne!(next, leader);
        g.replicas[leader] = Some(g.open(leader as u64 + 1));
        g.run(10);
        g.ask(next, 9, Request::Directory);
        match g.replies.last() {
            Some((9, Response::Directory(d))) => assert_eq!(d.nodes.len(), 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(g.replicas[leader].as_ref().unwrap().latest().nodes_len(), 1);
    }

    #[test]
    fn a_reply_is_held_while_its_change_cannot_commit() {
        let mut g = Group::new();
        g.run(40);
        let leader = g.leader().unwrap();
        let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        for &i in &others {
            g.replicas[i] = None;
        }
        g.ask(leader, 3, register(4));
        assert!(g.replies.is_empty(), "{:?}", g.replies);
        // Without a quorum it steps down (check_quorum), and says so.
        g.run(60);
        assert!(
            matches!(&g.replies[..], [(3, Response::NotLeader { .. })]),
            "{:?}",
            g.replies
        );
    }

    #[test]
    fn a_leader_cut_off_answers_no_read_from_a_state_the_others_moved_past() {
        let mut g = Group::new();
        g.run(40);
        let old = g.leader().unwrap();
        g.isolated = Some(old);
        // The others elect a leader and register a node; the old one has not heard.
        g.run(60);
        let new = (0..3).find(|&i| i != old && g.replicas[i].as_ref().unwrap().is_leader());
        let new = new.expect("the majority elects a leader");
        g.ask(new, 1, register(9));
        assert!(matches!(
            g.replies.last(),
            Some((1, Response::Registered { .. }))
        ));
        // Paused all along, the old leader still takes itself for the leader. Asked for
        // the directory, it must not answer with one that lacks node 9: it waits until it
        // hears from the others, then says it does not lead.
        assert!(g.replicas[old].as_ref().unwrap().is_leader());
        g.ask(old, 2, Request::Directory);
        assert!(
            g.replies.iter().all(|(tag, _)| *tag != 2),
            "{:?}",
            g.replies
        );
        g.isolated = None;
        g.run(10);
        let answer = g.replies.iter().find(|(tag, _)| *tag == 2);
        assert!(
            matches!(answer, Some((2, Response::NotLeader { .. }))),
            "{answer:?}"
        );
    }

    #[test]
    fn compaction_keeps_a_lagging_replica_in_step() {
        let mut g = Group::new();
        g.run(40);
        let leader = g.leader().unwrap();
        let lagging = (leader + 1) % 3;
        g.replicas[lagging] = None;
        for node in 1..=(COMPACT_AFTER_ENTRIES as u32 * 2) {
            g.ask(leader, node, register(node as NodeId));
        }
        g.replicas[lagging] = Some(g.open(lagging as u64 + 1));
        g.run(20);
        let r = g.replicas[lagging].as_ref().unwrap();
        assert_eq!(r.latest().nodes_len(), COMPACT_AFTER_ENTRIES * 2);
        assert!(g.disks[leader].as_ref().unwrap().len() < 64 << 10);
    }
}
