//! Coherent caching between the processes that use one volume (docs/fs.md, "Coherent
//! caching"): the member table and membership version that fence writers, the lease that
//! bounds how long a member trusts its cache, and the invalidations a writer sends to the
//! other members before it commits. Sans-I/O: the mount's driver and the simulator run it.

use crate::layout::{field, get_u32, get_u64, put_u32, put_u64, Volume};
use crate::txn::Cache;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use tutti_client::Minitx;
use tutti_wire::{Item, NodeId};

/// Where the membership version sits in every node's header.
pub const MEMBERSHIP_AT: u64 = 72;
/// Where the member table starts in the superblock (the first node's header).
pub const TABLE_AT: u64 = 1024;
pub const SLOT_BYTES: u64 = 64;
/// Members one volume has at most (the table fills the header's last 3 KiB).
pub const SLOTS: usize = 48;
/// How long a member trusts what it validated after its last renewal was sent.
pub const LEASE_MS_DEFAULT: u64 = 2_000;
/// How long a writer waits for a member's acknowledgement before it revokes the member.
pub const ACK_TIMEOUT_MS: u64 = 1_000;
/// A kernel attribute timeout stops this long before the lease does (the kernel's clock and
/// ours are one clock, but the reply takes a moment to reach it).
const TTL_MARGIN_MS: u64 = 50;

/// One member of a volume, as its slot records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Random, never 0; a member that joins again draws a new one.
    pub token: u64,
    /// Raised by each renewal: a slot whose count stands still for three leases belongs to
    /// a member that is gone.
    pub renewals: u64,
    pub lease_ms: u32,
    /// Where the member takes invalidations; `None` for one that caches nothing (fsck).
    pub callback: Option<SocketAddr>,
    pub joined_unix_s: u64,
    pub pid: u32,
}

impl Member {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SLOT_BYTES as usize];
        put_u64(&mut b, 0, self.token);
        put_u64(&mut b, 8, self.renewals);
        put_u32(&mut b, 16, self.lease_ms);
        if let Some(a) = self.callback {
            b[20..22].copy_from_slice(&a.port().to_le_bytes());
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b[24..40].copy_from_slice(&ip.octets());
        }
        put_u64(&mut b, 40, self.joined_unix_s);
        put_u32(&mut b, 48, self.pid);
        b
    }

    /// The member a slot's bytes hold; `None` for a free slot.
    pub fn decode(b: &[u8]) -> Option<Member> {
        let token = get_u64(b, 0);
        if token == 0 {
            return None;
        }
        let port = u16::from_le_bytes([b[20], b[21]]);
        let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&b[24..40]).expect("16 bytes"));
        let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
        Some(Member {
            token,
            renewals: get_u64(b, 8),
            lease_ms: get_u32(b, 16),
            callback: (port != 0).then_some(SocketAddr::new(ip, port)),
            joined_unix_s: get_u64(b, 40),
            pid: get_u32(b, 48),
        })
    }
}

/// The member table and the membership version, as read from the superblock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    pub version: u64,
    pub slots: Vec<Option<Member>>,
}

impl Members {
    /// Decodes the superblock's header (at least `TABLE_AT + SLOTS × SLOT_BYTES` bytes).
    pub fn decode(header: &[u8]) -> Members {
        let slots = (0..SLOTS)
            .map(|i| {
                let at = (TABLE_AT + i as u64 * SLOT_BYTES) as usize;
                Member::decode(&header[at..at + SLOT_BYTES as usize])
            })
            .collect();
        Members {
            version: get_u64(header, MEMBERSHIP_AT),
            slots,
        }
    }

    pub fn slot_of(&self, token: u64) -> Option<usize> {
        (self.slots.iter()).position(|m| m.as_ref().is_some_and(|m| m.token == token))
    }

    /// The members other than `me` that take invalidations.
    pub fn peers(&self, me: u64) -> Vec<(usize, Member)> {
        (self.slots.iter().enumerate())
            .filter_map(|(i, m)| Some((i, m.clone()?)))
            .filter(|(_, m)| m.token != me && m.callback.is_some())
            .collect()
    }
}

/// How long a member revoked for the first time in a while caches nothing before it takes
/// invalidations again (8 default leases); each revocation in a row doubles it, up to
/// `CALLBACKLESS_MAX_MS`.
pub const CALLBACKLESS_FIRST_MS: u64 = 16_000;
pub const CALLBACKLESS_MAX_MS: u64 = 256_000;

