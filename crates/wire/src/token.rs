//! The cluster token: a secret that every process of a cluster holds, read from a file that
//! only its owner may read. A connection proves it on both sides with HMAC-SHA256 over fresh
//! nonces, so the secret itself never crosses the wire (docs/protocol.md, "Handshake").

use hmac::{KeyInit, Mac};
use std::path::Path;
use std::sync::Arc;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Bytes of a token, at least: 16 random bytes make guessing hopeless.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Bytes of a token file, at most: a token is a line, not a document.
const TOKEN_FILE_BYTES_MAX: u64 = 4096;
/// Bytes of a proof: an HMAC-SHA256 tag.
pub(crate) const PROOF_BYTES: usize = 32;
/// Bytes of the nonce each side sends in its hello.
pub const NONCE_BYTES: usize = 16;
/// What every proof starts with, so that a tag made for something else never passes.
const PROOF_CONTEXT: &[u8] = b"tutti cluster token proof v1";

/// Which end of a connection proves: the two ends sign differently, so that a proof heard
/// from one cannot be sent back as the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Connector = 1,
    Acceptor = 2,
}

/// The secret of a cluster. Cheap to clone; prints as `ClusterToken(..)`.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken(Arc<[u8]>);

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(..)")
    }
}

/// Why a token could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("token file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("a cluster token needs at least {TOKEN_BYTES_MIN} bytes, this one has {0}; `tutti token new FILE` makes one")]
    TooShort(usize),
}

impl ClusterToken {
    /// The token `secret` (surrounding whitespace is not part of it).
    pub fn new(secret: &[u8]) -> Result<ClusterToken, TokenError> {
        let secret = secret.trim_ascii();
        if secret.len() < TOKEN_BYTES_MIN {
            return Err(TokenError::TooShort(secret.len()));
        }
        Ok(ClusterToken(secret.into()))
    }

    /// The token in the file at `path`, which no one but its owner may read or write.
    pub fn read(path: &Path) -> Result<ClusterToken, TokenError> {
        let err = |reason: String| TokenError::File {
            path: path.display().to_string(),
            reason,
        };
        let bytes = crate::credentials::read_private(path, TOKEN_FILE_BYTES_MAX).map_err(err)?;
        ClusterToken::new(&bytes).map_err(|e| err(e.to_string()))
    }

    /// A new random token: 32 bytes from the operating system, as 64 hex digits.
    pub fn generate() -> String {
        use rand::RngCore;
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        secret.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(
        &self,
        side: Side,
        prover: &[u8; NONCE_BYTES],
        verifier: &[u8; NONCE_BYTES],
    ) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(PROOF_CONTEXT);
        mac.update(&[side as u8]);
        mac.update(prover);
        mac.update(verifier);
        mac
    }

    /// What `side` sends to show it holds the token: a tag over its own nonce and the
    /// peer's, which the peer picked fresh for this connection.
    pub(crate) fn proof(
        &self,
        side: Side,
        own: &[u8; NONCE_BYTES],
        peer: &[u8; NONCE_BYTES],
    ) -> [u8; PROOF_BYTES] {
        self.mac(side, own, peer).finalize().into_bytes().into()
    }

    /// Whether `proof` is what a holder of this token on `side` sends, with nonce `prover`,
    /// to a peer whose nonce is `verifier`. Compares in constant time.
    pub(crate) fn verify(
        &self,
        side: Side,
        prover: &[u8; NONCE_BYTES],
        verifier: &[u8; NONCE_BYTES],
        proof: &[u8],
    ) -> bool {
        self.mac(side, prover, verifier).verify_slice(proof).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> ClusterToken {
        ClusterToken::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_proof_passes_only_for_its_token_side_and_nonces() {
        let (a, b) = ([1; NONCE_BYTES], [2; NONCE_BYTES]);
        let t = token("0123456789abcdef0123");
        let proof = t.proof(Side::Connector, &a, &b);
        assert!(t.verify(Side::Connector, &a, &b, &proof));
        assert!(!t.verify(Side::Acceptor, &a, &b, &proof), "reflected");
        assert!(!t.verify(Side::Connector, &a, &a, &proof), "replayed");
        assert!(!token("0123456789abcdef0124").verify(Side::Connector, &a, &b, &proof));
        assert!(!t.verify(Side::Connector, &a, &b, &proof[..31]));
    }

    #[test]
    fn a_short_token_or_one_others_can_read_is_refused() {
        assert_eq!(
            ClusterToken::new(b"  short \n"),
            Err(TokenError::TooShort(5))
        );
        assert_eq!(token(" 0123456789abcdef\n"), token("0123456789abcdef"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, ClusterToken::generate()).unwrap();
        let err = ClusterToken::read(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ClusterToken::read(&path).is_ok());
    }
}
