//! The memory node's byte address space. `ram` mode maps anonymous memory (pages cost RSS
//! only once written); `log` mode maps the sparse disk image file, so that committed writes
//! land in the page cache and a background flush makes them durable. It also keeps a
//! backup's cut: the space as of one instant, read page by page while writes go on.

use memmap2::{MmapOptions, MmapRaw};
use rustc_hash::FxHashMap;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

pub struct Space {
    map: Arc<MmapRaw>,
    size_bytes: u64,
    /// The pages that may hold a byte other than zero: set by every write, and at open
    /// for the image file's data. A cut reads only these pages: reading the others, holes
    /// of a sparse image, would fill the page cache with zeros (a 1 GiB node took 2.8 s to
    /// back up, 83 % of it the kernel zeroing pages).
    written: Pages,
    /// The pages written since the cut of the last backup that completed (since this
    /// process started, before one did): what an incremental cut holds.
    since_base: Pages,
    cut: Option<Cut>,
}

/// A set of pages, one bit each.
#[derive(Clone)]
struct Pages(Vec<u64>);

impl Pages {
    fn new(size_bytes: u64) -> Pages {
        Pages(vec![
            0;
            size_bytes.div_ceil(PAGE_BYTES).div_ceil(64) as usize
        ])
    }

    /// Adds every page that `[addr, addr + len)` touches.
    fn insert(&mut self, addr: u64, len: u64) {
        for page in addr / PAGE_BYTES..(addr + len).div_ceil(PAGE_BYTES) {
            self.0[(page / 64) as usize] |= 1 << (page % 64);
        }
    }

    /// Whether the page starting at `start` is in the set.
    fn contains(&self, start: u64) -> bool {
        let page = start / PAGE_BYTES;
        self.0[(page / 64) as usize] & (1 << (page % 64)) != 0
    }
}

/// The unit a cut saves and reads.
pub const PAGE_BYTES: u64 = 4096;

/// The space as of a backup's cut, by copy-on-write: the first write since the cut to a page
/// the backup has not read yet saves the page's old bytes first. The backup reads in
/// address order, so a page below `read_upto` is never needed again; saved pages cost
/// memory only for the pages written ahead of the reader.
struct Cut {
    /// An incremental cut's pages (written since the base); a full cut's are all pages.
    only: Option<Pages>,
    /// Pages written since this cut: the next base's `since_base` if the backup completes.
    since_cut: Pages,
    read_upto: u64,
    /// Pages saved, by address; an empty one was zero.
    saved: FxHashMap<u64, Box<[u8]>>,
    saved_bytes: u64,
    saved_bytes_max: u64,
}

/// What a read of the cut found wrong.
#[derive(Debug, PartialEq, Eq)]
pub enum CutReadError {
    NoCut,
    /// Reads go in order: this one must start at `expected`.
    OutOfOrder {
        expected: u64,
    },
    /// The range is not whole pages inside the space.
    BadRange,
}

/// A handle that flushes the image to disk from another thread while the participant runs.
#[derive(Clone)]
pub struct Flusher(Arc<MmapRaw>);

impl Flusher {
    pub fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// The image file at `path`, `size_bytes` long (made, sparse, if new); an image of another
/// size is refused.
pub(crate) fn image_file(path: &Path, size_bytes: u64) -> std::io::Result<std::fs::File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let len = file.metadata()?.len();
    if len != 0 && len != size_bytes {
        return Err(std::io::Error::other(format!(
            "image {} holds {len} bytes but --size is {size_bytes}; a node's size cannot change",
            path.display()
        )));
    }
    file.set_len(size_bytes)?;
    Ok(file)
}

impl Space {
    pub fn anonymous(size_bytes: u64) -> std::io::Result<Space> {
        let map = MmapOptions::new()
            .len(usize::try_from(size_bytes).map_err(std::io::Error::other)?)
            .map_anon()?;
        Ok(Space {
            map: Arc::new(MmapRaw::from(map)),
            size_bytes,
            written: Pages::new(size_bytes),
            since_base: Pages::new(size_bytes),
            cut: None,
        })
    }

    /// Opens (creating if absent) the sparse image file of exactly `size_bytes`.
    pub fn image(path: &Path, size_bytes: u64) -> std::io::Result<Space> {
        let file = image_file(path, size_bytes)?;
        let map = MmapOptions::new()
            .len(usize::try_from(size_bytes).map_err(std::io::Error::other)?)
            .map_raw(&file)?;
        let mut space = Space {
            map: Arc::new(map),
            size_bytes,
            written: Pages::new(size_bytes),
            since_base: Pages::new(size_bytes),
            cut: None,
        };
        for (start, end) in data_extents(&file, size_bytes) {
            space.written.insert(start, end - start);
        }
        Ok(space)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn flusher(&self) -> Flusher {
        Flusher(self.map.clone())
    }

    /// Whether `[addr, addr + len)` lies inside the space.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len)
            .is_some_and(|end| end <= self.size_bytes)
    }

