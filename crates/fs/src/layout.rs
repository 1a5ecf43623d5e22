//! Where a volume lives on its memory nodes (docs/fs.md, "Layout"): on every node one region
//! holding a header, an inode bitmap, a block bitmap, an inode table and the data blocks;
//! how inode numbers and block references name (memory node, slot); and the headers' bytes.

use tutti_wire::NodeId;

/// "TUTTIFS1" in ASCII, the first word of every node's header.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TUTTIFS1");
/// Version 2 added extended attributes (an inode's bytes 128..136).
pub const FORMAT_VERSION: u32 = 2;
/// Bytes of a node's header; the sections after it start on a page.
pub const HEADER_BYTES: u64 = 4096;
pub const INODE_BYTES: u64 = 256;
pub const BLOCK_BYTES_DEFAULT: u32 = 16 << 10;
pub const BLOCK_BYTES_MIN: u32 = 4 << 10;
pub const BLOCK_BYTES_MAX: u32 = 1 << 20;
pub const BYTES_PER_INODE_DEFAULT: u32 = 8 << 10;
/// What the manager calls the kind of a volume's region.
pub const REGION_KIND: &str = "fs";
/// Slots and block indexes are below 2^40 on a node; the node id sits above them.
const INDEX_BITS: u32 = 40;
const PAGE: u64 = 4096;

/// Offsets of the header's fields. Every node's header holds the same values except
/// `NODE_INDEX`; the first node's header is the superblock.
pub mod field {
    pub const MAGIC: u64 = 0;
    pub const FORMAT_VERSION: u64 = 8;
    pub const BLOCK_BYTES: u64 = 12;
    pub const BYTES_PER_NODE: u64 = 16;
    pub const INODES_PER_NODE: u64 = 24;
    pub const BLOCKS_PER_NODE: u64 = 32;
    pub const VOLUME_ID: u64 = 40;
    pub const ROOT: u64 = 48;
    pub const NODE_INDEX: u32 = 56;
    pub const NODES: u64 = 60;
    pub const CREATED_UNIX_S: u64 = 64;
    pub const END: u64 = 72;
}

/// A file's inode number: the memory node holding the inode and its slot there. FUSE's root
/// (1) maps to the volume's root, which is never 1 since node ids start at 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    pub fn new(node: NodeId, slot: u64) -> Ino {
        assert!(slot < 1 << INDEX_BITS, "inode slot {slot} out of range");
        Ino((node as u64) << INDEX_BITS | slot)
    }
    pub fn node(self) -> NodeId {
        (self.0 >> INDEX_BITS) as NodeId
    }
    pub fn slot(self) -> u64 {
        self.0 & ((1 << INDEX_BITS) - 1)
    }
}

/// A data or pointer block: its memory node and index there; 0 is "no block" (a hole).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockRef(pub u64);

impl BlockRef {
    pub const NONE: BlockRef = BlockRef(0);
    pub fn new(node: NodeId, index: u64) -> BlockRef {
        assert!(index < 1 << INDEX_BITS, "block index {index} out of range");
        BlockRef((node as u64) << INDEX_BITS | index)
    }
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
    pub fn node(self) -> NodeId {
        (self.0 >> INDEX_BITS) as NodeId
    }
    pub fn index(self) -> u64 {
        self.0 & ((1 << INDEX_BITS) - 1)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("block size {0} is not a power of two in {BLOCK_BYTES_MIN}..={BLOCK_BYTES_MAX}")]
    BlockBytes(u32),
    #[error("{0} bytes per inode: use a multiple of 256 of at least 1024")]
    BytesPerInode(u32),
    #[error("{bytes_per_node} bytes per node hold fewer than 64 inodes and 64 blocks of {block_bytes} bytes")]
    TooSmall {
        bytes_per_node: u64,
        block_bytes: u32,
    },
    #[error("the region's parameters are not a volume's ({0} bytes)")]
    Params(usize),
    #[error("node {node} holds no volume header (magic {magic:#x})")]
    NotFormatted { node: NodeId, magic: u64 },
    #[error("node {node}'s header disagrees with the volume's: {what}")]
    Header { node: NodeId, what: String },
    #[error("node {node} holds a volume of format version {found}; this tutti reads version {FORMAT_VERSION}: make it again with `tutti fs mkfs --force` (which loses its files)")]
    Version { node: NodeId, found: u32 },
}

