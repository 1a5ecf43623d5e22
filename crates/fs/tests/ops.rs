//! The operations against a volume in memory (one process, no cluster): each plan's
//! minitransaction applied by a small executor with the memory nodes' semantics.

use std::collections::HashMap;
use tutti_client::Minitx;
use tutti_fs::inode::{Inode, Time, S_IFDIR, S_IFREG};
use tutti_fs::layout::{Geometry, Ino, Volume, INODE_BYTES};
use tutti_fs::ops::{self, Caller, Made, NewFile};
use tutti_fs::txn::{Cache, OpResult, Plan, Txn};
use tutti_wire::{CmpOp, Item, NodeId};

const NOW: Time = Time {
    s: 1_700_000_000,
    ns: 0,
};
const ROOT: Caller = Caller { uid: 0, gid: 0 };

struct Memory {
    vol: Volume,
    images: HashMap<NodeId, Vec<u8>>,
    cache: Cache,
}

impl Memory {
    fn new() -> Memory {
        let g = Geometry::new(1 << 20, 4096, 2048).unwrap();
        let vol = Volume {
            geometry: g,
            nodes: vec![(1, 0), (2, 0)],
        };
        let images = vol
            .nodes
            .iter()
            .map(|(n, _)| (*n, vec![0u8; 1 << 20]))
            .collect();
        let mut m = Memory {
            vol,
            images,
            cache: Cache::default(),
        };
        let zero = Inode::decode(&[0u8; INODE_BYTES as usize]);
        let tx = tutti_fs::volume::format_minitx(&m.vol, &zero, 1, NOW);
        assert!(m.exec(&tx).0);
        m
    }

