//! The optimistic transaction every file-system operation runs in (SinfoniaFS, Sinfonia §5.2):
//! an operation reads inodes, directory blocks and bitmap words from the mount's `Cache`,
//! records a compare item for each thing it relied on and stages its changes; `Txn::finish`
//! turns that into one minitransaction. A failed compare drops the stale objects and the
//! operation runs again. Sans-I/O: the mount's driver and the simulator run the plans.

use crate::coherence::{ByteRanges, Grant};
use crate::layout::{BlockRef, Ino, Volume};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tutti_client::Minitx;
use tutti_wire::NodeId;
use tutti_wire::{CmpOp, Item};

/// Bytes of cached objects (inodes, directory blocks, bitmap pages) a mount keeps before it
/// starts over with an empty cache; pointer blocks count too.
pub const CACHE_BYTES_MAX: usize = 256 << 20;
/// Bitmaps are cached and compared in pages of this many bytes (512 words).
pub const BITMAP_PAGE_BYTES: u64 = 4096;
/// Nearby inode slots fetched with one that an allocation needs, so that a run of creates
/// does not wait for a fetch each.
pub const INODE_PREFETCH: u64 = 32;

/// Why an operation stopped before it could be planned: something it needs is not cached,
/// or the answer is an error (which is validated like any result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Miss,
    Errno(i32),
}

pub type OpResult<T> = Result<T, Stop>;

/// Pointer blocks of one file, valid while its inode's `iversion` is the one they were read
/// under (every change to a file's block map raises its `iversion`).
#[derive(Default)]
struct FilePointers {
    iversion: u64,
    blocks: HashMap<BlockRef, Vec<u8>>,
}

/// What one mount knows of the volume. Everything in it may be stale; compares find out.
#[derive(Default)]
pub struct Cache {
    objects: BTreeMap<(NodeId, u64), Vec<u8>>,
    /// The cached bytes this mount may use without a compare (docs/fs.md, "Coherent
    /// caching"). Only bytes of cached objects: removing an object untrusts its bytes.
    trusted: ByteRanges,
    /// Bytes of cached objects that another member announced a write to since they were
    /// read (the numbers unused). A run that compares such a byte reads the object again
    /// first (the compare would fail); the rest of the object still serves operations that
    /// compare every byte they rely on (creates by other mounts change a directory's times
    /// and counts, not what a create in it reads).
    changed: ByteRanges,
    /// Objects inserted so far, and the number each object got when it was inserted.
    fills: u64,
    filled: HashMap<(NodeId, u64), u64>,
    pointers: HashMap<Ino, FilePointers>,
    bytes: usize,
    /// Where this mount last allocated, per node and bitmap: the word index.
    cursors: HashMap<(NodeId, crate::layout::Bitmap), u64>,
}

/// Where a fetched object goes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dest {
    Object,
    /// A pointer block of `ino`, read under its `iversion`.
    Pointers(Ino, u64),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fetch {
    pub node: NodeId,
    pub addr: u64,
    pub len: u32,
    pub dest: Dest,
    pub block: BlockRef,
}

impl Fetch {
    /// A fetch of `len` bytes at `addr` of `node` into the object cache.
    pub fn object(node: NodeId, addr: u64, len: u32) -> Fetch {
        Fetch {
            node,
            addr,
            len,
            dest: Dest::Object,
            block: BlockRef::NONE,
        }
    }
}

impl Cache {
    pub fn object(&self, node: NodeId, addr: u64) -> Option<&Vec<u8>> {
        self.objects.get(&(node, addr))
    }

    /// The cached object that holds byte `addr` of `node`, if any.
    fn containing(&self, node: NodeId, addr: u64) -> Option<(u64, usize)> {
        let (&(n, at), obj) = self.objects.range(..=(node, addr)).next_back()?;
        (n == node && addr < at + obj.len() as u64).then_some((at, obj.len()))
    }

    /// Caches `bytes` as the object at `addr` of `node`, in place of every object it
    /// overlaps: cached objects never overlap, so each cached byte has one copy and trust
    /// kept by address means that copy. Its bytes are not trusted until said so.
    fn insert(&mut self, node: NodeId, addr: u64, bytes: Vec<u8>) {
        if self.bytes > CACHE_BYTES_MAX {
            *self = Cache::default();
        }
        for (at, _) in self.overlapping(node, addr, bytes.len() as u64) {
            self.remove(node, at);
        }
        self.bytes += bytes.len();
        self.fills += 1;
        self.filled.insert((node, addr), self.fills);
        self.objects.insert((node, addr), bytes);
    }

    /// Forgets the object starting at `at` of `node`, and any trust in its bytes.
    fn remove(&mut self, node: NodeId, at: u64) {
        if let Some(old) = self.objects.remove(&(node, at)) {
            self.bytes -= old.len();
            self.trusted.unset(node, at, old.len() as u64);
            self.filled.remove(&(node, at));
            self.changed.unset(node, at, old.len() as u64);
        }
    }

