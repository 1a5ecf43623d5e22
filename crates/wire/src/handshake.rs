//! The first bytes on every connection: each side sends a hello (magic and protocol
//! version) before any frame, and a side that hears another version closes the connection
//! naming both (docs/protocol.md, "Handshake"). Frames follow only between equal versions,
//! so a frame's encoding may change from one version to the next.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The protocol this build speaks; it changes whenever a message or frame encoding does.
pub const PROTOCOL_VERSION: u32 = 6;
/// What a hello starts with.
const HELLO_MAGIC: [u8; 8] = *b"TUTTIRPC";
pub const HELLO_BYTES: usize = 12;
/// How long a side waits for the other's hello.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// This build's hello: the magic, then the protocol version as a little-endian u32.
pub fn hello() -> [u8; HELLO_BYTES] {
    let mut h = [0; HELLO_BYTES];
    h[..8].copy_from_slice(&HELLO_MAGIC);
    h[8..].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h
}

/// Why a connection was not opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error("the peer speaks tutti protocol version {theirs}, this build speaks version {ours}; run one tutti version across the cluster")]
    Version { ours: u32, theirs: u32 },
    #[error("the peer is not a tutti endpoint (its first bytes were {0:02x?})")]
    NotTutti(Vec<u8>),
    #[error("no hello within {} ms", HELLO_TIMEOUT.as_millis())]
    Timeout,
    #[error("{0}")]
    Io(String),
}

/// Sends this build's hello and checks the peer's; both sides call it on a new connection.
pub async fn greet(stream: &mut TcpStream) -> Result<(), HandshakeError> {
    let io = |e: std::io::Error| HandshakeError::Io(e.to_string());
    stream.write_all(&hello()).await.map_err(io)?;
    let mut theirs = [0; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut theirs))
        .await
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(io)?;
    check(&theirs)
}

/// Checks a peer's hello against this build's.
fn check(theirs: &[u8; HELLO_BYTES]) -> Result<(), HandshakeError> {
    if theirs[..8] != HELLO_MAGIC {
        return Err(HandshakeError::NotTutti(theirs.to_vec()));
    }
    let version = u32::from_le_bytes(theirs[8..].try_into().expect("4 bytes"));
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    Ok(())
}
