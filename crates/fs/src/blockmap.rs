//! A file's block map (docs/fs.md, "Files"): a radix tree of pointer blocks, `height` levels
//! under the inode's root (height 0: the root is the file's only data block). Holes are
//! null pointers, so sparse files cost nothing where they are empty. Reads, writes,
//! truncates and fallocate as runs of a `Txn`.

use crate::inode::{Inode, Time, S_IFMT, S_IFREG};
use crate::layout::{get_u64, Bitmap, BlockRef, Ino};
use crate::ops::{inode, FILE_BYTES_LOG2_MAX, FREE_BLOCKS_PER_TXN, HEIGHT_MAX};
use crate::txn::{OpResult, Stop, Txn};

fn errno<T>(e: i32) -> OpResult<T> {
    Err(Stop::Errno(e))
}

fn per_block(tx: &Txn<'_>) -> u64 {
    tx.vol.geometry.pointers_per_block()
}

/// Blocks a tree of `height` levels maps.
fn capacity(p: u64, height: u32) -> u64 {
    p.saturating_pow(height)
}

/// The largest size a file of this volume may have.
pub fn file_bytes_max(block_bytes: u32) -> u64 {
    let p = block_bytes as u64 / 8;
    (capacity(p, HEIGHT_MAX).saturating_mul(block_bytes as u64)).min(1 << FILE_BYTES_LOG2_MAX)
}

/// Entry `slot` of pointer block `b` (its bytes `block`) of file `ino` as of `base`. A
/// reference outside the volume means the cached block is not the file's: it was read
/// after another mount changed the file and the block went to other use. The inode and the
/// block are read again (a changed inode discards the file's cached pointer blocks).
fn pointer(
    tx: &mut Txn<'_>,
    (ino, base): (Ino, u64),
    b: BlockRef,
    block: &[u8],
    slot: u64,
) -> OpResult<BlockRef> {
    let r = BlockRef(get_u64(block, slot * 8));
    if r.is_none() || tx.vol.valid_block(r) {
        return Ok(r);
    }
    let inode_addr = tx.vol.inode_addr(ino);
    tx.refetch(ino.node(), inode_addr, crate::layout::INODE_BYTES as u32);
    Err(tx.refetch_pointers(ino, base, b))
}

/// The data block holding block `index` of the file, or NONE for a hole. `base` is the
/// `iversion` the file's pointer blocks are read under.
pub fn lookup(tx: &mut Txn<'_>, ino: Ino, base: u64, i: &Inode, index: u64) -> OpResult<BlockRef> {
    let p = per_block(tx);
    if i.root.is_none() || index >= capacity(p, i.height) {
        return Ok(BlockRef::NONE);
    }
    let mut b = i.root;
    for level in (1..=i.height).rev() {
        let block = tx.pointer_block(ino, base, b)?;
        b = pointer(
            tx,
            (ino, base),
            b,
            &block,
            index / capacity(p, level - 1) % p,
        )?;
        if b.is_none() {
            return Ok(b);
        }
    }
    Ok(b)
}

fn alloc_block(tx: &mut Txn<'_>, ino: Ino, i: &mut Inode) -> OpResult<BlockRef> {
    let (node, index) = tx.alloc(ino.node(), Bitmap::Blocks)?;
    i.blocks += 1;
    Ok(BlockRef::new(node, index))
}

/// The data block for block `index`, allocating it (and pointer blocks, and taller roots)
/// if it is a hole; true if it is new (its whole image must be written).
fn map(
    tx: &mut Txn<'_>,
    ino: Ino,
    base: u64,
    i: &mut Inode,
    index: u64,
) -> OpResult<(BlockRef, bool)> {
    let p = per_block(tx);
    while index >= capacity(p, i.height) {
        if i.root.is_none() {
            i.height = (0..=HEIGHT_MAX)
                .find(|h| index < capacity(p, *h))
                .expect("in range");
            break;
        }
        let top = alloc_block(tx, ino, i)?;
        tx.new_pointer_block(ino, top);
        tx.set_pointer(ino, base, top, 0, i.root)?;
        i.root = top;
        i.height += 1;
    }
    if i.height == 0 {
        if i.root.is_none() {
            i.root = alloc_block(tx, ino, i)?;
            return Ok((i.root, true));
        }
        return Ok((i.root, false));
    }
    if i.root.is_none() {
        i.root = alloc_block(tx, ino, i)?;
        tx.new_pointer_block(ino, i.root);
    }
    let mut b = i.root;
    for level in (1..=i.height).rev() {
        let slot = index / capacity(p, level - 1) % p;
        let block = tx.pointer_block(ino, base, b)?;
        let child = pointer(tx, (ino, base), b, &block, slot)?;
        if !child.is_none() {
            b = child;
            continue;
        }
        let new = alloc_block(tx, ino, i)?;
        if level > 1 {
            tx.new_pointer_block(ino, new);
        }
        tx.set_pointer(ino, base, b, slot, new)?;
        if level == 1 {
            return Ok((new, true));
        }
        b = new;
    }
    Ok((b, false))
}