    pub fn read(&self, addr: u64, len: u64) -> &[u8] {
        assert!(self.contains(addr, len), "read outside the space");
        // SAFETY: the range is inside the mapping, which lives as long as `self.map`; only
        // the participant (through `&mut self`) writes, so no write aliases this borrow.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(addr as usize), len as usize) }
    }

    /// `len` bytes from `addr`, the pages never written (holes of a sparse image) given as
    /// the zeros they hold without being touched: reading a hole through the mapping would
    /// fill it, with a page of the page cache on a disk, of RAM on a tmpfs (`ram-repl`).
    pub fn read_written(&self, addr: u64, len: u64) -> Vec<u8> {
        assert!(self.contains(addr, len), "read outside the space");
        let (mut out, end) = (vec![0; len as usize], addr + len);
        let mut page = addr / PAGE_BYTES * PAGE_BYTES;
        while page < end {
            if self.is_written(page) {
                let (from, to) = (page.max(addr), (page + PAGE_BYTES).min(end));
                out[(from - addr) as usize..(to - addr) as usize]
                    .copy_from_slice(self.read(from, to - from));
            }
            page += PAGE_BYTES;
        }
        out
    }

    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        assert!(
            self.contains(addr, bytes.len() as u64),
            "write outside the space"
        );
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len() as u64;
        if let Some(cut) = &mut self.cut {
            cut.since_cut.insert(addr, len);
            self.save_for_cut(addr, len);
        }
        self.written.insert(addr, len);
        self.since_base.insert(addr, len);
        // SAFETY: as in `read`; `&mut self` excludes every other borrow of the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(addr as usize),
                bytes.len(),
            )
        }
    }

    fn is_written(&self, start: u64) -> bool {
        self.written.contains(start)
    }

    /// Keeps the space as it is now for a backup, until `end_cut`; replaces a cut in
    /// progress. An `incremental` cut holds only the pages written since the cut of the
    /// last backup that completed (`end_cut(true)`).
    pub fn begin_cut(&mut self, incremental: bool) {
        let size_bytes = self.size_bytes;
        self.cut = Some(Cut {
            only: incremental.then(|| self.since_base.clone()),
            since_cut: Pages::new(size_bytes),
            read_upto: 0,
            saved: FxHashMap::default(),
            saved_bytes: 0,
            saved_bytes_max: 0,
        });
    }

    /// Whether the cut was read to the end.
    pub fn cut_read_whole(&self) -> bool {
        self.cut
            .as_ref()
            .is_some_and(|c| c.read_upto == self.size_bytes)
    }

    /// Bytes the cut holds saved now, and the most it held at once (0, 0 with no cut).
    pub fn cut_saved_bytes(&self) -> (u64, u64) {
        self.cut
            .as_ref()
            .map_or((0, 0), |c| (c.saved_bytes, c.saved_bytes_max))
    }

    /// Drops the cut; `completed`: it was read whole, and becomes the base of the next
    /// incremental cut. Returns the most bytes it held saved at once (0 if there was none).
    pub fn end_cut(&mut self, completed: bool) -> u64 {
        let Some(cut) = self.cut.take() else {
            return 0;
        };
        if completed {
            self.since_base = cut.since_cut;
        }
        cut.saved_bytes_max
    }

    /// The bytes of the page starting at `start` (the last page may be short).
    fn page(&self, start: u64) -> &[u8] {
        self.read(start, PAGE_BYTES.min(self.size_bytes - start))
    }

    fn save_for_cut(&mut self, addr: u64, len: u64) {
        let first = addr / PAGE_BYTES * PAGE_BYTES;
        let cut = self.cut.as_ref().expect("a cut");
        let mut start = first.max(cut.read_upto.div_ceil(PAGE_BYTES) * PAGE_BYTES);
        while start < addr + len {
            if !self.cut.as_ref().expect("a cut").saved.contains_key(&start) {
                // A page never written is zero: saved as nothing.
                let old: Box<[u8]> = match self.is_written(start) {
                    true => self.page(start).into(),
                    false => Box::new([]),
                };
                let old_len = old.len() as u64;
                let cut = self.cut.as_mut().expect("a cut");
                cut.saved.insert(start, old);
                cut.saved_bytes += old_len;
                cut.saved_bytes_max = cut.saved_bytes_max.max(cut.saved_bytes);
            }
            start += PAGE_BYTES;
        }
    }

    /// Reads `[offset, offset + len)` of the space as of the cut, which must start where
    /// the last read ended and be whole pages (or end at the space's end). Returns the runs
    /// of pages not all zero, as `(offset, bytes)`.
    pub fn read_cut(&mut self, offset: u64, len: u64) -> Result<Vec<(u64, Vec<u8>)>, CutReadError> {
        let size_bytes = self.size_bytes;
        let cut = self.cut.as_ref().ok_or(CutReadError::NoCut)?;
        if offset != cut.read_upto {
            return Err(CutReadError::OutOfOrder {
                expected: cut.read_upto,
            });
        }
        let end = offset.checked_add(len).ok_or(CutReadError::BadRange)?;
        if len == 0 || end > size_bytes || (end % PAGE_BYTES != 0 && end != size_bytes) {
            return Err(CutReadError::BadRange);
        }
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut start = offset;
        let zero = [0u8; PAGE_BYTES as usize];
        while start < end {
            let page_len = PAGE_BYTES.min(size_bytes - start) as usize;
            let wanted = cut.only.as_ref().is_none_or(|only| only.contains(start));
            let bytes = match cut.saved.get(&start) {
                _ if !wanted => &[][..],
                // A page saved as nothing was zero; an incremental cut sends it as zeros.
                Some(saved) if saved.is_empty() && cut.only.is_some() => &zero[..page_len],
                Some(saved) => &saved[..],
                None if !self.is_written(start) && cut.only.is_some() => &zero[..page_len],
                None if !self.is_written(start) => &[],
                None => self.page(start),
            };
            // A full cut leaves out zero pages; an incremental one sends every page it holds.
            if (cut.only.is_some() && !bytes.is_empty()) || bytes.iter().any(|&b| b != 0) {
                match runs.last_mut() {
                    Some((run, run_bytes)) if *run + run_bytes.len() as u64 == start => {
                        run_bytes.extend_from_slice(bytes)
                    }
                    _ => runs.push((start, bytes.to_vec())),
                }
            }
            start += PAGE_BYTES;
        }
        let cut = self.cut.as_mut().expect("a cut");
        cut.saved.retain(|&page, _| page >= end);
        cut.saved_bytes = cut.saved.values().map(|p| p.len() as u64).sum();
        cut.read_upto = end;
        Ok(runs)
    }
}