/// The sections of one node's region, in bytes from the region's start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_bytes: u32,
    pub bytes_per_inode: u32,
    pub bytes_per_node: u64,
    pub inodes_per_node: u64,
    pub blocks_per_node: u64,
    pub inode_bitmap_at: u64,
    pub block_bitmap_at: u64,
    pub inode_table_at: u64,
    pub data_at: u64,
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

impl Geometry {
    pub fn new(
        bytes_per_node: u64,
        block_bytes: u32,
        bytes_per_inode: u32,
    ) -> Result<Geometry, LayoutError> {
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
        {
            return Err(LayoutError::BlockBytes(block_bytes));
        }
        if bytes_per_inode < 1024 || !bytes_per_inode.is_multiple_of(256) {
            return Err(LayoutError::BytesPerInode(bytes_per_inode));
        }
        let too_small = LayoutError::TooSmall {
            bytes_per_node,
            block_bytes,
        };
        let inodes_per_node = (bytes_per_node / bytes_per_inode as u64) / 64 * 64;
        let inode_bitmap_at = HEADER_BYTES;
        let block_bitmap_at = inode_bitmap_at + round_up(inodes_per_node / 8, PAGE);
        // Blocks take what is left; the block bitmap's pages come out of it too.
        let bb = block_bytes as u64;
        let itable_bytes = inodes_per_node * INODE_BYTES;
        let fixed = block_bitmap_at + itable_bytes + 2 * PAGE;
        let mut blocks_per_node = bytes_per_node.saturating_sub(fixed) * 8 / (8 * bb + 1) / 64 * 64;
        let (inode_table_at, data_at) = loop {
            let inode_table_at = block_bitmap_at + round_up(blocks_per_node / 8, PAGE);
            let data_at = round_up(inode_table_at + itable_bytes, PAGE);
            if data_at + blocks_per_node * bb <= bytes_per_node || blocks_per_node == 0 {
                break (inode_table_at, data_at);
            }
            blocks_per_node -= 64;
        };
        if inodes_per_node < 64 || blocks_per_node < 64 {
            return Err(too_small);
        }
        Ok(Geometry {
            block_bytes,
            bytes_per_inode,
            bytes_per_node,
            inodes_per_node,
            blocks_per_node,
            inode_bitmap_at,
            block_bitmap_at,
            inode_table_at,
            data_at,
        })
    }

    /// The region's parameters, as the manager keeps them: block bytes and bytes per inode,
    /// two little-endian u32.
    pub fn params(&self) -> Vec<u8> {
        let mut p = self.block_bytes.to_le_bytes().to_vec();
        p.extend_from_slice(&self.bytes_per_inode.to_le_bytes());
        p
    }

    pub fn from_params(bytes_per_node: u64, params: &[u8]) -> Result<Geometry, LayoutError> {
        let word = |i: usize| u32::from_le_bytes(params[i..i + 4].try_into().expect("4 bytes"));
        if params.len() != 8 {
            return Err(LayoutError::Params(params.len()));
        }
        Geometry::new(bytes_per_node, word(0), word(4))
    }

    pub fn pointers_per_block(&self) -> u64 {
        self.block_bytes as u64 / 8
    }

    pub fn inode_bitmap_bytes(&self) -> u64 {
        self.inodes_per_node / 8
    }

    pub fn block_bitmap_bytes(&self) -> u64 {
        self.blocks_per_node / 8
    }
}

/// A volume placed on its nodes: the geometry and each node's region base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub geometry: Geometry,
    /// The nodes in the region's order, each with the region's first address.
    pub nodes: Vec<(NodeId, u64)>,
}