/// When a revoked member takes invalidations again. A member is revoked when another one
/// could not reach its callback (or it stopped renewing): joining again at once with the
/// same callback would, under a one-way partition, be revoked again at the next write, and
/// every write would wait out an acknowledgement and a lease each time. So it first joins
/// without a callback, caching nothing and validating every read, which costs the others
/// nothing; it tries its callback again after a wait that doubles while revocations follow
/// each other.
#[derive(Debug, Default)]
pub struct Rejoins {
    /// Revocations since the member last held a callback for `CALLBACKLESS_MAX_MS`.
    in_a_row: u32,
    /// When the member last joined with a callback, if it holds one.
    taking_since: Option<u64>,
    /// It caches nothing until then.
    not_before: u64,
}

impl Rejoins {
    /// The member was revoked at `now`: returns how long it now caches nothing.
    pub fn revoked(&mut self, now: u64) -> u64 {
        if self
            .taking_since
            .is_some_and(|t| now >= t + CALLBACKLESS_MAX_MS)
        {
            self.in_a_row = 0;
        }
        self.taking_since = None;
        let wait = (CALLBACKLESS_FIRST_MS << self.in_a_row.min(8)).min(CALLBACKLESS_MAX_MS);
        self.in_a_row += 1;
        self.not_before = now + wait;
        wait
    }

    /// Whether the member may join with its callback at `now`.
    pub fn may_take_invalidations(&self, now: u64) -> bool {
        now >= self.not_before
    }

    /// The member joined with its callback at `now`.
    pub fn took_invalidations(&mut self, now: u64) {
        self.taking_since = Some(now);
    }
}

/// The bytes of the superblock a member reads to learn the table and the version.
pub fn table_read(vol: &Volume) -> (NodeId, u64, u32) {
    let first = vol.nodes[0].0;
    let len = TABLE_AT + SLOTS as u64 * SLOT_BYTES;
    (first, vol.header_addr(first), len as u32)
}

fn slot_addr(vol: &Volume, slot: usize) -> (NodeId, u64) {
    let first = vol.nodes[0].0;
    (
        first,
        vol.header_addr(first) + TABLE_AT + slot as u64 * SLOT_BYTES,
    )
}

/// A change of membership: `slot`, holding the member with token `old` (0: free), is given
/// to `new` (`None`: freed), and the version goes from `version` to `version + 1` on every
/// node, compared everywhere, so that every member's next write fails its compare of the
/// version and makes it read the table again.
pub fn membership_minitx(
    vol: &Volume,
    version: u64,
    slot: usize,
    old: u64,
    new: Option<&Member>,
) -> Minitx {
    let (first, at) = slot_addr(vol, slot);
    let nodes = (vol.nodes.len() as u32).to_le_bytes().to_vec();
    let new = new.map_or(vec![0; SLOT_BYTES as usize], Member::encode);
    // The node count too: after a grow, the version is on more nodes than `vol` names.
    let mut tx = Minitx::new()
        .compare(first, vol.header_addr(first) + field::NODES, nodes)
        .compare(first, at, old.to_le_bytes().to_vec())
        .write(first, at, new);
    for &(node, base) in &vol.nodes {
        tx = tx
            .compare(node, base + MEMBERSHIP_AT, version.to_le_bytes().to_vec())
            .write(
                node,
                base + MEMBERSHIP_AT,
                (version + 1).to_le_bytes().to_vec(),
            );
    }
    tx.class("fs-members")
}

/// The fence of a write whose outcome its writer does not know (a late attempt, or
/// recovery, may still commit it): the version goes up on every node. An attempt not yet
/// prepared then fails its compare of the version; one prepared holds its lock on it, so
/// that this waits until it is decided. Added, not compared: it needs no version known;
/// but the node count is compared, so that it moves the version on every node (after a
/// grow `vol` does not know, it fails: learn the volume and go again).
pub fn fence_minitx(vol: &Volume) -> Minitx {
    let first = vol.nodes[0].0;
    let nodes = (vol.nodes.len() as u32).to_le_bytes().to_vec();
    let tx = Minitx::new().compare(first, vol.header_addr(first) + field::NODES, nodes);
    (vol.nodes.iter())
        .fold(tx, |tx, &(node, base)| {
            tx.add(node, base + MEMBERSHIP_AT, 1)
        })
        .class("fs-members")
}

