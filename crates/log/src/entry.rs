//! What a slot holds, byte by byte (docs/log.md, "Slots"): a header naming the position,
//! the epoch it was written in, the writer, its streams with their backpointers, a
//! checksum; then the payload. Junk (a filled hole) is a header with no streams or payload.

/// Bytes before the stream headers.
pub const ENTRY_HEADER_BYTES: usize = 40;
/// Streams one entry may belong to (Tango §5: the number of objects a transaction writes).
pub const STREAMS_PER_ENTRY_MAX: usize = 16;
/// Marks an unused backpointer (a stream with fewer than K earlier entries).
pub const NO_POSITION: u64 = u64::MAX;

const STATE_DATA: u8 = 1;
const STATE_JUNK: u8 = 2;

/// A stream's id. Any 32-bit value.
pub type StreamId = u32;

/// One stream an entry belongs to, with the positions of the stream's previous entries,
/// newest first (at most K; fewer when the stream is younger).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamHeader {
    pub stream: StreamId,
    pub backpointers: Vec<u64>,
}

/// What a written slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    Data {
        streams: Vec<StreamHeader>,
        payload: Vec<u8>,
    },
    Junk,
}

/// A decoded slot: the position it holds, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub position: u64,
    pub epoch: u64,
    /// Chosen by the appender per append, so that a retry can tell its own entry.
    pub writer: u64,
    pub content: Content,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("entry of {payload} bytes with {streams} streams needs {needed} bytes; slots are {slot_bytes}")]
    TooLarge {
        payload: usize,
        streams: usize,
        needed: usize,
        slot_bytes: u32,
    },
    #[error("{0} streams; an entry belongs to at most {STREAMS_PER_ENTRY_MAX}")]
    TooManyStreams(usize),
    #[error("stream {0} is listed twice")]
    DuplicateStream(StreamId),
    #[error("slot of position {position} is corrupt: {why}")]
    Corrupt { position: u64, why: String },
}

/// Bytes of one stream header with `k` backpointers.
pub fn stream_header_bytes(k: u8) -> usize {
    4 + 8 * usize::from(k)
}

/// Bytes of an entry's header with `streams` streams of `k` backpointers.
pub fn header_bytes(streams: usize, k: u8) -> usize {
    ENTRY_HEADER_BYTES + streams * stream_header_bytes(k)
}

/// Checks that `streams` and a payload of `payload` bytes fit one slot, before anything is sent.
pub fn check_fits(
    streams: &[StreamId],
    payload: usize,
    slot_bytes: u32,
    k: u8,
) -> Result<(), EntryError> {
    if streams.len() > STREAMS_PER_ENTRY_MAX {
        return Err(EntryError::TooManyStreams(streams.len()));
    }
    for (i, s) in streams.iter().enumerate() {
        if streams[..i].contains(s) {
            return Err(EntryError::DuplicateStream(*s));
        }
    }
    let needed = header_bytes(streams.len(), k) + payload;
    if needed > slot_bytes as usize {
        return Err(EntryError::TooLarge {
            payload,
            streams: streams.len(),
            needed,
            slot_bytes,
        });
    }
    Ok(())
}

