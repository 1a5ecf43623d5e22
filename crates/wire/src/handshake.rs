//! The first bytes on every connection. Each side sends a hello (magic, protocol version,
//! whether it holds a cluster token, a fresh nonce) before any frame; a side that hears
//! another version closes the connection naming both. Where both hold a token, the
//! connector proves it first and the acceptor answers with a verdict and its own proof, so
//! a peer without the token hears nothing past the hello (docs/protocol.md, "Handshake").
//! Frames follow only between equal versions, so a frame's encoding may change from one
//! version to the next.

use crate::credentials::{server_name, Credentials};
use crate::token::{ClusterToken, Side, NONCE_BYTES, PROOF_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The protocol this build speaks; it changes whenever a message or frame encoding does.
pub const PROTOCOL_VERSION: u32 = 16;
/// What a hello starts with.
const HELLO_MAGIC: [u8; 8] = *b"TUTTIRPC";
/// The magic and the version: every protocol version starts its hello with them, so that
/// two versions always name each other.
pub const HELLO_VERSION_BYTES: usize = 12;
/// A whole hello: the magic, the version, the flags byte and the nonce.
pub const HELLO_BYTES: usize = HELLO_VERSION_BYTES + 1 + NONCE_BYTES;
/// The flag saying that the sender holds a cluster token and will ask for its proof.
const FLAG_TOKEN: u8 = 1;
/// The flag saying that the sender requires TLS, in the one hello it sends in the clear to
/// a peer without TLS before closing.
const FLAG_TLS: u8 = 2;
/// The acceptor's verdict on the connector's proof: its own proof follows.
const VERDICT_ACCEPTED: u8 = 1;
/// The acceptor's verdict on the connector's proof: the connection closes.
const VERDICT_REFUSED: u8 = 0;
/// How long a side waits for each of the other's messages.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// This build's hello: the magic, the protocol version as a little-endian u32, `flags`
/// (`FLAG_TOKEN`, `FLAG_TLS`) and `nonce`.
pub fn hello(flags: u8, nonce: &[u8; NONCE_BYTES]) -> [u8; HELLO_BYTES] {
    let mut h = [0; HELLO_BYTES];
    h[..8].copy_from_slice(&HELLO_MAGIC);
    h[8..HELLO_VERSION_BYTES].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    h[HELLO_VERSION_BYTES] = flags;
    h[HELLO_VERSION_BYTES + 1..].copy_from_slice(nonce);
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
    #[error("the peer requires the cluster token and this process has none: pass the cluster's --token-file")]
    TokenRequired,
    #[error("the peer presented no cluster token and this process requires one: give every process of the cluster the same --token-file")]
    TokenMissing,
    #[error("the peer's cluster token differs from this process's: give every process of the cluster the same --token-file")]
    TokenWrong,
    #[error("TLS with the peer failed: {0} (every process of the cluster needs TLS, certificates from the same --tls-ca, each naming the host it is dialled at)")]
    Tls(String),
    #[error("the peer speaks TLS and this process has no TLS set-up: give it the cluster's --tls-cert, --tls-key and --tls-ca")]
    TlsUnexpected,
    #[error("the peer requires TLS and this process has no TLS set-up: give it the cluster's --tls-cert, --tls-key and --tls-ca")]
    TlsRequired,
    #[error("the peer does not speak TLS and this process requires it: give every process of the cluster --tls-cert, --tls-key and --tls-ca")]
    TlsMissing,
    #[error("no answer within {} ms", HELLO_TIMEOUT.as_millis())]
    Timeout,
    #[error("{0}")]
    Io(String),
}

impl HandshakeError {
    /// Whether the two ends are set up so that they never connect (versions, tokens), as
    /// opposed to a connection lost on the way: trying again changes nothing.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, HandshakeError::Timeout | HandshakeError::Io(_))
    }
}

fn io(e: std::io::Error) -> HandshakeError {
    HandshakeError::Io(e.to_string())
}

/// The two halves of an open connection, over TLS or not.
pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Opens a connection dialled to `addr`: TLS first if `credentials` has it, then `greet`.
pub async fn connect(
    stream: TcpStream,
    addr: &str,
    credentials: &Credentials,
) -> Result<(Reader, Writer), HandshakeError> {
    let token = credentials.token.as_ref();
    let Some(tls) = &credentials.tls else {
        return plain(stream, Side::Connector, token).await;
    };
    let name = server_name(addr).map_err(HandshakeError::Tls)?;
    let tls = tokio::time::timeout(HELLO_TIMEOUT, tls.connector().connect(name, stream)).await;
    let stream = tls
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(tls_error)?;
    encrypted(stream, Side::Connector, token).await
}

/// Opens an accepted connection: TLS first if `credentials` has it, then `greet`.
pub async fn accept(
    stream: TcpStream,
    credentials: &Credentials,
) -> Result<(Reader, Writer), HandshakeError> {
    let token = credentials.token.as_ref();
    let Some(tls) = &credentials.tls else {
        return plain(stream, Side::Acceptor, token).await;
    };
    let mut first = [0; 1];
    let peeked = tokio::time::timeout(HELLO_TIMEOUT, stream.peek(&mut first)).await;
    if peeked.map_err(|_| HandshakeError::Timeout)?.map_err(io)? == 1 && first[0] == HELLO_MAGIC[0]
    {
        // A peer without TLS: a hello that says so tells it why it is refused.
        let mut stream = stream;
        let _ = stream.write_all(&hello(FLAG_TLS, &[0; NONCE_BYTES])).await;
        return Err(HandshakeError::TlsMissing);
    }
    let tls = tokio::time::timeout(HELLO_TIMEOUT, tls.acceptor().accept(stream)).await;
    let stream = tls
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(tls_error)?;
    encrypted(stream, Side::Acceptor, token).await
}