/// A renewal: `me`'s slot still holds its token (it was not revoked); its count goes up.
pub fn renewal_minitx(vol: &Volume, slot: usize, me: u64) -> Minitx {
    let (first, at) = slot_addr(vol, slot);
    Minitx::new()
        .compare(first, at, me.to_le_bytes().to_vec())
        .add(first, at + 8, 1)
        .class("fs-members")
}

/// The compare item that fences a write: the version as this member knows it, on `node`.
pub fn fence(vol: &Volume, node: NodeId, version: u64) -> (NodeId, u64, Vec<u8>) {
    (
        node,
        vol.header_addr(node) + MEMBERSHIP_AT,
        version.to_le_bytes().to_vec(),
    )
}

/// What `tx` writes, as a member announces it: (node, address, length) of each write and
/// add.
pub fn written(tx: &Minitx) -> Vec<(NodeId, u64, u32)> {
    (tx.items().iter())
        .filter_map(|(node, item)| match item {
            Item::Write { addr, bytes } => Some((*node, *addr, bytes.len() as u32)),
            Item::Add { addr, .. } => Some((*node, *addr, 8)),
            _ => None,
        })
        .collect()
}

/// Whether a plan that writes `writes` is announced to the other members before it runs:
/// every one that writes anything is.
pub fn must_announce(writes: &[(NodeId, u64, u32)]) -> bool {
    !writes.is_empty() && !crate::planted(crate::Bug::WriteNotAnnounced)
}

/// Another member announces a write (`writer`, `seq`) of `ranges`: its window opens, and
/// the cache stops trusting those bytes and marks them changed. The caller holds the cache
/// (see `Cache`).
pub fn take_announcement(
    trust: &mut Trust,
    cache: &mut Cache,
    writer: u64,
    seq: u64,
    ranges: &[(NodeId, u64, u32)],
    now: u64,
) {
    trust.announced(writer, seq, ranges, now);
    for &(node, addr, len) in ranges {
        cache.changed_elsewhere(node, addr, len as u64);
    }
}

/// Marks a member keeps at most before it forgets them all and trusts nothing read before.
const MARKS_MAX: usize = 16_384;

/// When a member may trust what it read: the receiving side of invalidations and the
/// member's lease, per byte. Every write announced, ended, or of the member's own, *moves*
/// the bytes it writes: a read of them that began before the move is not trusted, and
/// neither is one of bytes a window still holds open. A read of other bytes is. Times are
/// the driver's clock in milliseconds.
#[derive(Debug)]
pub struct Trust {
    lease_ms: u64,
    /// When the last renewal that committed was sent.
    renewed_at: Option<u64>,
    /// Raised when everything trusted so far stops being trusted (the lease lapsed, the
    /// member was revoked).
    epoch: u64,
    /// Raised by every move.
    moves: u64,
    /// A read that began before this move is not trusted anywhere: the marks before it
    /// were forgotten (`MARKS_MAX`).
    floor: u64,
    /// Bytes moved, with the number of their last move.
    marks: ByteRanges,
    /// Writes announced and not yet ended, by (writer's token, sequence).
    windows: HashMap<(u64, u64), Window>,
}

/// Another member's write, announced and not yet ended.
#[derive(Debug)]
struct Window {
    opened_at: u64,
    ranges: Vec<(NodeId, u64, u32)>,
}

/// What a member knew when it started reading: what it read may be trusted only where
/// nothing moved since and the lease held until it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    epoch: u64,
    moves: u64,
}

impl Trust {
    pub fn new(lease_ms: u64) -> Trust {
        Trust {
            lease_ms,
            renewed_at: None,
            epoch: 0,
            moves: 0,
            floor: 0,
            marks: ByteRanges::default(),
            windows: HashMap::new(),
        }
    }

    pub fn stamp(&self) -> Stamp {
        Stamp {
            epoch: self.epoch,
            moves: self.moves,
        }
    }

    fn lease_end(&self) -> Option<u64> {
        self.renewed_at.map(|t| t + self.lease_ms)
    }