    /// Applies `tx` as a memory node would: (committed, reads, failed compares).
    fn exec(&mut self, tx: &Minitx) -> (bool, Vec<Vec<u8>>, Vec<usize>) {
        let mut reads = vec![];
        let mut failed = vec![];
        for (i, (node, item)) in tx.items().iter().enumerate() {
            let img = &self.images[node];
            match item {
                Item::Read { addr, len } => {
                    reads.push(img[*addr as usize..(*addr + *len as u64) as usize].to_vec())
                }
                Item::Compare { addr, op, bytes } => {
                    assert_eq!(*op, CmpOp::Eq);
                    if img[*addr as usize..*addr as usize + bytes.len()] != bytes[..] {
                        failed.push(i);
                    }
                }
                _ => {}
            }
        }
        if !failed.is_empty() {
            return (false, reads, failed);
        }
        for (node, item) in tx.items() {
            let img = self.images.get_mut(node).unwrap();
            match item {
                Item::Write { addr, bytes } => {
                    img[*addr as usize..*addr as usize + bytes.len()].copy_from_slice(bytes)
                }
                Item::Add { addr, delta } => {
                    let at = *addr as usize;
                    let v = u64::from_le_bytes(img[at..at + 8].try_into().unwrap())
                        .wrapping_add(*delta as u64);
                    img[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                _ => {}
            }
        }
        (true, reads, vec![])
    }

    fn run<T>(&mut self, op: impl Fn(&mut Txn<'_>) -> OpResult<T>) -> Result<T, i32> {
        loop {
            let plan = {
                let mut tx = Txn::new(&self.vol, &self.cache, 7);
                let a = op(&mut tx);
                tx.finish(a)
            };
            match plan {
                Plan::Done(r) => return r,
                Plan::Fetch(fetches) => {
                    let tx = fetches
                        .iter()
                        .fold(Minitx::new(), |t, f| t.read(f.node, f.addr, f.len));
                    let (_, reads, _) = self.exec(&tx);
                    for (f, b) in fetches.iter().zip(reads) {
                        self.cache.fill(f, b);
                    }
                }
                Plan::Run {
                    tx,
                    result,
                    effects,
                    compared,
                } => {
                    let (ok, _, failed) = self.exec(&tx);
                    self.cache.settle(ok, &failed, &compared, *effects);
                    if ok {
                        return result;
                    }
                }
            }
        }
    }

    fn mkdir(&mut self, parent: Ino, name: &str) -> Result<Ino, i32> {
        let new = NewFile::of(S_IFDIR | 0o755);
        loop {
            if let Made::Done((i, _)) =
                self.run(|tx| ops::make(tx, parent, name.as_bytes(), &new, ROOT, 1, NOW))?
            {
                return Ok(i);
            }
        }
    }

    fn create(&mut self, parent: Ino, name: &str) -> Result<Ino, i32> {
        let new = NewFile::of(S_IFREG | 0o644);
        loop {
            if let Made::Done((i, _)) =
                self.run(|tx| ops::make(tx, parent, name.as_bytes(), &new, ROOT, 2, NOW))?
            {
                return Ok(i);
            }
        }
    }

    fn rename(&mut self, sp: Ino, s: &str, dp: Ino, d: &str, flags: u32) -> Result<(), i32> {
        let never = |_: Ino, _: u64| false;
        loop {
            if let Made::Done(_) = self
                .run(|tx| ops::rename(tx, sp, s.as_bytes(), dp, d.as_bytes(), flags, &never, NOW))?
            {
                return Ok(());
            }
        }
    }

    fn lookup(&mut self, parent: Ino, name: &str) -> Result<Ino, i32> {
        self.run(|tx| ops::lookup(tx, parent, name.as_bytes()))
            .map(|(i, _)| i)
    }

    fn fsck(&self) -> Vec<tutti_fs::fsck::Problem> {
        let read = |n: NodeId, a: u64, l: u32| {
            self.images[&n][a as usize..a as usize + l as usize].to_vec()
        };
        tutti_fs::fsck::check_image(&self.vol, &read).problems
    }
}

#[test]
fn a_directory_renamed_into_another_is_found_there() {
    let mut m = Memory::new();
    let root = m.vol.root();
    let own = m.mkdir(root, "own").unwrap();
    let shared = m.mkdir(root, "shared").unwrap();
    let s0 = m.mkdir(shared, "s0").unwrap();
    m.rename(shared, "s0", own, "s2", 0).unwrap();
    assert_eq!(m.lookup(own, "s2"), Ok(s0));
    assert_eq!(m.lookup(shared, "s0"), Err(libc::ENOENT));
    m.rename(own, "s2", shared, "s2", 0).unwrap();
    assert_eq!(m.lookup(shared, "s2"), Ok(s0));
    assert!(m.fsck().is_empty(), "{:?}", m.fsck());
}

#[test]
fn many_names_split_buckets_and_stay_found() {
    let mut m = Memory::new();
    let root = m.vol.root();
    let d = m.mkdir(root, "d").unwrap();
    let names: Vec<String> = (0..300)
        .map(|i| format!("file-{i}-{}", "y".repeat(40)))
        .collect();
    let inos: Vec<Ino> = names.iter().map(|n| m.create(d, n).unwrap()).collect();
    for (n, i) in names.iter().zip(&inos) {
        assert_eq!(m.lookup(d, n), Ok(*i), "{n}");
    }
    for n in names.iter().step_by(2) {
        m.rename(d, n, root, n, 0).unwrap();
    }
    for (k, n) in names.iter().enumerate() {
        let (here, there) = if k % 2 == 0 { (root, d) } else { (d, root) };
        assert_eq!(m.lookup(here, n), Ok(inos[k]));
        assert_eq!(m.lookup(there, n), Err(libc::ENOENT));
    }
    assert!(m.fsck().is_empty(), "{:?}", m.fsck());
}

#[test]
fn extended_attributes_are_validated_against_another_mount_and_freed_with_their_file() {
    use tutti_fs::xattr;
    let mut m = Memory::new();
    let root = m.vol.root();
    let f = m.create(root, "f").unwrap();
    m.run(|tx| xattr::set(tx, f, b"user.a", b"1", 0, NOW))
        .unwrap();
    assert_eq!(m.run(|tx| xattr::get(tx, f, b"user.a")), Ok(b"1".to_vec()));
    // Another mount removes the attribute (freeing the block) and sets another, which
    // takes a block again: this mount's cached copy must not answer.
    let mine = std::mem::take(&mut m.cache);
    m.run(|tx| xattr::remove(tx, f, b"user.a", NOW)).unwrap();
    m.run(|tx| xattr::set(tx, f, b"user.b", b"2", xattr::XATTR_CREATE, NOW))
        .unwrap();
    m.cache = mine;
    assert_eq!(m.run(|tx| xattr::get(tx, f, b"user.a")), Err(libc::ENODATA));
    assert_eq!(m.run(|tx| xattr::get(tx, f, b"user.b")), Ok(b"2".to_vec()));
    assert_eq!(m.run(|tx| xattr::list(tx, f)), Ok(b"user.b\0".to_vec()));
    assert_eq!(
        m.run(|tx| xattr::set(tx, f, b"user.b", b"3", xattr::XATTR_CREATE, NOW)),
        Err(libc::EEXIST)
    );
    let big = vec![7u8; 5000];
    assert_eq!(
        m.run(|tx| xattr::set(tx, f, b"user.big", &big, 0, NOW)),
        Err(libc::ENOSPC)
    );
    let d = m.mkdir(root, "d").unwrap();
    m.run(|tx| xattr::set(tx, d, b"user.d", b"", 0, NOW))
        .unwrap();
    assert!(m.fsck().is_empty(), "{:?}", m.fsck());
    let never = |_: Ino, _: u64| false;
    m.run(|tx| ops::unlink(tx, root, b"f", &never, NOW))
        .unwrap();
    m.run(|tx| ops::rmdir(tx, root, b"d", NOW)).unwrap();
    assert!(m.fsck().is_empty(), "{:?}", m.fsck());
}

/// A mount that read a file's inode and then fetches its pointer block after another mount
/// truncated the file and gave the block to other data must not act on that data as
/// pointers (it panicked on a block reference outside the volume, seen by `tutti chaos
/// --workload fs`): it reads the inode again and unlinks the file as it now is.
#[test]
fn a_pointer_block_reused_behind_a_stale_inode_is_read_again() {
    use tutti_fs::ops::SetAttr;
    let mut m = Memory::new();
    let root = m.vol.root();
    let f = m.create(root, "f").unwrap();
    let three_blocks = vec![(0u64, vec![1u8; 3 * 4096])];
    m.run(|tx| ops::write(tx, f, &three_blocks, false, true, NOW))
        .unwrap();
    // This mount knows f's inode, not its pointer block.
    let mut mine = Cache::default();
    std::mem::swap(&mut m.cache, &mut mine);
    m.run(|tx| ops::inode(tx, f)).unwrap();
    std::mem::swap(&mut m.cache, &mut mine);
    // Another mount truncates f and fills the volume's free blocks with 0xff data.
    let empty = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    while !m
        .run(|tx| ops::setattr(tx, f, &empty, true, NOW))
        .unwrap()
        .1
    {}
    // One block each: every block the volume had free, f's pointer block among them,
    // now holds 0xff data.
    let one_block = vec![(0u64, vec![0xffu8; 4096])];
    for k in 0.. {
        let g = m.create(root, &format!("g{k}")).unwrap();
        if m.run(|tx| ops::write(tx, g, &one_block, false, true, NOW)) == Err(libc::ENOSPC) {
            break;
        }
    }
    std::mem::swap(&mut m.cache, &mut mine);
    let never = |_: Ino, _: u64| false;
    m.run(|tx| ops::unlink(tx, root, b"f", &never, NOW))
        .unwrap();
    assert!(m.fsck().is_empty(), "{:?}", m.fsck());
}

/// The kernel names a file by its slot and generation bits: after another mount frees the
/// file and its slot goes to a new one, a request on the old name answers ESTALE instead
/// of acting on the new file (`tutti chaos --workload fs` saw reads return another file's
/// data before).
#[test]
fn a_handle_to_a_freed_and_reused_slot_is_stale() {
    let mut m = Memory::new();
    let root = m.vol.root();
    let f = m.create(root, "f").unwrap();
    let old = m.run(|tx| ops::inode(tx, f)).unwrap();
    let handle = m.vol.handle(f, old.igeneration);
    let never = |_: Ino, _: u64| false;
    m.run(|tx| ops::unlink(tx, root, b"f", &never, NOW))
        .unwrap();
    let g = (0..64)
        .map(|k| m.create(root, &format!("g{k}")).unwrap())
        .find(|g| *g == f)
        .expect("the slot is given to a new file");
    let (ino, generation) = m.vol.from_handle(handle);
    assert_eq!(ino, g);
    let read_as = |m: &mut Memory, generation: u64| {
        m.run(|tx| {
            tx.expect_generation(ino, generation);
            ops::read(tx, ino, 0, 10).map(drop)
        })
    };
    assert_eq!(read_as(&mut m, generation), Err(libc::ESTALE));
    let new = m.run(|tx| ops::inode(tx, g)).unwrap();
    let (_, current) = m.vol.from_handle(m.vol.handle(g, new.igeneration));
    assert_eq!(read_as(&mut m, current), Ok(()));
}