/// The ranges of `file` (of `size_bytes`) that hold data, by `SEEK_DATA`/`SEEK_HOLE`: the
/// whole file where the file system cannot tell.
fn data_extents(file: &std::fs::File, size_bytes: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let seek = |offset: u64, whence| {
        // SAFETY: lseek on a descriptor `file` owns; it moves only the file offset, which
        // nothing else here uses (the space is read and written through the mapping).
        let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
        u64::try_from(at).ok()
    };
    let mut extents = Vec::new();
    let mut offset = 0;
    while offset < size_bytes {
        let Some(data) = seek(offset, libc::SEEK_DATA) else {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENXIO) {
                return vec![(0, size_bytes)];
            }
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)
            .unwrap_or(size_bytes)
            .min(size_bytes);
        if hole <= data {
            return vec![(0, size_bytes)];
        }
        extents.push((data, hole));
        offset = hole;
    }
    extents
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the cut from `offset` to the end, `chunk` bytes at a time, into `image`.
    fn read_rest(space: &mut Space, image: &mut [u8], mut offset: u64, chunk: u64) {
        while offset < space.size_bytes() {
            let len = chunk.min(space.size_bytes() - offset);
            for (at, bytes) in space.read_cut(offset, len).unwrap() {
                image[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
            }
            offset += len;
        }
    }

    #[test]
    fn a_cut_reads_the_space_as_it_was_whatever_is_written_after() {
        let size = 10 * PAGE_BYTES + 100;
        let mut space = Space::anonymous(size).unwrap();
        let mut expected = vec![0u8; size as usize];
        for (addr, bytes) in [
            (5, &b"before"[..]),
            (7 * PAGE_BYTES - 2, b"straddle"),
            (size - 3, b"end"),
        ] {
            space.write(addr, bytes);
            expected[addr as usize..addr as usize + bytes.len()].copy_from_slice(bytes);
        }

        space.begin_cut(false);
        space.write(5, b"AFTER!");
        space.write(7 * PAGE_BYTES - 4, b"overwritten");
        space.write(9 * PAGE_BYTES, b"new");
        space.write(size - 3, b"END");
        let mut image = vec![0u8; size as usize];
        let first = space.read_cut(0, 3 * PAGE_BYTES).unwrap();
        assert_eq!(first, vec![(0, expected[..PAGE_BYTES as usize].to_vec())]);
        image[..PAGE_BYTES as usize].copy_from_slice(&first[0].1);
        space.write(PAGE_BYTES, b"behind the reader: not saved");
        read_rest(&mut space, &mut image, 3 * PAGE_BYTES, 2 * PAGE_BYTES);
        assert!(image == expected, "the cut's image differs");
        assert_eq!(space.read(5, 6), b"AFTER!", "the space itself moved on");
        assert_eq!(
            space.end_cut(false),
            3 * PAGE_BYTES + 100,
            "pages 0, 6, 7 and the short last one were saved; 9 was zero"
        );
    }

    #[test]
    fn an_image_reopened_knows_which_pages_hold_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let size = 64 * PAGE_BYTES;
        let mut space = Space::image(&path, size).unwrap();
        space.write(40 * PAGE_BYTES + 5, b"kept");
        space.flusher().flush().unwrap();
        drop(space);
        let mut space = Space::image(&path, size).unwrap();
        assert!(space.is_written(40 * PAGE_BYTES));
        assert!(!space.is_written(0), "a hole");
        space.begin_cut(false);
        let mut image = vec![0u8; size as usize];
        read_rest(&mut space, &mut image, 0, 16 * PAGE_BYTES);
        assert_eq!(&image[40 * 4096 + 5..40 * 4096 + 9], b"kept");
    }

    /// Reading the written pages gives the space's bytes and leaves the holes of the image
    /// file holes (on a tmpfs, where reading one through the mapping would fill it).
    #[test]
    fn reading_the_written_pages_leaves_the_holes_unfilled() {
        use std::os::unix::fs::MetadataExt;
        let shm = std::path::Path::new("/dev/shm");
        let dir = match shm.is_dir() {
            true => tempfile::tempdir_in(shm).unwrap(),
            false => tempfile::tempdir().unwrap(),
        };
        let path = dir.path().join("image");
        let size = 256 * PAGE_BYTES;
        let mut space = Space::image(&path, size).unwrap();
        space.write(3 * PAGE_BYTES - 2, b"across");
        space.write(200 * PAGE_BYTES, b"far");
        let read = space.read_written(PAGE_BYTES + 7, 250 * PAGE_BYTES);
        let allocated = std::fs::metadata(&path).unwrap().blocks() * 512;
        assert!(allocated <= 8 * PAGE_BYTES, "{allocated} bytes allocated");
        // Now through the mapping, which fills the holes.
        assert_eq!(&read[..], space.read(PAGE_BYTES + 7, 250 * PAGE_BYTES));
    }

    /// The pages an incremental cut of `space` holds, each with its first byte.
    fn incremental(space: &mut Space) -> Vec<(u64, usize, u8)> {
        space.begin_cut(true);
        let runs = space.read_cut(0, space.size_bytes()).unwrap();
        (runs.iter())
            .flat_map(|(at, bytes)| {
                (bytes.chunks(PAGE_BYTES as usize).enumerate())
                    .map(move |(i, page)| (at / PAGE_BYTES + i as u64, page.len(), page[0]))
            })
            .collect()
    }

    #[test]
    fn an_incremental_cut_holds_the_pages_written_since_the_last_completed_one() {
        let mut space = Space::anonymous(8 * PAGE_BYTES).unwrap();
        space.write(0, b"one");
        space.write(3 * PAGE_BYTES, b"three");
        space.begin_cut(false);
        space.write(5 * PAGE_BYTES, b"five");
        assert_eq!(space.read_cut(0, 8 * PAGE_BYTES).unwrap().len(), 2);
        space.end_cut(true);
        space.write(3 * PAGE_BYTES, &[0; 5]);
        let page = PAGE_BYTES as usize;
        assert_eq!(
            incremental(&mut space),
            vec![(3, page, 0), (5, page, b'f')],
            "written since the completed cut, zeroed ones too"
        );
        space.end_cut(false);
        space.write(7 * PAGE_BYTES, b"seven");
        assert_eq!(
            incremental(&mut space),
            vec![(3, page, 0), (5, page, b'f'), (7, page, b's')],
            "a cut that did not complete is no base"
        );
        space.end_cut(true);
        assert_eq!(incremental(&mut space), vec![]);
    }

    #[test]
    fn cut_reads_go_in_order_over_whole_pages() {
        let mut space = Space::anonymous(4 * PAGE_BYTES).unwrap();
        assert_eq!(space.read_cut(0, PAGE_BYTES), Err(CutReadError::NoCut));
        space.begin_cut(false);
        assert_eq!(space.read_cut(0, 100), Err(CutReadError::BadRange));
        assert_eq!(
            space.read_cut(PAGE_BYTES, PAGE_BYTES),
            Err(CutReadError::OutOfOrder { expected: 0 })
        );
        assert_eq!(
            space.read_cut(0, 5 * PAGE_BYTES),
            Err(CutReadError::BadRange)
        );
        assert_eq!(space.read_cut(0, 4 * PAGE_BYTES), Ok(vec![]), "all zero");
        assert_eq!(space.end_cut(false), 0);
    }
}
