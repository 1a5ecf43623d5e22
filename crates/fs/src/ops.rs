//! The file-system operations, each one run of a `Txn` (SinfoniaFS Fig. 12): read what the
//! operation needs from the cache, decide, stage the changes. The driver turns the run into
//! one minitransaction; nothing here does I/O, so the mount and the simulator share it.

use crate::dir::{name_hash, Bucket, Entry, Table, NAME_BYTES_MAX};
use crate::inode::{
    field, times_bytes, Inode, Time, FLAG_ORPHAN, INLINE_BYTES, S_IFDIR, S_IFLNK, S_IFMT,
};
use crate::layout::{Bitmap, BlockRef, Ino, INODE_BYTES};
use crate::txn::{OpResult, Stop, Txn, INODE_PREFETCH};
use tutti_wire::NodeId;

/// Blocks one minitransaction frees at most; a longer truncate or unlink takes several.
pub const FREE_BLOCKS_PER_TXN: usize = 1000;
/// Largest file: 2^50 bytes, or what four levels of pointer blocks reach if less.
pub const FILE_BYTES_LOG2_MAX: u32 = 50;
/// Tallest block map.
pub const HEIGHT_MAX: u32 = 4;

fn errno<T>(e: i32) -> OpResult<T> {
    Err(Stop::Errno(e))
}

/// The inode `ino`, validated whole (its `iversion` is compared).
pub fn inode(tx: &mut Txn<'_>, ino: Ino) -> OpResult<Inode> {
    let i = slot(tx, ino)?;
    if !crate::planted(crate::Bug::InodeNotValidated) {
        tx.check(ino.node(), tx.vol.inode_addr(ino), 8);
    }
    if i.is_free() || !tx.is_expected(ino, &i) {
        return errno(libc::ESTALE);
    }
    Ok(i)
}

/// The inode `ino`, validated only as the same live file (its `igeneration` and mode): for
/// a directory whose entries, not attributes, the operation depends on. The caller compares
/// any other field it relies on, except `root`, which a directory keeps for life; so the
/// cached inode serves even after other mounts changed its times and counts. A directory
/// removed by another mount between the kernel's lookup and this operation is ENOENT, as a
/// removed directory is on a local file system.
pub fn identity(tx: &mut Txn<'_>, ino: Ino) -> OpResult<Inode> {
    if !tx.vol.valid_ino(ino) {
        return errno(libc::ESTALE);
    }
    let addr = tx.vol.inode_addr(ino);
    let i = Inode::decode(&tx.object_despite_changes(ino.node(), addr, INODE_BYTES as u32)?);
    tx.check(ino.node(), addr + field::IGENERATION, 12);
    if i.is_free() || !tx.is_expected(ino, &i) {
        return errno(libc::ENOENT);
    }
    Ok(i)
}

fn slot(tx: &mut Txn<'_>, ino: Ino) -> OpResult<Inode> {
    if !tx.vol.valid_ino(ino) {
        return errno(libc::ESTALE);
    }
    let b = tx.object(ino.node(), tx.vol.inode_addr(ino), INODE_BYTES as u32)?;
    Ok(Inode::decode(&b))
}

/// Stages `new` as `ino`'s inode (it was `old`), raising its `iversion`.
pub(crate) fn stage_inode(tx: &mut Txn<'_>, ino: Ino, old: &Inode, mut new: Inode) {
    new.iversion = old.iversion + 1;
    tx.moves_iversion(ino, old.iversion, new.iversion);
    tx.stage(ino.node(), tx.vol.inode_addr(ino), new.encode());
}

/// A directory's entries changed: its `iversion`, entry count and link count by adds (so
/// that creates in one directory from several mounts do not fail each other's compares),
/// its times by one write.
pub(crate) fn touch_dir(tx: &mut Txn<'_>, dir: Ino, entries: i64, nlink: i64, now: Time) {
    let (node, at) = (dir.node(), tx.vol.inode_addr(dir));
    tx.add(node, at + field::IVERSION, 1);
    if entries != 0 {
        tx.add(node, at + field::ENTRIES, entries);
    }
    if nlink != 0 {
        tx.add(node, at + field::NLINK, nlink);
    }
    tx.write(node, at + field::MTIME_S, times_bytes(now, now));
}

