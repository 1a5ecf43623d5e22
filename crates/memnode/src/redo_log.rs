//! The redo log on disk: segment files of CRC-framed records, appended by one writer thread
//! with group commit, scanned at restart (torn tails cut), and truncated only at the head by
//! the garbage-collection rule. Record layout and recovery are described in docs/storage.md.

use bincode::{Decode, Encode};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use tutti_wire::{NodeId, Tid};

/// Log sequence number: records are numbered 1, 2, 3, … with no gaps.
pub type Lsn = u64;

/// Default size at which a new segment starts; GC deletes whole segments.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Record header: payload length (u32 LE) and CRC32C of the payload (u32 LE).
const HEADER_BYTES: usize = 8;
/// A record's payload never exceeds this: a 16 MiB minitransaction plus headers.
const RECORD_BYTES_MAX: usize = 17 * 1024 * 1024;

#[derive(Encode, Decode, Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// A COMMIT-OK vote with the writes to apply if the minitransaction commits (Fig. 4 l. 24).
    Prepare {
        tid: Tid,
        participants: Vec<NodeId>,
        writes: Vec<(u64, Vec<u8>)>,
    },
    /// The outcome of a prepared tid; written lazily (Fig. 5 "decided").
    Decided { tid: Tid, commit: bool },
    /// The tid must abort if its coordinator ever asks (Fig. 7); synced before replying.
    ForcedAbort { tid: Tid },
}

