//! The FUSE adapter (fuser 0.18): maps the kernel's requests onto `FileSystem` operations,
//! keeps this mount's open files and its write-back buffers. With the default `cache_ms` of
//! 0 the kernel keeps attributes, and entries while no other mount caches, only while this
//! mount's lease lets it trust them, and is told to forget them when another member
//! announces a write to them (docs/fs.md, "Coherent caching"), so that other mounts'
//! changes show at once.

use crate::coherence::Stamp;
use crate::inode::{Inode, Time, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use crate::layout::Ino;
use crate::members::Changed;
use crate::ops::{Caller, Found, NewFile, SetAttr};
use crate::volume::{FileSystem, Handle};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::runtime::Handle as Runtime;
use tutti_wire::NodeId;

/// Bytes of writes one open file buffers before they go out as one minitransaction.
pub const WRITE_BACK_BYTES_DEFAULT: usize = 4 << 20;
/// Separate extents one file buffers at most (random writes flush sooner).
const WRITE_BACK_EXTENTS_MAX: usize = 256;
/// Largest write the kernel sends in one request.
const MAX_WRITE_BYTES: u32 = 1 << 20;

#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may trust attributes and entries; 0 validates every one.
    pub cache_ms: u64,
    /// Threads reading requests from the kernel.
    pub threads: usize,
    /// Let every user in, not only the mounting one.
    pub allow_other: bool,
    pub write_back_bytes: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            cache_ms: 0,
            threads: 4,
            allow_other: true,
            write_back_bytes: WRITE_BACK_BYTES_DEFAULT,
        }
    }
}

/// Writes accepted but not yet on the memory nodes, for one file.
struct Dirty {
    extents: Vec<(u64, Vec<u8>)>,
    bytes: usize,
    /// Every buffered write came from root. If not, the flush clears setuid and setgid as
    /// POSIX asks of an unprivileged write; nothing in this mount sees the file before the
    /// flush (stat, setattr and reads flush first).
    privileged: bool,
}

impl Default for Dirty {
    fn default() -> Self {
        Dirty {
            extents: vec![],
            bytes: 0,
            privileged: true,
        }
    }
}

struct OpenFile {
    h: Handle,
    append: bool,
}

#[derive(Default)]
struct Handles {
    next: u64,
    files: HashMap<u64, OpenFile>,
    /// Open handles per file: an unlinked file stays until its last close here.
    open: HashMap<Handle, usize>,
    dirs: HashMap<u64, Vec<(u64, FileType, Vec<u8>)>>,
    /// Files unlinked while open here: their last close frees them.
    orphans: std::collections::HashSet<Handle>,
}

/// What the kernel was given to keep: what another member's write covers is forgotten
/// there.
pub type Given = Arc<Mutex<Kept>>;

/// An entry the kernel keeps: the bucket that holds it (node, address), its directory's
/// kernel number and its name.
type KeptEntry = ((NodeId, u64), u64, Vec<u8>);

/// An entry to forget: its directory's kernel number, its name, and when it was given.
type Doomed = (u64, Vec<u8>, Instant);

/// How long after its reply an entry may still be on its way into the kernel's cache: a
/// notice to forget it that arrives first finds nothing (the kernel need not wait for
/// lookups in flight), so an entry given this recently is told again this much later.
const ENTRY_IN_FLIGHT: Duration = Duration::from_millis(20);

/// Attributes and entries the kernel keeps.
pub struct Kept {
    /// Files whose attributes it keeps, and the number it knows each by.
    attrs: HashMap<Ino, u64>,
    /// Entries given since `since`, and in the lease before (`older`). One given earlier
    /// has timed out in the kernel (no timeout outlasts the lease), so the notes stay
    /// bounded by two leases of lookups.
    entries: BTreeMap<KeptEntry, Instant>,
    older: BTreeMap<KeptEntry, Instant>,
    since: Instant,
    lease: Duration,
    bucket_bytes: u32,
}