    /// What may be trusted, at `now`, of bytes read since `stamp` was taken.
    pub fn grant(&self, stamp: Stamp, now: u64) -> Grant<'_> {
        let live = stamp.epoch == self.epoch
            && stamp.moves >= self.floor
            && (self.lease_end()).is_some_and(|end| now + TTL_MARGIN_MS < end);
        Grant {
            trust: live.then_some(self),
            stamp,
        }
    }

    /// How long the kernel may keep attributes held in `len` bytes at `addr` of `node`,
    /// read since `stamp`: until shortly before the lease ends, or not at all.
    pub fn ttl_ms(&self, stamp: Stamp, (node, addr, len): (NodeId, u64, u64), now: u64) -> u64 {
        match self.lease_end() {
            Some(end) if self.grant(stamp, now).covers(node, addr, len) => {
                end - now - TTL_MARGIN_MS
            }
            _ => 0,
        }
    }

    /// A renewal sent at `sent_at` committed: the lease runs from then.
    pub fn renewed(&mut self, sent_at: u64) {
        self.renewed_at = Some(self.renewed_at.map_or(sent_at, |t| t.max(sent_at)));
    }

    /// The lease is gone (revoked, or not renewed in time): nothing read before is trusted.
    pub fn lapse(&mut self) {
        if crate::planted(crate::Bug::LapsedTrustKept) {
            return;
        }
        self.renewed_at = None;
        self.epoch += 1;
    }

    /// Nothing read before is trusted; the lease holds.
    pub fn distrust(&mut self) {
        self.epoch += 1;
    }

    /// The member holds its callback (joined with it, or took it back after a revocation)
    /// by a change of membership sent at `sent_at`: nothing it read before is trusted, and
    /// its lease runs from then. A write that committed while it had no callback was
    /// announced to the others only, and a read in flight across the change may hold the
    /// bytes from before that write.
    pub fn took_invalidations(&mut self, sent_at: u64) {
        if !crate::planted(crate::Bug::RetakenCallbackKeepsTrust) {
            self.distrust();
        }
        self.renewed(sent_at);
    }

    /// `ranges` move (a write of this member's own begins or ends, or another's is
    /// announced or ends): what reads in flight read of them is not trusted.
    pub fn moved(&mut self, ranges: &[(NodeId, u64, u32)]) {
        self.moves += 1;
        if self.marks.len() + ranges.len() > MARKS_MAX {
            self.marks.clear();
            self.floor = self.moves;
        }
        if !crate::planted(crate::Bug::MoveNotMarked) {
            for &(node, addr, len) in ranges {
                self.marks.set(node, addr, len as u64, self.moves);
            }
        }
    }

    /// The lease ended without a renewal (the driver asks at each tick).
    pub fn lapsed(&self, now: u64) -> bool {
        self.lease_end().is_some_and(|end| now >= end)
    }

    /// Another member announces a write (`writer`, `seq`) of `ranges`: until it ends,
    /// nothing read of them is trusted, and what was being read of them when it arrived
    /// never is.
    pub fn announced(&mut self, writer: u64, seq: u64, ranges: &[(NodeId, u64, u32)], now: u64) {
        self.moved(ranges);
        let window = Window {
            opened_at: now,
            ranges: ranges.to_vec(),
        };
        self.windows.insert((writer, seq), window);
    }

    /// The write (`writer`, `seq`) has its outcome. A read that began while it was open
    /// may hold either side of it, so its bytes move again: without that, a read begun
    /// after the announcement and answered before the commit would be trusted once the
    /// window closed.
    pub fn ended(&mut self, writer: u64, seq: u64) {
        if let Some(window) = self.windows.remove(&(writer, seq)) {
            self.moved(&window.ranges);
        }
    }

    /// Writers whose announced write has been open for `limit_ms` or more: the member
    /// revokes them (which fences their commit if it is still in flight), then ends the
    /// windows with `forget`.
    pub fn overdue(&self, now: u64, limit_ms: u64) -> Vec<u64> {
        let mut late: Vec<u64> = (self.windows.iter())
            .filter(|(_, w)| now >= w.opened_at + limit_ms)
            .map(|(&(writer, _), _)| writer)
            .collect();
        late.sort_unstable();
        late.dedup();
        late
    }

    /// Ends every window of `writer` (revoked).
    pub fn forget(&mut self, writer: u64) {
        let ended: Vec<(u64, u64)> = (self.windows.keys())
            .filter(|&&(w, _)| w == writer)
            .copied()
            .collect();
        for (w, seq) in ended {
            self.ended(w, seq);
        }
    }

    /// The ranges of open windows that overlap `len` bytes at `addr` of `node`, as (start,
    /// end).
    fn open_over(
        &self,
        node: NodeId,
        addr: u64,
        len: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let planted = crate::planted(crate::Bug::WindowIgnored);
        (self.windows.values().flat_map(|w| &w.ranges))
            .filter(move |&&(n, a, l)| {
                n == node && a < addr + len && addr < a + l as u64 && !planted
            })
            .map(|&(_, a, l)| (a, a + l as u64))
    }
}