impl LogRecord {
    /// Whether a reply may depend on this record, so it must be synced first.
    pub fn needs_sync(&self) -> bool {
        !matches!(self, LogRecord::Decided { .. })
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("redo log I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("redo log segment {path} is corrupt at byte {offset} and is not the last segment; restore the node from a backup")]
    Corrupt { path: PathBuf, offset: u64 },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<RECORD_BYTES_MAX>()
}

pub fn encode_record(lsn: Lsn, record: &LogRecord, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    bincode::encode_into_std_write((lsn, record), out, config())
        .expect("encoding into memory cannot fail");
    let payload_len = out.len() - start - HEADER_BYTES;
    let crc = crc32c::crc32c(&out[start + HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the record at the start of `bytes`: `Some((lsn, record, bytes used))`, or `None`
/// if the bytes are incomplete or fail their CRC (a torn or corrupt tail).
pub fn decode_record(bytes: &[u8]) -> Option<(Lsn, LogRecord, usize)> {
    let header = bytes.get(..HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len == 0 || len > RECORD_BYTES_MAX {
        return None;
    }
    let payload = bytes.get(HEADER_BYTES..HEADER_BYTES + len)?;
    if crc32c::crc32c(payload) != crc {
        return None;
    }
    let ((lsn, record), used): ((Lsn, LogRecord), usize) =
        bincode::decode_from_slice(payload, config()).ok()?;
    (used == len).then_some((lsn, record, HEADER_BYTES + len))
}

fn segment_path(dir: &Path, first_lsn: Lsn) -> PathBuf {
    dir.join(format!("{first_lsn:020}.log"))
}

fn list_segments(dir: &Path) -> Result<Vec<(Lsn, PathBuf)>, LogError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        let first = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<Lsn>().ok());
        if let Some(first) = first {
            segments.push((first, path));
        }
    }
    segments.sort();
    Ok(segments)
}

/// The writer end of the redo log. Only one thread owns it.
pub struct RedoLog {
    dir: PathBuf,
    /// (first lsn, path) of every segment on disk, oldest first; the last is being appended.
    segments: Vec<(Lsn, PathBuf)>,
    file: File,
    segment_bytes: u64,
    segment_bytes_max: u64,
    next_lsn: Lsn,
    bytes_total: u64,
}

/// What stage 1 of recovery read back from disk.
pub struct Recovered {
    pub log: RedoLog,
    pub records: Vec<(Lsn, LogRecord)>,
}

impl RedoLog {
    /// Opens the log in `dir` (creating it), reads every record, and cuts a torn tail of the
    /// last segment so that appends continue after the last whole record.
    pub fn open(dir: &Path, segment_bytes_max: u64) -> Result<Recovered, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut segments = list_segments(dir)?;
        let mut records = Vec::new();
        let mut bytes_total = 0;
        let count = segments.len();
        for (i, (_, path)) in segments.iter().enumerate() {
            let mut bytes = Vec::new();
            File::open(path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io_err(path))?;
            let mut offset = 0;
            while let Some((lsn, record, used)) = decode_record(&bytes[offset..]) {
                if records.last().is_some_and(|(prev, _)| *prev + 1 != lsn) {
                    break;
                }
                records.push((lsn, record));
                offset += used;
            }
            if offset < bytes.len() {
                if i + 1 != count {
                    return Err(LogError::Corrupt {
                        path: path.clone(),
                        offset: offset as u64,
                    });
                }
                tracing::warn!(path = %path.display(), offset, cut = bytes.len() - offset, "cutting torn log tail");
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(io_err(path))?;
                file.set_len(offset as u64)
                    .and_then(|_| file.sync_data())
                    .map_err(io_err(path))?;
            }
            bytes_total += offset as u64;
        }
        let next_lsn = records
            .last()
            .map_or_else(|| segments.last().map_or(1, |s| s.0), |(lsn, _)| lsn + 1);
        if segments.is_empty() {
            segments.push((next_lsn, segment_path(dir, next_lsn)));
            sync_dir(dir)?;
        }
        let (_, path) = segments.last().expect("at least one segment");
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err(path))?;
        let segment_bytes = file.metadata().map_err(io_err(path))?.len();
        let log = RedoLog {
            dir: dir.to_path_buf(),
            segments,
            file,
            segment_bytes,
            segment_bytes_max,
            next_lsn,
            bytes_total,
        };
        Ok(Recovered { log, records })
    }

    pub fn next_lsn(&self) -> Lsn {
        self.next_lsn
    }

    pub fn bytes_total(&self) -> u64 {
        self.bytes_total
    }

    /// Appends already-encoded records numbered `first..first + count` (not yet synced).
    pub fn append(&mut self, first: Lsn, count: u64, bytes: &[u8]) -> Result<(), LogError> {
        assert_eq!(
            first, self.next_lsn,
            "log records must be appended in lsn order"
        );
        if self.segment_bytes >= self.segment_bytes_max {
            self.rotate()?;
        }
        let path = &self.segments.last().expect("current segment").1;
        self.file.write_all(bytes).map_err(io_err(path))?;
        self.segment_bytes += bytes.len() as u64;
        self.bytes_total += bytes.len() as u64;
        self.next_lsn += count;
        Ok(())
    }

    pub fn sync(&mut self) -> Result<(), LogError> {
        let path = &self.segments.last().expect("current segment").1;
        self.file.sync_data().map_err(io_err(path))
    }

    fn rotate(&mut self) -> Result<(), LogError> {
        self.sync()?;
        let path = segment_path(&self.dir, self.next_lsn);
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        sync_dir(&self.dir)?;
        self.segments.push((self.next_lsn, path));
        self.segment_bytes = 0;
        Ok(())
    }

    /// Deletes every segment all of whose records have lsn < `live_from` (never the current one).
    pub fn truncate_head(&mut self, live_from: Lsn) -> Result<(), LogError> {
        let mut removed = false;
        while self.segments.len() > 1 && self.segments[1].0 <= live_from {
            let (_, path) = self.segments.remove(0);
            let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            fs::remove_file(&path).map_err(io_err(&path))?;
            self.bytes_total = self.bytes_total.saturating_sub(len);
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 1,
            coordinator: 9,
            seq,
        }
    }

    fn append(log: &mut RedoLog, record: LogRecord) {
        let mut buf = Vec::new();
        let lsn = log.next_lsn();
        encode_record(lsn, &record, &mut buf);
        log.append(lsn, 1, &buf).unwrap();
    }

    #[test]
    fn records_survive_reopen_and_torn_tail_is_cut() {
        let dir = std::env::temp_dir().join(format!("tutti-redo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut log = RedoLog::open(&dir, SEGMENT_BYTES_MAX_DEFAULT).unwrap().log;
        append(
            &mut log,
            LogRecord::Prepare {
                tid: tid(1),
                participants: vec![1, 2],
                writes: vec![(8, vec![1; 8])],
            },
        );
        append(
            &mut log,
            LogRecord::Decided {
                tid: tid(1),
                commit: true,
            },
        );
        log.sync().unwrap();
        drop(log);
        // A torn third record: half its bytes.
        let mut buf = Vec::new();
        encode_record(3, &LogRecord::ForcedAbort { tid: tid(2) }, &mut buf);
        let seg = list_segments(&dir).unwrap().pop().unwrap().1;
        OpenOptions::new()
            .append(true)
            .open(&seg)
            .unwrap()
            .write_all(&buf[..buf.len() / 2])
            .unwrap();
        let recovered = RedoLog::open(&dir, SEGMENT_BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(recovered.records.len(), 2);
        assert_eq!(recovered.log.next_lsn(), 3);
        let mut log = recovered.log;
        append(&mut log, LogRecord::ForcedAbort { tid: tid(2) });
        log.sync().unwrap();
        drop(log);
        let recovered = RedoLog::open(&dir, SEGMENT_BYTES_MAX_DEFAULT).unwrap();
        assert_eq!(
            recovered.records.last().unwrap(),
            &(3, LogRecord::ForcedAbort { tid: tid(2) })
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_byte_fails_crc() {
        let mut buf = Vec::new();
        encode_record(
            1,
            &LogRecord::Decided {
                tid: tid(1),
                commit: false,
            },
            &mut buf,
        );
        assert!(decode_record(&buf).is_some());
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(
                decode_record(&bad).is_none(),
                "flipped byte {i} went unnoticed"
            );
        }
    }
}
