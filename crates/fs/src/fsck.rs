//! The volume's invariants, checked over a snapshot (docs/fs.md, "fsck"): every block
//! allocated once and referenced once, bitmaps matching the inodes and blocks in use, link
//! and entry counts, directory entries naming live inodes of the right generation, parents.
//! Sans-I/O: `check` asks for the blocks it still needs; the driver and the simulator read them.

use crate::dir::{name_hash, Bucket, Table};
use crate::inode::{Inode, FLAG_ORPHAN, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::layout::{get_u64, BlockRef, Ino, Volume, INODE_BYTES};
use crate::xattr::Xattrs;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tutti_wire::NodeId;

/// What a snapshot holds: each node's bitmaps and inode table, and the blocks read so far.
#[derive(Default)]
pub struct Snapshot {
    pub inode_bitmaps: HashMap<NodeId, Vec<u8>>,
    pub block_bitmaps: HashMap<NodeId, Vec<u8>>,
    pub inode_tables: HashMap<NodeId, Vec<u8>>,
    pub blocks: HashMap<BlockRef, Vec<u8>>,
}

fn bit(map: &[u8], i: u64) -> bool {
    map[(i / 8) as usize] & (1 << (i % 8)) != 0
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A block allocated in its bitmap that nothing references (a crashed client's leak).
    LeakedBlock(BlockRef),
    /// An inode with no links, not in any directory (unlinked while open, then the mount
    /// crashed; or a large unlink cut short).
    Orphan(Ino),
    /// Anything else, described.
    Broken(String),
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub inodes_used: u64,
    pub blocks_used: u64,
    pub files: u64,
    pub directories: u64,
    pub problems: Vec<Problem>,
}

impl Snapshot {
    fn inode(&self, ino: Ino) -> Inode {
        let at = (ino.slot() * INODE_BYTES) as usize;
        Inode::decode(&self.inode_tables[&ino.node()][at..at + INODE_BYTES as usize])
    }

    fn block(&self, b: BlockRef) -> Option<&Vec<u8>> {
        self.blocks.get(&b)
    }
}

/// Walks the volume in `snap`. `Err` lists the blocks to read into `snap.blocks` first.
pub fn check(vol: &Volume, snap: &Snapshot) -> Result<Report, Vec<BlockRef>> {
    let mut c = Checker {
        vol,
        snap,
        need: BTreeSet::new(),
        refs: BTreeMap::new(),
        links: HashMap::new(),
        subdirs: HashMap::new(),
        report: Report::default(),
        problems: vec![],
    };
    c.walk();
    if !c.need.is_empty() {
        return Err(c.need.into_iter().collect());
    }
    c.finish();
    Ok(c.report)
}

struct Checker<'a> {
    vol: &'a Volume,
    snap: &'a Snapshot,
    need: BTreeSet<BlockRef>,
    /// Each referenced block, with who references it (for the message).
    refs: BTreeMap<BlockRef, Ino>,
    /// Entries naming each inode, and (for directories) the directory they are in.
    links: HashMap<Ino, Vec<Ino>>,
    subdirs: HashMap<Ino, u64>,
    report: Report,
    problems: Vec<Problem>,
}

impl Checker<'_> {
    fn broken(&mut self, what: String) {
        self.problems.push(Problem::Broken(what));
    }

    fn reference(&mut self, b: BlockRef, owner: Ino) -> bool {
        if !self.vol.valid_block(b) {
            self.broken(format!(
                "inode {:#x} references block {:#x}, outside the volume",
                owner.0, b.0
            ));
            return false;
        }
        if let Some(other) = self.refs.insert(b, owner) {
            self.broken(format!(
                "block {:#x} is referenced by inodes {:#x} and {:#x}",
                b.0, other.0, owner.0
            ));
            return false;
        }
        true
    }

    fn walk(&mut self) {
        let root = self.vol.root();
        let mut dirs = vec![root];
        self.links.entry(root).or_default().push(root);
        let mut seen = BTreeSet::from([root]);
        while let Some(d) = dirs.pop() {
            let children = self.directory(d);
            let subdirs = children.iter().filter(|(_, is_dir)| *is_dir).count() as u64;
            self.subdirs.insert(d, subdirs);
            for (child, is_dir) in children {
                if is_dir && seen.insert(child) {
                    dirs.push(child);
                } else if is_dir {
                    self.broken(format!(
                        "directory {:#x} is linked from more than one place",
                        child.0
                    ));
                }
            }
        }
        for &(node, _) in &self.vol.nodes {
            for slot in 0..self.vol.geometry.inodes_per_node {
                let ino = Ino::new(node, slot);
                let inode = self.snap.inode(ino);
                let allocated = bit(&self.snap.inode_bitmaps[&node], slot);
                if allocated == inode.is_free() {
                    self.broken(format!(
                        "inode {:#x}: bitmap says {} but its mode is {:#o}",
                        ino.0,
                        if allocated { "used" } else { "free" },
                        inode.mode
                    ));
                }
                if !inode.is_free() {
                    self.inode(ino, &inode);
                }
            }
        }
    }

    /// The entries of directory `d`: (child, is a directory).
    fn directory(&mut self, d: Ino) -> Vec<(Ino, bool)> {
        let dir = self.snap.inode(d);
        let mut out = vec![];
        if !dir.is_dir() {
            self.broken(format!(
                "{:#x} is listed as a directory but is not one",
                d.0
            ));
            return out;
        }
        let Some(tb) = self.snap.block(dir.root) else {
            self.need.insert(dir.root);
            return out;
        };
        let table = Table::decode(tb);
        if !table.owned_by(d, dir.igeneration) {
            self.broken(format!(
                "directory {:#x}: its table block belongs to {:#x}",
                d.0, table.owner.0
            ));
            return out;
        }
        let mut buckets: Vec<(usize, BlockRef)> =
            table.buckets.iter().copied().enumerate().collect();
        buckets.sort_by_key(|(_, b)| *b);
        buckets.dedup_by_key(|(_, b)| *b);
        let mut count = 0;
        for (slot, b) in buckets {
            let Some(bytes) = self.snap.block(b) else {
                self.need.insert(b);
                continue;
            };
            let Some(bucket) = Bucket::decode(bytes) else {
                self.broken(format!(
                    "directory {:#x}: bucket {:#x} does not decode",
                    d.0, b.0
                ));
                continue;
            };
            if !bucket.owned_by(d, dir.igeneration) {
                self.broken(format!(
                    "directory {:#x}: bucket {:#x} belongs to {:#x}",
                    d.0, b.0, bucket.owner.0
                ));
                continue;
            }
            let mask = (1u64 << bucket.depth) - 1;
            for e in &bucket.entries {
                count += 1;
                if name_hash(&e.name) & mask != slot as u64 & mask {
                    self.broken(format!(
                        "directory {:#x}: {:?} is in the wrong bucket",
                        d.0,
                        String::from_utf8_lossy(&e.name)
                    ));
                }
                if !self.vol.valid_ino(e.ino) {
                    self.broken(format!(
                        "directory {:#x}: {:?} names inode {:#x}, outside the volume",
                        d.0,
                        String::from_utf8_lossy(&e.name),
                        e.ino.0
                    ));
                    continue;
                }
                let child = self.snap.inode(e.ino);
                if child.is_free()
                    || child.igeneration != e.generation
                    || (child.mode >> 12) as u8 != e.kind
                {
                    self.broken(format!(
                        "directory {:#x}: {:?} names inode {:#x} generation {}, which is {}",
                        d.0,
                        String::from_utf8_lossy(&e.name),
                        e.ino.0,
                        e.generation,
                        if child.is_free() {
                            "free".to_string()
                        } else {
                            format!("generation {} mode {:#o}", child.igeneration, child.mode)
                        }
                    ));
                    continue;
                }
                self.links.entry(e.ino).or_default().push(d);
                out.push((e.ino, child.is_dir()));
            }
        }
        if self.need.is_empty() && count != dir.entries {
            self.broken(format!(
                "directory {:#x} counts {} entries but holds {count}",
                d.0, dir.entries
            ));
        }
        out
    }

    fn inode(&mut self, ino: Ino, i: &Inode) {
        self.report.inodes_used += 1;
        let links = self.links.get(&ino).cloned().unwrap_or_default();
        let mut blocks = 0u64;
        match i.mode & S_IFMT {
            S_IFDIR => {
                self.report.directories += 1;
                blocks += self.directory_blocks(ino, i);
                let subdirs = self.subdirs.get(&ino).copied().unwrap_or(0);
                if i.nlink != 2 + subdirs {
                    self.broken(format!(
                        "directory {:#x} has nlink {} but {} subdirectories",
                        ino.0, i.nlink, subdirs
                    ));
                }
                let expect_parent = if ino == self.vol.root() {
                    Some(ino)
                } else {
                    links.first().copied()
                };
                if links.is_empty() && ino != self.vol.root() {
                    self.broken(format!("directory {:#x} is in no directory", ino.0));
                } else if expect_parent != Some(i.parent) {
                    self.broken(format!(
                        "directory {:#x} names {:#x} as its parent",
                        ino.0, i.parent.0
                    ));
                }
            }
            S_IFREG | S_IFLNK | libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFSOCK => {
                self.report.files += 1;
                if !i.root.is_none() {
                    blocks += self.map_blocks(ino, i.root, i.height);
                }
                if links.is_empty() && i.nlink == 0 {
                    self.problems.push(Problem::Orphan(ino));
                } else if links.len() as u64 != i.nlink {
                    self.broken(format!(
                        "inode {:#x} has nlink {} but {} entries",
                        ino.0,
                        i.nlink,
                        links.len()
                    ));
                } else if i.flags & FLAG_ORPHAN != 0 && i.nlink > 0 {
                    self.broken(format!("inode {:#x} is marked orphan but has links", ino.0));
                }
            }
            other => self.broken(format!("inode {:#x} has unknown type {other:#o}", ino.0)),
        }
        if !i.xattr.is_none() {
            blocks += self.xattr_block(ino, i);
        }
        if self.need.is_empty() && blocks != i.blocks {
            self.broken(format!(
                "inode {:#x} counts {} blocks but holds {blocks}",
                ino.0, i.blocks
            ));
        }
    }

    fn directory_blocks(&mut self, ino: Ino, i: &Inode) -> u64 {
        if !self.reference(i.root, ino) {
            return 0;
        }
        let Some(tb) = self.snap.block(i.root) else {
            self.need.insert(i.root);
            return 0;
        };
        let mut buckets = Table::decode(tb).buckets;
        buckets.sort();
        buckets.dedup();
        1 + buckets
            .into_iter()
            .filter(|b| self.reference(*b, ino))
            .count() as u64
    }

    /// The attribute block of `ino`: referenced once, naming its owner, well formed.
    fn xattr_block(&mut self, ino: Ino, i: &Inode) -> u64 {
        if !self.reference(i.xattr, ino) {
            return 0;
        }
        let Some(block) = self.snap.block(i.xattr) else {
            self.need.insert(i.xattr);
            return 1;
        };
        match Xattrs::decode(block) {
            Some(x) if x.owned_by(ino, i.igeneration) => {}
            Some(x) => self.broken(format!(
                "inode {:#x}: its attribute block {:#x} belongs to {:#x}",
                ino.0, i.xattr.0, x.owner.0
            )),
            None => self.broken(format!(
                "inode {:#x}: its attribute block {:#x} does not decode",
                ino.0, i.xattr.0
            )),
        }
        1
    }

    fn map_blocks(&mut self, ino: Ino, b: BlockRef, level: u32) -> u64 {
        if !self.reference(b, ino) {
            return 0;
        }
        if level == 0 {
            return 1;
        }
        let Some(block) = self.snap.block(b) else {
            self.need.insert(b);
            return 0;
        };
        let block = block.clone();
        let mut n = 1;
        for slot in 0..self.vol.geometry.pointers_per_block() {
            let child = BlockRef(get_u64(&block, slot * 8));
            if !child.is_none() {
                n += self.map_blocks(ino, child, level - 1);
            }
        }
        n
    }

    fn finish(&mut self) {
        for &(node, _) in &self.vol.nodes {
            for index in 0..self.vol.geometry.blocks_per_node {
                let b = BlockRef::new(node, index);
                let allocated = bit(&self.snap.block_bitmaps[&node], index);
                self.report.blocks_used += allocated as u64;
                match (allocated, self.refs.get(&b)) {
                    (true, None) => self.problems.push(Problem::LeakedBlock(b)),
                    (false, Some(owner)) => self.problems.push(Problem::Broken(format!(
                        "block {:#x} of inode {:#x} is free in its bitmap",
                        b.0, owner.0
                    ))),
                    _ => {}
                }
            }
        }
        self.report.problems = std::mem::take(&mut self.problems);
    }
}

