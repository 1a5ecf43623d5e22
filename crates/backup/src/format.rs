//! A backup on disk (docs/backup.md): `manifest.json`, written last, and one file per memory
//! node, `node-ID.image`, that holds the runs of the node's image that are not all zero, each
//! with its CRC. The manifest records each file's length and CRC, so that a file cut short
//! or changed is found without trusting anything inside it.

use crate::Error;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use tutti_wire::{NodeId, RegionInfo};

pub const MANIFEST: &str = "manifest.json";
/// The manifest's version (2: incremental backups); a reader takes 1 and 2.
pub const FORMAT: u32 = 2;
const FORMAT_OLDEST: u32 = 1;
/// The image files' version.
const IMAGE_FORMAT: u32 = 1;
/// The longest chain of incremental backups a restore follows.
pub const CHAIN_MAX: usize = 1000;
const MAGIC: &[u8; 8] = b"TUTTIBKP";
/// magic, format u32, node id u32, image bytes u64, backup id u64.
const HEADER_BYTES: usize = 32;
/// offset u64, length u32, CRC-32C of the bytes u32.
const RUN_HEADER_BYTES: usize = 16;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Manifest {
    pub format: u32,
    /// The backup's id, in hex: what the nodes knew it by.
    pub backup: String,
    pub created_unix_ms: u64,
    pub tutti_version: String,
    pub nodes: Vec<NodeImage>,
    /// The manager's regions, read just after the cut.
    pub regions: Vec<RegionInfo>,
    /// From the first node fenced to the last cut taken: how long some node refused new
    /// locks.
    pub fenced_ms: u64,
    /// From the cut to the last byte stored.
    pub copy_ms: u64,
    /// The backup an incremental one starts from (absent: a full backup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Base>,
}

/// Where an incremental backup's base is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Base {
    /// Its id, as its manifest names it.
    pub backup: String,
    /// Its directory, absolute.
    pub path: std::path::PathBuf,
}

impl Manifest {
    /// The id the nodes knew this backup by.
    pub fn id(&self) -> Option<u64> {
        u64::from_str_radix(self.backup.trim_start_matches("0x"), 16).ok()
    }
}

/// One memory node's image in a backup.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NodeImage {
    pub id: NodeId,
    pub size_bytes: u64,
    /// Its file, relative to the backup's directory.
    pub file: String,
    pub file_bytes: u64,
    /// CRC-32C of the whole file.
    pub crc32c: u32,
    /// Bytes of the image that the file holds (the rest is zero, or for an incremental
    /// image as in the base).
    pub data_bytes: u64,
    pub runs: u64,
    /// The file holds only the pages written since the base's cut, zero or not.
    #[serde(default)]
    pub incremental: bool,
}

