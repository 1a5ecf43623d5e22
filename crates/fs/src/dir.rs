//! Directories as extendible hash tables (docs/fs.md, "Directories"): a table block of
//! pointers to bucket blocks, indexed by the low `depth` bits of the FNV-1a hash of a name;
//! a full bucket splits in two by one more bit. Lookup, create and unlink read and change one
//! bucket, so they cost the same in a directory of 100,000 entries as in one of ten.

use crate::layout::{get_u32, get_u64, put_u32, put_u64, BlockRef, Ino};

/// Longest name, as in Linux.
pub const NAME_BYTES_MAX: usize = 255;
/// The table's header: version u64, depth u32, 4 zero bytes, owner ino u64, owner
/// igeneration u64; then 2^depth bucket references.
pub const TABLE_HEADER_BYTES: usize = 32;
/// A bucket's header: version u64, owner ino u64, owner igeneration u64, local depth u32,
/// entry count u32, bytes of entries u32, 4 zero bytes; then the entries.
pub const BUCKET_HEADER_BYTES: usize = 40;
/// An entry: ino u64, igeneration u64, file type u8 (st_mode >> 12), name length u8, name.
pub const ENTRY_HEADER_BYTES: usize = 18;

/// FNV-1a, 64 bits: the hash that places a name (specified in docs/fs.md).
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A new directory's table (depth 0) and its one empty bucket at `bucket`.
pub fn empty_directory(owner: Ino, generation: u64, bucket: BlockRef) -> (Table, Bucket) {
    let table = Table {
        version: 1,
        depth: 0,
        owner,
        owner_generation: generation,
        buckets: vec![bucket],
    };
    (table, Bucket::new(owner, generation, 1, 0))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub version: u64,
    pub depth: u32,
    pub owner: Ino,
    pub owner_generation: u64,
    pub buckets: Vec<BlockRef>,
}

impl Table {
    /// The deepest table a block of `block_bytes` holds.
    pub fn depth_max(block_bytes: u32) -> u32 {
        let pointers = (block_bytes as usize - TABLE_HEADER_BYTES) / 8;
        usize::BITS - 1 - pointers.leading_zeros()
    }

    pub fn decode(b: &[u8]) -> Table {
        let depth = get_u32(b, 8).min(Self::depth_max(b.len() as u32));
        let at = |i: usize| BlockRef(get_u64(b, (TABLE_HEADER_BYTES + 8 * i) as u64));
        Table {
            version: get_u64(b, 0),
            depth,
            owner: Ino(get_u64(b, 16)),
            owner_generation: get_u64(b, 24),
            buckets: (0..1usize << depth).map(at).collect(),
        }
    }

    pub fn encode(&self, block_bytes: u32) -> Vec<u8> {
        let mut b = vec![0u8; block_bytes as usize];
        put_u64(&mut b, 0, self.version);
        put_u32(&mut b, 8, self.depth);
        put_u64(&mut b, 16, self.owner.0);
        put_u64(&mut b, 24, self.owner_generation);
        for (i, r) in self.buckets.iter().enumerate() {
            put_u64(&mut b, (TABLE_HEADER_BYTES + 8 * i) as u64, r.0);
        }
        b
    }

    pub fn slot(&self, hash: u64) -> usize {
        (hash & ((1u64 << self.depth) - 1)) as usize
    }

    /// Does this table belong to the directory `(ino, generation)`? A block that once held
    /// another directory's table may still be in a cache.
    pub fn owned_by(&self, ino: Ino, generation: u64) -> bool {
        self.owner == ino && self.owner_generation == generation
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub ino: Ino,
    pub generation: u64,
    /// `st_mode >> 12`, the file type.
    pub kind: u8,
    pub name: Vec<u8>,
}

impl Entry {
    fn bytes(&self) -> usize {
        ENTRY_HEADER_BYTES + self.name.len()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub version: u64,
    pub owner: Ino,
    pub owner_generation: u64,
    pub depth: u32,
    pub entries: Vec<Entry>,
}

impl Bucket {
    pub fn new(owner: Ino, owner_generation: u64, version: u64, depth: u32) -> Bucket {
        Bucket {
            version,
            owner,
            owner_generation,
            depth,
            entries: vec![],
        }
    }

    /// Decodes a bucket; `None` if its entries run past the block (not a bucket).
    pub fn decode(b: &[u8]) -> Option<Bucket> {
        let entries = (RawEntries::of(b)?)
            .map(|e| e.map(RawEntry::into_entry))
            .collect::<Option<Vec<Entry>>>()?;
        let (owner, owner_generation) = Self::owner_in(b);
        Some(Bucket {
            version: get_u64(b, 0),
            owner,
            owner_generation,
            depth: get_u32(b, 24),
            entries,
        })
    }

    /// The directory (inode number and igeneration) bucket bytes `b` name as their owner.
    fn owner_in(b: &[u8]) -> (Ino, u64) {
        (Ino(get_u64(b, 8)), get_u64(b, 16))
    }