    /// Whether another member announced a write to any of the `len` bytes at `addr` of
    /// `node` since the object holding them was read.
    fn is_changed(&self, node: NodeId, addr: u64, len: u64) -> bool {
        self.changed.max_within(node, addr, len).is_some()
    }

    /// Another member is about to write `len` bytes at `addr` of `node`: this member
    /// trusts them no more and marks them changed in the objects that hold them, which it
    /// keeps for their other bytes.
    pub fn changed_elsewhere(&mut self, node: NodeId, addr: u64, len: u64) {
        if crate::planted(crate::Bug::AnnouncementIgnored) {
            return;
        }
        self.trusted.unset(node, addr, len);
        for (at, olen) in self.overlapping(node, addr, len) {
            let (from, to) = (addr.max(at), (addr + len).min(at + olen as u64));
            self.changed.set(node, from, to - from, 0);
        }
    }

    /// Whether one cached object holds all `len` bytes at `addr` of `node`.
    fn covers(&self, node: NodeId, addr: u64, len: u64) -> bool {
        (self.containing(node, addr)).is_some_and(|(at, olen)| addr + len <= at + olen as u64)
    }

    /// Marks what `grant` grants of the `len` cached bytes at `addr` of `node` as usable
    /// without a compare (nothing, unless one cached object holds them all).
    fn trust(&mut self, node: NodeId, addr: u64, len: u64, grant: &Grant<'_>) {
        if self.covers(node, addr, len) {
            for (at, len) in grant.pieces(node, addr, len) {
                self.trusted.set(node, at, len, grant.epoch());
            }
        }
    }

    /// Whether the `len` bytes at `addr` of `node` are cached, trusted, and granted now.
    fn is_trusted(&self, node: NodeId, addr: u64, len: u64, grant: &Grant<'_>) -> bool {
        self.trusted.all(node, addr, len, grant.epoch()) && grant.covers(node, addr, len)
    }

    /// Every cached object that overlaps `len` bytes at `addr` of `node`, as (start,
    /// length): the one holding `addr`, if it starts before it, and those starting within.
    fn overlapping(&self, node: NodeId, addr: u64, len: u64) -> Vec<(u64, usize)> {
        let before = self.containing(node, addr).filter(|&(at, _)| at < addr);
        let within = (self.objects.range((node, addr)..(node, addr + len)))
            .map(|(&(_, at), obj)| (at, obj.len()));
        before.into_iter().chain(within).collect()
    }

    /// Objects inserted so far (a write notes it when it begins).
    pub fn fills(&self) -> u64 {
        self.fills
    }

    /// Forgets the objects holding `touched` that were inserted after fill `since`: a
    /// write's effects must not be applied to a copy read after the write committed, which
    /// holds them already (an atomic add would count twice).
    fn drop_filled_after(&mut self, touched: &[(NodeId, u64)], since: u64) {
        for &(node, addr) in touched {
            if let Some((at, _)) = self.containing(node, addr) {
                if self.filled.get(&(node, at)).is_some_and(|&n| n > since) {
                    self.drop_containing(node, addr);
                }
            }
        }
    }

    /// After this member's committed write `tx` (its effects applied): the bytes it wrote
    /// or added to are trusted no more, and then what `grant` grants (what nothing moved
    /// under since the write began) of the bytes it compared and the bytes it wrote that
    /// the cache holds is trusted: the commit found the first as cached and made the second
    /// so. A word it added to stays trusted only if it was: the cached word plus the delta
    /// is only as good as the cached word was.
    fn settle_trust(&mut self, tx: &Minitx, grant: &Grant<'_>) {
        for (node, item) in tx.items() {
            if let Item::Compare {
                addr,
                op: CmpOp::Eq,
                bytes,
            } = item
            {
                self.trust(*node, *addr, bytes.len() as u64, grant);
            }
        }
        for (node, item) in tx.items() {
            match item {
                Item::Write { addr, bytes } => {
                    self.trusted.unset(*node, *addr, bytes.len() as u64);
                    self.trust(*node, *addr, bytes.len() as u64, grant);
                }
                Item::Add { addr, .. } if !self.is_trusted(*node, *addr, 8, grant) => {
                    self.trusted.unset(*node, *addr, 8);
                }
                _ => {}
            }
        }
    }

    /// Forgets every object that overlaps `len` bytes at `addr` of `node` (a write went
    /// there that the cache does not copy).
    fn drop_overlapping(&mut self, node: NodeId, addr: u64, len: u64) {
        for (at, _) in self.overlapping(node, addr, len) {
            self.remove(node, at);
        }
    }

    /// Stores what a fetch read, trusting what `grant` (the member's trust since before the
    /// read) grants of an object's bytes.
    pub fn fill_trusting(&mut self, fetch: &Fetch, bytes: Vec<u8>, grant: &Grant<'_>) {
        self.fill(fetch, bytes);
        if fetch.dest == Dest::Object {
            self.trust(fetch.node, fetch.addr, fetch.len as u64, grant);
        }
    }