impl Kept {
    fn new(lease: Duration, bucket_bytes: u32) -> Kept {
        Kept {
            attrs: HashMap::new(),
            entries: BTreeMap::new(),
            older: BTreeMap::new(),
            since: Instant::now(),
            lease,
            bucket_bytes,
        }
    }

    fn keep_entry(&mut self, entry: KeptEntry) {
        if self.since.elapsed() >= self.lease {
            self.older = std::mem::take(&mut self.entries);
            self.since = Instant::now();
        }
        self.entries.insert(entry, Instant::now());
    }

    /// Takes the entries held in the buckets that `len` bytes at `addr` of `node` overlap.
    fn take_entries(&mut self, node: NodeId, addr: u64, len: u32, into: &mut Vec<Doomed>) {
        let first = addr.saturating_sub(self.bucket_bytes as u64 - 1);
        let (from, to) = (
            ((node, first), 0, vec![]),
            ((node, addr + len as u64), 0, vec![]),
        );
        for kept in [&mut self.entries, &mut self.older] {
            let covered: Vec<KeptEntry> = (kept.range(from.clone()..to.clone()))
                .map(|(e, _)| e.clone())
                .collect();
            for e in covered {
                let given = kept.remove(&e).expect("just found");
                into.push((e.1, e.2, given));
            }
        }
    }
}

/// What one mount keeps: its volume, open files and write-back buffers.
struct State {
    fs: Arc<FileSystem>,
    /// `--cache-ms`: how long the kernel keeps attributes and entries whatever other
    /// mounts do; `None`: as long as coherence allows.
    fixed_ttl: Option<Duration>,
    given: Given,
    write_back_bytes: usize,
    handles: Mutex<Handles>,
    dirty: Mutex<HashMap<Handle, Arc<tokio::sync::Mutex<Dirty>>>>,
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn system_time(t: Time) -> SystemTime {
    if t.s >= 0 {
        UNIX_EPOCH + Duration::new(t.s as u64, t.ns)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.s.unsigned_abs()) + Duration::from_nanos(t.ns as u64)
    }
}

fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            s: d.as_secs() as i64,
            ns: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut s, mut ns) = (-(d.as_secs() as i64), d.subsec_nanos());
            if ns > 0 {
                s -= 1;
                ns = 1_000_000_000 - ns;
            }
            Time { s, ns }
        }
    }
}

fn kind(mode: u32) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// One mount of a volume: the FUSE session's file system. Each request runs as a task on
/// the runtime and replies itself, so that a dispatch thread goes back to the kernel at
/// once and a request costs no thread hand-off on its way back.
pub struct Mount {
    state: Arc<State>,
    rt: Runtime,
}

impl Mount {
    /// The files whose attributes this mount let the kernel keep (for `forgetter`).
    pub fn given(&self) -> Given {
        self.state.given.clone()
    }