    /// The entry named `name` in bucket bytes `b`, without decoding the others (a lookup
    /// needs one of hundreds); `None` if `b` is not a bucket of directory `(owner,
    /// generation)`.
    pub fn find_in(b: &[u8], owner: Ino, generation: u64, name: &[u8]) -> Option<Option<Entry>> {
        if Self::owner_in(b) != (owner, generation) {
            return None;
        }
        let mut found = None;
        for e in RawEntries::of(b)? {
            // Every entry walked, as `decode` does: a block whose entries do not parse is
            // not a bucket, whatever its first entries say.
            let e = e?;
            if found.is_none() && e.name == name {
                found = Some(e.into_entry());
            }
        }
        Some(found)
    }

    pub fn used_bytes(&self) -> usize {
        self.entries.iter().map(Entry::bytes).sum()
    }

    /// Does `e` fit next to the entries already here?
    pub fn fits(&self, e: &Entry, block_bytes: u32) -> bool {
        BUCKET_HEADER_BYTES + self.used_bytes() + e.bytes() <= block_bytes as usize
    }

    pub fn encode(&self, block_bytes: u32) -> Vec<u8> {
        let mut b = vec![0u8; block_bytes as usize];
        put_u64(&mut b, 0, self.version);
        put_u64(&mut b, 8, self.owner.0);
        put_u64(&mut b, 16, self.owner_generation);
        put_u32(&mut b, 24, self.depth);
        put_u32(&mut b, 28, self.entries.len() as u32);
        put_u32(&mut b, 32, self.used_bytes() as u32);
        let mut at = BUCKET_HEADER_BYTES;
        for e in &self.entries {
            put_u64(&mut b, at as u64, e.ino.0);
            put_u64(&mut b, at as u64 + 8, e.generation);
            b[at + 16] = e.kind;
            b[at + 17] = e.name.len() as u8;
            b[at + ENTRY_HEADER_BYTES..at + e.bytes()].copy_from_slice(&e.name);
            at += e.bytes();
        }
        b
    }

    pub fn find(&self, name: &[u8]) -> Option<usize> {
        self.entries.iter().position(|e| e.name == name)
    }

    pub fn owned_by(&self, ino: Ino, generation: u64) -> bool {
        self.owner == ino && self.owner_generation == generation
    }
}

/// An entry as it lies in a bucket's bytes.
struct RawEntry<'a> {
    ino: Ino,
    generation: u64,
    kind: u8,
    name: &'a [u8],
}

impl RawEntry<'_> {
    fn into_entry(self) -> Entry {
        Entry {
            ino: self.ino,
            generation: self.generation,
            kind: self.kind,
            name: self.name.to_vec(),
        }
    }
}

/// The entries of a bucket's bytes in order; `None` for one that runs past the bytes of
/// entries the header gives (the block is not a bucket), and nothing after it.
struct RawEntries<'a> {
    b: &'a [u8],
    at: usize,
    end: usize,
    left: usize,
}

impl<'a> RawEntries<'a> {
    fn of(b: &'a [u8]) -> Option<RawEntries<'a>> {
        let end = BUCKET_HEADER_BYTES + get_u32(b, 32) as usize;
        (end <= b.len()).then_some(RawEntries {
            b,
            at: BUCKET_HEADER_BYTES,
            end,
            left: get_u32(b, 28) as usize,
        })
    }
}

impl<'a> Iterator for RawEntries<'a> {
    type Item = Option<RawEntry<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (b, at) = (self.b, self.at);
        let name_at = at + ENTRY_HEADER_BYTES;
        let len = (name_at <= self.end).then(|| b[at + 17] as usize);
        let Some(len) = len.filter(|len| name_at + len <= self.end) else {
            self.left = 0;
            return Some(None);
        };
        self.at = name_at + len;
        Some(Some(RawEntry {
            ino: Ino(get_u64(b, at as u64)),
            generation: get_u64(b, at as u64 + 8),
            kind: b[at + 16],
            name: &b[name_at..name_at + len],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_and_buckets_round_trip() {
        let t = Table {
            version: 9,
            depth: 2,
            owner: Ino(77),
            owner_generation: 4,
            buckets: vec![BlockRef(1), BlockRef(2), BlockRef(1), BlockRef(3)],
        };
        assert_eq!(Table::decode(&t.encode(16384)), t);
        assert_eq!(Table::depth_max(16384), 10);
        assert_eq!(Table::depth_max(4096), 8);
        let mut b = Bucket::new(Ino(77), 4, 3, 1);
        for name in ["a", "bb", "a-much-longer-name"] {
            b.entries.push(Entry {
                ino: Ino(5),
                generation: 1,
                kind: 8,
                name: name.as_bytes().to_vec(),
            });
        }
        assert_eq!(Bucket::decode(&b.encode(4096)), Some(b.clone()));
        assert_eq!(b.find(b"bb"), Some(1));
        let bytes = b.encode(4096);
        assert_eq!(
            Bucket::find_in(&bytes, Ino(77), 4, b"bb"),
            Some(Some(b.entries[1].clone()))
        );
        assert_eq!(Bucket::find_in(&bytes, Ino(77), 4, b"b"), Some(None));
        assert_eq!(
            Bucket::find_in(&bytes, Ino(77), 5, b"bb"),
            None,
            "another owner"
        );
        let mut cut = bytes.clone();
        put_u32(&mut cut, 32, 30);
        assert_eq!(Bucket::decode(&cut), None, "entries past their bytes");
        assert_eq!(
            Bucket::find_in(&cut, Ino(77), 4, b"a-much-longer-name"),
            None
        );
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(name_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
