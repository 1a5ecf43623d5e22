//! `tutti tls new DIR`: a cluster's own certificate authority and a certificate signed by
//! it, for `--tls-cert`, `--tls-key` and `--tls-ca`.

use super::out::outln;
use super::token::write_private;
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub(crate) struct TlsArgs {
    #[command(subcommand)]
    command: TlsCommand,
}

#[derive(Subcommand)]
enum TlsCommand {
    /// Make DIR/NAME.pem and DIR/NAME.key, a certificate for the given hosts signed by the
    /// cluster's authority DIR/ca.pem (made first, with DIR/ca.key, if DIR has none).
    ///
    /// Prints {"ca", "cert", "key", "hosts", "new_ca"}. Give every process
    /// `--tls-cert DIR/NAME.pem --tls-key DIR/NAME.key --tls-ca DIR/ca.pem`. A certificate
    /// serves both ends of a connection; a connector checks that the acceptor's names the
    /// host it dialled, so list every address (IP or DNS name) a process is reached at.
    /// Keep DIR/ca.key away from the cluster's machines once the certificates are made.
    New {
        dir: PathBuf,
        /// Hosts the certificate names (repeatable).
        #[arg(long = "host", default_values_t = ["127.0.0.1".to_string(), "localhost".to_string()])]
        hosts: Vec<String>,
        /// File name of the certificate and key (NAME.pem, NAME.key).
        #[arg(long, default_value = "node")]
        name: String,
        /// Replace NAME.pem and NAME.key if they exist.
        #[arg(long)]
        force: bool,
    },
}

pub(crate) fn run(a: TlsArgs) -> Result<(), String> {
    let TlsCommand::New {
        dir,
        hosts,
        name,
        force,
    } = a.command;
    if name.is_empty() || name == "ca" || name.contains('/') {
        return Err(format!("--name {name:?}: a file name other than \"ca\""));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let (ca_pem, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let new_ca = !ca_pem.exists();
    let issuer = if new_ca {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        (params.distinguished_name).push(DnType::CommonName, "tutti cluster authority");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
        write_private(&ca_key, &key.serialize_pem(), false)?;
        write_private(&ca_pem, &cert.pem(), false)?;
        Issuer::new(params, key)
    } else {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
        let key =
            KeyPair::from_pem(&read(&ca_key)?).map_err(|e| format!("{}: {e}", ca_key.display()))?;
        Issuer::from_ca_cert_pem(&read(&ca_pem)?, key)
            .map_err(|e| format!("{}: {e}", ca_pem.display()))?
    };
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(hosts.clone()).map_err(|e| format!("--host: {e}"))?;
    (params.distinguished_name).push(DnType::CommonName, format!("tutti {name}"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write_private(&key_path, &key.serialize_pem(), force)?;
    write_private(&cert_path, &cert.pem(), force)?;
    let out = json!({
        "ca": ca_pem, "cert": cert_path, "key": key_path, "hosts": hosts, "new_ca": new_ca,
    });
    outln!("{out}");
    Ok(())
}