/// What a member's trust grants, at one moment, to bytes read since a stamp: the bytes
/// nothing moved under since, that no window holds open, while the stamp's epoch and the
/// lease hold.
pub struct Grant<'a> {
    /// `None`: nothing is granted (another epoch, the lease is short or gone).
    trust: Option<&'a Trust>,
    stamp: Stamp,
}

impl Grant<'_> {
    /// The epoch granted bytes are trusted in.
    pub fn epoch(&self) -> u64 {
        self.stamp.epoch
    }

    /// Whether every one of `len` bytes at `addr` of `node` is granted.
    pub fn covers(&self, node: NodeId, addr: u64, len: u64) -> bool {
        self.trust.is_some_and(|t| {
            t.open_over(node, addr, len).next().is_none()
                && (t.marks.max_within(node, addr, len)).is_none_or(|m| m <= self.stamp.moves)
        })
    }

    /// The pieces of `len` bytes at `addr` of `node` that are granted, as (address,
    /// length), in order.
    pub fn pieces(&self, node: NodeId, addr: u64, len: u64) -> Vec<(u64, u64)> {
        let Some(t) = self.trust else {
            return vec![];
        };
        if self.covers(node, addr, len) {
            return vec![(addr, len)];
        }
        let end = addr + len;
        let mut moved: Vec<(u64, u64)> = (t.marks.within(node, addr, len))
            .filter(|&(_, _, m)| m > self.stamp.moves)
            .map(|(a, e, _)| (a, e))
            .collect();
        moved.extend(t.open_over(node, addr, len));
        moved.sort_unstable();
        let mut pieces = vec![];
        let mut at = addr;
        for (a, e) in moved {
            if a > at {
                pieces.push((at, a.min(end) - at));
            }
            at = at.max(e);
        }
        if at < end {
            pieces.push((at, end - at));
        }
        pieces
    }
}

/// Disjoint byte ranges of the nodes, each carrying a number: which bytes a member trusts
/// (in which trust epoch), which moved (at which move).
#[derive(Default, Debug)]
pub struct ByteRanges {
    /// (node, start) → (end, number).
    ranges: BTreeMap<(NodeId, u64), (u64, u64)>,
}

impl ByteRanges {
    /// Sets `len` bytes at `addr` of `node` to `number`.
    pub fn set(&mut self, node: NodeId, addr: u64, len: u64, number: u64) {
        if len > 0 {
            self.unset(node, addr, len);
            self.ranges.insert((node, addr), (addr + len, number));
        }
    }

    /// Removes `len` bytes at `addr` of `node`; what lies around them stays.
    pub fn unset(&mut self, node: NodeId, addr: u64, len: u64) {
        let end = addr + len;
        let hit: Vec<(NodeId, u64)> = (self.overlapping(node, addr, len))
            .map(|(k, _)| k)
            .collect();
        for key in hit {
            let Some((e, number)) = self.ranges.remove(&key) else {
                continue;
            };
            if key.1 < addr {
                self.ranges.insert(key, (addr, number));
            }
            if e > end {
                self.ranges.insert((node, end), (e, number));
            }
        }
    }

    /// The ranges overlapping `len` bytes at `addr` of `node`, in order.
    fn overlapping(
        &self,
        node: NodeId,
        addr: u64,
        len: u64,
    ) -> impl Iterator<Item = ((NodeId, u64), (u64, u64))> + '_ {
        let first = (self.ranges.range(..=(node, addr)).next_back())
            .filter(|(&(n, _), &(e, _))| n == node && e > addr);
        let rest = self
            .ranges
            .range((node, addr + 1)..(node, addr + len.max(1)));
        (first.into_iter().chain(rest))
            .filter(move |_| len > 0)
            .map(|(&k, &v)| (k, v))
    }

    /// The ranges overlapping `len` bytes at `addr` of `node`, as (start, end, number).
    fn within(
        &self,
        node: NodeId,
        addr: u64,
        len: u64,
    ) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.overlapping(node, addr, len)
            .map(|((_, a), (e, number))| (a, e, number))
    }

    /// Whether every one of `len` bytes at `addr` of `node` is set to `number`.
    pub fn all(&self, node: NodeId, addr: u64, len: u64, number: u64) -> bool {
        let (mut at, end) = (addr, addr + len);
        while at < end {
            match self.ranges.range(..=(node, at)).next_back() {
                Some((&(n, _), &(e, v))) if n == node && e > at && v == number => at = e,
                _ => return false,
            }
        }
        true
    }

    /// The largest number set among `len` bytes at `addr` of `node`, if any is.
    pub fn max_within(&self, node: NodeId, addr: u64, len: u64) -> Option<u64> {
        self.within(node, addr, len).map(|(_, _, v)| v).max()
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn clear(&mut self) {
        self.ranges.clear();
    }
}

