//! The driver of coherent caching (docs/fs.md, "Coherent caching"): joins the volume's
//! member table, renews the lease, announces each write to the other members before it
//! commits, takes their announcements, and revokes members that stop answering. The rules
//! themselves are `coherence`'s.

use crate::coherence::{
    self, Announcement, Grant, Member, Members, Rejoins, Stamp, Trust, ACK_TIMEOUT_MS,
};
use crate::layout::{Ino, Volume, INODE_BYTES};
use crate::volume::{FileSystem, FsError};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tutti_client::Minitx;
use tutti_wire::{Connection, NodeId, Request, Response};

/// What another member's write changed, for the kernel to forget what it keeps of it.
#[derive(Clone, Copy, Debug)]
pub enum Changed<'a> {
    /// Everything: this member's lease lapsed or it was revoked.
    All,
    /// `ranges`, which hold the inodes `inodes` (and perhaps directory buckets).
    Ranges {
        ranges: &'a [(NodeId, u64, u32)],
        inodes: &'a [Ino],
    },
}

/// What makes the kernel forget the attributes and entries a change covers: picks, at once,
/// those it was let keep and returns the notices to send it, which may block (an entry's
/// takes its directory's lock in the kernel); `None` if it keeps none of them.
pub type Forget = Box<dyn Fn(Changed<'_>) -> Option<Notices> + Send + Sync>;
pub type Notices = Box<dyn FnOnce() + Send>;

/// This process's place among the volume's members.
pub(crate) struct Membership {
    token: u64,
    slot: usize,
    callback: Option<SocketAddr>,
    members: Members,
    /// Other members' renewal counts as last seen, and since when (ms).
    seen: HashMap<u64, (u64, u64)>,
}

impl Membership {
    /// The member table as read now; says when this member starts or stops being the only
    /// one that caches (what decides whether the kernel keeps entries). A member without a
    /// callback caches nothing either way.
    fn learn(&mut self, members: Members) {
        let (was, is) = (self.members.peers(self.token), members.peers(self.token));
        match (self.callback.is_some(), was.is_empty(), is.is_empty()) {
            (true, false, true) => {
                tracing::info!("no other member caches: the kernel may keep entries")
            }
            (true, true, false) => tracing::info!(
                others = is.len(),
                "other members cache: the kernel keeps no entries"
            ),
            _ => {}
        }
        self.members = members;
    }
}

/// A `FileSystem`'s coherence state.
pub(crate) struct Coherent {
    born: Instant,
    lease_ms: u64,
    membership: Mutex<Option<Membership>>,
    /// Taken after the mount's cache where both are held (never the other way round).
    trust: Mutex<Trust>,
    seq: AtomicU64,
    forget: OnceLock<Forget>,
    peers: Mutex<HashMap<SocketAddr, Arc<Connection>>>,
    /// Held while joining; holds the callback this member takes invalidations on (`None`
    /// for one that caches nothing), which it joins with again once revoked and its wait
    /// is over (`rejoins`).
    joining: tokio::sync::Mutex<Option<SocketAddr>>,
    rejoins: Mutex<Rejoins>,
}

impl Coherent {
    pub(crate) fn new(lease_ms: u64) -> Coherent {
        Coherent {
            born: Instant::now(),
            lease_ms,
            membership: Mutex::new(None),
            trust: Mutex::new(Trust::new(lease_ms)),
            seq: AtomicU64::new(1),
            forget: OnceLock::new(),
            peers: Mutex::new(HashMap::new()),
            joining: tokio::sync::Mutex::new(None),
            rejoins: Mutex::new(Rejoins::default()),
        }
    }
}

/// The inodes whose bytes `len` bytes at `addr` of `node` cover.
fn inodes_in(vol: &Volume, node: NodeId, addr: u64, len: u64) -> Vec<Ino> {
    if !vol.holds(node) {
        return vec![];
    }
    let g = &vol.geometry;
    let table = vol.inode_addr(Ino::new(node, 0));
    let table_end = table + g.inodes_per_node * INODE_BYTES;
    let (from, to) = (addr.max(table), (addr + len).min(table_end));
    if from >= to {
        return vec![];
    }
    let (first, last) = ((from - table) / INODE_BYTES, (to - 1 - table) / INODE_BYTES);
    (first..=last).map(|slot| Ino::new(node, slot)).collect()
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl FileSystem {
    fn coherent(&self) -> &Coherent {
        &self.coherent
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.coherent().born.elapsed().as_millis() as u64
    }

    fn trust(&self) -> std::sync::MutexGuard<'_, Trust> {
        self.coherent().trust.lock().expect("trust poisoned")
    }

    fn membership(&self) -> std::sync::MutexGuard<'_, Option<Membership>> {
        (self.coherent().membership.lock()).expect("membership poisoned")
    }

    /// What this member knows now: take it before reading, for `attr_ttl` and trust.
    pub fn stamp(&self) -> Stamp {
        self.trust().stamp()
    }

    /// `f` of what this member's trust grants now to bytes read since `stamp`, under the
    /// trust's lock.
    pub(crate) fn granted<R>(&self, stamp: Stamp, f: impl FnOnce(&Grant<'_>) -> R) -> R {
        let now = self.now_ms();
        f(&self.trust().grant(stamp, now))
    }

    /// A write of this member's own of `ranges` begins or ends: reads of them in flight may
    /// have seen either side of it, so what they read of them is not trusted. Returns the
    /// stamp after it.
    pub(crate) fn own_write(&self, ranges: &[(NodeId, u64, u32)]) -> Stamp {
        let mut trust = self.trust();
        trust.moved(ranges);
        trust.stamp()
    }

    /// Stops trusting anything cached (a write of this member may have committed unseen).
    pub(crate) fn distrust_all(&self) {
        self.trust().distrust();
    }

    /// How long the kernel may keep the attributes of `ino` this member read since `stamp`.
    pub fn attr_ttl(&self, stamp: Stamp, ino: Ino) -> Duration {
        self.ttl(
            stamp,
            (ino.node(), self.volume().inode_addr(ino), INODE_BYTES),
        )
    }

    /// How long the kernel may keep what it was told of `len` bytes at `addr` of `node`, read
    /// since `stamp`.
    pub fn ttl(&self, stamp: Stamp, bytes: (NodeId, u64, u64)) -> Duration {
        let now = self.now_ms();
        Duration::from_millis(self.trust().ttl_ms(stamp, bytes, now))
    }

    /// How long a lease lasts: nothing is trusted longer past a renewal.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.coherent().lease_ms)
    }

    /// Whether no other member takes invalidations, as far as this one knows. A member that
    /// joins later knows of this one, so two members never both believe it.
    pub fn caches_alone(&self) -> bool {
        (self.membership().as_ref()).is_some_and(|m| m.members.peers(m.token).is_empty())
    }

    /// Sets what tells the kernel to forget attributes and entries (the mount's notifier).
    pub fn on_forget(&self, forget: Forget) {
        let _ = self.coherent().forget.set(forget);
    }

    /// The membership version and this member's token, joining first if this process is
    /// not a member (with its callback, if it has one and no revocation keeps it from it:
    /// none for a member that caches nothing, such as fsck).
    pub(crate) async fn member(&self) -> Result<(u64, u64), FsError> {
        if let Some(known) = self.member_now() {
            return Ok(known);
        }
        self.join_again().await?;
        self.member_now()
            .ok_or_else(|| FsError::Cluster("not a member".into()))
    }

    fn member_now(&self) -> Option<(u64, u64)> {
        (self.membership().as_ref()).map(|m| (m.members.version, m.token))
    }

    /// The volume's member table as it is now.
    pub async fn members(&self) -> Result<Members, FsError> {
        let vol = self.volume();
        let (node, addr, len) = coherence::table_read(&vol);
        let read = Minitx::new().read(node, addr, len).class("fs-members");
        let until = Instant::now() + self.deadline;
        let header = crate::volume::exec(&self.cluster, &read, until).await?;
        Ok(Members::decode(&header.reads[0]))
    }

    /// Takes a slot in the volume's member table (`callback`: where this member takes
    /// invalidations; `None` for one that caches nothing). Its lease starts.
    pub async fn join(&self, callback: Option<SocketAddr>) -> Result<(), FsError> {
        let mut wanted = self.coherent().joining.lock().await;
        *wanted = callback;
        self.take_slot(self.callback_due(callback)).await
    }

    /// Joins with this member's callback if its wait after a revocation is over, else
    /// without one; a member that holds a slot without its callback takes the callback
    /// there once the wait is over.
    async fn join_again(&self) -> Result<(), FsError> {
        let wanted = self.coherent().joining.lock().await;
        self.take_slot(self.callback_due(*wanted)).await
    }

    fn callback_due(&self, callback: Option<SocketAddr>) -> Option<SocketAddr> {
        let rejoins = self.coherent().rejoins.lock().expect("rejoins poisoned");
        callback.filter(|_| rejoins.may_take_invalidations(self.now_ms()))
    }

    /// Holds a slot with `callback`: this member's own with the callback set there, or a free
    /// one. The caller holds `joining`. Only a member with a callback trusts what it reads
    /// (the others announce nothing to one without), and only what it reads once it holds it.
    async fn take_slot(&self, callback: Option<SocketAddr>) -> Result<(), FsError> {
        let held = (self.membership().as_ref()).map(|m| (m.callback, m.token));
        if held.is_some_and(|(c, _)| c == callback) {
            return Ok(());
        }
        let until = Instant::now() + self.deadline;
        loop {
            let members = self.members().await?;
            let own = held.and_then(|(_, token)| Some((members.slot_of(token)?, token)));
            let (slot, old, me) = match own {
                Some((slot, token)) => {
                    let was = members.slots[slot].clone().expect("a member's slot");
                    (slot, token, Member { callback, ..was })
                }
                None => {
                    let Some(slot) = members.slots.iter().position(Option::is_none) else {
                        return Err(FsError::Members(format!(
                            "the volume has {} members already (mounts, fsck, grow): unmount \
                             one, or wait for a dead one's slot to be reclaimed (3 leases)",
                            coherence::SLOTS
                        )));
                    };
                    let me = Member {
                        token: rand::random::<u64>() | 1,
                        renewals: 0,
                        lease_ms: self.coherent().lease_ms as u32,
                        callback,
                        joined_unix_s: unix_s(),
                        pid: std::process::id(),
                    };
                    (slot, 0, me)
                }
            };
            let vol = self.volume();
            let tx = coherence::membership_minitx(&vol, members.version, slot, old, Some(&me));
            let sent = self.now_ms();
            let outcome = crate::volume::exec(&self.cluster, &tx, until).await?;
            if outcome.committed {
                let mut members = members;
                members.version += 1;
                members.slots[slot] = Some(me.clone());
                let takes = callback.is_some();
                tracing::info!(slot, token = me.token, takes, "joined the volume's members");
                *self.membership() = Some(Membership {
                    token: me.token,
                    slot,
                    callback,
                    members,
                    seen: HashMap::new(),
                });
                if takes {
                    (self.coherent().rejoins.lock().expect("rejoins poisoned"))
                        .took_invalidations(self.now_ms());
                    self.trust().took_invalidations(sent);
                }
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(FsError::Deadline("joining the volume's members".into()));
            }
            // The grow that changed the node count, or another member's change: again.
            self.refresh_volume().await?;
        }
    }

    /// Gives this member's slot up (unmount); what it cached is no longer kept coherent.
    /// Waits at most three leases: the others reclaim a slot that long without renewals
    /// anyway, so a mount whose cluster is gone does not wait out its deadline to exit.
    pub async fn leave(&self) {
        let Some(m) = self.membership().take() else {
            return;
        };
        self.trust().lapse();
        let bound = Duration::from_millis(3 * self.coherent().lease_ms);
        match tokio::time::timeout(bound, self.clear_slot(m.slot, m.token)).await {
            Ok(Ok(_)) => tracing::info!(slot = m.slot, "left the volume's members"),
            Ok(Err(e)) => tracing::warn!("leaving the volume's members: {e}"),
            Err(_) => tracing::warn!(
                "leaving the volume's members: no answer within three leases; the others reclaim the slot"
            ),
        }
    }

    /// Frees `slot` if it still holds the member with `token`; returns whether it did.
    async fn clear_slot(&self, slot: usize, token: u64) -> Result<bool, FsError> {
        let until = Instant::now() + self.deadline;
        loop {
            let members = self.members().await?;
            if members.slots[slot].as_ref().map(|m| m.token) != Some(token) {
                return Ok(false);
            }
            let vol = self.volume();
            let tx = coherence::membership_minitx(&vol, members.version, slot, token, None);
            if crate::volume::exec(&self.cluster, &tx, until)
                .await?
                .committed
            {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Err(FsError::Deadline("changing the volume's members".into()));
            }
            // Another change of membership, or a grow, came first: again.
            self.refresh_volume().await?;
        }
    }

    /// Learns the member table again (a write's fence failed, or a renewal is due); if this
    /// member was revoked, it stops trusting and joins again.
    pub(crate) async fn refresh_members(&self) -> Result<(), FsError> {
        let members = self.members().await?;
        let rejoin = {
            let mut guard = self.membership();
            let Some(m) = guard.as_mut() else {
                return Ok(());
            };
            match members.slot_of(m.token) {
                Some(_) => {
                    m.learn(members);
                    None
                }
                None => guard.take().map(|m| m.callback),
            }
        };
        if let Some(callback) = rejoin {
            let wait_ms =
                (self.coherent().rejoins.lock().expect("rejoins poisoned")).revoked(self.now_ms());
            tracing::warn!(
                ?callback,
                wait_ms,
                "revoked from the volume's members (another member could not reach this \
                 one, or it stopped renewing): joining again, caching nothing until the \
                 wait is over"
            );
            self.lose_trust();
            self.join_again().await?;
        }
        Ok(())
    }

    /// Stops trusting anything cached, in user space and in the kernel (whose timeouts
    /// end with the lease anyway).
    fn lose_trust(&self) {
        self.trust().lapse();
        let forget = self.coherent().forget.get();
        if let Some(notices) = forget.and_then(|forget| forget(Changed::All)) {
            // The kernel forgets in the notification's write: off the runtime.
            tokio::task::spawn_blocking(notices);
        }
    }

    /// Announces a write of `ranges` to every other member that takes invalidations and
    /// waits for each to acknowledge; one that does not in time is revoked, and the write
    /// waits out its lease. Returns the announcement's number and who took it.
    pub(crate) async fn announce(
        &self,
        ranges: Vec<(NodeId, u64, u32)>,
    ) -> Result<Option<(u64, Vec<SocketAddr>)>, FsError> {
        let (me, peers) = {
            let guard = self.membership();
            let Some(m) = guard.as_ref() else {
                return Ok(None);
            };
            (m.token, m.members.peers(m.token))
        };
        if peers.is_empty() {
            return Ok(None);
        }
        let seq = self.coherent().seq.fetch_add(1, Ordering::Relaxed);
        let mut announcement = Announcement::new(&peers, self.now_ms());
        let req = Request::Invalidate {
            writer: me,
            seq,
            ranges,
        };
        let calls = peers.iter().map(|(_, m)| {
            let addr = m.callback.expect("peers take invalidations");
            let req = &req;
            async move {
                let call = async {
                    let conn = self.peer(addr).await?;
                    conn.call(req).await.map_err(|e| e.to_string())
                };
                let answer = tokio::time::timeout(Duration::from_millis(ACK_TIMEOUT_MS), call)
                    .await
                    .unwrap_or_else(|_| Err("no answer in time".into()));
                (m.token, addr, answer)
            }
        });
        let mut took = vec![];
        for (token, addr, answer) in futures::future::join_all(calls).await {
            match answer {
                Ok(Response::Invalidated) => {
                    announcement.acknowledged(token);
                    took.push(addr);
                }
                Ok(other) => {
                    tracing::warn!(%addr, "a member answered {other:?} to an invalidation");
                    announcement.unreachable(token, self.now_ms());
                }
                Err(e) => {
                    tracing::warn!(%addr, "a member did not take an invalidation: {e}");
                    self.drop_peer(addr);
                    announcement.unreachable(token, self.now_ms());
                }
            }
        }
        let late = announcement.late(self.now_ms());
        if !late.is_empty() {
            for &(slot, token) in &late {
                self.revoke(slot, token).await?;
                announcement.acknowledged(token);
            }
            // Their kernels and caches trust nothing read under a lease older than this.
            tokio::time::sleep(Duration::from_millis(self.coherent().lease_ms + 50)).await;
        }
        debug_assert!(announcement.complete());
        Ok(Some((seq, took)))
    }

    /// Fences this member's writes whose outcome it does not know (`coherence::fence_minitx`)
    /// and learns the version it moved to. Until this returns, their announcements must not
    /// end: a write that commits after the others' windows closed would leave them trusting
    /// what it changed. If it fails, the windows stay open and the others revoke this member
    /// when they are overdue, which fences the write the same way.
    pub(crate) async fn fence_unknown(&self) -> Result<(), FsError> {
        let until = Instant::now() + self.deadline;
        loop {
            let tx = coherence::fence_minitx(&self.volume());
            if crate::volume::exec(&self.cluster, &tx, until)
                .await?
                .committed
            {
                return self.refresh_members().await;
            }
            if Instant::now() >= until {
                return Err(FsError::Deadline("fencing a write".into()));
            }
            // The volume grew: fence its new nodes too.
            self.refresh_volume().await?;
        }
    }

    /// Tells the members an announced write has its outcome.
    pub(crate) fn end_announcement(&self, seq: u64, took: Vec<SocketAddr>) {
        let Some((_, me)) = self.member_now() else {
            return;
        };
        let req = Request::WriteEnded { writer: me, seq };
        for addr in took {
            if let Some(conn) = self.cached_peer(addr) {
                let req = req.clone();
                tokio::spawn(async move {
                    let _ = conn.send_one_way(&req).await;
                });
            }
        }
    }

    fn cached_peer(&self, addr: SocketAddr) -> Option<Arc<Connection>> {
        (self.coherent().peers.lock().expect("peers poisoned"))
            .get(&addr)
            .cloned()
    }

    async fn peer(&self, addr: SocketAddr) -> Result<Arc<Connection>, String> {
        if let Some(conn) = self.cached_peer(addr).filter(|c| !c.is_closed()) {
            return Ok(conn);
        }
        let opts = self.cluster.options();
        let conn = Connection::connect(&addr.to_string(), opts.frame_bytes_max, &opts.dialer)
            .await
            .map_err(|e| e.to_string())?;
        let conn = Arc::new(conn);
        (self.coherent().peers.lock().expect("peers poisoned")).insert(addr, conn.clone());
        Ok(conn)
    }

    fn drop_peer(&self, addr: SocketAddr) {
        (self.coherent().peers.lock().expect("peers poisoned")).remove(&addr);
    }

    /// Removes the member holding `slot` with `token` from the table (it stopped
    /// answering, or stopped renewing).
    async fn revoke(&self, slot: usize, token: u64) -> Result<(), FsError> {
        if self.clear_slot(slot, token).await? {
            tracing::warn!(slot, token, "revoked a member that stopped answering");
        }
        self.refresh_members().await
    }

    /// Another member announces a write of `ranges`: the cache stops trusting them and
    /// marks them changed, and nothing read of them is trusted until it ends. Returns what
    /// makes the kernel forget the attributes and entries among them that it keeps, to send
    /// before acknowledging (`None`: it keeps none of them).
    pub fn announced(
        &self,
        writer: u64,
        seq: u64,
        ranges: &[(NodeId, u64, u32)],
    ) -> Option<Notices> {
        let now = self.now_ms();
        let vol = self.volume();
        let mut inodes = vec![];
        {
            // The window opens under the cache's hold: a fill decides whether to trust what
            // it read under the same hold, so it sees the window or its bytes are dropped.
            let mut cache = self.cache();
            coherence::take_announcement(&mut self.trust(), &mut cache, writer, seq, ranges, now);
            for &(node, addr, len) in ranges {
                inodes.extend(inodes_in(&vol, node, addr, len as u64));
            }
        }
        let forget = self.coherent().forget.get()?;
        forget(Changed::Ranges {
            ranges,
            inodes: &inodes,
        })
    }

    pub fn write_ended(&self, writer: u64, seq: u64) {
        self.trust().ended(writer, seq);
    }

    /// Serves other members' invalidations on `listener` (the callback this member joined
    /// with), with the cluster's credentials, until the process ends.
    pub fn serve_invalidations(self: &Arc<Self>, listener: tokio::net::TcpListener) {
        let fs = self.clone();
        let opts = self.cluster.options();
        let (frames, credentials) = (opts.frame_bytes_max, opts.dialer.credentials().clone());
        tokio::spawn(tutti_wire::conn::serve(
            listener,
            frames,
            credentials,
            move |id, req, replies| match req {
                Request::Invalidate {
                    writer,
                    seq,
                    ranges,
                } => {
                    let Some(notices) = fs.announced(writer, seq, &ranges) else {
                        // The kernel keeps none of them: nothing to wait for.
                        let _ = replies.send((id, Response::Invalidated));
                        return;
                    };
                    tokio::spawn(async move {
                        // The kernel forgets in the notification's write: off the runtime.
                        if tokio::task::spawn_blocking(notices).await.is_ok() {
                            let _ = replies.send((id, Response::Invalidated));
                        }
                    });
                }
                Request::WriteEnded { writer, seq } => fs.write_ended(writer, seq),
                other => {
                    let refused = tutti_wire::conn::bad_request(format!(
                        "a tutti-fs member takes invalidations only, not {other:?}"
                    ));
                    let _ = replies.send((id, refused));
                }
            },
        ));
    }

    /// Renews the lease every quarter of it, learns the member table, and reclaims the
    /// slots of members gone (not renewed for three leases) or that left a write open too
    /// long; until the process ends.
    pub fn spawn_renewals(self: &Arc<Self>) {
        let fs = self.clone();
        tokio::spawn(async move {
            let every = Duration::from_millis(fs.coherent().lease_ms / 4);
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = fs.renew().await {
                    tracing::warn!("renewing the member lease: {e}");
                }
            }
        });
    }

    async fn renew(&self) -> Result<(), FsError> {
        let Some((slot, me)) = (self.membership().as_ref()).map(|m| (m.slot, m.token)) else {
            return Ok(());
        };
        let vol = self.volume();
        let (node, addr, len) = coherence::table_read(&vol);
        let tx = coherence::renewal_minitx(&vol, slot, me).read(node, addr, len);
        let sent = self.now_ms();
        let until = Instant::now() + Duration::from_millis(self.coherent().lease_ms);
        let outcome = match crate::volume::exec(&self.cluster, &tx, until).await {
            Ok(o) => o,
            Err(e) => {
                if self.trust().lapsed(self.now_ms()) {
                    self.lose_trust();
                }
                return Err(e);
            }
        };
        if !outcome.committed {
            // The slot no longer holds this member: it was revoked.
            return self.refresh_members().await;
        }
        let takes = (self.membership().as_ref()).is_some_and(|m| m.callback.is_some());
        if takes {
            self.trust().renewed(sent);
        }
        let members = Members::decode(&outcome.reads[0]);
        let now = self.now_ms();
        let lease_ms = self.coherent().lease_ms;
        let mut gone = vec![];
        {
            let mut guard = self.membership();
            let Some(m) = guard.as_mut() else {
                return Ok(());
            };
            for (i, member) in members.slots.iter().enumerate() {
                let Some(member) = member.as_ref().filter(|x| x.token != m.token) else {
                    continue;
                };
                let seen = m.seen.entry(member.token).or_insert((member.renewals, now));
                if seen.0 != member.renewals {
                    *seen = (member.renewals, now);
                } else if now >= seen.1 + 3 * (member.lease_ms as u64).max(lease_ms) {
                    gone.push((i, member.token));
                }
            }
            m.seen.retain(|t, _| members.slot_of(*t).is_some());
            m.learn(members);
        }
        for (slot, token) in gone {
            tracing::warn!(
                slot,
                token,
                "a member stopped renewing: reclaiming its slot"
            );
            self.revoke(slot, token).await?;
        }
        let overdue = self
            .trust()
            .overdue(now, self.deadline.as_millis() as u64 + 2_000);
        for writer in overdue {
            let slot = (self.membership().as_ref()).and_then(|m| m.members.slot_of(writer));
            if let Some(slot) = slot {
                tracing::warn!(writer, "a member left a write open too long: revoking it");
                self.revoke(slot, writer).await?;
            }
            self.trust().forget(writer);
        }
        // A member without its callback since a revocation takes it again once due.
        self.join_again().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;

    #[test]
    fn ranges_name_the_inodes_they_cover() {
        let geometry = Geometry::new(64 << 20, 16 << 10, 8 << 10).expect("geometry");
        let vol = Volume {
            geometry,
            nodes: vec![(1, 0), (2, 1 << 30)],
        };
        let at = vol.inode_addr(Ino::new(2, 5));
        assert_eq!(inodes_in(&vol, 2, at + 40, 24), vec![Ino::new(2, 5)]);
        assert_eq!(
            inodes_in(&vol, 2, at + 200, 100),
            vec![Ino::new(2, 5), Ino::new(2, 6)]
        );
        assert!(inodes_in(&vol, 2, 1 << 30, 64).is_empty(), "the header");
        assert!(
            inodes_in(&vol, 3, at, 8).is_empty(),
            "not a node of the volume"
        );
    }
}