    /// Whether `tx`, a plan's minitransaction, only compares bytes trusted and granted:
    /// then its answer stands without it.
    pub fn answers_on_trust(&self, tx: &Minitx, grant: &Grant<'_>) -> bool {
        (tx.items().iter()).all(|(node, item)| match item {
            Item::Compare {
                addr,
                op: CmpOp::Eq,
                bytes,
            } => self.is_trusted(*node, *addr, bytes.len() as u64, grant),
            _ => false,
        })
    }

    /// Learns how a plan's minitransaction `tx` ended (`outcome`: committed, and the
    /// positions of the compares that failed), as `settle` does, and what this member may
    /// trust after it (`settle_trust`). `since`: the fill count when a write began (objects
    /// filled after it may hold its effects already: they are dropped, not patched).
    pub fn settle_run(
        &mut self,
        tx: &Minitx,
        outcome: (bool, &[usize]),
        compared: &[(NodeId, u64)],
        effects: Effects,
        since: u64,
        grant: &Grant<'_>,
    ) {
        let (committed, failed) = outcome;
        if committed {
            self.drop_filled_after(&effects.touched(), since);
        }
        self.settle(committed, failed, compared, effects);
        if committed {
            self.settle_trust(tx, grant);
        }
    }

    /// Stores what a fetch read.
    pub fn fill(&mut self, fetch: &Fetch, bytes: Vec<u8>) {
        match fetch.dest {
            Dest::Object => self.insert(fetch.node, fetch.addr, bytes),
            Dest::Pointers(ino, iversion) => {
                let file = self.pointers.entry(ino).or_default();
                if file.iversion != iversion {
                    *file = FilePointers {
                        iversion,
                        blocks: HashMap::new(),
                    };
                }
                self.bytes += bytes.len();
                file.blocks.insert(fetch.block, bytes);
            }
        }
    }

    /// Forgets the object holding byte `addr` of `node` (a compare on it failed).
    pub fn drop_containing(&mut self, node: NodeId, addr: u64) {
        if let Some((at, _)) = self.containing(node, addr) {
            self.remove(node, at);
        }
    }

    fn patch(&mut self, node: NodeId, addr: u64, bytes: &[u8]) {
        if let Some((at, len)) = self.containing(node, addr) {
            let off = (addr - at) as usize;
            if off + bytes.len() <= len {
                let obj = self.objects.get_mut(&(node, at)).expect("contained");
                obj[off..off + bytes.len()].copy_from_slice(bytes);
            } else {
                self.drop_containing(node, addr);
            }
        }
    }

    /// Learns how a plan's minitransaction ended: applies its effects if it committed,
    /// else forgets each object whose compare failed (`failed` are item positions).
    pub fn settle(
        &mut self,
        committed: bool,
        failed: &[usize],
        compared: &[(NodeId, u64)],
        effects: Effects,
    ) {
        if committed {
            self.apply(effects);
            return;
        }
        for &i in failed {
            let (node, addr) = compared[i];
            self.drop_containing(node, addr);
        }
    }

