//! The byte layout of the redo log: the header that opens every segment and the records
//! that follow it, encoded and decoded by hand in little-endian exactly as docs/storage.md
//! ("Redo log records") specifies, so the format is the text and not a library's choice.

use tutti_wire::{NodeId, Tid};

/// Log sequence number: records are numbered 1, 2, 3, … with no gaps.
pub type Lsn = u64;

/// The first bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TUTTILOG";
/// The segment format this build writes and reads.
pub const SEGMENT_FORMAT_VERSION: u32 = 1;
/// Magic, version, reserved, first lsn, CRC32C of those 24 bytes, reserved.
pub const SEGMENT_HEADER_BYTES: usize = 32;

/// Record frame: payload length (u32 LE) and CRC32C of the payload (u32 LE).
pub const RECORD_HEADER_BYTES: usize = 8;
/// A record's payload never exceeds this: a 16 MiB minitransaction plus headers.
pub const RECORD_BYTES_MAX: usize = 17 * 1024 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The node's epoch reached `epoch`. Forced-aborts of stale tids are skipped or dropped
    /// on the strength of the epoch, so it must never go back across a restart (§4.6).
    Epoch { epoch: u64 },
}

impl LogRecord {
    /// Whether a reply may depend on this record, so it must be synced first.
    pub fn needs_sync(&self) -> bool {
        !matches!(self, LogRecord::Decided { .. })
    }

    fn kind(&self) -> u8 {
        match self {
            LogRecord::Prepare { .. } => KIND_PREPARE,
            LogRecord::Decided { .. } => KIND_DECIDED,
            LogRecord::ForcedAbort { .. } => KIND_FORCED_ABORT,
            LogRecord::Epoch { .. } => KIND_EPOCH,
        }
    }
}

const KIND_PREPARE: u8 = 1;
const KIND_DECIDED: u8 = 2;
const KIND_FORCED_ABORT: u8 = 3;
const KIND_EPOCH: u8 = 4;

/// Why a segment's header was not accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderProblem {
    /// Not a tutti segment, or its header is damaged.
    #[error("wrong magic or CRC")]
    Damaged,
    /// A well-formed header of another format version.
    #[error("format version {0}")]
    Version(u32),
    /// The header names another first lsn than the file name.
    #[error("the header names first lsn {0}, not the one in the file name")]
    FirstLsn(Lsn),
}