    /// What makes the kernel forget attributes and entries once mounted, through
    /// `notifier`: for `FileSystem::on_forget`.
    pub fn forgetter(given: Given, notifier: fuser::Notifier) -> crate::members::Forget {
        Box::new(move |changed: Changed<'_>| {
            let (mut files, mut entries) = (vec![], vec![]);
            {
                let mut kept = given.lock().expect("given poisoned");
                match changed {
                    Changed::All => {
                        files.extend(kept.attrs.drain().map(|(_, k)| k));
                        let recent = std::mem::take(&mut kept.entries);
                        let older = std::mem::take(&mut kept.older);
                        let all = recent.into_iter().chain(older);
                        entries.extend(all.map(|(e, given)| (e.1, e.2, given)));
                    }
                    Changed::Ranges { ranges, inodes } => {
                        files.extend(inodes.iter().filter_map(|i| kept.attrs.remove(i)));
                        for &(node, addr, len) in ranges {
                            kept.take_entries(node, addr, len, &mut entries);
                        }
                    }
                }
            }
            if files.is_empty() && entries.is_empty() {
                return None;
            }
            let notifier = notifier.clone();
            Some(Box::new(move || {
                // ENOENT: the kernel let it go already.
                for k in files {
                    let _ = notifier.inval_inode(INodeNo(k), 0, 0);
                }
                let forget = |(dir, name, _): &Doomed| {
                    let _ = notifier.inval_entry(INodeNo(*dir), OsStr::from_bytes(name));
                };
                let recent: Vec<&Doomed> = (entries.iter())
                    .filter(|e| e.2.elapsed() < ENTRY_IN_FLIGHT)
                    .collect();
                entries.iter().for_each(forget);
                if !recent.is_empty() {
                    std::thread::sleep(ENTRY_IN_FLIGHT);
                    recent.into_iter().for_each(forget);
                }
            }) as crate::members::Notices)
        })
    }

    pub fn new(fs: Arc<FileSystem>, rt: Runtime, opts: &MountOptions) -> Mount {
        let kept = Kept::new(fs.lease(), fs.volume().geometry.block_bytes);
        let state = State {
            fs,
            fixed_ttl: (opts.cache_ms > 0).then(|| Duration::from_millis(opts.cache_ms)),
            given: Arc::new(Mutex::new(kept)),
            write_back_bytes: opts.write_back_bytes,
            handles: Mutex::default(),
            dirty: Mutex::default(),
        };
        Mount {
            state: Arc::new(state),
            rt,
        }
    }

    /// Runs `request` on the runtime with the mount's state.
    fn spawn<F, R>(&self, request: R)
    where
        R: FnOnce(Arc<State>) -> F,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(request(self.state.clone()));
    }
}

impl State {
    /// The kernel's number for file `ino` of generation `generation` (the root is 1; the
    /// others carry their generation, `Volume::handle`).
    fn kernel_ino(&self, ino: Ino, generation: u64) -> INodeNo {
        if ino == self.fs.root() {
            INodeNo(1)
        } else {
            INodeNo(self.fs.volume().handle(ino, generation))
        }
    }

    /// The file a kernel number names.
    fn ino(&self, k: INodeNo) -> Handle {
        if k.0 == 1 {
            return Handle::any(self.fs.root());
        }
        let (ino, generation) = self.fs.volume().from_handle(k.0);
        Handle {
            ino,
            generation: Some(generation),
        }
    }

    /// The handle of file `ino` with `igeneration` `generation`, as the kernel knows it.
    fn handle(&self, ino: Ino, generation: u64) -> Handle {
        self.ino(self.kernel_ino(ino, generation))
    }

    fn attr(&self, ino: Ino, i: &Inode) -> FileAttr {
        let bs = self.fs.volume().geometry.block_bytes;
        let size = if i.is_dir() {
            i.blocks * bs as u64
        } else {
            i.size
        };
        FileAttr {
            ino: self.kernel_ino(ino, i.igeneration),
            size,
            blocks: i.blocks * (bs as u64 / 512),
            atime: system_time(i.atime),
            mtime: system_time(i.mtime),
            ctime: system_time(i.ctime),
            crtime: system_time(i.ctime),
            kind: kind(i.mode),
            perm: (i.mode & 0o7777) as u16,
            nlink: i.nlink.min(u32::MAX as u64) as u32,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            blksize: bs,
            flags: 0,
        }
    }

    /// Remembers a file unlinked while open here, for its last close to free.
    fn keep_orphan(&self, kept: Option<(Ino, u64)>) {
        if let Some((ino, generation)) = kept {
            let h = self.handle(ino, generation);
            self.handles
                .lock()
                .expect("handles poisoned")
                .orphans
                .insert(h);
        }
    }