/// A TLS failure (a certificate refused, a peer without TLS) rather than a lost connection.
fn tls_error(e: std::io::Error) -> HandshakeError {
    use rustls::InvalidMessage::InvalidContentType;
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        // What a peer without TLS sends first, its hello, is no TLS record.
        Some(rustls::Error::InvalidMessage(InvalidContentType)) => HandshakeError::TlsMissing,
        Some(tls) => HandshakeError::Tls(tls.to_string()),
        None => io(e),
    }
}

async fn plain(
    mut stream: TcpStream,
    side: Side,
    token: Option<&ClusterToken>,
) -> Result<(Reader, Writer), HandshakeError> {
    greet(&mut stream, side, token).await?;
    // Owned halves: no lock between the reader and the writer task.
    let (rd, wr) = stream.into_split();
    Ok((Box::new(rd), Box::new(wr)))
}

async fn encrypted<S>(
    mut stream: S,
    side: Side,
    token: Option<&ClusterToken>,
) -> Result<(Reader, Writer), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    greet(&mut stream, side, token).await?;
    let (rd, wr) = tokio::io::split(stream);
    Ok((Box::new(rd), Box::new(wr)))
}

async fn read_within<S>(stream: &mut S, buf: &mut [u8]) -> Result<(), HandshakeError>
where
    S: AsyncRead + Unpin,
{
    tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(buf))
        .await
        .map_err(|_| HandshakeError::Timeout)?
        .map_err(io)?;
    Ok(())
}

/// Opens a new connection from `side`: exchanges hellos and, where both ends hold a token,
/// proofs of it. With `token`, a peer without it (or with another) is refused; without,
/// a peer that asks for one is.
async fn greet<S>(
    stream: &mut S,
    side: Side,
    token: Option<&ClusterToken>,
) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let flags = if token.is_some() { FLAG_TOKEN } else { 0 };
    stream.write_all(&hello(flags, &nonce)).await.map_err(io)?;
    let mut theirs = [0; HELLO_BYTES];
    // The version first: a peer of another version may send a hello of another length.
    read_within(stream, &mut theirs[..HELLO_VERSION_BYTES]).await?;
    check_version(&theirs[..HELLO_VERSION_BYTES])?;
    read_within(stream, &mut theirs[HELLO_VERSION_BYTES..]).await?;
    if theirs[HELLO_VERSION_BYTES] & FLAG_TLS != 0 {
        return Err(HandshakeError::TlsRequired);
    }
    let peer_token = theirs[HELLO_VERSION_BYTES] & FLAG_TOKEN != 0;
    let peer_nonce: [u8; NONCE_BYTES] = theirs[HELLO_VERSION_BYTES + 1..]
        .try_into()
        .expect("a hello ends with a nonce");
    let token = match (token, peer_token) {
        (None, false) => return Ok(()),
        (None, true) => return Err(HandshakeError::TokenRequired),
        (Some(_), false) => return Err(HandshakeError::TokenMissing),
        (Some(token), true) => token,
    };
    let mut proof = [0; PROOF_BYTES];
    match side {
        Side::Connector => {
            let ours = token.proof(Side::Connector, &nonce, &peer_nonce);
            stream.write_all(&ours).await.map_err(io)?;
            let mut verdict = [VERDICT_REFUSED];
            read_within(stream, &mut verdict).await?;
            if verdict[0] != VERDICT_ACCEPTED {
                return Err(HandshakeError::TokenWrong);
            }
            read_within(stream, &mut proof).await?;
            if !token.verify(Side::Acceptor, &peer_nonce, &nonce, &proof) {
                return Err(HandshakeError::TokenWrong);
            }
        }
        Side::Acceptor => {
            read_within(stream, &mut proof).await?;
            if !token.verify(Side::Connector, &peer_nonce, &nonce, &proof) {
                let _ = stream.write_all(&[VERDICT_REFUSED]).await;
                return Err(HandshakeError::TokenWrong);
            }
            let mut answer = [0; 1 + PROOF_BYTES];
            answer[0] = VERDICT_ACCEPTED;
            answer[1..].copy_from_slice(&token.proof(Side::Acceptor, &nonce, &peer_nonce));
            stream.write_all(&answer).await.map_err(io)?;
        }
    }
    Ok(())
}

/// Checks the magic and version a peer's hello starts with against this build's.
fn check_version(theirs: &[u8]) -> Result<(), HandshakeError> {
    if theirs[..8] != HELLO_MAGIC {
        // 0x16 0x03: a TLS handshake record, a ClientHello.
        if theirs[..2] == [0x16, 0x03] {
            return Err(HandshakeError::TlsUnexpected);
        }
        return Err(HandshakeError::NotTutti(theirs.to_vec()));
    }
    let version = u32::from_le_bytes(theirs[8..12].try_into().expect("4 bytes"));
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    Ok(())
}
