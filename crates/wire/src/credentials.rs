//! What a process proves to its peers and asks of them: the cluster token (token.rs), and
//! optionally mutual TLS 1.3 with certificates of the cluster's own authority (rustls, ring
//! provider). Both ends of a connection need the same of each (docs/operations.md,
//! "Security").

use crate::token::ClusterToken;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The token and the TLS set-up of a process, either or both. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub token: Option<ClusterToken>,
    pub tls: Option<Arc<Tls>>,
}

impl Credentials {
    /// `self`, with what `other` has and `self` lacks.
    pub fn or(self, other: Credentials) -> Credentials {
        Credentials {
            token: self.token.or(other.token),
            tls: self.tls.or(other.tls),
        }
    }

    /// Whether a peer must prove something before it is served.
    pub fn authenticates_peers(&self) -> bool {
        self.token.is_some() || self.tls.is_some()
    }
}

/// Where a process's credentials are: what `--token-file`, `--tls-cert`, `--tls-key` and
/// `--tls-ca` name, and what a local cluster's cluster.json records for its clients.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialFiles {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsFiles>,
}

/// A certificate chain and its key (PEM), and the authority's certificates (PEM).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl CredentialFiles {
    /// Reads the token and loads the TLS set-up the files name.
    pub fn load(&self) -> Result<Credentials, String> {
        let token = (self.token_file.as_deref())
            .map(ClusterToken::read)
            .transpose()
            .map_err(|e| e.to_string())?;
        let tls = (self.tls.as_ref())
            .map(|t| Tls::load(&t.cert, &t.key, &t.ca).map(Arc::new))
            .transpose()?;
        Ok(Credentials { token, tls })
    }

    /// The same files, named by absolute paths (for processes started elsewhere).
    pub fn absolute(&self) -> Result<CredentialFiles, String> {
        let abs = |p: &Path| {
            p.canonicalize()
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        Ok(CredentialFiles {
            token_file: self.token_file.as_deref().map(abs).transpose()?,
            tls: match &self.tls {
                Some(t) => Some(TlsFiles {
                    cert: abs(&t.cert)?,
                    key: abs(&t.key)?,
                    ca: abs(&t.ca)?,
                }),
                None => None,
            },
        })
    }

    /// The flags that give a `tutti` process these files.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        if let Some(path) = &self.token_file {
            flags.extend(["--token-file".into(), path.display().to_string()]);
        }
        if let Some(t) = &self.tls {
            for (flag, path) in [
                ("--tls-cert", &t.cert),
                ("--tls-key", &t.key),
                ("--tls-ca", &t.ca),
            ] {
                flags.extend([flag.into(), path.display().to_string()]);
            }
        }
        flags
    }
}

/// Mutual TLS: this process's certificate chain and key, and the authority whose
/// certificates it accepts from peers. Every connection is TLS 1.3; each end presents its
/// certificate and checks the other's, the connector also against the host it dialled.
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

/// Bytes of a key file, at most.
const KEY_FILE_BYTES_MAX: u64 = 64 << 10;

/// The bytes of `path`, a file that no one but its owner may read or write (as ssh and
/// PostgreSQL ask of their keys): a secret others can read protects nothing.
pub(crate) fn read_private(path: &Path, bytes_max: u64) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {mode:03o} lets others read it; `chmod 600 {}`",
            path.display()
        ));
    }
    if meta.len() > bytes_max {
        return Err(format!("{} bytes, more than {bytes_max}", meta.len()));
    }
    std::fs::read(path).map_err(|e| e.to_string())
}

/// An error about the file at `path`, naming it.
fn at(path: &Path) -> impl Fn(String) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

impl Tls {
    /// Loads `cert` (PEM: this process's certificate, then any intermediates), `key` (PEM,
    /// mode 0600) and `ca` (PEM: the certificates that peers' chains must lead to).
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Tls, String> {
        let pem = |path: &Path| -> Result<Vec<CertificateDer<'static>>, String> {
            let certs: Result<Vec<_>, _> = (CertificateDer::pem_file_iter(path))
                .map_err(|e| at(path)(e.to_string()))?
                .collect();
            let certs = certs.map_err(|e| at(path)(e.to_string()))?;
            if certs.is_empty() {
                return Err(at(path)("no PEM certificate in it".into()));
            }
            Ok(certs)
        };
        let chain = pem(cert)?;
        let mut roots = rustls::RootCertStore::empty();
        for c in pem(ca)? {
            roots.add(c).map_err(|e| at(ca)(e.to_string()))?;
        }
        let key_pem = read_private(key, KEY_FILE_BYTES_MAX).map_err(at(key))?;
        let private =
            PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| at(key)(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = [&rustls::version::TLS13];
        let roots = Arc::new(roots);
        let client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), private.clone_key())
            .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?;
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| at(ca)(e.to_string()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, private)
            .map_err(|e| at(cert)(e.to_string()))?;
        Ok(Tls {
            connector: Arc::new(client).into(),
            acceptor: Arc::new(server).into(),
        })
    }

    pub(crate) fn connector(&self) -> &tokio_rustls::TlsConnector {
        &self.connector
    }

    pub(crate) fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }
}

/// The name a connector checks the acceptor's certificate against: the host of `addr`
/// (`HOST:PORT`, an IP address or a DNS name).
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| format!("{addr}: {e}"))
}

/// Refuses to serve on an address beyond loopback without a token or TLS: anyone who can
/// reach the port could otherwise read and write every byte of the cluster.
pub fn require_credentials_beyond_loopback(
    listening: SocketAddr,
    credentials: &Credentials,
) -> Result<(), String> {
    if listening.ip().is_loopback() || credentials.authenticates_peers() {
        return Ok(());
    }
    Err(format!(
        "{listening} is reachable from other machines, and this process has no cluster token \
         and no TLS: give every process of the cluster the same --token-file FILE (`tutti \
         token new FILE` makes one) or TLS certificates (`tutti tls new`), or listen on 127.0.0.1"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_may_serve_without_credentials() {
        let open: SocketAddr = "0.0.0.0:7701".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:7701".parse().unwrap();
        let none = Credentials::default();
        assert!(require_credentials_beyond_loopback(local, &none).is_ok());
        assert!(require_credentials_beyond_loopback(open, &none).is_err());
        let token = Credentials {
            token: Some(ClusterToken::new(b"0123456789abcdef").unwrap()),
            tls: None,
        };
        assert!(require_credentials_beyond_loopback(open, &token).is_ok());
    }

    #[test]
    fn the_server_name_is_the_dialled_host() {
        assert_eq!(
            server_name("127.0.0.1:7701").unwrap(),
            ServerName::try_from("127.0.0.1").unwrap()
        );
        assert_eq!(
            server_name("[::1]:7701").unwrap(),
            ServerName::try_from("::1").unwrap()
        );
        assert_eq!(
            server_name("node-1.example:7701").unwrap(),
            ServerName::try_from("node-1.example").unwrap()
        );
    }
}
