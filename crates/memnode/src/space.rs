//! The memory node's byte address space. `ram` mode maps anonymous memory (pages cost RSS
//! only once written); `log` mode maps the sparse disk image file, so that committed writes
//! land in the page cache and a background flush makes them durable.

use memmap2::{MmapOptions, MmapRaw};
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Arc;

pub struct Space {
    map: Arc<MmapRaw>,
    size_bytes: u64,
}

/// A handle that flushes the image to disk from another thread while the participant runs.
#[derive(Clone)]
pub struct Flusher(Arc<MmapRaw>);

impl Flusher {
    pub fn flush(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Space {
    pub fn anonymous(size_bytes: u64) -> std::io::Result<Space> {
        let map = MmapOptions::new()
            .len(usize::try_from(size_bytes).map_err(std::io::Error::other)?)
            .map_anon()?;
        Ok(Space {
            map: Arc::new(MmapRaw::from(map)),
            size_bytes,
        })
    }

    /// Opens (creating if absent) the sparse image file of exactly `size_bytes`.
    pub fn image(path: &Path, size_bytes: u64) -> std::io::Result<Space> {
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
        let map = MmapOptions::new()
            .len(usize::try_from(size_bytes).map_err(std::io::Error::other)?)
            .map_raw(&file)?;
        Ok(Space {
            map: Arc::new(map),
            size_bytes,
        })
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

    pub fn write(&mut self, addr: u64, bytes: &[u8]) {
        assert!(
            self.contains(addr, bytes.len() as u64),
            "write outside the space"
        );
        // SAFETY: as in `read`; `&mut self` excludes every other borrow of the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(addr as usize),
                bytes.len(),
            )
        }
    }
}