pub(crate) fn check_name(name: &[u8]) -> OpResult<()> {
    if name.len() > NAME_BYTES_MAX {
        return errno(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return errno(libc::EINVAL);
    }
    Ok(())
}

/// Where `name` is or would be in directory `dir`.
pub struct Place {
    pub dir: Inode,
    pub table: Table,
    pub bucket_ref: BlockRef,
    pub bucket: Bucket,
    pub index: Option<usize>,
}

fn table(tx: &mut Txn<'_>, ino: Ino, dir: &Inode) -> OpResult<Table> {
    let (b, bs) = (dir.root, tx.vol.geometry.block_bytes);
    if !tx.vol.valid_block(b) {
        return errno(libc::EIO);
    }
    let addr = tx.vol.block_addr(b);
    let t = Table::decode(tx.object_ref(b.node(), addr, bs)?);
    if !t.owned_by(ino, dir.igeneration) {
        // The block was reused since this mount read it, or this mount's copy of the
        // directory is what is stale (freed, its blocks reused): read both again, or the
        // operation would fetch the same block forever.
        tx.refetch(ino.node(), tx.vol.inode_addr(ino), INODE_BYTES as u32);
        return Err(tx.refetch(b.node(), addr, bs));
    }
    tx.check(b.node(), addr, crate::dir::TABLE_HEADER_BYTES as u32);
    Ok(t)
}

fn bucket(tx: &mut Txn<'_>, ino: Ino, dir: &Inode, b: BlockRef) -> OpResult<Bucket> {
    let generation = dir.igeneration;
    read_bucket(tx, ino, dir, b, |bytes| {
        Bucket::decode(bytes).filter(|k| k.owned_by(ino, generation))
    })
}

/// What `read` finds in bucket `b` of directory `ino` (`None`: the block is not one of its
/// buckets, or not a bucket at all), with the bucket's header validated.
fn read_bucket<T>(
    tx: &mut Txn<'_>,
    ino: Ino,
    dir: &Inode,
    b: BlockRef,
    read: impl FnOnce(&[u8]) -> Option<T>,
) -> OpResult<T> {
    let bs = tx.vol.geometry.block_bytes;
    if !tx.vol.valid_block(b) {
        return errno(libc::EIO);
    }
    let addr = tx.vol.block_addr(b);
    match read(tx.object_ref(b.node(), addr, bs)?) {
        Some(k) => {
            if !crate::planted(crate::Bug::BucketNotValidated) {
                tx.check(b.node(), addr, 24);
            }
            Ok(k)
        }
        None => {
            // As in `table`: the bucket, the table or the directory may be the stale one.
            tx.refetch(ino.node(), tx.vol.inode_addr(ino), INODE_BYTES as u32);
            if tx.vol.valid_block(dir.root) {
                tx.refetch(dir.root.node(), tx.vol.block_addr(dir.root), bs);
            }
            Err(tx.refetch(b.node(), addr, bs))
        }
    }
}

/// Directory `ino`, its table, and the bucket where `name` goes.
fn bucket_for(tx: &mut Txn<'_>, ino: Ino, name: &[u8]) -> OpResult<(Inode, Table, BlockRef)> {
    let dir = identity(tx, ino)?;
    if !dir.is_dir() {
        return errno(libc::ENOTDIR);
    }
    let table = table(tx, ino, &dir)?;
    let bucket_ref = table.buckets[table.slot(name_hash(name))];
    Ok((dir, table, bucket_ref))
}

/// Finds where `name` goes in directory `ino`.
pub fn place(tx: &mut Txn<'_>, ino: Ino, name: &[u8]) -> OpResult<Place> {
    let (dir, table, bucket_ref) = bucket_for(tx, ino, name)?;
    let bucket = bucket(tx, ino, &dir, bucket_ref)?;
    let index = bucket.find(name);
    Ok(Place {
        dir,
        table,
        bucket_ref,
        bucket,
        index,
    })
}

pub(crate) fn stage_bucket(tx: &mut Txn<'_>, b: BlockRef, mut bucket: Bucket) {
    bucket.version += 1;
    let bytes = bucket.encode(tx.vol.geometry.block_bytes);
    tx.stage(b.node(), tx.vol.block_addr(b), bytes);
}

/// Splits the full bucket of `p` in two by one more hash bit, doubling the table first if
/// the bucket is as deep as it.
pub(crate) fn split(tx: &mut Txn<'_>, ino: Ino, p: Place, now: Time) -> OpResult<()> {
    let bs = tx.vol.geometry.block_bytes;
    let mut table = p.table;
    if p.bucket.depth >= table.depth {
        if table.depth >= Table::depth_max(bs) {
            return errno(libc::ENOSPC);
        }
        table.buckets.extend_from_within(..);
        table.depth += 1;
    }
    let (node, index) = tx.alloc(p.bucket_ref.node(), Bitmap::Blocks)?;
    let high_ref = BlockRef::new(node, index);
    let bit = 1u64 << p.bucket.depth;
    let gen = p.dir.igeneration;
    let mut low = Bucket::new(ino, gen, p.bucket.version, p.bucket.depth + 1);
    let mut high = Bucket::new(ino, gen, 1, p.bucket.depth + 1);
    for e in p.bucket.entries {
        match name_hash(&e.name) & bit {
            0 => low.entries.push(e),
            _ => high.entries.push(e),
        }
    }
    for (i, r) in table.buckets.iter_mut().enumerate() {
        if *r == p.bucket_ref && i as u64 & bit != 0 {
            *r = high_ref;
        }
    }
    table.version += 1;
    let table_ref = p.dir.root;
    tx.stage(
        table_ref.node(),
        tx.vol.block_addr(table_ref),
        table.encode(bs),
    );
    stage_bucket(tx, p.bucket_ref, low);
    tx.create_block(high_ref, high.encode(bs), true);
    tx.add(ino.node(), tx.vol.inode_addr(ino) + field::BLOCKS, 1);
    touch_dir(tx, ino, 0, 0, now);
    Ok(())
}

/// Who asks, for ownership of new files and the setuid/setgid rules.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// What `make` creates.
#[derive(Clone, Debug)]
pub struct NewFile {
    /// `st_mode`, type included (after the umask).
    pub mode: u32,
    pub rdev: u32,
    /// Symlinks: the target.
    pub target: Vec<u8>,
}

impl NewFile {
    /// A file of `mode` (type and permissions), no device, no target.
    pub fn of(mode: u32) -> NewFile {
        NewFile {
            mode,
            rdev: 0,
            target: vec![],
        }
    }
}

/// An operation that had to split a directory bucket first; run it again.
#[derive(Debug)]
pub enum Made<T> {
    Done(T),
    Split,
}

fn alloc_inode(tx: &mut Txn<'_>, prefer: NodeId) -> OpResult<(Ino, Inode)> {
    let (node, slot_index) = tx.alloc(prefer, Bitmap::Inodes)?;
    let ino = Ino::new(node, slot_index);
    let last = (slot_index + INODE_PREFETCH).min(tx.vol.geometry.inodes_per_node);
    for s in slot_index + 1..last {
        tx.want(
            node,
            tx.vol.inode_addr(Ino::new(node, s)),
            INODE_BYTES as u32,
        );
    }
    let addr = tx.vol.inode_addr(ino);
    let old = Inode::decode(&tx.object(node, addr, INODE_BYTES as u32)?);
    if !old.is_free() {
        // The slot or the bitmap page that called it free is stale: read both again.
        tx.refetch_bitmap_page(node, Bitmap::Inodes, slot_index);
        return Err(tx.refetch(node, addr, INODE_BYTES as u32));
    }
    tx.check(node, addr, 16);
    Ok((ino, old))
}

/// Creates `name` in directory `parent`: a regular file, FIFO, device, socket, directory
/// or symlink, per `new.mode`. Atomic: EEXIST if the name is taken (O_EXCL for free).
pub fn make(
    tx: &mut Txn<'_>,
    parent: Ino,
    name: &[u8],
    new: &NewFile,
    who: Caller,
    prefer: NodeId,
    now: Time,
) -> OpResult<Made<(Ino, Inode)>> {
    check_name(name)?;
    let p = place(tx, parent, name)?;
    if p.index.is_some() {
        return errno(libc::EEXIST);
    }
    let is_dir = new.mode & S_IFMT == S_IFDIR;
    let probe = Entry {
        ino: Ino(0),
        generation: 0,
        kind: (new.mode >> 12) as u8,
        name: name.to_vec(),
    };
    if !p.bucket.fits(&probe, tx.vol.geometry.block_bytes) {
        split(tx, parent, p, now)?;
        return Ok(Made::Split);
    }
    let (ino, old) = alloc_inode(tx, prefer)?;
    let mut mode = new.mode;
    let mut gid = who.gid;
    if p.dir.mode & libc::S_ISGID != 0 {
        // The group is not covered by the directory's identity compare.
        tx.check(parent.node(), tx.vol.inode_addr(parent) + field::GID, 4);
        gid = p.dir.gid;
        if is_dir {
            mode |= libc::S_ISGID;
        }
    }
    let mut inode = Inode::fresh(&old, mode, who.uid, gid, now);
    inode.rdev = new.rdev;
    if is_dir {
        inode.parent = parent;
    }
    if is_dir {
        init_dir(tx, ino, &mut inode)?;
    } else if mode & S_IFMT == S_IFLNK {
        init_symlink(tx, ino, &mut inode, &new.target)?;
    }
    stage_inode(tx, ino, &old, inode.clone());
    inode.iversion = old.iversion + 1;
    let mut bucket = p.bucket;
    bucket.entries.push(Entry {
        ino,
        generation: inode.igeneration,
        ..probe
    });
    stage_bucket(tx, p.bucket_ref, bucket);
    touch_dir(tx, parent, 1, if is_dir { 1 } else { 0 }, now);
    Ok(Made::Done((ino, inode)))
}

/// A new directory's table and its one empty bucket, on the directory's node if it has room.
fn init_dir(tx: &mut Txn<'_>, ino: Ino, inode: &mut Inode) -> OpResult<()> {
    let bs = tx.vol.geometry.block_bytes;
    let (n1, i1) = tx.alloc(ino.node(), Bitmap::Blocks)?;
    let (n2, i2) = tx.alloc(ino.node(), Bitmap::Blocks)?;
    let (table_ref, bucket_ref) = (BlockRef::new(n1, i1), BlockRef::new(n2, i2));
    let (table, bucket) = crate::dir::empty_directory(ino, inode.igeneration, bucket_ref);
    tx.create_block(table_ref, table.encode(bs), true);
    tx.create_block(bucket_ref, bucket.encode(bs), true);
    inode.root = table_ref;
    inode.blocks = 2;
    Ok(())
}

fn init_symlink(tx: &mut Txn<'_>, ino: Ino, inode: &mut Inode, target: &[u8]) -> OpResult<()> {
    let bs = tx.vol.geometry.block_bytes as usize;
    if target.is_empty() {
        return errno(libc::ENOENT);
    }
    if target.len() > bs.min(libc::PATH_MAX as usize) {
        return errno(libc::ENAMETOOLONG);
    }
    inode.size = target.len() as u64;
    if target.len() <= INLINE_BYTES {
        inode.inline = target.to_vec();
        return Ok(());
    }
    let (node, index) = tx.alloc(ino.node(), Bitmap::Blocks)?;
    let b = BlockRef::new(node, index);
    let mut image = vec![0u8; bs];
    image[..target.len()].copy_from_slice(target);
    tx.create_block(b, image, false);
    inode.root = b;
    inode.blocks = 1;
    Ok(())
}

/// The target of symlink `ino`: inline, or read from its block (the returned read index).
pub enum Target {
    Inline(Vec<u8>),
    Read(usize),
}

pub fn readlink(tx: &mut Txn<'_>, ino: Ino) -> OpResult<Target> {
    let i = inode(tx, ino)?;
    if i.kind() != S_IFLNK {
        return errno(libc::EINVAL);
    }
    if i.root.is_none() {
        return Ok(Target::Inline(i.inline));
    }
    let addr = tx.vol.block_addr(i.root);
    Ok(Target::Read(tx.read(i.root.node(), addr, i.size as u32)))
}

/// Looks `name` up in directory `parent`.
pub fn lookup(tx: &mut Txn<'_>, parent: Ino, name: &[u8]) -> OpResult<(Ino, Inode)> {
    find(tx, parent, name).map(|f| (f.ino, f.inode))
}

/// A directory entry and the file it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub ino: Ino,
    pub inode: Inode,
    /// Where the bucket that holds the entry lies (node, address): every change of the
    /// entry writes it.
    pub bucket: (NodeId, u64),
}