impl Entry {
    /// The slot bytes to write (only as many as the entry needs). `k` is the log's
    /// backpointers per stream; shorter lists are padded with `NO_POSITION`.
    pub fn encode(&self, k: u8) -> Vec<u8> {
        let (state, streams, payload): (u8, &[StreamHeader], &[u8]) = match &self.content {
            Content::Data { streams, payload } => (STATE_DATA, streams, payload),
            Content::Junk => (STATE_JUNK, &[], &[]),
        };
        let mut b = Vec::with_capacity(header_bytes(streams.len(), k) + payload.len());
        b.extend_from_slice(&(self.position + 1).to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&self.writer.to_le_bytes());
        b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.push(state);
        b.push(streams.len() as u8);
        b.extend_from_slice(&[0; 6]);
        for s in streams {
            debug_assert!(s.backpointers.len() <= usize::from(k));
            b.extend_from_slice(&s.stream.to_le_bytes());
            for i in 0..usize::from(k) {
                let p = s.backpointers.get(i).copied().unwrap_or(NO_POSITION);
                b.extend_from_slice(&p.to_le_bytes());
            }
        }
        b.extend_from_slice(payload);
        let crc = crc32c::crc32c(&b);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the slot bytes read for `position`: `Ok(None)` if the slot does not hold it
    /// (never written, or it holds another position of the same slot), else the entry.
    /// `bytes` may stop after the entry; if it stops before, `Err(Need(n))` says how many
    /// bytes to read. `slot_bytes` bounds what an entry may claim.
    pub fn decode(
        position: u64,
        bytes: &[u8],
        k: u8,
        slot_bytes: u32,
    ) -> Result<Option<Entry>, Decoded> {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        if bytes.len() < ENTRY_HEADER_BYTES {
            return Err(Decoded::Need(ENTRY_HEADER_BYTES));
        }
        if u64_at(0) != position + 1 {
            return Ok(None);
        }
        let corrupt = |why: String| Decoded::Corrupt(EntryError::Corrupt { position, why });
        let len = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
        let state = bytes[32];
        let n = usize::from(bytes[33]);
        if n > STREAMS_PER_ENTRY_MAX {
            return Err(corrupt(format!("{n} streams")));
        }
        let end = header_bytes(n, k) + len;
        if end > slot_bytes as usize {
            return Err(corrupt(format!("{end} bytes in a slot of {slot_bytes}")));
        }
        if bytes.len() < end {
            return Err(Decoded::Need(end));
        }
        let stored = u32::from_le_bytes(bytes[28..32].try_into().unwrap());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bytes[..28]), &[0; 4]);
        if crc32c::crc32c_append(crc, &bytes[32..end]) != stored {
            return Err(corrupt("checksum mismatch".into()));
        }
        let content = match state {
            STATE_DATA => {
                let mut streams = Vec::with_capacity(n);
                let mut at = ENTRY_HEADER_BYTES;
                for _ in 0..n {
                    let stream = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                    let backpointers = (0..usize::from(k))
                        .map(|i| u64_at(at + 4 + 8 * i))
                        .filter(|&p| p != NO_POSITION)
                        .collect();
                    streams.push(StreamHeader {
                        stream,
                        backpointers,
                    });
                    at += stream_header_bytes(k);
                }
                Content::Data {
                    streams,
                    payload: bytes[at..end].to_vec(),
                }
            }
            STATE_JUNK if n == 0 && len == 0 => Content::Junk,
            other => return Err(corrupt(format!("state {other} with {n} streams"))),
        };
        Ok(Some(Entry {
            position,
            epoch: u64_at(8),
            writer: u64_at(16),
            content,
        }))
    }
}

/// Whether a slot's first bytes (at least 8) say it holds `position`, data or junk: all
/// the slow check needs to know.
pub fn holds(position: u64, bytes: &[u8]) -> bool {
    held_position(bytes) == Some(position)
}

/// The position a slot's bytes hold, from its tag; `None` for a slot never written.
pub fn held_position(bytes: &[u8]) -> Option<u64> {
    let tag = u64::from_le_bytes(bytes.get(0..8)?.try_into().expect("8 bytes"));
    tag.checked_sub(1)
}

