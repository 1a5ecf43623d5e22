//! rename(2) as one minitransaction: within a directory, across directories, directories
//! into directories (with the loop check walking the destination's ancestors, each
//! validated), over an existing target, and the `RENAME_NOREPLACE` / `RENAME_EXCHANGE` flags.

use crate::dir::{Bucket, Entry};
use crate::inode::{field, Inode, Time};
use crate::layout::Ino;
use crate::ops::{identity, inode, place, Made, Unlinked};
use crate::txn::{OpResult, Stop, Txn};

/// Deepest directory tree the loop check walks before it gives up with ELOOP.
pub const DEPTH_MAX: usize = 4096;

fn errno<T>(e: i32) -> OpResult<T> {
    Err(Stop::Errno(e))
}

/// EINVAL if `dir` is `ancestor` or lies under it: a directory cannot move into itself.
fn not_under(tx: &mut Txn<'_>, dir: Ino, ancestor: Ino) -> OpResult<()> {
    let root = tx.vol.root();
    let mut at = dir;
    for _ in 0..DEPTH_MAX {
        if at == ancestor {
            return errno(libc::EINVAL);
        }
        if at == root {
            return Ok(());
        }
        let i = identity(tx, at)?;
        tx.check(at.node(), tx.vol.inode_addr(at) + field::PARENT, 8);
        at = i.parent;
    }
    errno(libc::ELOOP)
}

fn set_entry(bucket: &mut Bucket, name: &[u8], to: &Entry) {
    let i = bucket.find(name).expect("the entry is there");
    bucket.entries[i] = Entry {
        name: name.to_vec(),
        ..to.clone()
    };
}

/// Renames `sname` in `sp` to `dname` in `dp` (flags: `libc::RENAME_NOREPLACE`,
/// `libc::RENAME_EXCHANGE`). A target replaced loses a link, as in unlink.
#[allow(clippy::too_many_arguments)]
pub fn rename(
    tx: &mut Txn<'_>,
    sp: Ino,
    sname: &[u8],
    dp: Ino,
    dname: &[u8],
    flags: u32,
    is_open: &dyn Fn(Ino, u64) -> bool,
    now: Time,
) -> OpResult<Made<Unlinked>> {
    let exchange = flags & libc::RENAME_EXCHANGE != 0;
    let noreplace = flags & libc::RENAME_NOREPLACE != 0;
    if exchange && noreplace || flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 {
        return errno(libc::EINVAL);
    }
    crate::ops::check_name(dname)?;
    let s = place(tx, sp, sname)?;
    let Some(si) = s.index else {
        return errno(libc::ENOENT);
    };
    let moving = s.bucket.entries[si].clone();
    let moved = inode(tx, moving.ino)?;
    let d = place(tx, dp, dname)?;
    let target = d.index.map(|i| d.bucket.entries[i].clone());
    if target.as_ref().is_some_and(|t| t.ino == moving.ino) {
        return Ok(Made::Done(Unlinked::Done));
    }
    if noreplace && target.is_some() {
        return errno(libc::EEXIST);
    }
    if exchange && target.is_none() {
        return errno(libc::ENOENT);
    }
    let replaced: Option<(Entry, Inode)> = match target {
        Some(t) => Some((t.clone(), inode(tx, t.ino)?)),
        None => None,
    };
    if let (false, Some((_, t))) = (exchange, &replaced) {
        match (moved.is_dir(), t.is_dir()) {
            (true, false) => return errno(libc::ENOTDIR),
            (false, true) => return errno(libc::EISDIR),
            (true, true) if t.entries != 0 => return errno(libc::ENOTEMPTY),
            _ => {}
        }
    }
    if moved.is_dir() && sp != dp {
        not_under(tx, dp, moving.ino)?;
    }
    if let (true, Some((t, ti))) = (exchange, &replaced) {
        if ti.is_dir() && sp != dp {
            not_under(tx, sp, t.ino)?;
        }
    }
    let same_bucket = s.bucket_ref == d.bucket_ref;
    let arriving = Entry {
        name: dname.to_vec(),
        ..moving.clone()
    };
    if replaced.is_none() {
        let mut room = if same_bucket {
            s.bucket.clone()
        } else {
            d.bucket.clone()
        };
        room.entries.retain(|e| e.name != sname || !same_bucket);
        if !room.fits(&arriving, tx.vol.geometry.block_bytes) {
            crate::ops::split(tx, dp, d, now)?;
            return Ok(Made::Split);
        }
    }
    let mut sb = s.bucket;
    let mut db = (!same_bucket).then_some(d.bucket);
    match (&replaced, exchange) {
        (Some((t, _)), true) => {
            set_entry(&mut sb, sname, t);
            set_entry(db.as_mut().unwrap_or(&mut sb), dname, &moving);
        }
        (Some(_), false) => {
            sb.entries.retain(|e| e.name != sname);
            set_entry(db.as_mut().unwrap_or(&mut sb), dname, &moving);
        }
        (None, _) => {
            sb.entries.retain(|e| e.name != sname);
            db.as_mut().unwrap_or(&mut sb).entries.push(arriving);
        }
    }
    crate::ops::stage_bucket(tx, s.bucket_ref, sb);
    if let Some(db) = db {
        crate::ops::stage_bucket(tx, d.bucket_ref, db);
    }
    let cross = sp != dp;
    let mut new = moved.clone();
    new.ctime = now;
    if moved.is_dir() && cross {
        new.parent = dp;
    }
    crate::ops::stage_inode(tx, moving.ino, &moved, new);
    let moved_dir = moved.is_dir() as i64;
    let mut result = Unlinked::Done;
    let (mut s_entries, mut s_nlink, mut d_entries, mut d_nlink) = (-1, -moved_dir, 1, moved_dir);
    match (&replaced, exchange) {
        (Some((t, ti)), true) => {
            let mut other = ti.clone();
            other.ctime = now;
            if ti.is_dir() && cross {
                other.parent = sp;
            }
            crate::ops::stage_inode(tx, t.ino, ti, other);
            let target_dir = ti.is_dir() as i64;
            (s_entries, d_entries) = (0, 0);
            (s_nlink, d_nlink) = (target_dir - moved_dir, moved_dir - target_dir);
        }
        (Some((t, ti)), false) => {
            d_entries = 0;
            if ti.is_dir() {
                crate::ops::free_dir(tx, t.ino, ti)?;
                d_nlink -= 1;
            } else {
                result = crate::ops::drop_link(tx, t.ino, ti, is_open(t.ino, ti.igeneration), now)?;
            }
        }
        (None, _) => {}
    }
    if cross {
        crate::ops::touch_dir(tx, sp, s_entries, s_nlink, now);
        crate::ops::touch_dir(tx, dp, d_entries, d_nlink, now);
    } else {
        crate::ops::touch_dir(tx, sp, s_entries + d_entries, s_nlink + d_nlink, now);
    }
    Ok(Made::Done(result))
}
