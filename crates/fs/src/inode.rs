//! The inode, 256 bytes on its memory node (docs/fs.md, "Inodes"). `iversion` rises on every
//! change and never falls over the slot's life (a reused slot continues from where it was),
//! so a cached inode whose `iversion` still compares equal is exactly the stored one.
//! `igeneration` rises each time the slot is given to a new file.

use crate::layout::{get_u32, get_u64, put_u32, put_u64, BlockRef, Ino, INODE_BYTES};

/// Byte offsets of the fields, little-endian.
pub mod field {
    pub const IVERSION: u64 = 0;
    pub const IGENERATION: u64 = 8;
    pub const MODE: u64 = 16;
    pub const UID: u64 = 20;
    pub const GID: u64 = 24;
    pub const RDEV: u64 = 28;
    pub const NLINK: u64 = 32;
    /// mtime and ctime (seconds, then nanoseconds) are bytes 40..64, one write for both.
    pub const MTIME_S: u64 = 40;
    pub const CTIME_S: u64 = 48;
    pub const MTIME_NS: u64 = 56;
    pub const CTIME_NS: u64 = 60;
    pub const ATIME_S: u64 = 64;
    pub const ATIME_NS: u64 = 72;
    pub const FLAGS: u64 = 76;
    pub const SIZE: u64 = 80;
    pub const BLOCKS: u64 = 88;
    pub const ROOT: u64 = 96;
    pub const HEIGHT: u64 = 104;
    pub const PARENT: u64 = 112;
    pub const ENTRIES: u64 = 120;
    pub const XATTR: u64 = 128;
    pub const INLINE: u64 = 136;
}

/// Bytes a symlink target may take inside the inode; longer ones go to a data block.
pub const INLINE_BYTES: usize = (INODE_BYTES - field::INLINE) as usize;
/// `flags`: the file was unlinked while a mount held it open; fsck frees it.
pub const FLAG_ORPHAN: u32 = 1;

pub const S_IFMT: u32 = libc::S_IFMT;
pub const S_IFDIR: u32 = libc::S_IFDIR;
pub const S_IFREG: u32 = libc::S_IFREG;
pub const S_IFLNK: u32 = libc::S_IFLNK;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Time {
    pub s: i64,
    pub ns: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub iversion: u64,
    pub igeneration: u64,
    /// `st_mode`: the file type and permission bits; 0 for a free slot.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub nlink: u64,
    pub mtime: Time,
    pub ctime: Time,
    pub atime: Time,
    pub flags: u32,
    pub size: u64,
    /// Blocks held, data and pointer blocks both.
    pub blocks: u64,
    /// Files and symlinks: the block map's root (a data block at height 0, else a pointer
    /// block). Directories: the hash table's block.
    pub root: BlockRef,
    pub height: u32,
    /// Directories: the parent directory (the root is its own parent).
    pub parent: Ino,
    /// Directories: how many entries they hold.
    pub entries: u64,
    /// The block holding the extended attributes (`xattr::Xattrs`), if any.
    pub xattr: BlockRef,
    /// Symlinks up to `INLINE_BYTES`: the target.
    pub inline: Vec<u8>,
}

impl Inode {
    /// A new file of `mode` in the free slot `old`: the slot's next generation, one link (a
    /// directory two, and its parent to be set), times `now`, nothing allocated. `iversion`
    /// stays `old`'s: staging the inode raises it.
    pub fn fresh(old: &Inode, mode: u32, uid: u32, gid: u32, now: Time) -> Inode {
        Inode {
            iversion: old.iversion,
            igeneration: old.igeneration + 1,
            mode,
            uid,
            gid,
            rdev: 0,
            nlink: if mode & S_IFMT == S_IFDIR { 2 } else { 1 },
            mtime: now,
            ctime: now,
            atime: now,
            flags: 0,
            size: 0,
            blocks: 0,
            root: BlockRef::NONE,
            height: 0,
            parent: Ino(0),
            entries: 0,
            xattr: BlockRef::NONE,
            inline: vec![],
        }
    }