/// A writer's announcement to the other members before it commits: who still owes an
/// acknowledgement, and who must be revoked for not giving one in time.
#[derive(Debug)]
pub struct Announcement {
    /// Peer token → (slot, deadline).
    pending: HashMap<u64, (usize, u64)>,
}

impl Announcement {
    pub fn new(peers: &[(usize, Member)], now: u64) -> Announcement {
        let pending = (peers.iter())
            .map(|(slot, m)| (m.token, (*slot, now + ACK_TIMEOUT_MS)))
            .collect();
        Announcement { pending }
    }

    pub fn acknowledged(&mut self, peer: u64) {
        self.pending.remove(&peer);
    }

    /// A peer that cannot be reached (refused, closed) is revoked at once.
    pub fn unreachable(&mut self, peer: u64, now: u64) {
        if let Some((_, deadline)) = self.pending.get_mut(&peer) {
            *deadline = now;
        }
    }

    /// Peers past their deadline, as (slot, token): to revoke, then `acknowledged`.
    pub fn late(&self, now: u64) -> Vec<(usize, u64)> {
        let mut late: Vec<(usize, u64)> = (self.pending.iter())
            .filter(|(_, &(_, deadline))| now >= deadline)
            .map(|(&token, &(slot, _))| (slot, token))
            .collect();
        late.sort_unstable();
        late
    }

