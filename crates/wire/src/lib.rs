//! Wire types and transport of tutti: the messages that coordinators, memory nodes and the
//! management node exchange, their framing with size limits, and a pipelined RPC connection.
//! It holds no protocol logic: the participant, coordinator and manager interpret these
//! messages; this crate only names, encodes, validates sizes and carries them.

pub mod backoff;
pub mod conn;
pub mod credentials;
pub mod frame;
pub mod handshake;
pub mod limits;
pub mod managers;
pub mod message;
mod planted;
pub mod token;

pub use backoff::Backoff;
pub use conn::{
    bad_request, serve, serve_connection, serve_until, Connection, Connections, Dialer, Replies,
    RpcError, GOING_AWAY_GRACE,
};
pub use credentials::{
    require_credentials_beyond_loopback, CredentialFiles, Credentials, Tls, TlsFiles,
};
pub use frame::{decode_envelope, encode_envelope, FrameError, FRAME_BYTES_MAX_DEFAULT, ONE_WAY};
pub use handshake::{HandshakeError, PROTOCOL_VERSION};
pub use limits::Limits;
pub use managers::Managers;
pub use message::*;
pub use token::{ClusterToken, TokenError};
pub use tokio_util::sync::CancellationToken;