    pub fn decode(b: &[u8]) -> Inode {
        assert_eq!(b.len() as u64, INODE_BYTES);
        let time = |s, ns| Time {
            s: get_u64(b, s) as i64,
            ns: get_u32(b, ns),
        };
        let size = get_u64(b, field::SIZE);
        let mode = get_u32(b, field::MODE);
        let inline_len = if mode & S_IFMT == S_IFLNK && size as usize <= INLINE_BYTES {
            size as usize
        } else {
            0
        };
        let at = field::INLINE as usize;
        Inode {
            iversion: get_u64(b, field::IVERSION),
            igeneration: get_u64(b, field::IGENERATION),
            mode,
            uid: get_u32(b, field::UID),
            gid: get_u32(b, field::GID),
            rdev: get_u32(b, field::RDEV),
            nlink: get_u64(b, field::NLINK),
            mtime: time(field::MTIME_S, field::MTIME_NS),
            ctime: time(field::CTIME_S, field::CTIME_NS),
            atime: time(field::ATIME_S, field::ATIME_NS),
            flags: get_u32(b, field::FLAGS),
            size,
            blocks: get_u64(b, field::BLOCKS),
            root: BlockRef(get_u64(b, field::ROOT)),
            height: get_u32(b, field::HEIGHT),
            parent: Ino(get_u64(b, field::PARENT)),
            entries: get_u64(b, field::ENTRIES),
            xattr: BlockRef(get_u64(b, field::XATTR)),
            inline: b[at..at + inline_len].to_vec(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_BYTES as usize];
        put_u64(&mut b, field::IVERSION, self.iversion);
        put_u64(&mut b, field::IGENERATION, self.igeneration);
        put_u32(&mut b, field::MODE, self.mode);
        put_u32(&mut b, field::UID, self.uid);
        put_u32(&mut b, field::GID, self.gid);
        put_u32(&mut b, field::RDEV, self.rdev);
        put_u64(&mut b, field::NLINK, self.nlink);
        b[field::MTIME_S as usize..field::ATIME_S as usize]
            .copy_from_slice(&times_bytes(self.mtime, self.ctime));
        put_u64(&mut b, field::ATIME_S, self.atime.s as u64);
        put_u32(&mut b, field::ATIME_NS, self.atime.ns);
        put_u32(&mut b, field::FLAGS, self.flags);
        put_u64(&mut b, field::SIZE, self.size);
        put_u64(&mut b, field::BLOCKS, self.blocks);
        put_u64(&mut b, field::ROOT, self.root.0);
        put_u32(&mut b, field::HEIGHT, self.height);
        put_u64(&mut b, field::PARENT, self.parent.0);
        put_u64(&mut b, field::ENTRIES, self.entries);
        put_u64(&mut b, field::XATTR, self.xattr.0);
        assert!(self.inline.len() <= INLINE_BYTES);
        let at = field::INLINE as usize;
        b[at..at + self.inline.len()].copy_from_slice(&self.inline);
        b
    }

    pub fn is_free(&self) -> bool {
        self.mode == 0
    }
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }
}

/// Bytes 40..64 of an inode: mtime and ctime, as one write item.
pub fn times_bytes(mtime: Time, ctime: Time) -> Vec<u8> {
    let mut b = vec![0u8; 24];
    b[0..8].copy_from_slice(&(mtime.s as u64).to_le_bytes());
    b[8..16].copy_from_slice(&(ctime.s as u64).to_le_bytes());
    b[16..20].copy_from_slice(&mtime.ns.to_le_bytes());
    b[20..24].copy_from_slice(&ctime.ns.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_round_trips() {
        let i = Inode {
            iversion: 7,
            igeneration: 3,
            mode: S_IFLNK | 0o777,
            uid: 1000,
            gid: 100,
            rdev: 0,
            nlink: 1,
            mtime: Time {
                s: 1_700_000_000,
                ns: 5,
            },
            ctime: Time {
                s: -1,
                ns: 999_999_999,
            },
            atime: Time { s: 2, ns: 0 },
            flags: FLAG_ORPHAN,
            size: 5,
            blocks: 0,
            root: BlockRef::NONE,
            height: 0,
            parent: Ino(0),
            entries: 0,
            xattr: BlockRef(5 << 40 | 9),
            inline: b"a/b/c".to_vec(),
        };
        assert_eq!(Inode::decode(&i.encode()), i);
    }
}