/// The header of the segment whose first record is `first_lsn`, which says that every
/// record in its first `synced_sectors` sectors of 512 bytes was synced (0: no claim).
pub fn segment_header(first_lsn: Lsn, synced_sectors: u32) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0; SEGMENT_HEADER_BYTES];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&synced_sectors.to_le_bytes());
    h[16..24].copy_from_slice(&first_lsn.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Checks the header at the start of `bytes` for a segment named after `first_lsn`, and
/// returns how many of its first sectors it says were synced.
pub fn check_segment_header(bytes: &[u8], first_lsn: Lsn) -> Result<u32, HeaderProblem> {
    let h = bytes
        .get(..SEGMENT_HEADER_BYTES)
        .ok_or(HeaderProblem::Damaged)?;
    let crc = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes"));
    if h[..8] != SEGMENT_MAGIC || crc32c::crc32c(&h[..24]) != crc {
        return Err(HeaderProblem::Damaged);
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if version != SEGMENT_FORMAT_VERSION {
        return Err(HeaderProblem::Version(version));
    }
    let named = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
    if named != first_lsn {
        return Err(HeaderProblem::FirstLsn(named));
    }
    Ok(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")))
}

fn put_tid(out: &mut Vec<u8>, tid: &Tid) {
    out.extend_from_slice(&tid.epoch.to_le_bytes());
    out.extend_from_slice(&tid.coordinator.to_le_bytes());
    out.extend_from_slice(&tid.seq.to_le_bytes());
}

/// Appends the record `lsn` to `out`: length, CRC32C, then the payload.
pub fn encode_record(lsn: Lsn, record: &LogRecord, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
    out.extend_from_slice(&lsn.to_le_bytes());
    out.push(record.kind());
    match record {
        LogRecord::Prepare {
            tid,
            participants,
            writes,
        } => {
            put_tid(out, tid);
            let count = u16::try_from(participants.len()).expect("at most 65535 participants");
            out.extend_from_slice(&count.to_le_bytes());
            for node in participants {
                out.extend_from_slice(&node.to_le_bytes());
            }
            let count = u32::try_from(writes.len()).expect("a record stays under 17 MiB");
            out.extend_from_slice(&count.to_le_bytes());
            for (addr, bytes) in writes {
                out.extend_from_slice(&addr.to_le_bytes());
                let len = u32::try_from(bytes.len()).expect("a record stays under 17 MiB");
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
        LogRecord::Decided { tid, commit } => {
            put_tid(out, tid);
            out.push(u8::from(*commit));
        }
        LogRecord::ForcedAbort { tid } => put_tid(out, tid),
        LogRecord::Epoch { epoch } => out.extend_from_slice(&epoch.to_le_bytes()),
    }
    let payload_len = out.len() - start - RECORD_HEADER_BYTES;
    assert!(payload_len <= RECORD_BYTES_MAX, "log record over 17 MiB");
    let crc = crc32c::crc32c(&out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the record at the start of `bytes`: `Some((lsn, record, bytes used))`, or `None`
/// if the bytes are incomplete, fail their CRC (a torn or corrupt tail), or do not follow
/// the layout to the last byte.
pub fn decode_record(bytes: &[u8]) -> Option<(Lsn, LogRecord, usize)> {
    let header = bytes.get(..RECORD_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len == 0 || len > RECORD_BYTES_MAX {
        return None;
    }
    let payload = bytes.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len)?;
    if crc32c::crc32c(payload) != crc {
        return None;
    }
    let mut r = Reader(payload);
    let lsn = r.u64()?;
    let record = match r.u8()? {
        KIND_PREPARE => {
            let tid = r.tid()?;
            let count = r.u16()? as usize;
            let participants = (0..count).map(|_| r.u16()).collect::<Option<_>>()?;
            let count = r.u32()? as usize;
            // Each write takes at least 12 bytes: never reserve more than the payload holds.
            let mut writes = Vec::with_capacity(count.min(r.0.len() / 12));
            for _ in 0..count {
                let addr = r.u64()?;
                let len = r.u32()? as usize;
                writes.push((addr, r.bytes(len)?.to_vec()));
            }
            LogRecord::Prepare {
                tid,
                participants,
                writes,
            }
        }
        KIND_DECIDED => {
            let tid = r.tid()?;
            let commit = match r.u8()? {
                0 => false,
                1 => true,
                _ => return None,
            };
            LogRecord::Decided { tid, commit }
        }
        KIND_FORCED_ABORT => LogRecord::ForcedAbort { tid: r.tid()? },
        KIND_EPOCH => LogRecord::Epoch { epoch: r.u64()? },
        _ => return None,
    };
    r.0.is_empty()
        .then_some((lsn, record, RECORD_HEADER_BYTES + len))
}

/// The unread rest of a payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N).map(|b| b.try_into().expect("N bytes"))
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|[b]| b)
    }

    fn u16(&mut self) -> Option<u16> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn tid(&mut self) -> Option<Tid> {
        Some(Tid {
            epoch: self.u64()?,
            coordinator: self.u64()?,
            seq: self.u64()?,
        })
    }
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

    /// The layout of docs/storage.md, byte by byte, for one record of each kind.
    #[test]
    fn records_follow_the_documented_layout() {
        let t = Tid {
            epoch: 2,
            coordinator: 0x0102_0304_0506_0708,
            seq: 5,
        };
        let tid_bytes = [
            &2u64.to_le_bytes()[..],
            &0x0102_0304_0506_0708u64.to_le_bytes(),
            &5u64.to_le_bytes(),
        ]
        .concat();
        let cases = [
            (
                LogRecord::Prepare {
                    tid: t,
                    participants: vec![1, 3],
                    writes: vec![(64, vec![0xaa, 0xbb])],
                },
                [
                    &[1][..],
                    &tid_bytes,
                    &[2, 0, 1, 0, 3, 0],
                    &[1, 0, 0, 0],
                    &64u64.to_le_bytes(),
                    &[2, 0, 0, 0, 0xaa, 0xbb],
                ]
                .concat(),
            ),
            (
                LogRecord::Decided {
                    tid: t,
                    commit: true,
                },
                [&[2][..], &tid_bytes, &[1]].concat(),
            ),
            (
                LogRecord::ForcedAbort { tid: t },
                [&[3][..], &tid_bytes].concat(),
            ),
            (
                LogRecord::Epoch { epoch: 7 },
                [&[4][..], &7u64.to_le_bytes()].concat(),
            ),
        ];
        for (record, body) in cases {
            let mut out = Vec::new();
            encode_record(42, &record, &mut out);
            let payload = [&42u64.to_le_bytes()[..], &body].concat();
            let mut expected = (payload.len() as u32).to_le_bytes().to_vec();
            expected.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
            expected.extend_from_slice(&payload);
            assert_eq!(out, expected, "{record:?}");
            assert_eq!(decode_record(&out), Some((42, record, expected.len())));
        }
    }

    #[test]
    fn the_segment_header_follows_the_documented_layout() {
        let h = segment_header(17, 0x0102_0304);
        assert_eq!(&h[..8], b"TUTTILOG");
        assert_eq!(h[8..12], [1, 0, 0, 0]);
        assert_eq!(h[12..16], [4, 3, 2, 1]);
        assert_eq!(h[16..24], 17u64.to_le_bytes());
        assert_eq!(h[24..28], crc32c::crc32c(&h[..24]).to_le_bytes());
        assert_eq!(h[28..], [0; 4]);
        assert_eq!(check_segment_header(&h, 17), Ok(0x0102_0304));
        assert_eq!(check_segment_header(&segment_header(17, 0), 17), Ok(0));
        assert_eq!(
            check_segment_header(&h, 18),
            Err(HeaderProblem::FirstLsn(17))
        );
        let mut other = h;
        other[8] = 9;
        let crc = crc32c::crc32c(&other[..24]);
        other[24..28].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            check_segment_header(&other, 17),
            Err(HeaderProblem::Version(9))
        );
        for i in 0..28 {
            let mut bad = h;
            bad[i] ^= 0x10;
            assert_eq!(
                check_segment_header(&bad, 17),
                Err(HeaderProblem::Damaged),
                "byte {i}"
            );
        }
    }

    #[test]
    fn a_payload_that_does_not_end_where_its_layout_does_is_refused() {
        let mut out = Vec::new();
        encode_record(1, &LogRecord::ForcedAbort { tid: tid(1) }, &mut out);
        // One byte more, length and CRC fixed up: the frame is intact, the layout is not.
        out.push(0);
        let len = (out.len() - RECORD_HEADER_BYTES) as u32;
        let crc = crc32c::crc32c(&out[RECORD_HEADER_BYTES..]);
        out[..4].copy_from_slice(&len.to_le_bytes());
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_record(&out), None);
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
            assert!(decode_record(&bad).is_none(), "flipped byte {i}");
        }
    }
}