/// `lookup`, and where the entry lies.
pub fn find(tx: &mut Txn<'_>, parent: Ino, name: &[u8]) -> OpResult<Found> {
    if name.len() > NAME_BYTES_MAX {
        return errno(libc::ENAMETOOLONG);
    }
    // `place` without decoding the bucket's other entries: lookups are most requests.
    let (dir, _, b) = bucket_for(tx, parent, name)?;
    let generation = dir.igeneration;
    let found = read_bucket(tx, parent, &dir, b, |bytes| {
        Bucket::find_in(bytes, parent, generation, name)
    })?;
    let Some(e) = found else {
        return errno(libc::ENOENT);
    };
    let child = inode(tx, e.ino)?;
    if child.igeneration != e.generation {
        return errno(libc::EIO);
    }
    Ok(Found {
        ino: e.ino,
        inode: child,
        bucket: (b.node(), tx.vol.block_addr(b)),
    })
}

/// What became of an inode whose last link went.
#[derive(Debug, PartialEq, Eq)]
pub enum Unlinked {
    /// Links remain, or it was freed with its blocks in the same minitransaction.
    Done,
    /// It is kept as an orphan (the inode and its `igeneration`): open here, or too large
    /// to free at once. The driver frees it with `reclaim` (after the last close).
    Orphan(Ino, u64),
}

