//! Extended attributes (docs/fs.md, "Extended attributes"): a file's attributes live packed
//! in one block of its own, named by the inode's `xattr` field, allocated with the first
//! attribute and freed with the last. Every change rewrites the inode too, so the ops here
//! are minitransactions like any other: they compare the inode and the block's header.

use crate::inode::Inode;
use crate::layout::{get_u32, get_u64, put_u32, put_u64, Bitmap, BlockRef, Ino, INODE_BYTES};
use crate::ops::{inode, stage_inode};
use crate::txn::{OpResult, Stop, Txn};

/// The block's header: stamp u64, owner ino u64, owner igeneration u64, entry count u32,
/// bytes of entries u32; then the entries.
pub const HEADER_BYTES: usize = 32;
/// An entry: name length u8, value length u32, name, value.
pub const ENTRY_HEADER_BYTES: usize = 5;
/// Longest name and value, as Linux's VFS allows them (XATTR_NAME_MAX, XATTR_SIZE_MAX).
pub const NAME_BYTES_MAX: usize = 255;
pub const VALUE_BYTES_MAX: usize = 64 << 10;
/// setxattr(2) flags.
pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;

/// One file's attributes, as stored in its block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattrs {
    /// The owner's `iversion` when the block was last written. `iversion` never repeats for
    /// a slot, so a cached block whose header still compares equal is the stored one, even
    /// if the block was freed and given to the same file again meanwhile.
    pub stamp: u64,
    pub owner: Ino,
    pub owner_generation: u64,
    /// (name, value), in the order they were set.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Xattrs {
    /// `None` if the bytes are not a well-formed attribute block.
    pub fn decode(b: &[u8]) -> Option<Xattrs> {
        let count = get_u32(b, 24) as usize;
        let bytes = get_u32(b, 28) as usize;
        let body = b.get(HEADER_BYTES..HEADER_BYTES.checked_add(bytes)?)?;
        let mut entries = Vec::with_capacity(count.min(body.len()));
        let mut at = 0;
        for _ in 0..count {
            let head = body.get(at..at + ENTRY_HEADER_BYTES)?;
            let name_len = head[0] as usize;
            let value_len = u32::from_le_bytes(head[1..5].try_into().expect("4")) as usize;
            at += ENTRY_HEADER_BYTES;
            let name = body.get(at..at + name_len)?.to_vec();
            at += name_len;
            let value = body.get(at..at.checked_add(value_len)?)?.to_vec();
            at += value_len;
            entries.push((name, value));
        }
        (at == bytes).then_some(Xattrs {
            stamp: get_u64(b, 0),
            owner: Ino(get_u64(b, 8)),
            owner_generation: get_u64(b, 16),
            entries,
        })
    }

    /// Bytes the entries take after the header.
    pub fn bytes(&self) -> usize {
        (self.entries.iter())
            .map(|(n, v)| ENTRY_HEADER_BYTES + n.len() + v.len())
            .sum()
    }

    pub fn encode(&self, block_bytes: u32) -> Vec<u8> {
        let mut b = vec![0u8; block_bytes as usize];
        put_u64(&mut b, 0, self.stamp);
        put_u64(&mut b, 8, self.owner.0);
        put_u64(&mut b, 16, self.owner_generation);
        put_u32(&mut b, 24, self.entries.len() as u32);
        put_u32(&mut b, 28, self.bytes() as u32);
        let mut at = HEADER_BYTES;
        for (name, value) in &self.entries {
            b[at] = name.len() as u8;
            b[at + 1..at + 5].copy_from_slice(&(value.len() as u32).to_le_bytes());
            at += ENTRY_HEADER_BYTES;
            b[at..at + name.len()].copy_from_slice(name);
            at += name.len();
            b[at..at + value.len()].copy_from_slice(value);
            at += value.len();
        }
        b
    }

    pub fn owned_by(&self, ino: Ino, generation: u64) -> bool {
        self.owner == ino && self.owner_generation == generation
    }

    fn get(&self, name: &[u8]) -> Option<&Vec<u8>> {
        (self.entries.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The names, each followed by a NUL, as listxattr(2) answers them.
    pub fn names(&self) -> Vec<u8> {
        let mut out = vec![];
        for (name, _) in &self.entries {
            out.extend_from_slice(name);
            out.push(0);
        }
        out
    }
}

/// File `ino`'s inode and attributes, both validated: the inode's `iversion` and the
/// block's header are compared.
fn load(tx: &mut Txn<'_>, ino: Ino) -> OpResult<(Inode, Option<Xattrs>)> {
    let i = inode(tx, ino)?;
    let b = i.xattr;
    if b.is_none() {
        return Ok((i, None));
    }
    if !tx.vol.valid_block(b) {
        return Err(Stop::Errno(libc::EIO));
    }
    let (bs, addr) = (tx.vol.geometry.block_bytes, tx.vol.block_addr(b));
    match Xattrs::decode(&tx.object(b.node(), addr, bs)?) {
        Some(x) if x.owned_by(ino, i.igeneration) => {
            tx.check(b.node(), addr, 24);
            Ok((i, Some(x)))
        }
        // The cached block was another file's (freed and reused since), or the cached inode
        // is the stale one: read both again.
        _ => {
            tx.refetch(ino.node(), tx.vol.inode_addr(ino), INODE_BYTES as u32);
            Err(tx.refetch(b.node(), addr, bs))
        }
    }
}

/// The value of attribute `name` of `ino` (ENODATA if it has none).
pub fn get(tx: &mut Txn<'_>, ino: Ino, name: &[u8]) -> OpResult<Vec<u8>> {
    let (_, x) = load(tx, ino)?;
    match x.as_ref().and_then(|x| x.get(name)) {
        Some(v) => Ok(v.clone()),
        None => Err(Stop::Errno(libc::ENODATA)),
    }
}

/// The names of `ino`'s attributes, NUL-terminated.
pub fn list(tx: &mut Txn<'_>, ino: Ino) -> OpResult<Vec<u8>> {
    let (_, x) = load(tx, ino)?;
    Ok(x.map(|x| x.names()).unwrap_or_default())
}

/// Sets attribute `name` of `ino` to `value` (setxattr(2): `flags` may hold XATTR_CREATE or
/// XATTR_REPLACE). ENOSPC when the attributes would not fit in one block.
pub fn set(
    tx: &mut Txn<'_>,
    ino: Ino,
    name: &[u8],
    value: &[u8],
    flags: i32,
    now: crate::inode::Time,
) -> OpResult<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Stop::Errno(libc::ERANGE));
    }
    if value.len() > VALUE_BYTES_MAX {
        return Err(Stop::Errno(libc::E2BIG));
    }
    let (old, x) = load(tx, ino)?;
    let exists = x.as_ref().is_some_and(|x| x.get(name).is_some());
    if exists && flags & XATTR_CREATE != 0 {
        return Err(Stop::Errno(libc::EEXIST));
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(Stop::Errno(libc::ENODATA));
    }
    let mut entries = x.map(|x| x.entries).unwrap_or_default();
    match entries.iter_mut().find(|(n, _)| n == name) {
        Some((_, v)) => *v = value.to_vec(),
        None => entries.push((name.to_vec(), value.to_vec())),
    }
    store(tx, ino, &old, entries, now)
}