/// An entry's streams as its header gives them, for the backward scans that read only
/// headers: `Ok(None)` if the slot does not hold `position`, `Ok(Some(streams))` (empty
/// for junk) if it does. The checksum covers the payload too, so it is not checked here.
pub fn peek_streams(position: u64, bytes: &[u8], k: u8) -> Result<Option<Vec<StreamId>>, Decoded> {
    if bytes.len() < ENTRY_HEADER_BYTES {
        return Err(Decoded::Need(ENTRY_HEADER_BYTES));
    }
    if !holds(position, bytes) {
        return Ok(None);
    }
    let n = usize::from(bytes[33]);
    if n > STREAMS_PER_ENTRY_MAX {
        let why = format!("{n} streams");
        return Err(Decoded::Corrupt(EntryError::Corrupt { position, why }));
    }
    if bytes.len() < header_bytes(n, k) {
        return Err(Decoded::Need(header_bytes(n, k)));
    }
    let at = |i: usize| ENTRY_HEADER_BYTES + i * stream_header_bytes(k);
    Ok(Some(
        (0..n)
            .map(|i| u32::from_le_bytes(bytes[at(i)..at(i) + 4].try_into().unwrap()))
            .collect(),
    ))
}

/// Why a slot's bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// Read at least this many bytes of the slot and decode again.
    Need(usize),
    Corrupt(EntryError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(position: u64) -> Entry {
        Entry {
            position,
            epoch: 3,
            writer: 0xfeed,
            content: Content::Data {
                streams: vec![
                    StreamHeader {
                        stream: 7,
                        backpointers: vec![40, 12],
                    },
                    StreamHeader {
                        stream: 1 << 31,
                        backpointers: vec![],
                    },
                ],
                payload: b"hello".to_vec(),
            },
        }
    }

    #[test]
    fn entries_round_trip_and_name_their_position() {
        let e = data(41);
        let bytes = e.encode(4);
        assert_eq!(bytes.len(), header_bytes(2, 4) + 5);
        assert_eq!(Entry::decode(41, &bytes, 4, 4096), Ok(Some(e)));
        assert_eq!(
            Entry::decode(40, &bytes, 4, 4096),
            Ok(None),
            "another position"
        );
        assert_eq!(
            Entry::decode(0, &[0; 64], 4, 4096),
            Ok(None),
            "never written"
        );
        let junk = Entry {
            position: 9,
            epoch: 2,
            writer: 1,
            content: Content::Junk,
        };
        assert_eq!(Entry::decode(9, &junk.encode(4), 4, 4096), Ok(Some(junk)));
    }

    #[test]
    fn a_header_alone_gives_the_streams() {
        let bytes = data(41).encode(4);
        let header = &bytes[..header_bytes(2, 4)];
        assert_eq!(peek_streams(41, header, 4), Ok(Some(vec![7, 1 << 31])));
        assert_eq!(peek_streams(40, header, 4), Ok(None));
        assert_eq!(
            peek_streams(41, &header[..50], 4),
            Err(Decoded::Need(header.len()))
        );
    }

    #[test]
    fn a_short_read_asks_for_more_and_a_flipped_bit_is_caught() {
        let bytes = data(41).encode(4);
        assert_eq!(
            Entry::decode(41, &bytes[..50], 4, 4096),
            Err(Decoded::Need(bytes.len()))
        );
        let mut slot = bytes.clone();
        slot.resize(4096, 0);
        for i in 8..bytes.len() {
            let mut bad = slot.clone();
            bad[i] ^= 0x10;
            assert!(
                matches!(Entry::decode(41, &bad, 4, 4096), Err(Decoded::Corrupt(_))),
                "byte {i}"
            );
        }
    }

    #[test]
    fn what_does_not_fit_is_refused_before_sending() {
        assert_eq!(
            check_fits(&[1, 2], 4096 - header_bytes(2, 4), 4096, 4),
            Ok(())
        );
        assert!(matches!(
            check_fits(&[1, 2], 4097 - header_bytes(2, 4), 4096, 4),
            Err(EntryError::TooLarge { needed: 4097, .. })
        ));
        assert_eq!(
            check_fits(&[1, 2, 1], 0, 4096, 4),
            Err(EntryError::DuplicateStream(1))
        );
        let many: Vec<_> = (0..17).collect();
        assert_eq!(
            check_fits(&many, 0, 1 << 20, 4),
            Err(EntryError::TooManyStreams(17))
        );
    }
}