    fn is_open(&self) -> impl Fn(Ino, u64) -> bool + Sync + '_ {
        |ino, generation| {
            let h = self.handle(ino, generation);
            self.handles
                .lock()
                .expect("handles poisoned")
                .open
                .contains_key(&h)
        }
    }

    fn dirty_of(&self, h: Handle) -> Option<Arc<tokio::sync::Mutex<Dirty>>> {
        self.dirty.lock().expect("dirty poisoned").get(&h).cloned()
    }

    /// Sends `h`'s buffered writes to the memory nodes.
    async fn flush(&self, h: Handle) -> Result<(), i32> {
        let Some(d) = self.dirty_of(h) else {
            return Ok(());
        };
        let mut d = d.lock().await;
        self.flush_locked(h, &mut d).await
    }

    async fn flush_locked(&self, h: Handle, d: &mut Dirty) -> Result<(), i32> {
        let mut extents = std::mem::take(&mut d.extents);
        let privileged = std::mem::replace(&mut d.privileged, true);
        d.bytes = 0;
        extents.sort_by_key(|(off, _)| *off);
        let mut batch: Vec<(u64, Vec<u8>)> = vec![];
        let mut bytes = 0;
        for e in extents {
            bytes += e.1.len();
            batch.push(e);
            if bytes >= self.write_back_bytes {
                self.fs.write(h, &batch, false, privileged).await?;
                batch.clear();
                bytes = 0;
            }
        }
        if !batch.is_empty() {
            self.fs.write(h, &batch, false, privileged).await?;
        }
        Ok(())
    }

    async fn buffer_write(
        &self,
        h: Handle,
        offset: u64,
        data: &[u8],
        privileged: bool,
    ) -> Result<(), i32> {
        let d = {
            let mut all = self.dirty.lock().expect("dirty poisoned");
            all.entry(h).or_default().clone()
        };
        let mut d = d.lock().await;
        let end = offset + data.len() as u64;
        let overlaps = d
            .extents
            .iter()
            .any(|(o, b)| offset < o + b.len() as u64 && *o < end);
        if overlaps || d.extents.len() >= WRITE_BACK_EXTENTS_MAX {
            self.flush_locked(h, &mut d).await?;
        }
        match d.extents.last_mut() {
            Some((o, b)) if *o + b.len() as u64 == offset => b.extend_from_slice(data),
            _ => d.extents.push((offset, data.to_vec())),
        }
        d.bytes += data.len();
        d.privileged &= privileged;
        if d.bytes >= self.write_back_bytes {
            self.flush_locked(h, &mut d).await?;
        }
        Ok(())
    }

    async fn getattr_fresh(&self, h: Handle) -> Result<Inode, i32> {
        self.flush(h).await?;
        self.fs.getattr(h).await
    }

    fn new_handle(&self, file: Handle, append: bool) -> u64 {
        let mut h = self.handles.lock().expect("handles poisoned");
        h.next += 1;
        let fh = h.next;
        h.files.insert(fh, OpenFile { h: file, append });
        *h.open.entry(file).or_default() += 1;
        fh
    }

    /// Closes handle `fh` and returns its file if that was the file's last handle here
    /// and the close has work left: buffered writes to send, or, for a file unlinked while
    /// open, freeing it (`finish_close`).
    fn close_handle(&self, fh: u64) -> Option<Handle> {
        let mut h = self.handles.lock().expect("handles poisoned");
        let f = h.files.remove(&fh)?;
        let count = h.open.get_mut(&f.h).expect("counted");
        *count -= 1;
        if *count > 0 {
            return None;
        }
        h.open.remove(&f.h);
        if h.orphans.contains(&f.h) || self.dirty_of(f.h).is_some() {
            return Some(f.h);
        }
        None
    }

    /// The rest of the last close of `file`: sends its buffered writes, then frees it if
    /// it was unlinked while open.
    async fn finish_close(&self, file: Handle) -> Result<(), i32> {
        let flushed = self.flush(file).await;
        self.forget_clean(file);
        let orphan = self
            .handles
            .lock()
            .expect("handles poisoned")
            .orphans
            .remove(&file);
        if orphan {
            self.fs.reclaim(file.ino, file.generation).await?;
        }
        flushed
    }

    /// Drops `file`'s write buffer if it holds nothing and nobody else holds it: a handle
    /// opened since the close may be adding to it.
    fn forget_clean(&self, file: Handle) {
        let mut all = self.dirty.lock().expect("dirty poisoned");
        let unused = all.get(&file).is_some_and(|d| {
            Arc::strong_count(d) == 1 && d.try_lock().is_ok_and(|d| d.extents.is_empty())
        });
        if unused {
            all.remove(&file);
        }
    }

    /// How long the kernel may keep attributes of `ino` read since `stamp` (noted, for
    /// another member's write to make it forget them).
    fn attr_ttl(&self, stamp: Stamp, ino: Ino, i: &Inode) -> Duration {
        if let Some(ttl) = self.fixed_ttl {
            return ttl;
        }
        // Decided and noted under one hold of `given`: an announcement that arrives after
        // the decision finds the note (and has the kernel forget), one before it has moved
        // the trust the decision reads (and the answer gets no time).
        let mut given = self.given.lock().expect("given poisoned");
        let ttl = self.fs.attr_ttl(stamp, ino);
        if !ttl.is_zero() {
            given
                .attrs
                .insert(ino, self.kernel_ino(ino, i.igeneration).0);
        }
        ttl
    }

    /// How long the kernel may keep entry `name` of `dir`, held in the bucket at `bucket` and
    /// read since
    /// `stamp` (noted, as `attr_ttl` notes attributes). Only while no other member caches:
    /// the kernel forgets an entry under its directory's lock, which a create there may
    /// hold while it waits for another member's acknowledgement, so two members that both
    /// kept entries could each wait for the other until one is revoked.
    fn entry_ttl(
        &self,
        stamp: Stamp,
        dir: INodeNo,
        name: &[u8],
        bucket: (NodeId, u64),
    ) -> Duration {
        if let Some(ttl) = self.fixed_ttl {
            return ttl;
        }
        if !self.fs.caches_alone() {
            return Duration::ZERO;
        }
        let mut given = self.given.lock().expect("given poisoned");
        let (node, addr) = bucket;
        let ttl = self.fs.ttl(stamp, (node, addr, given.bucket_bytes as u64));
        if !ttl.is_zero() {
            given.keep_entry((bucket, dir.0, name.to_vec()));
        }
        ttl
    }

    /// How long the kernel may keep the entry of a file this mount just made: `--cache-ms`,
    /// or not at all (what it read before is not trusted past its own write).
    fn made_entry_ttl(&self) -> Duration {
        self.fixed_ttl.unwrap_or(Duration::ZERO)
    }

    /// Replies the entry of a file this mount made or linked.
    fn entry(&self, stamp: Stamp, reply: ReplyEntry, r: Result<(Ino, Inode), i32>) {
        match r {
            Ok((ino, i)) => reply.entry_with_ttls(
                &self.attr_ttl(stamp, ino, &i),
                &self.made_entry_ttl(),
                &self.attr(ino, &i),
                Generation(i.igeneration),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    /// Replies what a lookup of `name` in `dir` found.
    fn found(
        &self,
        stamp: Stamp,
        reply: ReplyEntry,
        dir: INodeNo,
        name: &[u8],
        r: Result<Found, i32>,
    ) {
        match r {
            Ok(f) => reply.entry_with_ttls(
                &self.attr_ttl(stamp, f.ino, &f.inode),
                &self.entry_ttl(stamp, dir, name, f.bucket),
                &self.attr(f.ino, &f.inode),
                Generation(f.inode.igeneration),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn reply_attr(&self, stamp: Stamp, reply: ReplyAttr, h: Handle, r: Result<Inode, i32>) {
        match r {
            Ok(inode) => reply.attr(
                &self.attr_ttl(stamp, h.ino, &inode),
                &self.attr(h.ino, &inode),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    async fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Found, i32> {
        let mut found = self.fs.lookup(parent, name).await?;
        let h = self.handle(found.ino, found.inode.igeneration);
        if self.dirty_of(h).is_some() {
            found.inode = self.getattr_fresh(h).await?;
        }
        Ok(found)
    }

    async fn write(
        &self,
        h: Handle,
        fh: u64,
        offset: u64,
        data: Vec<u8>,
        uid: u32,
    ) -> Result<(), i32> {
        let append = (self
            .handles
            .lock()
            .expect("handles poisoned")
            .files
            .get(&fh))
        .is_some_and(|f| f.append);
        if append {
            self.flush(h).await?;
            return self
                .fs
                .write(h, &[(offset, data)], true, uid == 0)
                .await
                .map(|_| ());
        }
        self.buffer_write(h, offset, &data, uid == 0).await
    }

    /// Lists directory `h` for a new directory handle.
    async fn opendir(&self, h: Handle) -> Result<u64, i32> {
        let (dir, entries, parent_generation) = self.fs.list(h).await?;
        let mut items = vec![
            (
                self.kernel_ino(h.ino, dir.igeneration).0,
                FileType::Directory,
                b".".to_vec(),
            ),
            (
                self.kernel_ino(dir.parent, parent_generation).0,
                FileType::Directory,
                b"..".to_vec(),
            ),
        ];
        for e in entries {
            items.push((
                self.kernel_ino(e.ino, e.generation).0,
                kind((e.kind as u32) << 12),
                e.name,
            ));
        }
        let mut h = self.handles.lock().expect("handles poisoned");
        h.next += 1;
        let fh = h.next;
        h.dirs.insert(fh, items);
        Ok(fh)
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), i32>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

/// Answers getxattr or listxattr: the size alone when the caller asks with `size` 0,
/// ERANGE when its buffer is too small.
fn reply_xattr(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, i32>) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(err(e)),
    }
}

fn set_attr(
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
    ctime: Option<SystemTime>,
) -> SetAttr {
    let now = crate::volume::now();
    let at = |t: Option<TimeOrNow>| {
        t.map(|t| match t {
            TimeOrNow::Now => now,
            TimeOrNow::SpecificTime(s) => time_of(s),
        })
    };
    SetAttr {
        mode,
        uid,
        gid,
        size,
        atime: at(atime),
        mtime: at(mtime),
        ctime: ctime.map(time_of),
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

impl Filesystem for Mount {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let m = &self.state;
        let stamp = m.fs.stamp();
        let p = m.ino(parent);
        if let Some(r) = m.fs.trusted_lookup(p, name.as_bytes()) {
            let clean = |f: &Found| m.dirty_of(m.handle(f.ino, f.inode.igeneration)).is_none();
            if r.as_ref().map_or(true, clean) {
                return m.found(stamp, reply, parent, name.as_bytes(), r);
            }
        }
        let name = name.as_bytes().to_vec();
        self.spawn(move |m| async move {
            let stamp = m.fs.stamp();
            let r = m.lookup(m.ino(parent), &name).await;
            m.found(stamp, reply, parent, &name, r);
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let m = &self.state;
        let (stamp, i) = (m.fs.stamp(), m.ino(ino));
        if m.dirty_of(i).is_none() {
            if let Some(r) = m.fs.trusted_getattr(i) {
                return m.reply_attr(stamp, reply, i, r);
            }
        }
        self.spawn(move |m| async move {
            let stamp = m.fs.stamp();
            let i = m.ino(ino);
            let r = m.getattr_fresh(i).await;
            m.reply_attr(stamp, reply, i, r);
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = set_attr(mode, uid, gid, size, atime, mtime, ctime);
        let privileged = req.uid() == 0;
        self.spawn(move |m| async move {
            let stamp = m.fs.stamp();
            let i = m.ino(ino);
            let r = async {
                m.flush(i).await?;
                m.fs.setattr(i, &set, privileged).await
            }
            .await;
            m.reply_attr(stamp, reply, i, r);
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(move |m| async move {
            match m.fs.readlink(m.ino(ino)).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mode = if mode & S_IFMT == 0 {
            mode | S_IFREG
        } else {
            mode
        };
        if matches!(mode & S_IFMT, S_IFDIR | S_IFLNK) {
            return reply.error(Errno::EINVAL);
        }
        let new = NewFile {
            mode: mode & !umask,
            rdev,
            target: vec![],
        };
        self.make(req, parent, name, new, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let new = NewFile::of(S_IFDIR | (mode & !umask & 0o7777));
        self.make(req, parent, name, new, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes().to_vec();
        self.spawn(move |m| async move {
            let r = m.fs.unlink(m.ino(parent), &name, &m.is_open()).await;
            empty(reply, r.map(|kept| m.keep_orphan(kept)));
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes().to_vec();
        self.spawn(move |m| async move {
            empty(reply, m.fs.rmdir(m.ino(parent), &name).await);
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let new = NewFile {
            mode: S_IFLNK | 0o777,
            rdev: 0,
            target: target.as_os_str().as_bytes().to_vec(),
        };
        self.make(req, parent, link_name, new, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name.as_bytes().to_vec(), newname.as_bytes().to_vec());
        self.spawn(move |m| async move {
            let (sp, dp) = (m.ino(parent), m.ino(newparent));
            let r =
                m.fs.rename(sp, &name, dp, &newname, flags.bits(), &m.is_open())
                    .await;
            empty(reply, r.map(|kept| m.keep_orphan(kept)));
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let newname = newname.as_bytes().to_vec();
        self.spawn(move |m| async move {
            let stamp = m.fs.stamp();
            let i = m.ino(ino);
            let r = m.fs.link(i, m.ino(newparent), &newname).await;
            m.entry(stamp, reply, r.map(|inode| (i.ino, inode)));
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(move |m| async move {
            let i = m.ino(ino);
            match m.fs.getattr(i).await {
                Ok(inode) if inode.is_dir() => reply.error(Errno::EISDIR),
                Ok(_) => {
                    let fh = m.new_handle(i, flags.0 & libc::O_APPEND != 0);
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(move |m| async move {
            let i = m.ino(ino);
            let r = async {
                m.flush(i).await?;
                m.fs.read(i, offset, size).await
            }
            .await;
            match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (data, uid) = (data.to_vec(), req.uid());
        self.spawn(move |m| async move {
            let len = data.len() as u32;
            match m.write(m.ino(ino), fh.0, offset, data, uid).await {
                Ok(()) => reply.written(len),
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing buffered: answered here, with no hand-off to the runtime (every close).
        let i = self.state.ino(ino);
        if self.state.dirty_of(i).is_none() {
            return reply.ok();
        }
        self.spawn(move |m| async move { empty(reply, m.flush(i).await) });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.state.close_handle(fh.0) {
            None => reply.ok(),
            Some(file) => {
                self.spawn(move |m| async move { empty(reply, m.finish_close(file).await) })
            }
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // A committed minitransaction is durable on its memory nodes (log mode): flushing
        // the buffered writes is all fsync needs.
        self.spawn(move |m| async move { empty(reply, m.flush(m.ino(ino)).await) });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.spawn(move |m| async move {
            match m.opendir(m.ino(ino)).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let h = self.state.handles.lock().expect("handles poisoned");
        let Some(items) = h.dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in items.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        (self.state.handles.lock().expect("handles poisoned"))
            .dirs
            .remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory changes are committed when their operation returns.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |m| async move {
            match m.fs.usage().await {
                Ok(u) => reply.statfs(
                    u.blocks,
                    u.blocks_free,
                    u.blocks_free,
                    u.inodes,
                    u.inodes_free,
                    u.block_bytes,
                    crate::dir::NAME_BYTES_MAX as u32,
                    u.block_bytes,
                ),
                Err(e) => reply.error(err(e)),
            }
        });
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name.as_bytes().to_vec();
        self.spawn(move |m| async move {
            let r = m.fs.getxattr(m.ino(ino), &name).await;
            reply_xattr(reply, size, r);
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.spawn(move |m| async move {
            let r = m.fs.listxattr(m.ino(ino)).await;
            reply_xattr(reply, size, r);
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (name, value) = (name.as_bytes().to_vec(), value.to_vec());
        self.spawn(move |m| async move {
            empty(reply, m.fs.setxattr(m.ino(ino), &name, &value, flags).await);
        });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.as_bytes().to_vec();
        self.spawn(move |m| async move {
            empty(reply, m.fs.removexattr(m.ino(ino), &name).await);
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |m| async move {
            let i = m.ino(ino);
            let r = async {
                m.flush(i).await?;
                m.fs.fallocate(i, offset, length, mode).await
            }
            .await;
            empty(reply, r);
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let new = NewFile::of(S_IFREG | (mode & !umask & 0o7777));
        let (name, who) = (name.as_bytes().to_vec(), caller(req));
        self.spawn(move |m| async move {
            match m.fs.make(m.ino(parent), &name, &new, who).await {
                Ok((ino, i)) => {
                    let fh =
                        m.new_handle(m.handle(ino, i.igeneration), flags & libc::O_APPEND != 0);
                    reply.created(
                        &m.made_entry_ttl(),
                        &m.attr(ino, &i),
                        Generation(i.igeneration),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    );
                }
                Err(e) => reply.error(err(e)),
            }
        });
    }
}

impl Mount {
    /// Creates `name` in `parent` (mknod, mkdir, symlink) and replies its entry.
    fn make(&self, req: &Request, parent: INodeNo, name: &OsStr, new: NewFile, reply: ReplyEntry) {
        let (name, who) = (name.as_bytes().to_vec(), caller(req));
        self.spawn(move |m| async move {
            let stamp = m.fs.stamp();
            let r = m.fs.make(m.ino(parent), &name, &new, who).await;
            m.entry(stamp, reply, r);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(kept: &mut Kept, node: NodeId, addr: u64, len: u32) -> Vec<(u64, Vec<u8>)> {
        let mut out = vec![];
        kept.take_entries(node, addr, len, &mut out);
        out.into_iter().map(|(dir, name, _)| (dir, name)).collect()
    }

    #[test]
    fn a_write_forgets_the_entries_of_the_buckets_it_overlaps_only() {
        let mut kept = Kept::new(Duration::from_secs(60), 100);
        kept.keep_entry(((2, 1000), 7, b"a".to_vec()));
        kept.keep_entry(((2, 1000), 7, b"b".to_vec()));
        kept.keep_entry(((2, 1100), 7, b"c".to_vec()));
        kept.keep_entry(((3, 1000), 7, b"d".to_vec()));
        assert!(
            taken(&mut kept, 2, 900, 100).is_empty(),
            "ends where a bucket starts"
        );
        assert!(
            taken(&mut kept, 2, 1200, 8).is_empty(),
            "after the last bucket"
        );
        assert_eq!(
            taken(&mut kept, 2, 1099, 1),
            vec![(7, b"a".to_vec()), (7, b"b".to_vec())]
        );
        assert!(taken(&mut kept, 2, 1000, 8).is_empty(), "forgotten once");
        assert_eq!(taken(&mut kept, 2, 1050, 100), vec![(7, b"c".to_vec())]);
        assert_eq!(taken(&mut kept, 3, 0, 2000), vec![(7, b"d".to_vec())]);
    }

    #[test]
    fn entries_older_than_two_leases_are_let_go() {
        let mut kept = Kept::new(Duration::from_millis(1), 100);
        kept.keep_entry(((2, 1000), 7, b"a".to_vec()));
        std::thread::sleep(Duration::from_millis(2));
        kept.keep_entry(((2, 1000), 7, b"b".to_vec()));
        std::thread::sleep(Duration::from_millis(2));
        kept.keep_entry(((2, 1000), 7, b"c".to_vec()));
        let names: Vec<_> = taken(&mut kept, 2, 1000, 1)
            .into_iter()
            .map(|e| e.1)
            .collect();
        assert_eq!(names, vec![b"c".to_vec(), b"b".to_vec()]);
    }
}