    /// Applies the effects of a committed minitransaction to the cache.
    pub fn apply(&mut self, effects: Effects) {
        for (node, addr, len) in effects.uncached {
            self.drop_overlapping(node, addr, len as u64);
        }
        for (node, addr, bytes) in effects.writes {
            self.patch(node, addr, &bytes);
        }
        for (node, addr, bytes) in effects.objects {
            self.insert(node, addr, bytes);
        }
        for (node, addr, delta) in effects.adds {
            if let Some((at, len)) = self.containing(node, addr) {
                let off = (addr - at) as usize;
                if off + 8 <= len {
                    let obj = self.objects.get_mut(&(node, at)).expect("contained");
                    let v = u64::from_le_bytes(obj[off..off + 8].try_into().expect("8"));
                    let v = v.wrapping_add(delta as u64);
                    obj[off..off + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        for (ino, from, to) in effects.iversions {
            let file = self.pointers.entry(ino).or_default();
            if file.iversion == from {
                file.iversion = to;
            } else {
                *file = FilePointers {
                    iversion: to,
                    blocks: HashMap::new(),
                };
            }
        }
        for (ino, block, bytes) in effects.pointers {
            let file = self.pointers.entry(ino).or_default();
            self.bytes += bytes.len();
            file.blocks.insert(block, bytes);
        }
        for (ino, block) in effects.freed_pointers {
            if let Some(file) = self.pointers.get_mut(&ino) {
                file.blocks.remove(&block);
            }
        }
        for (node, kind, word) in effects.cursors {
            self.cursors.insert((node, kind), word);
        }
    }
}

impl Effects {
    /// Where the cached objects it changes lie (an address in each).
    fn touched(&self) -> Vec<(NodeId, u64)> {
        let writes = self.writes.iter().map(|(n, a, _)| (*n, *a));
        let objects = self.objects.iter().map(|(n, a, _)| (*n, *a));
        let adds = self.adds.iter().map(|(n, a, _)| (*n, *a));
        writes.chain(objects).chain(adds).collect()
    }
}

/// What a committed minitransaction changes in the cache.
#[derive(Default, Debug)]
pub struct Effects {
    writes: Vec<(NodeId, u64, Vec<u8>)>,
    objects: Vec<(NodeId, u64, Vec<u8>)>,
    /// Blocks written whole and not kept (file data): a cached copy from their last use
    /// is forgotten.
    uncached: Vec<(NodeId, u64, u32)>,
    adds: Vec<(NodeId, u64, i64)>,
    iversions: Vec<(Ino, u64, u64)>,
    pointers: Vec<(Ino, BlockRef, Vec<u8>)>,
    freed_pointers: Vec<(Ino, BlockRef)>,
    cursors: Vec<(NodeId, crate::layout::Bitmap, u64)>,
}

/// What to do next for an operation.
pub enum Plan<T> {
    /// Read these into the cache, then run the operation again.
    Fetch(Vec<Fetch>),
    /// Run `tx`. If it commits, apply `effects` and answer `result` (its reads, in order,
    /// are the operation's data); if a compare fails, drop `compared[i]` for each failed
    /// item `i` and run the operation again.
    Run {
        tx: Minitx,
        result: Result<T, i32>,
        effects: Box<Effects>,
        compared: Vec<(NodeId, u64)>,
    },
    /// Nothing to run: the answer needs no validation.
    Done(Result<T, i32>),
}

/// One run of an operation against the cache.
pub struct Txn<'a> {
    pub vol: &'a Volume,
    cache: &'a Cache,
    /// Randomness from the driver (where allocation starts looking).
    hint: u64,
    compares: BTreeMap<(NodeId, u64), Vec<u8>>,
    staged: BTreeMap<(NodeId, u64), Vec<u8>>,
    fresh: BTreeMap<(NodeId, u64), (Vec<u8>, bool)>,
    raw: Vec<(NodeId, u64, Vec<u8>)>,
    adds: Vec<(NodeId, u64, i64)>,
    reads: Vec<(NodeId, u64, u32)>,
    misses: BTreeSet<Fetch>,
    bits: BTreeMap<(NodeId, u64), (u64, u64)>,
    iversions: Vec<(Ino, u64, u64)>,
    pointers: BTreeMap<(Ino, BlockRef), Vec<u8>>,
    freed_pointers: Vec<(Ino, BlockRef)>,
    cursors: Vec<(NodeId, crate::layout::Bitmap, u64)>,
    /// Files named by kernel handles: the generation bits each must have.
    expected: Vec<(Ino, u64)>,
    /// Bits `free` returns by atomic adds, per bitmap word.
    freed: BTreeMap<(NodeId, u64), u64>,
}

/// Changed byte spans closer than this are written as one item.
const SPAN_GAP_BYTES: usize = 32;

impl<'a> Txn<'a> {
    pub fn new(vol: &'a Volume, cache: &'a Cache, hint: u64) -> Txn<'a> {
        Txn {
            vol,
            cache,
            hint,
            compares: BTreeMap::new(),
            staged: BTreeMap::new(),
            fresh: BTreeMap::new(),
            raw: vec![],
            adds: vec![],
            reads: vec![],
            misses: BTreeSet::new(),
            bits: BTreeMap::new(),
            iversions: vec![],
            pointers: BTreeMap::new(),
            freed_pointers: vec![],
            cursors: vec![],
            expected: vec![],
            freed: BTreeMap::new(),
        }
    }

    /// Says that `ino` came from a kernel handle with generation bits `generation`: the
    /// operation answers ESTALE (ENOENT for a directory it works in) if the slot now holds
    /// another file.
    pub fn expect_generation(&mut self, ino: Ino, generation: u64) {
        self.expected.push((ino, generation));
    }

    /// Is `i`, read from slot `ino`, the file the kernel's handle named (if one did)?
    pub fn is_expected(&self, ino: Ino, i: &crate::inode::Inode) -> bool {
        let mask = self.vol.handle_generation_mask();
        (self.expected.iter())
            .filter(|(e, _)| *e == ino)
            .all(|(_, g)| i.igeneration & mask == *g)
    }

    /// The object of `len` bytes at `addr` of `node`, as this run has staged it or as cached.
    pub fn object(&mut self, node: NodeId, addr: u64, len: u32) -> OpResult<Vec<u8>> {
        self.object_ref(node, addr, len).map(<[u8]>::to_vec)
    }

    /// `object`, borrowed: a directory block is 16 KiB, and a lookup reads a few bytes of it.
    pub fn object_ref(&mut self, node: NodeId, addr: u64, len: u32) -> OpResult<&[u8]> {
        let key = (node, addr);
        if self.staged.contains_key(&key) {
            return Ok(&self.staged[&key]);
        }
        if self.fresh.contains_key(&key) {
            return Ok(&self.fresh[&key].0);
        }
        let cache = self.cache;
        match cache.object(node, addr) {
            Some(_) if cache.is_changed(node, addr, len as u64) => {
                Err(self.refetch(node, addr, len))
            }
            Some(b) if b.len() == len as usize => Ok(b),
            _ => {
                self.want(node, addr, len);
                Err(Stop::Miss)
            }
        }
    }

    /// `object`, even if another member has announced writes to some of its bytes since
    /// this mount read it: for an operation that compares every byte it relies on (a
    /// compare of a changed byte makes the run read the object again, see `finish`).
    pub fn object_despite_changes(
        &mut self,
        node: NodeId,
        addr: u64,
        len: u32,
    ) -> OpResult<Vec<u8>> {
        match self.cache.object(node, addr) {
            Some(b) if b.len() == len as usize && !self.staged.contains_key(&(node, addr)) => {
                Ok(b.clone())
            }
            _ => self.object(node, addr, len),
        }
    }

    /// Asks for an object to be fetched without stopping (prefetch).
    pub fn want(&mut self, node: NodeId, addr: u64, len: u32) {
        if self.cache.object(node, addr).map(Vec::len) != Some(len as usize) {
            self.misses.insert(Fetch::object(node, addr, len));
        }
    }

    /// The cached object is not what it should be (a block reused since it was read): fetch
    /// it again and run the operation again.
    pub fn refetch(&mut self, node: NodeId, addr: u64, len: u32) -> Stop {
        self.misses.insert(Fetch::object(node, addr, len));
        Stop::Miss
    }

    /// Fetches again the bitmap page holding bit `index` of `kind` on `node`.
    pub fn refetch_bitmap_page(&mut self, node: NodeId, kind: crate::layout::Bitmap, index: u64) {
        let word = self.vol.bitmap_word_addr(node, kind, index);
        let (at, len) = (self.bitmap_pages(node, kind).into_iter())
            .rfind(|(at, _)| *at <= word)
            .expect("a page holds every word");
        self.misses.insert(Fetch::object(node, at, len));
    }

    /// Validates `len` bytes at `addr` of a cached object: the minitransaction compares them
    /// with what this mount read.
    pub fn check(&mut self, node: NodeId, addr: u64, len: u32) {
        let (at, _) = self
            .cache
            .containing(node, addr)
            .expect("checked bytes are cached");
        let obj = self.cache.object(node, at).expect("cached");
        let off = (addr - at) as usize;
        let bytes = obj[off..off + len as usize].to_vec();
        let old = self.compares.insert((node, addr), bytes);
        assert!(
            old.is_none_or(|o| o.len() == len as usize),
            "one compare per place"
        );
    }

    /// The new image of a cached object; written as the bytes that differ.
    pub fn stage(&mut self, node: NodeId, addr: u64, bytes: Vec<u8>) {
        if self.fresh.contains_key(&(node, addr)) {
            let cache = self.fresh.get(&(node, addr)).expect("fresh").1;
            self.fresh.insert((node, addr), (bytes, cache));
            return;
        }
        let cached = self
            .cache
            .object(node, addr)
            .expect("staged objects are cached");
        assert_eq!(cached.len(), bytes.len(), "an object keeps its size");
        self.staged.insert((node, addr), bytes);
    }

    /// A newly allocated block's whole contents; `cache` keeps it (directory blocks).
    pub fn create_block(&mut self, block: BlockRef, bytes: Vec<u8>, cache: bool) {
        let addr = self.vol.block_addr(block);
        assert_eq!(bytes.len(), self.vol.geometry.block_bytes as usize);
        self.fresh.insert((block.node(), addr), (bytes, cache));
    }

    pub fn write(&mut self, node: NodeId, addr: u64, bytes: Vec<u8>) {
        self.raw.push((node, addr, bytes));
    }

    pub fn add(&mut self, node: NodeId, addr: u64, delta: i64) {
        self.adds.push((node, addr, delta));
    }

    /// Reads `len` bytes at commit; returns the read's index among the operation's data.
    pub fn read(&mut self, node: NodeId, addr: u64, len: u32) -> usize {
        self.reads.push((node, addr, len));
        self.reads.len() - 1
    }

    /// Says that this run moves `ino`'s `iversion` from `from` to `to` (its pointer blocks
    /// cached under `from` stay valid under `to`).
    pub fn moves_iversion(&mut self, ino: Ino, from: u64, to: u64) {
        self.iversions.push((ino, from, to));
    }

    /// A pointer block of `ino` as of `iversion` (staged by this run, or cached). EIO if `b`
    /// is not a block of the volume: the validated inode that names it is damaged.
    pub fn pointer_block(&mut self, ino: Ino, iversion: u64, b: BlockRef) -> OpResult<Vec<u8>> {
        if let Some(p) = self.pointers.get(&(ino, b)) {
            return Ok(p.clone());
        }
        if !self.vol.valid_block(b) {
            return Err(Stop::Errno(libc::EIO));
        }
        if let Some(file) = self.cache.pointers.get(&ino) {
            if file.iversion == iversion {
                if let Some(p) = file.blocks.get(&b) {
                    return Ok(p.clone());
                }
            }
        }
        self.misses.insert(Fetch {
            node: b.node(),
            addr: self.vol.block_addr(b),
            len: self.vol.geometry.block_bytes,
            dest: Dest::Pointers(ino, iversion),
            block: b,
        });
        Err(Stop::Miss)
    }

    /// Reads pointer block `b` of `ino` again, filed under `iversion`.
    pub fn refetch_pointers(&mut self, ino: Ino, iversion: u64, b: BlockRef) -> Stop {
        self.misses.insert(Fetch {
            node: b.node(),
            addr: self.vol.block_addr(b),
            len: self.vol.geometry.block_bytes,
            dest: Dest::Pointers(ino, iversion),
            block: b,
        });
        Stop::Miss
    }

    /// A newly allocated pointer block of `ino`, all holes.
    pub fn new_pointer_block(&mut self, ino: Ino, b: BlockRef) {
        let zeros = vec![0u8; self.vol.geometry.block_bytes as usize];
        self.fresh
            .insert((b.node(), self.vol.block_addr(b)), (zeros.clone(), false));
        self.pointers.insert((ino, b), zeros);
    }

    /// Sets entry `index` of pointer block `b` of `ino` (read as of `iversion`) to `to`.
    pub fn set_pointer(
        &mut self,
        ino: Ino,
        iversion: u64,
        b: BlockRef,
        index: u64,
        to: BlockRef,
    ) -> OpResult<()> {
        let mut block = self.pointer_block(ino, iversion, b)?;
        let at = index as usize * 8;
        block[at..at + 8].copy_from_slice(&to.0.to_le_bytes());
        let addr = self.vol.block_addr(b);
        match self.fresh.get_mut(&(b.node(), addr)) {
            Some((image, _)) => image.copy_from_slice(&block),
            None => self.write(b.node(), addr + at as u64, to.0.to_le_bytes().to_vec()),
        }
        self.pointers.insert((ino, b), block);
        Ok(())
    }

    pub fn pointer_freed(&mut self, ino: Ino, b: BlockRef) {
        self.pointers.remove(&(ino, b));
        self.fresh.remove(&(b.node(), self.vol.block_addr(b)));
        self.freed_pointers.push((ino, b));
    }

    fn bitmap_pages(&self, node: NodeId, kind: crate::layout::Bitmap) -> Vec<(u64, u32)> {
        let at = self.vol.bitmap_addr(node, kind);
        let bytes = self.vol.bitmap_bytes(kind);
        (0..bytes.div_ceil(BITMAP_PAGE_BYTES))
            .map(|p| {
                let len = BITMAP_PAGE_BYTES.min(bytes - p * BITMAP_PAGE_BYTES);
                (at + p * BITMAP_PAGE_BYTES, len as u32)
            })
            .collect()
    }

    /// The current value of the bitmap word at `addr` (this run's changes included).
    fn word(&mut self, node: NodeId, addr: u64) -> OpResult<u64> {
        if let Some(&(_, new)) = self.bits.get(&(node, addr)) {
            return Ok(new);
        }
        let Some((at, _)) = self.cache.containing(node, addr) else {
            let page = addr
                - (addr - self.vol.bitmap_addr(node, self.bitmap_kind(node, addr)))
                    % BITMAP_PAGE_BYTES;
            let pages = self.bitmap_pages(node, self.bitmap_kind(node, addr));
            let len = pages.iter().find(|(a, _)| *a == page).expect("a page").1;
            self.want(node, page, len);
            return Err(Stop::Miss);
        };
        let obj = self.cache.object(node, at).expect("cached");
        let off = (addr - at) as usize;
        let value = u64::from_le_bytes(obj[off..off + 8].try_into().expect("8"));
        // What the operation decides from a word (a free bit, a full word) is validated
        // like everything else it read.
        self.check(node, addr, 8);
        Ok(value)
    }

    fn bitmap_kind(&self, node: NodeId, addr: u64) -> crate::layout::Bitmap {
        use crate::layout::Bitmap;
        if addr >= self.vol.bitmap_addr(node, Bitmap::Blocks) {
            Bitmap::Blocks
        } else {
            Bitmap::Inodes
        }
    }

    fn set_word(&mut self, node: NodeId, addr: u64, old: u64, new: u64) {
        let entry = self.bits.entry((node, addr)).or_insert((old, old));
        entry.1 = new;
    }

    /// Takes a free bit of `kind` on `node`, or `None` if the node has none (every word is
    /// then compared, so that a stale "full" is found out).
    pub fn alloc_on(&mut self, node: NodeId, kind: crate::layout::Bitmap) -> OpResult<Option<u64>> {
        let pages = self.bitmap_pages(node, kind);
        let missing: Vec<_> = (pages.iter())
            .filter(|(a, len)| self.cache.object(node, *a).map(Vec::len) != Some(*len as usize))
            .copied()
            .collect();
        if !missing.is_empty() {
            for (a, len) in missing {
                self.want(node, a, len);
            }
            return Err(Stop::Miss);
        }
        // Start where this mount last allocated (runs of creates take neighbouring slots,
        // which the inode prefetch has read), else somewhere random (mounts spread out).
        let words = self.vol.bitmap_bytes(kind) / 8;
        let at = self.vol.bitmap_addr(node, kind);
        let start = (self.cache.cursors.get(&(node, kind)).copied()).unwrap_or(self.hint % words);
        for k in 0..words {
            let w = (start + k) % words;
            let value = self.word(node, at + w * 8)?;
            if value != u64::MAX {
                let bit = (!value).trailing_zeros() as u64;
                self.set_word(node, at + w * 8, value, value | 1 << bit);
                self.cursors.push((node, kind, w));
                return Ok(Some(w * 64 + bit));
            }
        }
        // Every word was read through `word`, which compares it: a stale "full" fails.
        Ok(None)
    }

    /// Takes a free bit of `kind`, on `prefer` if it has one, else on the next node that does.
    pub fn alloc(
        &mut self,
        prefer: NodeId,
        kind: crate::layout::Bitmap,
    ) -> OpResult<(NodeId, u64)> {
        let nodes: Vec<NodeId> = self.vol.nodes.iter().map(|(n, _)| *n).collect();
        let first = nodes.iter().position(|n| *n == prefer).unwrap_or(0);
        for i in 0..nodes.len() {
            let node = nodes[(first + i) % nodes.len()];
            if let Some(index) = self.alloc_on(node, kind)? {
                return Ok((node, index));
            }
        }
        Err(Stop::Errno(libc::ENOSPC))
    }

    /// Returns bit `index` of `kind` on `node`, which belongs to a file whose inode this
    /// run compares (so the bit is set when the minitransaction commits): by an atomic add
    /// on its word, not a compared write, so that mounts freeing neighbouring bits (two
    /// unlinking in one directory) do not fail each other's compares.
    pub fn free(&mut self, node: NodeId, kind: crate::layout::Bitmap, index: u64) -> OpResult<()> {
        let addr = self.vol.bitmap_word_addr(node, kind, index);
        let bit = 1u64 << (index % 64);
        let cached_set = self.cache.containing(node, addr).is_some_and(|(at, _)| {
            let obj = self.cache.object(node, at).expect("cached");
            let off = (addr - at) as usize;
            u64::from_le_bytes(obj[off..off + 8].try_into().expect("8")) & bit != 0
        });
        // A word this run writes carries the change itself; a bit this mount saw clear is
        // checked the compared way (stale, or damage that fsck reports).
        if self.bits.contains_key(&(node, addr)) || !cached_set {
            return self.free_compared(node, kind, index);
        }
        let freed = self.freed.entry((node, addr)).or_insert(0);
        if *freed & bit != 0 {
            return Err(Stop::Errno(libc::EIO));
        }
        *freed |= bit;
        Ok(())
    }

    /// Returns bit `index` of `kind` on `node` by a compared write of its word: for a bit
    /// no compared inode vouches for (fsck's repair of a leak). EIO if it is not set.
    pub fn free_compared(
        &mut self,
        node: NodeId,
        kind: crate::layout::Bitmap,
        index: u64,
    ) -> OpResult<()> {
        let addr = self.vol.bitmap_word_addr(node, kind, index);
        let value = self.word(node, addr)?;
        let bit = 1u64 << (index % 64);
        if value & bit == 0 {
            // Validated like any answer: if the word is as read, the volume is damaged
            // (fsck says how).
            return Err(Stop::Errno(libc::EIO));
        }
        self.set_word(node, addr, value, value & !bit);
        Ok(())
    }

    /// The plan for this run, given what the operation answered.
    pub fn finish<T>(mut self, answer: OpResult<T>) -> Plan<T> {
        let result = match answer {
            Err(Stop::Miss) => {
                assert!(!self.misses.is_empty(), "a miss names what to fetch");
                return Plan::Fetch(self.misses.into_iter().collect());
            }
            Err(Stop::Errno(e)) => {
                // An error changes nothing; only what it was decided from is validated.
                self.staged.clear();
                self.fresh.clear();
                self.raw.clear();
                self.adds.clear();
                self.reads.clear();
                self.iversions.clear();
                self.pointers.clear();
                self.freed_pointers.clear();
                self.cursors.clear();
                self.bits.clear();
                self.freed.clear();
                Err(e)
            }
            Ok(t) => Ok(t),
        };
        // A compare of bytes another member announced a write to would fail: read the
        // object again first. So would the write of a staged object with such bytes (its
        // other fields may have been decided from them).
        let compared = (self.compares.iter()).map(|(&(n, a), b)| (n, a, b.len()));
        let staged = (self.staged.iter()).map(|(&(n, a), b)| (n, a, b.len()));
        let stale: BTreeSet<Fetch> = (compared.chain(staged))
            .filter(|&(n, a, len)| self.cache.is_changed(n, a, len as u64))
            .filter_map(|(n, a, _)| {
                let (at, len) = self.cache.containing(n, a)?;
                Some(Fetch::object(n, at, len as u32))
            })
            .collect();
        if !stale.is_empty() {
            return Plan::Fetch(stale.into_iter().collect());
        }
        let mut tx = Minitx::new();
        let mut compared = vec![];
        for ((node, addr), bytes) in &self.compares {
            tx = tx.compare(*node, *addr, bytes.clone());
            compared.push((*node, *addr));
        }
        for (node, addr, len) in &self.reads {
            tx = tx.read(*node, *addr, *len);
        }
        let mut effects = Effects::default();
        for ((node, addr), new) in self.staged {
            let old = self
                .cache
                .object(node, addr)
                .expect("staged objects are cached");
            // The cache learns the changed spans (what the commit writes), not the whole
            // image: the bytes around them keep what trust they had.
            for (from, to) in changed_spans(old, &new) {
                let span = new[from..to].to_vec();
                tx = tx.write(node, addr + from as u64, span.clone());
                effects.writes.push((node, addr + from as u64, span));
            }
        }
        for ((node, addr), (bytes, cache)) in self.fresh {
            tx = tx.write(node, addr, bytes.clone());
            match cache {
                true => effects.objects.push((node, addr, bytes)),
                false => effects.uncached.push((node, addr, bytes.len() as u32)),
            }
        }
        for ((node, addr), (old, new)) in self.bits {
            if old != new {
                tx = tx.write(node, addr, new.to_le_bytes().to_vec());
                effects
                    .writes
                    .push((node, addr, new.to_le_bytes().to_vec()));
            }
        }
        for (node, addr, bytes) in self.raw {
            tx = tx.write(node, addr, bytes.clone());
            effects.writes.push((node, addr, bytes));
        }
        // After the words' writes: a word this run also allocates from is written with the
        // freed bits still set, and the add then clears them.
        let freed =
            (self.freed.into_iter()).map(|((n, a), mask)| (n, a, (mask as i64).wrapping_neg()));
        for (node, addr, delta) in self.adds.into_iter().chain(freed) {
            tx = tx.add(node, addr, delta);
            effects.adds.push((node, addr, delta));
        }
        effects.iversions = self.iversions;
        effects.pointers = self
            .pointers
            .into_iter()
            .map(|((i, b), p)| (i, b, p))
            .collect();
        effects.freed_pointers = self.freed_pointers;
        effects.cursors = self.cursors;
        if tx.items().is_empty() {
            return Plan::Done(result);
        }
        Plan::Run {
            tx: tx.class("fs"),
            result,
            effects: Box::new(effects),
            compared,
        }
    }
}

/// The byte spans where `new` differs from `old`, nearby spans merged.
fn changed_spans(old: &[u8], new: &[u8]) -> Vec<(usize, usize)> {
    let mut spans: Vec<(usize, usize)> = vec![];
    for i in 0..new.len() {
        if old[i] != new[i] {
            match spans.last_mut() {
                Some((_, end)) if i - *end < SPAN_GAP_BYTES => *end = i + 1,
                _ => spans.push((i, i + 1)),
            }
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_merge_when_close() {
        let old = vec![0u8; 200];
        let mut new = old.clone();
        new[3] = 1;
        new[10] = 1;
        new[150] = 1;
        assert_eq!(changed_spans(&old, &new), vec![(3, 11), (150, 151)]);
        assert!(changed_spans(&old, &old).is_empty());
    }

    /// Another member's announced write to some bytes of a cached object: those bytes are
    /// no longer trusted, a run that compares them reads the object again first, and the
    /// object still serves a run that compares only the others.
    #[test]
    fn bytes_another_member_changes_are_read_again_only_when_compared() {
        let geometry = crate::layout::Geometry::new(64 << 20, 16 << 10, 8 << 10).unwrap();
        let vol = Volume {
            geometry,
            nodes: vec![(1, 0)],
        };
        let addr = vol.inode_addr(Ino::new(1, 5));
        let inode = Fetch::object(1, addr, 256);
        let mut cache = Cache::default();
        let mut trust = crate::coherence::Trust::new(2000);
        trust.renewed(0);
        let grant = trust.grant(trust.stamp(), 1);
        cache.fill_trusting(&inode, vec![7; 256], &grant);
        cache.changed_elsewhere(1, addr + 40, 16);
        let trusted = |at, len| cache.is_trusted(1, at, len, &grant);
        assert!(trusted(addr, 40) && trusted(addr + 56, 200));
        assert!(!trusted(addr + 40, 1) && !trusted(addr + 55, 1));

        // What a run that reads the inode and compares 8 bytes at `at` fetches first.
        fn fetches(vol: &Volume, cache: &Cache, addr: u64, at: u64, strict: bool) -> Vec<Fetch> {
            let mut tx = Txn::new(vol, cache, 0);
            let read = match strict {
                true => tx.object(1, addr, 256),
                false => tx.object_despite_changes(1, addr, 256),
            };
            let answer = read.map(|_| tx.check(1, at, 8));
            match tx.finish(answer) {
                Plan::Fetch(f) => f,
                _ => vec![],
            }
        }
        let again = vec![inode.clone()];
        assert_eq!(
            fetches(&vol, &cache, addr, addr + 8, false),
            vec![],
            "unchanged: it runs"
        );
        assert_eq!(
            fetches(&vol, &cache, addr, addr + 48, false),
            again,
            "changed: read again"
        );
        assert_eq!(
            fetches(&vol, &cache, addr, addr + 8, true),
            again,
            "`object` reads again"
        );

        cache.fill(&inode, vec![8; 256]);
        assert_eq!(
            fetches(&vol, &cache, addr, addr + 48, true),
            vec![],
            "a fill clears marks"
        );
    }
}