/// Removes attribute `name` of `ino` (ENODATA if it has none).
pub fn remove(tx: &mut Txn<'_>, ino: Ino, name: &[u8], now: crate::inode::Time) -> OpResult<()> {
    let (old, x) = load(tx, ino)?;
    let mut entries = x.map(|x| x.entries).unwrap_or_default();
    let Some(at) = entries.iter().position(|(n, _)| n == name) else {
        return Err(Stop::Errno(libc::ENODATA));
    };
    entries.remove(at);
    store(tx, ino, &old, entries, now)
}

/// Writes `entries` as `ino`'s attributes: into its block (allocated on the inode's node
/// if it has none), or freeing the block when none remain; the inode's ctime moves.
fn store(
    tx: &mut Txn<'_>,
    ino: Ino,
    old: &Inode,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    now: crate::inode::Time,
) -> OpResult<()> {
    let bs = tx.vol.geometry.block_bytes;
    let mut new = old.clone();
    new.ctime = now;
    if entries.is_empty() {
        if !old.xattr.is_none() {
            tx.free(old.xattr.node(), Bitmap::Blocks, old.xattr.index())?;
            new.xattr = BlockRef::NONE;
            new.blocks -= 1;
        }
        stage_inode(tx, ino, old, new);
        return Ok(());
    }
    let x = Xattrs {
        stamp: old.iversion + 1,
        owner: ino,
        owner_generation: old.igeneration,
        entries,
    };
    if HEADER_BYTES + x.bytes() > bs as usize {
        return Err(Stop::Errno(libc::ENOSPC));
    }
    if old.xattr.is_none() {
        let (node, index) = tx.alloc(ino.node(), Bitmap::Blocks)?;
        new.xattr = BlockRef::new(node, index);
        new.blocks += 1;
        tx.create_block(new.xattr, x.encode(bs), true);
    } else {
        let b = old.xattr;
        tx.stage(b.node(), tx.vol.block_addr(b), x.encode(bs));
    }
    stage_inode(tx, ino, old, new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_rejects_garbage() {
        let x = Xattrs {
            stamp: 9,
            owner: Ino(1 << 40 | 3),
            owner_generation: 2,
            entries: vec![
                (b"user.a".to_vec(), b"1".to_vec()),
                (b"security.selinux".to_vec(), vec![]),
            ],
        };
        let b = x.encode(4096);
        assert_eq!(Xattrs::decode(&b), Some(x.clone()));
        assert_eq!(x.names(), b"user.a\0security.selinux\0".to_vec());
        let mut bad = b.clone();
        put_u32(&mut bad, 28, 4000);
        assert_eq!(Xattrs::decode(&bad), None);
        let mut bad = b;
        put_u32(&mut bad, 24, 3);
        assert_eq!(Xattrs::decode(&bad), None);
    }
}
