//! Frame format: a 4-byte big-endian length, then a bincode (standard config) envelope of
//! a 64-bit request id and a `Request` or `Response`. Decoding is bounded by the frame limit
//! and rejects trailing bytes, so any byte sequence yields a value or a `FrameError`.

use bincode::{Decode, Encode};
use bytes::{Bytes, BytesMut};

/// Default frame limit: a 16 MiB minitransaction plus headroom for its item headers.
pub const FRAME_BYTES_MAX_DEFAULT: usize = 17 * 1024 * 1024;

/// Request id 0 marks a one-way message: the receiver sends no reply.
pub const ONE_WAY: u64 = 0;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("frame has {0} trailing bytes")]
    Trailing(usize),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<FRAME_BYTES_MAX_DEFAULT>()
}

pub fn encode_envelope<T: Encode>(id: u64, body: &T) -> Bytes {
    let mut buf = BytesMut::with_capacity(64);
    let mut writer = BytesWriter(&mut buf);
    bincode::encode_into_writer((id, body), &mut writer, config())
        .expect("encoding into memory cannot fail");
    buf.freeze()
}

struct BytesWriter<'a>(&'a mut BytesMut);

impl bincode::enc::write::Writer for BytesWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

pub fn decode_envelope<T: Decode<()>>(frame: &[u8]) -> Result<(u64, T), FrameError> {
    let ((id, body), used): ((u64, T), usize) = bincode::decode_from_slice(frame, config())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != frame.len() {
        return Err(FrameError::Trailing(frame.len() - used));
    }
    Ok((id, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Request, Response};

    #[test]
    fn round_trip() {
        let frame = encode_envelope(7, &Request::Stats);
        let (id, req): (u64, Request) = decode_envelope(&frame).unwrap();
        assert_eq!(id, 7);
        assert!(matches!(req, Request::Stats));
    }

    #[test]
    fn garbage_never_panics() {
        let mut state = 0x9e3779b97f4a7c15u64;
        for len in 0..2000usize {
            let bytes: Vec<u8> = (0..len % 97)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let _ = decode_envelope::<Request>(&bytes);
            let _ = decode_envelope::<Response>(&bytes);
        }
    }

    #[test]
    fn huge_length_prefix_is_rejected_not_allocated() {
        // A Vec length of u64::MAX inside an ExecPrepare must fail on the limit.
        let mut bytes = vec![1u8, 0]; // id = 1, variant 0 (ExecPrepare)
        bytes.extend_from_slice(&[0; 3]); // tid fields
        bytes.extend_from_slice(&[0xff; 9]);
        assert!(decode_envelope::<Request>(&bytes).is_err());
    }
}