/// Frees the file's blocks from block `first` on, highest first, at most `budget` of them;
/// true if none remain there. Pointer blocks left empty are freed too.
pub fn free_from(
    tx: &mut Txn<'_>,
    ino: Ino,
    base: u64,
    i: &mut Inode,
    first: u64,
    budget: &mut usize,
) -> OpResult<bool> {
    if i.root.is_none() {
        return Ok(true);
    }
    let (emptied, done) = free_subtree(tx, ino, base, i, i.root, i.height, 0, first, budget)?;
    if emptied {
        i.root = BlockRef::NONE;
        i.height = 0;
    }
    Ok(done)
}

/// Frees, under block `b` at `level` whose first file block is `start`, the blocks at or
/// after `first`. Returns (b itself was freed, everything asked was freed).
#[allow(clippy::too_many_arguments)]
fn free_subtree(
    tx: &mut Txn<'_>,
    ino: Ino,
    base: u64,
    i: &mut Inode,
    b: BlockRef,
    level: u32,
    start: u64,
    first: u64,
    budget: &mut usize,
) -> OpResult<(bool, bool)> {
    let p = per_block(tx);
    if level == 0 {
        if start < first {
            return Ok((false, true));
        }
        if *budget == 0 {
            return Ok((false, false));
        }
        *budget -= 1;
        tx.free(b.node(), Bitmap::Blocks, b.index())?;
        i.blocks -= 1;
        return Ok((true, true));
    }
    let span = capacity(p, level - 1);
    let block = tx.pointer_block(ino, base, b)?;
    let mut done = true;
    for slot in (0..p).rev() {
        let child_start = start + slot * span;
        if child_start.saturating_add(span) <= first {
            break;
        }
        let child = pointer(tx, (ino, base), b, &block, slot)?;
        if child.is_none() {
            continue;
        }
        let (freed, all) = free_subtree(
            tx,
            ino,
            base,
            i,
            child,
            level - 1,
            child_start,
            first,
            budget,
        )?;
        if freed {
            tx.set_pointer(ino, base, b, slot, BlockRef::NONE)?;
        }
        if !all {
            done = false;
            break;
        }
    }
    let now = tx.pointer_block(ino, base, b)?;
    if now.iter().all(|&x| x == 0) && *budget > 0 {
        *budget -= 1;
        tx.free(b.node(), Bitmap::Blocks, b.index())?;
        tx.pointer_freed(ino, b);
        i.blocks -= 1;
        return Ok((true, done));
    }
    Ok((false, done))
}

/// A piece of a read: zeros (a hole or past a block's end) or the data of read `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Zeros(usize),
    Read(usize),
}

/// Reads up to `len` bytes at `offset` of file `ino`; the pieces, in order, make the data.
pub fn read(tx: &mut Txn<'_>, ino: Ino, offset: u64, len: u32) -> OpResult<Vec<Piece>> {
    let i = inode(tx, ino)?;
    if i.is_dir() {
        return errno(libc::EISDIR);
    }
    let end = (offset + len as u64).min(i.size);
    let bs = tx.vol.geometry.block_bytes as u64;
    let mut pieces = vec![];
    let mut at = offset;
    while at < end {
        let index = at / bs;
        let within = at % bs;
        let n = (bs - within).min(end - at);
        let b = lookup(tx, ino, i.iversion, &i, index)?;
        if b.is_none() {
            pieces.push(Piece::Zeros(n as usize));
        } else {
            let addr = tx.vol.block_addr(b) + within;
            pieces.push(Piece::Read(tx.read(b.node(), addr, n as u32)));
        }
        at += n;
    }
    Ok(pieces)
}