/// Drops one link of `ino` (not a directory); frees it when none remain.
pub(crate) fn drop_link(
    tx: &mut Txn<'_>,
    ino: Ino,
    old: &Inode,
    is_open: bool,
    now: Time,
) -> OpResult<Unlinked> {
    let mut new = old.clone();
    new.nlink -= 1;
    new.ctime = now;
    if new.nlink > 0 {
        stage_inode(tx, ino, old, new);
        return Ok(Unlinked::Done);
    }
    if is_open || old.blocks as usize > FREE_BLOCKS_PER_TXN {
        new.flags |= FLAG_ORPHAN;
        stage_inode(tx, ino, old, new);
        return Ok(Unlinked::Orphan(ino, old.igeneration));
    }
    let mut budget = FREE_BLOCKS_PER_TXN;
    let all = free_from(tx, ino, old.iversion, &mut new, 0, &mut budget)?;
    assert!(
        all,
        "a file of at most {FREE_BLOCKS_PER_TXN} blocks frees in one go"
    );
    free_inode(tx, ino, old, new)?;
    Ok(Unlinked::Done)
}

fn free_inode(tx: &mut Txn<'_>, ino: Ino, old: &Inode, mut new: Inode) -> OpResult<()> {
    tx.free(ino.node(), Bitmap::Inodes, ino.slot())?;
    if !old.xattr.is_none() {
        tx.free(old.xattr.node(), Bitmap::Blocks, old.xattr.index())?;
    }
    new.mode = 0;
    new.nlink = 0;
    new.flags = 0;
    new.size = 0;
    new.blocks = 0;
    new.root = BlockRef::NONE;
    new.height = 0;
    new.xattr = BlockRef::NONE;
    new.inline.clear();
    stage_inode(tx, ino, old, new);
    Ok(())
}