pub fn image_file_name(id: NodeId) -> String {
    format!("node-{id}.image")
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Writes one node's image file, run by run, in address order.
pub struct ImageWriter {
    out: BufWriter<File>,
    path: std::path::PathBuf,
    image: NodeImage,
    /// Runs must start at or after this.
    next_offset: u64,
}

impl ImageWriter {
    pub fn create(
        dir: &Path,
        id: NodeId,
        size_bytes: u64,
        backup: u64,
        incremental: bool,
    ) -> Result<Self, Error> {
        let file = image_file_name(id);
        let path = dir.join(&file);
        let out = File::create_new(&path).map_err(io(format!("create {}", path.display())))?;
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&IMAGE_FORMAT.to_le_bytes());
        header.extend_from_slice(&u32::from(id).to_le_bytes());
        header.extend_from_slice(&size_bytes.to_le_bytes());
        header.extend_from_slice(&backup.to_le_bytes());
        let mut w = ImageWriter {
            out: BufWriter::with_capacity(1 << 20, out),
            path,
            image: NodeImage {
                id,
                size_bytes,
                file,
                file_bytes: 0,
                crc32c: 0,
                data_bytes: 0,
                runs: 0,
                incremental,
            },
            next_offset: 0,
        };
        w.write(&header)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.out
            .write_all(bytes)
            .map_err(io(format!("write {}", self.path.display())))?;
        self.image.crc32c = crc32c::crc32c_append(self.image.crc32c, bytes);
        self.image.file_bytes += bytes.len() as u64;
        Ok(())
    }

    pub fn append(&mut self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        let end = offset + bytes.len() as u64;
        if offset < self.next_offset
            || end > self.image.size_bytes
            || bytes.len() > u32::MAX as usize
        {
            return Err(Error::Cluster(format!(
                "node {} sent [{offset}, {end}) out of order or outside its {} bytes",
                self.image.id, self.image.size_bytes
            )));
        }
        let mut header = [0u8; RUN_HEADER_BYTES];
        header[..8].copy_from_slice(&offset.to_le_bytes());
        header[8..12].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        header[12..].copy_from_slice(&crc32c::crc32c(bytes).to_le_bytes());
        self.write(&header)?;
        self.write(bytes)?;
        self.next_offset = end;
        self.image.data_bytes += bytes.len() as u64;
        self.image.runs += 1;
        Ok(())
    }

    /// Flushes and syncs the file; returns what the manifest records of it.
    pub fn finish(self) -> Result<NodeImage, Error> {
        let what = format!("sync {}", self.path.display());
        let file = self.out.into_inner().map_err(|e| Error::Io {
            what: what.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io(what))?;
        Ok(self.image)
    }
}

fn damaged(path: &Path, reason: impl Into<String>) -> Error {
    Error::Damaged {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads back the image file `expected` describes in `dir`, checking its length, its CRC,
/// its header and every run's CRC and place, and hands each run to `each_run`.
pub fn read_image(
    dir: &Path,
    expected: &NodeImage,
    mut each_run: impl FnMut(u64, &[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let path = dir.join(&expected.file);
    let file = File::open(&path).map_err(io(format!("open {}", path.display())))?;
    let len = file.metadata().map_err(io("stat the image file"))?.len();
    if len != expected.file_bytes {
        let reason = format!("{len} bytes, the manifest says {}", expected.file_bytes);
        return Err(damaged(&path, reason));
    }
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut crc = 0;
    let mut read = |buf: &mut [u8]| -> Result<(), Error> {
        input
            .read_exact(buf)
            .map_err(io(format!("read {}", path.display())))?;
        crc = crc32c::crc32c_append(crc, buf);
        Ok(())
    };
    let mut header = [0u8; HEADER_BYTES];
    read(&mut header)?;
    let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4"));
    let size = u64::from_le_bytes(header[16..24].try_into().expect("8"));
    if &header[..8] != MAGIC || word(8) != IMAGE_FORMAT {
        return Err(damaged(
            &path,
            format!("not a format-{IMAGE_FORMAT} image file"),
        ));
    }
    if word(12) != u32::from(expected.id) || size != expected.size_bytes {
        let reason = format!("holds node {} of {size} bytes", word(12));
        return Err(damaged(&path, reason));
    }
    let (mut at, mut next_offset, mut data_bytes, mut runs) = (HEADER_BYTES as u64, 0, 0, 0);
    let mut bytes = Vec::new();
    while at < len {
        let mut run = [0u8; RUN_HEADER_BYTES];
        read(&mut run)?;
        let offset = u64::from_le_bytes(run[..8].try_into().expect("8"));
        let run_len = u32::from_le_bytes(run[8..12].try_into().expect("4")) as u64;
        let run_crc = u32::from_le_bytes(run[12..].try_into().expect("4"));
        at += RUN_HEADER_BYTES as u64 + run_len;
        if offset < next_offset || offset + run_len > size || at > len {
            return Err(damaged(&path, format!("run at {offset} out of place")));
        }
        bytes.resize(run_len as usize, 0);
        read(&mut bytes)?;
        if crc32c::crc32c(&bytes) != run_crc {
            return Err(damaged(&path, format!("run at {offset}: CRC mismatch")));
        }
        each_run(offset, &bytes)?;
        (next_offset, data_bytes, runs) = (offset + run_len, data_bytes + run_len, runs + 1);
    }
    if crc != expected.crc32c || data_bytes != expected.data_bytes || runs != expected.runs {
        return Err(damaged(&path, "differs from what the manifest records"));
    }
    Ok(())
}

/// Writes `manifest` into `dir` atomically (a temporary file, synced, renamed, the
/// directory synced): a backup without it is incomplete.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), Error> {
    let tmp = dir.join("manifest.json.tmp");
    let bytes = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
    std::fs::write(&tmp, bytes).map_err(io("write the manifest"))?;
    File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io("sync the manifest"))?;
    std::fs::rename(&tmp, dir.join(MANIFEST)).map_err(io("rename the manifest"))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync the backup directory"))
}

pub fn read_manifest(dir: &Path) -> Result<Manifest, Error> {
    let path = dir.join(MANIFEST);
    let bytes = std::fs::read(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => damaged(
            &path,
            "missing: not a backup, or one that did not finish (`tutti backup create` writes it last)",
        ),
        _ => Error::Io {
            what: format!("read {}", path.display()),
            source,
        },
    })?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| damaged(&path, e.to_string()))?;
    if !(FORMAT_OLDEST..=FORMAT).contains(&manifest.format) {
        let reason = format!(
            "format {}; this build reads formats {FORMAT_OLDEST} to {FORMAT}",
            manifest.format
        );
        return Err(damaged(&path, reason));
    }
    Ok(manifest)
}

/// Checks a whole backup: the manifest, every image file against it, and that every
/// region lies inside the nodes it names. Returns the manifest.
pub fn verify(dir: &Path) -> Result<Manifest, Error> {
    let manifest = read_manifest(dir)?;
    let path = dir.join(MANIFEST);
    for r in &manifest.regions {
        for &(node, base) in &r.nodes {
            let inside = (manifest.nodes.iter())
                .any(|n| n.id == node && base.saturating_add(r.bytes_per_node) <= n.size_bytes);
            if !inside {
                let reason = format!("region {} lies outside node {node}", r.name);
                return Err(damaged(&path, reason));
            }
        }
    }
    for node in &manifest.nodes {
        read_image(dir, node, |_, _| Ok(()))?;
    }
    let chain = chain(dir, &manifest)?;
    for node in manifest.nodes.iter().filter(|n| n.incremental) {
        let full = (chain.iter().skip(1))
            .filter_map(|(_, m)| m.nodes.iter().find(|b| b.id == node.id))
            .find(|b| !b.incremental);
        if full.is_none() {
            let reason = format!(
                "node {} is incremental, and no base holds it whole",
                node.id
            );
            return Err(damaged(&path, reason));
        }
    }
    for (base_dir, base) in chain.iter().skip(1) {
        for node in &base.nodes {
            read_image(base_dir, node, |_, _| Ok(()))?;
        }
    }
    Ok(manifest)
}

/// `manifest` (in `dir`) and the bases it starts from, newest first: each base's manifest
/// must carry the id its successor names and images of the same sizes.
pub fn chain(
    dir: &Path,
    manifest: &Manifest,
) -> Result<Vec<(std::path::PathBuf, Manifest)>, Error> {
    let mut chain = vec![(dir.to_path_buf(), manifest.clone())];
    while let Some(base) = chain.last().expect("one").1.base.clone() {
        if chain.len() > CHAIN_MAX {
            let reason = format!("more than {CHAIN_MAX} incremental backups in a row");
            return Err(damaged(&dir.join(MANIFEST), reason));
        }
        let older = read_manifest(&base.path)?;
        if older.backup != base.backup {
            let reason = format!(
                "its base {} holds backup {}, not {}",
                base.path.display(),
                older.backup,
                base.backup
            );
            return Err(damaged(&dir.join(MANIFEST), reason));
        }
        let newer = &chain.last().expect("one").1;
        for n in &newer.nodes {
            if let Some(o) = older.nodes.iter().find(|o| o.id == n.id) {
                if o.size_bytes != n.size_bytes {
                    let reason = format!("node {} changed size from its base", n.id);
                    return Err(damaged(&dir.join(MANIFEST), reason));
                }
            }
        }
        chain.push((base.path, older));
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_of(images: Vec<NodeImage>) -> Manifest {
        Manifest {
            format: FORMAT,
            backup: "0x1".into(),
            created_unix_ms: 0,
            tutti_version: "test".into(),
            nodes: images,
            regions: vec![],
            fenced_ms: 0,
            copy_ms: 0,
            base: None,
        }
    }

    #[test]
    fn an_image_file_reads_back_and_any_change_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ImageWriter::create(dir.path(), 3, 1 << 20, 1, false).unwrap();
        w.append(0, &[1; 4096]).unwrap();
        w.append(65_536, &[2; 8192]).unwrap();
        assert!(w.append(4096, &[3; 10]).is_err(), "out of order");
        let image = w.finish().unwrap();
        assert_eq!((image.runs, image.data_bytes), (2, 12_288));
        write_manifest(dir.path(), &manifest_of(vec![image.clone()])).unwrap();
        let mut runs = Vec::new();
        read_image(dir.path(), &image, |offset, bytes| {
            runs.push((offset, bytes.len(), bytes[0]));
            Ok(())
        })
        .unwrap();
        assert_eq!(runs, vec![(0, 4096, 1), (65_536, 8192, 2)]);
        assert_eq!(verify(dir.path()).unwrap().nodes, vec![image.clone()]);

        let path = dir.path().join(&image.file);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + RUN_HEADER_BYTES + 100] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = verify(dir.path()).unwrap_err().to_string();
        assert!(err.contains("run at 0: CRC mismatch"), "{err}");
        bytes.truncate(bytes.len() - 1);
        std::fs::write(&path, &bytes).unwrap();
        let err = verify(dir.path()).unwrap_err().to_string();
        assert!(err.contains("the manifest says"), "{err}");
    }

    #[test]
    fn an_incremental_backup_needs_its_base_whole() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let image = |dir: &Path, incremental| {
            let mut w = ImageWriter::create(dir, 1, 1 << 20, 1, incremental).unwrap();
            w.append(0, &[1; 4096]).unwrap();
            w.finish().unwrap()
        };
        write_manifest(a.path(), &manifest_of(vec![image(a.path(), false)])).unwrap();
        let mut incremental = manifest_of(vec![image(b.path(), true)]);
        incremental.backup = "0x2".into();
        incremental.base = Some(Base {
            backup: "0x1".into(),
            path: a.path().to_path_buf(),
        });
        write_manifest(b.path(), &incremental).unwrap();
        assert_eq!(verify(b.path()).unwrap().id(), Some(2));
        assert_eq!(chain(b.path(), &incremental).unwrap().len(), 2);

        incremental.base.as_mut().unwrap().backup = "0x7".into();
        write_manifest(b.path(), &incremental).unwrap();
        let err = verify(b.path()).unwrap_err().to_string();
        assert!(err.contains("holds backup 0x1, not 0x7"), "{err}");
        incremental.base = None;
        write_manifest(b.path(), &incremental).unwrap();
        let err = verify(b.path()).unwrap_err().to_string();
        assert!(err.contains("no base holds it whole"), "{err}");
    }

    #[test]
    fn a_directory_without_a_manifest_is_not_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let err = verify(dir.path()).unwrap_err().to_string();
        assert!(err.contains("did not finish"), "{err}");
    }
}