/// Writes `extents` (sorted, not overlapping) into file `ino`; with `append`, the one
/// extent goes at the end of the file whatever its offset. Returns the file's new size.
pub fn write(
    tx: &mut Txn<'_>,
    ino: Ino,
    extents: &[(u64, Vec<u8>)],
    append: bool,
    privileged: bool,
    now: Time,
) -> OpResult<u64> {
    let old = inode(tx, ino)?;
    if old.kind() != S_IFREG {
        return errno(if old.is_dir() {
            libc::EISDIR
        } else {
            libc::EINVAL
        });
    }
    let bs = tx.vol.geometry.block_bytes as u64;
    let mut new = old.clone();
    let mut fresh: std::collections::BTreeMap<BlockRef, Vec<u8>> = Default::default();
    for (offset, data) in extents {
        let offset = if append { new.size } else { *offset };
        let end = offset + data.len() as u64;
        if end > file_bytes_max(bs as u32) {
            return errno(libc::EFBIG);
        }
        let mut at = offset;
        while at < end {
            let (index, within) = (at / bs, at % bs);
            let n = (bs - within).min(end - at);
            let chunk = &data[(at - offset) as usize..(at - offset + n) as usize];
            let (b, is_new) = map(tx, ino, old.iversion, &mut new, index)?;
            if is_new || fresh.contains_key(&b) {
                let image = fresh.entry(b).or_insert_with(|| vec![0u8; bs as usize]);
                image[within as usize..(within + n) as usize].copy_from_slice(chunk);
            } else {
                tx.write(b.node(), tx.vol.block_addr(b) + within, chunk.to_vec());
            }
            at += n;
        }
        new.size = new.size.max(end);
    }
    for (b, image) in fresh {
        tx.create_block(b, image, false);
    }
    new.mtime = now;
    new.ctime = now;
    if !privileged {
        // POSIX: a write by an unprivileged process clears setuid, and setgid if group-exec.
        new.mode &= !libc::S_ISUID;
        if new.mode & libc::S_IXGRP != 0 {
            new.mode &= !libc::S_ISGID;
        }
    }
    let size = new.size;
    crate::ops::stage_inode(tx, ino, &old, new);
    Ok(size)
}

/// The attribute changes of one setattr; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Time>,
    pub mtime: Option<Time>,
    /// Set by utimensat with explicit times (else ctime is `now`).
    pub ctime: Option<Time>,
}

/// Applies `set` to `ino`. A truncate that frees more than one minitransaction may frees
/// part of it and answers `false`: run it again until `true`.
pub fn setattr(
    tx: &mut Txn<'_>,
    ino: Ino,
    set: &SetAttr,
    privileged: bool,
    now: Time,
) -> OpResult<(Inode, bool)> {
    let old = inode(tx, ino)?;
    let mut new = old.clone();
    if let Some(mode) = set.mode {
        new.mode = (old.mode & S_IFMT) | (mode & !S_IFMT);
    }
    if let Some(uid) = set.uid {
        new.uid = uid;
    }
    if let Some(gid) = set.gid {
        new.gid = gid;
    }
    if (set.uid.is_some() || set.gid.is_some())
        && !old.is_dir()
        && set.mode.is_none()
        && !privileged
    {
        // chown by anyone clears setuid and (if group-exec) setgid, as Linux does.
        new.mode &= !libc::S_ISUID;
        if new.mode & libc::S_IXGRP != 0 {
            new.mode &= !libc::S_ISGID;
        }
    }
    let mut done = true;
    if let Some(size) = set.size {
        if old.is_dir() {
            return errno(libc::EISDIR);
        }
        if old.kind() != S_IFREG {
            return errno(libc::EINVAL);
        }
        if size > file_bytes_max(tx.vol.geometry.block_bytes) {
            return errno(libc::EFBIG);
        }
        done = truncate(tx, ino, &old, &mut new, size)?;
        new.mtime = now;
    }
    if let Some(t) = set.atime {
        new.atime = t;
    }
    if let Some(t) = set.mtime {
        new.mtime = t;
    }
    new.ctime = set.ctime.unwrap_or(now);
    crate::ops::stage_inode(tx, ino, &old, new.clone());
    new.iversion += 1;
    Ok((new, done))
}