/// Reads `len` bytes at `addr` of a node, straight from its memory (the simulator's spaces).
pub type ReadImage<'a> = &'a dyn Fn(NodeId, u64, u32) -> Vec<u8>;

/// Checks a volume read straight from its nodes' memory.
pub fn check_image(vol: &Volume, read: ReadImage<'_>) -> Report {
    use crate::layout::Bitmap;
    let g = &vol.geometry;
    let mut snap = Snapshot::default();
    for &(node, _) in &vol.nodes {
        let table_at = vol.inode_addr(Ino::new(node, 0));
        let ib = read(
            node,
            vol.bitmap_addr(node, Bitmap::Inodes),
            g.inode_bitmap_bytes() as u32,
        );
        let bb = read(
            node,
            vol.bitmap_addr(node, Bitmap::Blocks),
            g.block_bitmap_bytes() as u32,
        );
        let it = read(node, table_at, (g.inodes_per_node * INODE_BYTES) as u32);
        snap.inode_bitmaps.insert(node, ib);
        snap.block_bitmaps.insert(node, bb);
        snap.inode_tables.insert(node, it);
    }
    loop {
        match check(vol, &snap) {
            Ok(report) => return report,
            Err(need) => {
                for b in need {
                    let bytes = read(b.node(), vol.block_addr(b), g.block_bytes);
                    snap.blocks.insert(b, bytes);
                }
            }
        }
    }
}

/// The entries of directory `dir`, read straight from the nodes' memory; `None` if `dir`
/// is not a live directory.
pub fn list_image(vol: &Volume, read: ReadImage<'_>, dir: Ino) -> Option<Vec<crate::dir::Entry>> {
    let bs = vol.geometry.block_bytes;
    let inode = Inode::decode(&read(dir.node(), vol.inode_addr(dir), INODE_BYTES as u32));
    if !inode.is_dir() || !vol.valid_block(inode.root) {
        return None;
    }
    let table = Table::decode(&read(inode.root.node(), vol.block_addr(inode.root), bs));
    let mut refs = table.buckets;
    refs.sort();
    refs.dedup();
    let mut out = vec![];
    for b in refs {
        out.extend(Bucket::decode(&read(b.node(), vol.block_addr(b), bs))?.entries);
    }
    Some(out)
}