/// Removes `name` (not a directory) from `parent`. `is_open` says whether this mount holds
/// the file (inode, `igeneration`) open, in which case its inode outlives its last link.
pub fn unlink(
    tx: &mut Txn<'_>,
    parent: Ino,
    name: &[u8],
    is_open: &dyn Fn(Ino, u64) -> bool,
    now: Time,
) -> OpResult<Unlinked> {
    let p = place(tx, parent, name)?;
    let Some(i) = p.index else {
        return errno(libc::ENOENT);
    };
    let ino = p.bucket.entries[i].ino;
    let child = inode(tx, ino)?;
    if child.is_dir() {
        return errno(libc::EISDIR);
    }
    let mut bucket = p.bucket;
    bucket.entries.remove(i);
    stage_bucket(tx, p.bucket_ref, bucket);
    touch_dir(tx, parent, -1, 0, now);
    drop_link(tx, ino, &child, is_open(ino, child.igeneration), now)
}

/// Frees empty directory `ino` (its table, buckets and inode).
pub(crate) fn free_dir(tx: &mut Txn<'_>, ino: Ino, old: &Inode) -> OpResult<()> {
    let t = table(tx, ino, old)?;
    let mut buckets = t.buckets.clone();
    buckets.sort();
    buckets.dedup();
    for b in buckets.into_iter().chain([old.root]) {
        tx.free(b.node(), Bitmap::Blocks, b.index())?;
    }
    free_inode(tx, ino, old, old.clone())
}