    /// Every peer acknowledged (or was revoked): the write may commit.
    pub fn complete(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_revoked_again_and_again_caches_nothing_longer_each_time() {
        let mut r = Rejoins::default();
        assert!(
            r.may_take_invalidations(0),
            "a new member takes them at once"
        );
        r.took_invalidations(0);
        let mut now = 1_000;
        let mut waits = vec![];
        for _ in 0..7 {
            let wait = r.revoked(now);
            assert!(!r.may_take_invalidations(now + wait - 1));
            assert!(r.may_take_invalidations(now + wait));
            now += wait;
            r.took_invalidations(now);
            // Revoked again soon after it took them.
            now += 3_000;
            waits.push(wait);
        }
        assert_eq!(
            waits,
            [16_000, 32_000, 64_000, 128_000, 256_000, 256_000, 256_000]
        );
        // A callback held as long as the longest wait: the next revocation starts over.
        now += CALLBACKLESS_MAX_MS;
        assert_eq!(r.revoked(now), CALLBACKLESS_FIRST_MS);
    }

    fn member(token: u64, port: u16) -> Member {
        Member {
            token,
            renewals: 7,
            lease_ms: 2000,
            callback: (port != 0).then(|| SocketAddr::from(([127, 0, 0, 1], port))),
            joined_unix_s: 1_700_000_000,
            pid: 42,
        }
    }

    #[test]
    fn a_slot_holds_its_member_byte_for_byte() {
        for m in [member(5, 4000), member(6, 0)] {
            let b = m.encode();
            assert_eq!(b.len(), SLOT_BYTES as usize);
            assert_eq!(Member::decode(&b), Some(m));
        }
        let v6 = Member {
            callback: Some("[::1]:9".parse().unwrap()),
            ..member(9, 1)
        };
        assert_eq!(Member::decode(&v6.encode()), Some(v6));
        assert_eq!(Member::decode(&[0; 64]), None);
    }

    #[test]
    fn the_table_lists_peers_that_take_invalidations() {
        let mut header = vec![0u8; (TABLE_AT + SLOTS as u64 * SLOT_BYTES) as usize];
        put_u64(&mut header, MEMBERSHIP_AT, 3);
        for (slot, m) in [(0, member(1, 10)), (4, member(2, 0)), (47, member(3, 11))] {
            let at = (TABLE_AT + slot * SLOT_BYTES) as usize;
            header[at..at + 64].copy_from_slice(&m.encode());
        }
        let t = Members::decode(&header);
        assert_eq!(t.version, 3);
        assert_eq!(t.slot_of(2), Some(4));
        let peers: Vec<(usize, u64)> = t.peers(1).iter().map(|(s, m)| (*s, m.token)).collect();
        assert_eq!(
            peers,
            vec![(47, 3)],
            "not itself, not one without a callback"
        );
    }

    /// A volume over nodes 1 and 2 (the second's region at 1 GiB).
    fn two_nodes() -> Volume {
        let geometry = crate::layout::Geometry::new(64 << 20, 16 << 10, 8 << 10).unwrap();
        Volume {
            geometry,
            nodes: vec![(1, 0), (2, 1 << 30)],
        }
    }

    /// `tx`'s items, one line each, with the bytes as a little-endian number.
    fn described(tx: &Minitx) -> Vec<String> {
        let number = |b: &Vec<u8>| get_u64(&[b.clone(), vec![0; 8]].concat(), 0);
        (tx.items().iter())
            .map(|(n, i)| match i {
                Item::Compare { addr, bytes, .. } => format!("{n} cmp {addr} {}", number(bytes)),
                Item::Write { addr, bytes } => format!("{n} put {addr} {}", number(bytes)),
                Item::Add { addr, delta } => format!("{n} add {addr} {delta}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_change_of_membership_compares_the_slot_and_moves_the_version_everywhere() {
        let tx = membership_minitx(&two_nodes(), 7, 3, 42, None);
        let slot = TABLE_AT + 3 * SLOT_BYTES;
        assert_eq!(
            described(&tx),
            vec![
                format!("1 cmp {} 2", field::NODES),
                format!("1 cmp {slot} 42"),
                format!("1 put {slot} 0"),
                format!("1 cmp {MEMBERSHIP_AT} 7"),
                format!("1 put {MEMBERSHIP_AT} 8"),
                format!("2 cmp {} 7", (1u64 << 30) + MEMBERSHIP_AT),
                format!("2 put {} 8", (1u64 << 30) + MEMBERSHIP_AT),
            ]
        );
    }

    #[test]
    fn a_fence_moves_the_version_on_every_node_the_volume_spans() {
        assert_eq!(
            described(&fence_minitx(&two_nodes())),
            vec![
                format!("1 cmp {} 2", field::NODES),
                format!("1 add {MEMBERSHIP_AT} 1"),
                format!("2 add {} 1", (1u64 << 30) + MEMBERSHIP_AT),
            ]
        );
    }

    #[test]
    fn trust_needs_the_lease_and_no_write_announced_since_the_read_began() {
        const A: (NodeId, u64, u64) = (1, 100, 50);
        let covers = |t: &Trust, s: Stamp, now: u64| t.grant(s, now).covers(A.0, A.1, A.2);
        let mut t = Trust::new(2000);
        let s = t.stamp();
        assert!(!covers(&t, s, 0), "no lease yet");
        t.renewed(100);
        assert!(covers(&t, s, 500));
        assert_eq!(t.ttl_ms(s, A, 500), 2100 - 500 - TTL_MARGIN_MS);
        assert!(
            !covers(&t, s, 2100 - TTL_MARGIN_MS),
            "too close to the lease's end"
        );
        t.announced(9, 1, &[(1, 140, 8)], 600);
        let during = t.stamp();
        assert!(!covers(&t, during, 600), "a write is open");
        t.ended(9, 1);
        assert!(!covers(&t, s, 700), "read before the announcement");
        assert!(!covers(&t, during, 700), "read while the write was open");
        assert!(covers(&t, t.stamp(), 700));
        let s = t.stamp();
        t.lapse();
        t.renewed(800);
        assert!(!covers(&t, s, 900), "read under a lease that lapsed");
        assert_eq!(t.ttl_ms(s, A, 900), 0);
    }

    #[test]
    fn a_move_untrusts_only_the_bytes_it_writes() {
        let mut t = Trust::new(2000);
        t.renewed(0);
        let before = t.stamp();
        t.announced(9, 1, &[(1, 100, 8), (2, 0, 64)], 10);
        let during = t.stamp();
        let g = t.grant(before, 10);
        assert!(g.covers(1, 0, 100) && g.covers(1, 108, 100), "around it");
        assert!(!g.covers(1, 96, 8) && !g.covers(2, 63, 1));
        assert_eq!(g.pieces(1, 50, 100), vec![(50, 50), (108, 42)]);
        assert!(
            !t.grant(during, 10).covers(1, 100, 8),
            "the window holds it open"
        );
        t.moved(&[(1, 104, 16)]);
        assert_eq!(
            t.grant(during, 10).pieces(1, 90, 40),
            vec![(90, 10), (120, 10)]
        );
        t.ended(9, 1);
        let after = t.stamp();
        assert!(
            !t.grant(during, 20).covers(1, 100, 1),
            "read during the write"
        );
        assert!(t.grant(during, 20).covers(2, 64, 8));
        assert!(t.grant(after, 20).covers(1, 0, 1000));
        assert_eq!(t.ttl_ms(during, (1, 0, 100), 20), 2000 - 20 - TTL_MARGIN_MS);
        assert_eq!(t.ttl_ms(during, (1, 0, 101), 20), 0);
    }

    #[test]
    fn marks_are_bounded_and_what_they_forgot_is_not_trusted() {
        let mut t = Trust::new(2000);
        t.renewed(0);
        let old = t.stamp();
        for i in 0..MARKS_MAX as u64 + 1 {
            t.moved(&[(1, i * 16, 8)]);
        }
        assert!(t.marks.len() <= MARKS_MAX);
        assert!(
            !t.grant(old, 1).covers(3, 0, 8),
            "a move it no longer knows"
        );
        assert!(t.grant(t.stamp(), 1).covers(1, 0, 8));
    }

    #[test]
    fn byte_ranges_are_kept_per_range() {
        let mut t = ByteRanges::default();
        t.set(1, 100, 50, 3);
        assert!(t.all(1, 100, 50, 3));
        assert!(!t.all(1, 100, 50, 4), "another number");
        assert!(!t.all(2, 100, 8, 3), "another node");
        assert!(!t.all(1, 96, 8, 3), "starts before");
        t.unset(1, 120, 8);
        assert!(t.all(1, 100, 20, 3) && t.all(1, 128, 22, 3));
        assert!(!t.all(1, 116, 8, 3), "the hole");
        t.set(1, 120, 8, 3);
        assert!(t.all(1, 100, 50, 3), "adjacent ranges cover together");
        t.set(1, 140, 20, 4);
        assert!(!t.all(1, 100, 50, 3) && t.all(1, 100, 40, 3));
        assert_eq!(t.max_within(1, 0, 141), Some(4));
        assert_eq!(t.max_within(1, 0, 140), Some(3));
        assert_eq!(
            (t.max_within(1, 0, 100), t.max_within(1, 0, 0)),
            (None, None)
        );
        t.unset(1, 0, 1000);
        assert!(!t.all(1, 130, 1, 3) && !t.all(1, 150, 1, 4));
        assert!(t.is_empty());
        t.set(1, 10, 10, 1);
        t.set(1, 30, 10, 1);
        t.unset(1, 15, 20);
        assert!(t.all(1, 10, 5, 1) && t.all(1, 35, 5, 1));
        assert!(!t.all(1, 15, 1, 1) && !t.all(1, 34, 1, 1));
    }

    #[test]
    fn a_write_left_open_too_long_names_its_writer() {
        let mut t = Trust::new(2000);
        t.announced(9, 1, &[(1, 0, 8)], 0);
        t.announced(9, 2, &[(1, 8, 8)], 10);
        t.announced(8, 1, &[(1, 0, 8)], 500);
        assert!(t.overdue(999, 1000).is_empty());
        assert_eq!(t.overdue(1010, 1000), vec![9]);
        t.forget(9);
        assert_eq!(t.overdue(5000, 1000), vec![8]);
    }

    #[test]
    fn an_announcement_completes_when_every_peer_acknowledged_or_is_late() {
        let peers = vec![(1, member(10, 1)), (2, member(20, 2)), (3, member(30, 3))];
        let mut a = Announcement::new(&peers, 0);
        a.acknowledged(10);
        a.unreachable(30, 5);
        assert_eq!(a.late(5), vec![(3, 30)]);
        a.acknowledged(30);
        assert!(!a.complete());
        assert_eq!(a.late(ACK_TIMEOUT_MS), vec![(2, 20)]);
        a.acknowledged(20);
        assert!(a.complete());
    }
}