impl Volume {
    fn base(&self, node: NodeId) -> u64 {
        self.nodes
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, b)| *b)
            .unwrap_or_else(|| panic!("node {node} holds no part of this volume"))
    }

    pub fn holds(&self, node: NodeId) -> bool {
        self.nodes.iter().any(|(n, _)| *n == node)
    }

    /// The root directory: slot 0 on the first node.
    pub fn root(&self) -> Ino {
        Ino::new(self.nodes[0].0, 0)
    }

    pub fn header_addr(&self, node: NodeId) -> u64 {
        self.base(node)
    }

    pub fn inode_addr(&self, ino: Ino) -> u64 {
        self.base(ino.node()) + self.geometry.inode_table_at + ino.slot() * INODE_BYTES
    }

    pub fn block_addr(&self, block: BlockRef) -> u64 {
        assert!(!block.is_none(), "address of the null block");
        self.base(block.node())
            + self.geometry.data_at
            + block.index() * self.geometry.block_bytes as u64
    }

    /// The bitmap word holding `index`'s bit, for inodes or blocks.
    pub fn bitmap_word_addr(&self, node: NodeId, kind: Bitmap, index: u64) -> u64 {
        self.bitmap_addr(node, kind) + index / 64 * 8
    }

    pub fn bitmap_addr(&self, node: NodeId, kind: Bitmap) -> u64 {
        self.base(node)
            + match kind {
                Bitmap::Inodes => self.geometry.inode_bitmap_at,
                Bitmap::Blocks => self.geometry.block_bitmap_at,
            }
    }

    pub fn bitmap_bytes(&self, kind: Bitmap) -> u64 {
        match kind {
            Bitmap::Inodes => self.geometry.inode_bitmap_bytes(),
            Bitmap::Blocks => self.geometry.block_bitmap_bytes(),
        }
    }

    /// Bits of a slot in a kernel handle: enough for this volume's slots.
    fn handle_slot_bits(&self) -> u32 {
        (u64::BITS - (self.geometry.inodes_per_node - 1).leading_zeros()).max(1)
    }

    /// The low bits of an `igeneration` a kernel handle carries.
    pub fn handle_generation_mask(&self) -> u64 {
        (1u64 << (u64::BITS - 16 - self.handle_slot_bits())) - 1
    }

    /// The number the kernel knows the file `ino` of generation `generation` by: the
    /// generation's low bits, the node, the slot (docs/fs.md, "Names"). A slot given to a
    /// new file gets a new number, so the kernel never takes one file for another.
    pub fn handle(&self, ino: Ino, generation: u64) -> u64 {
        let bits = self.handle_slot_bits();
        (generation & self.handle_generation_mask()) << (16 + bits)
            | (ino.node() as u64) << bits
            | ino.slot()
    }

    /// The inode and generation bits a kernel number names (`handle`'s inverse).
    pub fn from_handle(&self, handle: u64) -> (Ino, u64) {
        let bits = self.handle_slot_bits();
        let node = (handle >> bits & 0xffff) as NodeId;
        let slot = handle & ((1 << bits) - 1);
        (
            Ino((node as u64) << INDEX_BITS | slot),
            handle >> (16 + bits),
        )
    }

    /// Does `ino` name an inode slot of this volume?
    pub fn valid_ino(&self, ino: Ino) -> bool {
        self.holds(ino.node()) && ino.slot() < self.geometry.inodes_per_node
    }

    pub fn valid_block(&self, b: BlockRef) -> bool {
        !b.is_none() && self.holds(b.node()) && b.index() < self.geometry.blocks_per_node
    }

    /// The header mkfs writes on the node at `index` of the region.
    pub fn header(&self, index: usize, volume_id: u64, created_unix_s: u64) -> Vec<u8> {
        let g = &self.geometry;
        let mut h = vec![0u8; field::END as usize];
        put_u64(&mut h, field::MAGIC, MAGIC);
        put_u32(&mut h, field::FORMAT_VERSION, FORMAT_VERSION);
        put_u32(&mut h, field::BLOCK_BYTES, g.block_bytes);
        put_u64(&mut h, field::BYTES_PER_NODE, g.bytes_per_node);
        put_u64(&mut h, field::INODES_PER_NODE, g.inodes_per_node);
        put_u64(&mut h, field::BLOCKS_PER_NODE, g.blocks_per_node);
        put_u64(&mut h, field::VOLUME_ID, volume_id);
        put_u64(&mut h, field::ROOT, self.root().0);
        put_u32(&mut h, field::NODE_INDEX as u64, index as u32);
        put_u32(&mut h, field::NODES, self.nodes.len() as u32);
        put_u64(&mut h, field::CREATED_UNIX_S, created_unix_s);
        h
    }

    /// Checks a node's header against the geometry; returns the volume id.
    pub fn check_header(&self, index: usize, h: &[u8]) -> Result<u64, LayoutError> {
        let node = self.nodes[index].0;
        let magic = get_u64(h, field::MAGIC);
        if magic != MAGIC {
            return Err(LayoutError::NotFormatted { node, magic });
        }
        let found = get_u32(h, field::FORMAT_VERSION);
        if found != FORMAT_VERSION {
            return Err(LayoutError::Version { node, found });
        }
        let expect = self.header(
            index,
            get_u64(h, field::VOLUME_ID),
            get_u64(h, field::CREATED_UNIX_S),
        );
        if h[..expect.len()] != expect[..] {
            let what = format!(
                "format {}, block bytes {}, {} inodes and {} blocks per node",
                get_u32(h, field::FORMAT_VERSION),
                get_u32(h, field::BLOCK_BYTES),
                get_u64(h, field::INODES_PER_NODE),
                get_u64(h, field::BLOCKS_PER_NODE)
            );
            return Err(LayoutError::Header { node, what });
        }
        Ok(get_u64(h, field::VOLUME_ID))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Bitmap {
    Inodes,
    Blocks,
}

pub fn get_u64(b: &[u8], at: u64) -> u64 {
    let at = at as usize;
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub fn get_u32(b: &[u8], at: u64) -> u32 {
    let at = at as usize;
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub fn put_u64(b: &mut [u8], at: u64, v: u64) {
    let at = at as usize;
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u32(b: &mut [u8], at: u64, v: u32) {
    let at = at as usize;
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_handles_round_trip_and_differ_by_generation() {
        for bytes in [1u64 << 22, 512 << 20, 64 << 30] {
            let g = Geometry::new(bytes, BLOCK_BYTES_DEFAULT, BYTES_PER_INODE_DEFAULT).unwrap();
            let vol = Volume {
                geometry: g.clone(),
                nodes: vec![(1, 0), (7, 0), (u16::MAX, 0)],
            };
            let mask = vol.handle_generation_mask();
            assert!(mask >= (1 << 20) - 1, "{bytes}: {mask:#x}");
            for node in [1, 7, u16::MAX] {
                for slot in [0, 1, g.inodes_per_node - 1] {
                    let ino = Ino::new(node, slot);
                    for generation in [0, 1, mask, mask + 2, u64::MAX] {
                        let h = vol.handle(ino, generation);
                        assert_ne!(h, 1, "1 is the kernel's root");
                        assert_eq!(vol.from_handle(h), (ino, generation & mask));
                    }
                    assert_ne!(vol.handle(ino, 3), vol.handle(ino, 4));
                }
            }
        }
    }

    #[test]
    fn sections_fit_and_do_not_overlap() {
        for bytes in [1u64 << 22, 100 << 20, 512 << 20, 1 << 30] {
            let g = Geometry::new(bytes, BLOCK_BYTES_DEFAULT, BYTES_PER_INODE_DEFAULT).unwrap();
            assert!(g.block_bitmap_at >= g.inode_bitmap_at + g.inode_bitmap_bytes());
            assert!(g.inode_table_at >= g.block_bitmap_at + g.block_bitmap_bytes());
            assert!(g.data_at >= g.inode_table_at + g.inodes_per_node * INODE_BYTES);
            assert!(g.data_at + g.blocks_per_node * g.block_bytes as u64 <= bytes);
            assert_eq!(g.data_at % 4096, 0);
            // Not much is wasted: less than 64 blocks' worth plus a few pages.
            let used = g.data_at + g.blocks_per_node * g.block_bytes as u64;
            assert!(
                bytes - used < 65 * g.block_bytes as u64 + 3 * PAGE,
                "{bytes}: {g:?}"
            );
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(Geometry::new(1 << 30, 3000, 8192).is_err());
        assert!(Geometry::new(1 << 30, 16384, 100).is_err());
        assert!(Geometry::new(64 << 10, 16384, 8192).is_err());
    }

    #[test]
    fn names_round_trip() {
        let i = Ino::new(3, 12345);
        assert_eq!((i.node(), i.slot()), (3, 12345));
        let b = BlockRef::new(65535, (1 << 40) - 1);
        assert_eq!((b.node(), b.index()), (65535, (1 << 40) - 1));
        assert!(BlockRef::NONE.is_none());
    }
}