pub fn rmdir(tx: &mut Txn<'_>, parent: Ino, name: &[u8], now: Time) -> OpResult<()> {
    if name == b"." {
        return errno(libc::EINVAL);
    }
    if name == b".." {
        return errno(libc::ENOTEMPTY);
    }
    let p = place(tx, parent, name)?;
    let Some(i) = p.index else {
        return errno(libc::ENOENT);
    };
    let ino = p.bucket.entries[i].ino;
    let child = inode(tx, ino)?;
    if !child.is_dir() {
        return errno(libc::ENOTDIR);
    }
    if child.entries != 0 {
        return errno(libc::ENOTEMPTY);
    }
    free_dir(tx, ino, &child)?;
    let mut bucket = p.bucket;
    bucket.entries.remove(i);
    stage_bucket(tx, p.bucket_ref, bucket);
    touch_dir(tx, parent, -1, -1, now);
    Ok(())
}

/// Adds a link `name` in `parent` to `ino`.
pub fn link(
    tx: &mut Txn<'_>,
    ino: Ino,
    parent: Ino,
    name: &[u8],
    now: Time,
) -> OpResult<Made<Inode>> {
    check_name(name)?;
    let old = inode(tx, ino)?;
    if old.is_dir() {
        return errno(libc::EPERM);
    }
    let p = place(tx, parent, name)?;
    if p.index.is_some() {
        return errno(libc::EEXIST);
    }
    let entry = Entry {
        ino,
        generation: old.igeneration,
        kind: (old.mode >> 12) as u8,
        name: name.to_vec(),
    };
    if !p.bucket.fits(&entry, tx.vol.geometry.block_bytes) {
        split(tx, parent, p, now)?;
        return Ok(Made::Split);
    }
    let mut new = old.clone();
    new.nlink += 1;
    new.ctime = now;
    new.flags &= !FLAG_ORPHAN;
    stage_inode(tx, ino, &old, new.clone());
    new.iversion += 1;
    let mut bucket = p.bucket;
    bucket.entries.push(entry);
    stage_bucket(tx, p.bucket_ref, bucket);
    touch_dir(tx, parent, 1, 0, now);
    Ok(Made::Done(new))
}

/// Every entry of directory `ino` (for readdir), validated together, and the
/// `igeneration` its parent has in this mount's cache (for the number of `..`, not validated).
pub fn list(tx: &mut Txn<'_>, ino: Ino) -> OpResult<(Inode, Vec<Entry>, u64)> {
    let dir = identity(tx, ino)?;
    if !dir.is_dir() {
        return errno(libc::ENOTDIR);
    }
    // `..` names the parent.
    tx.check(ino.node(), tx.vol.inode_addr(ino) + field::PARENT, 8);
    let t = table(tx, ino, &dir)?;
    let mut refs = t.buckets.clone();
    refs.sort();
    refs.dedup();
    let mut missing = false;
    for b in &refs {
        missing |= tx.vol.valid_block(*b) && !cached(tx, *b);
    }
    if missing {
        return Err(Stop::Miss);
    }
    let mut entries = vec![];
    for b in refs {
        entries.extend(bucket(tx, ino, &dir, b)?.entries);
    }
    let parent = match tx.vol.valid_ino(dir.parent) {
        true => slot(tx, dir.parent)?.igeneration,
        false => 0,
    };
    Ok((dir, entries, parent))
}

fn cached(tx: &mut Txn<'_>, b: BlockRef) -> bool {
    let bs = tx.vol.geometry.block_bytes;
    tx.object(b.node(), tx.vol.block_addr(b), bs).is_ok()
}

/// One step of freeing orphan `ino`: true once it is free (or linked again, or already free).
pub fn reclaim(tx: &mut Txn<'_>, ino: Ino) -> OpResult<bool> {
    let old = slot(tx, ino)?;
    tx.check(ino.node(), tx.vol.inode_addr(ino), 8);
    if old.is_free() || old.nlink > 0 {
        return Ok(true);
    }
    let mut new = old.clone();
    let mut budget = FREE_BLOCKS_PER_TXN;
    if !free_from(tx, ino, old.iversion, &mut new, 0, &mut budget)? {
        stage_inode(tx, ino, &old, new);
        return Ok(false);
    }
    free_inode(tx, ino, &old, new)?;
    Ok(true)
}

/// Returns a block that nothing references to its bitmap (fsck's repair of a crash's leak).
pub fn free_leaked(tx: &mut Txn<'_>, b: BlockRef) -> OpResult<()> {
    tx.free_compared(b.node(), Bitmap::Blocks, b.index())
}

pub use crate::blockmap::{fallocate, free_from, read, setattr, write, Piece, SetAttr};
pub use crate::rename::rename;
