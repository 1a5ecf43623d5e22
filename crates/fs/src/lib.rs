//! tutti-fs: a cluster file system on memory nodes (SinfoniaFS, Sinfonia §5). Inodes,
//! bitmaps, directory hash tables and file blocks live in one region on every memory node;
//! every operation is one minitransaction that validates what the mount cached with compare
//! items. Any number of mounts share a volume with no protocol of their own. This crate
//! owns the layout, the operations (sans-I/O, in `ops` over `txn`), their driver, fsck and
//! the FUSE adapter; the CLI's `tutti fs` drives it. It uses only the minitransaction client.

pub mod blockmap;
pub mod coherence;
pub mod dir;
pub mod fsck;
pub mod fsx;
pub mod inode;
pub mod layout;
pub mod members;
pub mod mount;
pub mod ops;
pub mod rename;
pub mod txn;
pub mod volume;
pub mod xattr;

pub use layout::{BlockRef, Ino};

/// Deliberate bugs that show the simulator's checks can fail (crates/sim/tests/planted.rs).
/// Planted only with the `planted-bugs` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A directory operation changes a bucket without comparing the version it read.
    BucketNotValidated,
    /// An operation acts on a file's inode as cached without comparing it: its frees
    /// (atomic adds on the bitmaps, which that compare vouches for) may return bits
    /// another mount already returned, and its block map may be stale.
    InodeNotValidated,
    /// A grow that formats the new nodes (zeroes their bitmaps) without comparing that the
    /// volume does not span them yet: run again, it frees everything allocated there since.
    GrowNotValidated,
    /// A member commits a write without announcing it to the other members: they keep
    /// trusting (and their kernels keep) what it changed.
    WriteNotAnnounced,
    /// A member does not note which bytes a write moved: a read of them that began before
    /// the move is trusted when it ends.
    MoveNotMarked,
    /// A member trusts bytes read while another member's announced write of them is open.
    WindowIgnored,
    /// A member acknowledges another's announcement but neither stops trusting the bytes
    /// announced nor marks them changed: it answers lookups and stats from what the write
    /// replaced.
    AnnouncementIgnored,
    /// A member that takes its callback back after a revocation keeps trusting reads begun
    /// before: one in flight across the change holds bytes that a write, committed while
    /// nobody announced to this member, replaced.
    RetakenCallbackKeepsTrust,
    /// A member whose lease is gone (revoked: the writer that revoked it commits without
    /// its acknowledgement) keeps trusting what it read.
    LapsedTrustKept,
}

tutti_wire::planted_bugs!(Bug);
pub use mount::{Mount, MountOptions};
pub use volume::{FileSystem, FsError, Handle, Shape, Usage};