fn truncate(tx: &mut Txn<'_>, ino: Ino, old: &Inode, new: &mut Inode, size: u64) -> OpResult<bool> {
    let bs = tx.vol.geometry.block_bytes as u64;
    if size >= old.size {
        new.size = size;
        return Ok(true);
    }
    let mut budget = FREE_BLOCKS_PER_TXN;
    let done = free_from(tx, ino, old.iversion, new, size.div_ceil(bs), &mut budget)?;
    if !done {
        // Part freed: the size stays where the remaining blocks end, at most the old size.
        new.size = old.size;
        return Ok(false);
    }
    new.size = size;
    if !size.is_multiple_of(bs) {
        // Bytes past the end of a file are zeros in its last block: later growth reads them.
        let b = lookup(tx, ino, old.iversion, new, size / bs)?;
        if !b.is_none() {
            let zeros = vec![0u8; (bs - size % bs) as usize];
            tx.write(b.node(), tx.vol.block_addr(b) + size % bs, zeros);
        }
    }
    Ok(true)
}

/// Blocks one fallocate minitransaction allocates or frees at most.
pub const FALLOCATE_BLOCKS_PER_TXN: u64 = 256;

/// Frees the data block holding block `index`, if any (its pointer blocks stay).
fn free_at(tx: &mut Txn<'_>, ino: Ino, base: u64, i: &mut Inode, index: u64) -> OpResult<()> {
    let p = per_block(tx);
    if i.root.is_none() || index >= capacity(p, i.height) {
        return Ok(());
    }
    if i.height == 0 {
        tx.free(i.root.node(), Bitmap::Blocks, i.root.index())?;
        i.root = BlockRef::NONE;
        i.blocks -= 1;
        return Ok(());
    }
    let mut b = i.root;
    for level in (1..=i.height).rev() {
        let slot = index / capacity(p, level - 1) % p;
        let block = tx.pointer_block(ino, base, b)?;
        let child = pointer(tx, (ino, base), b, &block, slot)?;
        if child.is_none() {
            return Ok(());
        }
        if level == 1 {
            tx.free(child.node(), Bitmap::Blocks, child.index())?;
            tx.set_pointer(ino, base, b, slot, BlockRef::NONE)?;
            i.blocks -= 1;
            return Ok(());
        }
        b = child;
    }
    Ok(())
}

/// fallocate(2) on bytes `from..end` of `ino`, at most `FALLOCATE_BLOCKS_PER_TXN` blocks
/// of it: mode 0 and KEEP_SIZE allocate (zeroed), PUNCH_HOLE (with KEEP_SIZE) and
/// ZERO_RANGE make the range read as zeros, freeing the blocks it covers whole. Returns
/// where the next run starts (`end` when done).
pub fn fallocate(
    tx: &mut Txn<'_>,
    ino: Ino,
    from: u64,
    end: u64,
    mode: i32,
    now: Time,
) -> OpResult<u64> {
    let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
    let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
    let known = libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
    if mode & !known != 0 || (punch && (!keep || zero)) {
        return errno(libc::EOPNOTSUPP);
    }
    let old = inode(tx, ino)?;
    if old.kind() != S_IFREG {
        return errno(if old.is_dir() {
            libc::EISDIR
        } else {
            libc::ENODEV
        });
    }
    let bs = tx.vol.geometry.block_bytes as u64;
    if end > file_bytes_max(bs as u32) {
        return errno(libc::EFBIG);
    }
    let stop = end.min((from / bs + FALLOCATE_BLOCKS_PER_TXN) * bs);
    let mut new = old.clone();
    let mut at = from;
    while at < stop {
        let (index, within) = (at / bs, at % bs);
        let n = (bs - within).min(stop - at);
        if punch || zero {
            if n == bs {
                free_at(tx, ino, old.iversion, &mut new, index)?;
            } else {
                let b = lookup(tx, ino, old.iversion, &new, index)?;
                if !b.is_none() {
                    tx.write(b.node(), tx.vol.block_addr(b) + within, vec![0; n as usize]);
                }
            }
        } else {
            let (b, fresh) = map(tx, ino, old.iversion, &mut new, index)?;
            if fresh {
                tx.create_block(b, vec![0; bs as usize], false);
            }
        }
        at += n;
    }
    if !keep && !punch {
        new.size = new.size.max(stop);
    }
    new.mtime = now;
    new.ctime = now;
    crate::ops::stage_inode(tx, ino, &old, new);
    Ok(stop)
}
