//! Argument types and parsers that several commands share: how to reach a cluster, the
//! memory node modes, sizes, durations and ranges; and the process-wide set-up (tracing, the
//! shutdown signal).

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tutti_client::{ClientOptions, Cluster};
use tutti_harness::local::access;
use tutti_memnode::Mode;
use tutti_wire::{CredentialFiles, Dialer, TlsFiles};

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub(crate) enum ModeArg {
    /// No redo log: survives application crashes, not memory node crashes.
    Ram,
    /// Redo log synced at prepare; survives crashes of every node.
    Log,
    /// `log`, and every record also on a mirror in another process before the node relies
    /// on it: a node keeps serving through the loss of its primary (docs/replication.md).
    LogRepl,
    /// `log-repl` with both copies in RAM (`--data` on a tmpfs): no disk, a node survives
    /// the loss of either copy but not of both; a copy does not survive its process.
    RamRepl,
}

impl ModeArg {
    pub(crate) fn mode(self) -> Mode {
        match self {
            ModeArg::Ram => Mode::Ram,
            ModeArg::Log | ModeArg::LogRepl | ModeArg::RamRepl => Mode::Log,
        }
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            ModeArg::Ram => "ram",
            ModeArg::Log => "log",
            ModeArg::LogRepl => "log-repl",
            ModeArg::RamRepl => "ram-repl",
        }
    }
    /// Whether each node has a primary and a mirror.
    pub(crate) fn replicated(self) -> bool {
        matches!(self, ModeArg::LogRepl | ModeArg::RamRepl)
    }
}

#[derive(Args)]
pub(crate) struct ClusterArg {
    /// Manager address (or a manager group's addresses, comma-separated), or a data
    /// directory / cluster.json written by `tutti up`.
    #[arg(long, global = true, default_value = "./tutti-data")]
    cluster: String,
    /// Give up after this long (retries included).
    #[arg(long, global = true, default_value_t = 10_000)]
    deadline_ms: u64,
}

impl ClusterArg {
    pub(crate) fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }

    /// The existing log `name` on the cluster, with this deadline.
    pub(crate) async fn open_log(
        &self,
        dialer: &Dialer,
        name: &str,
    ) -> Result<tutti_log::Log, String> {
        let cluster = self.connect(dialer).await?;
        let opts = tutti_log::LogOptions {
            deadline: self.deadline(),
            ..tutti_log::LogOptions::default()
        };
        (tutti_log::Log::open(&cluster, name, opts).await).map_err(|e| e.to_string())
    }

    /// The managers' addresses (one, or a group's comma-separated) and the credentials
    /// cluster.json records.
    pub(crate) fn access(&self) -> Result<(String, CredentialFiles), String> {
        access(&self.cluster).map_err(|e| e.to_string())
    }

    pub(crate) async fn connect(&self, dialer: &Dialer) -> Result<Cluster, String> {
        let (addr, files) = self.access()?;
        let opts = ClientOptions {
            deadline: Duration::from_millis(self.deadline_ms),
            dialer: with_cluster_credentials(dialer, &files)?,
            ..ClientOptions::default()
        };
        Cluster::connect(&addr, opts)
            .await
            .map_err(|e| e.to_string())
    }
}

/// What this process proves to its peers and asks of them (every command takes these).
#[derive(Args)]
pub(crate) struct CredentialArgs {
    /// The cluster token, in a file only its owner can read (`tutti token new FILE`). With
    /// it, this process proves the token on every connection and refuses peers that do not.
    /// `--cluster DIR` finds what `tutti up --token-file` recorded there.
    #[arg(long, global = true, env = "TUTTI_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Mutual TLS: this process's certificate (PEM, then any intermediates), with --tls-key
    /// and --tls-ca (`tutti tls new DIR` makes all three). Every connection is then TLS 1.3,
    /// each end checking the other's certificate against --tls-ca.
    #[arg(long, global = true, env = "TUTTI_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM, mode 0600).
    #[arg(long, global = true, env = "TUTTI_TLS_KEY", value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The certificates (PEM) that peers' certificates must lead to.
    #[arg(long, global = true, env = "TUTTI_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
}

impl CredentialArgs {
    pub(crate) fn files(&self) -> Result<CredentialFiles, String> {
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                ca: ca.clone(),
            }),
            (None, None, None) => None,
            _ => return Err("TLS needs all three of --tls-cert, --tls-key and --tls-ca".into()),
        };
        Ok(CredentialFiles {
            token_file: self.token_file.clone(),
            tls,
        })
    }
}

/// `dialer`, with what `files` (from cluster.json) names where its own flags gave nothing.
pub(crate) fn with_cluster_credentials(
    dialer: &Dialer,
    files: &CredentialFiles,
) -> Result<Dialer, String> {
    let own = dialer.credentials();
    let missing = CredentialFiles {
        token_file: files.token_file.clone().filter(|_| own.token.is_none()),
        tls: files.tls.clone().filter(|_| own.tls.is_none()),
    };
    let credentials = own.clone().or(missing.load()?);
    Ok(dialer.clone().with_credentials(credentials))
}

/// A size per second, or 0 for no limit.
pub(crate) fn parse_rate(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        _ => parse_size(s),
    }
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => {
            let mult = match s[i..]
                .trim()
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1u64 << 40,
                other => return Err(format!("unknown size suffix {other:?} (use K, M, G or T)")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size {s:?} is zero or too large"))
}

/// Seconds from "600", "600s", "10m" or "1h".
pub(crate) fn parse_duration_s(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|e| format!("duration {s:?}: {e}"))?;
    let unit_s = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown duration unit {other:?} (use s, m or h)")),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(n * unit_s)
}

pub(crate) fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let (lo, hi) = s.split_once('-').ok_or("expected MIN-MAX, e.g. 1-4")?;
    let (lo, hi): (f64, f64) = (
        lo.trim().parse().map_err(|e| format!("{e}"))?,
        hi.trim().parse().map_err(|e| format!("{e}"))?,
    );
    if lo < 0.0 || hi < lo {
        return Err("expected 0 <= MIN <= MAX".into());
    }
    Ok((lo, hi))
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub(crate) fn init_tracing(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("TUTTI_LOG").unwrap_or_else(|_| default.into());
    // Colours only on a terminal: `tutti up` sends each process's output to a log file.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
