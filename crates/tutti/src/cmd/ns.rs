//! `tutti ns`: a ZooKeeper-like namespace over the shared log from the command line, one
//! JSON object per call (`watch`: one per event). A failure ZooKeeper would report prints
//! `{"error": CODE, "path": P}` and exits 1. See docs/objects.md, "Namespace".

use super::args::{shutdown_signal, ClusterArg};
use super::items::{hex, to_hex};
use super::obj::{err, host_named, open_log};
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::time::Duration;
use tutti_log::LogOptions;
use tutti_tango::{
    version_or_any, Change, ChangeKind, Code, Kind, Namespace, NamespaceRef, Session, Stat, Tango,
    TangoError,
};
use tutti_wire::Dialer;

/// How often `watch` looks at the log.
const POLL_EVERY: Duration = Duration::from_millis(100);

#[derive(Args)]
pub(crate) struct NsArgs {
    #[command(subcommand)]
    command: NsCommand,
    #[command(flatten)]
    cluster: ClusterArg,
    /// The log the namespace lives in; created (every memory node, 64 MiB each) by the
    /// first `create`.
    #[arg(long, global = true, default_value = "tango")]
    log: String,
    /// The namespace: an object of the log's directory, created by the first `create`.
    #[arg(long, global = true, default_value = "ns")]
    namespace: String,
}

#[derive(Subcommand)]
enum NsCommand {
    /// Create a node: {"path": "/actual/name"} (with --sequential, the parent's 10-digit
    /// counter is appended to the name).
    ///
    /// An ephemeral node belongs to a new session: without --hold it lives until the
    /// session's timeout has passed and any `tutti ns` call expires it; with --hold this
    /// command keeps the session alive until interrupted, then closes it.
    Create {
        path: String,
        /// The node's data, in hex (default: none).
        #[arg(long, default_value = "")]
        data: String,
        #[arg(long)]
        ephemeral: bool,
        #[arg(long)]
        sequential: bool,
        /// An ephemeral node's session timeout.
        #[arg(long, default_value_t = 10_000, requires = "ephemeral")]
        session_timeout_ms: u64,
        /// Keep the ephemeral node's session alive until interrupted (SIGINT, SIGTERM).
        #[arg(long, requires = "ephemeral")]
        hold: bool,
    },
    /// Print a node's data and stat: {"data": HEX, "version": V, ...}.
    Get { path: String },
    /// Set a node's data (HEX; "" for none) if its version is --version: {"version": V},
    /// the new version.
    Set {
        path: String,
        hex: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Delete a node without children if its version is --version: {"deleted": PATH}.
    Delete {
        path: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// List a node's children: {"children": [NAME, ...]}, sorted.
    Ls { path: String },
    /// Print a line per change to the node's data or children until interrupted:
    /// {"event": "created"|"deleted"|"data-changed"|"children-changed", "path": P,
    /// "position": P}.
    Watch { path: String },
}

/// The data argument: hex, or "" for none.
fn data(s: &str) -> Result<Vec<u8>, String> {
    match s {
        "" => Ok(vec![]),
        s => hex(s),
    }
}

/// What a failed call prints: ZooKeeper's code on stdout, the message on stderr.
fn failure(e: TangoError) -> String {
    let (code, path) = match &e {
        TangoError::Namespace { code, path } => (code.name(), path.clone()),
        TangoError::BadPath { path, .. } => (Code::BadArguments.name(), path.clone()),
        _ => return err(e),
    };
    outln!("{}", json!({ "error": code, "path": path }));
    err(e)
}

fn stat(data: Option<&[u8]>, s: &Stat) -> Value {
    let mut out = json!({
        "version": s.version,
        "cversion": s.cversion,
        "created": s.created,
        "modified": s.modified,
        "ephemeral_owner": s.ephemeral_owner,
        "num_children": s.num_children,
        "data_length": s.data_length,
    });
    if let Some(data) = data {
        out["data"] = json!(to_hex(data));
    }
    out
}

pub(crate) async fn run(a: NsArgs, dialer: &Dialer) -> Result<(), String> {
    let cluster = a.cluster.connect(dialer).await?;
    let opts = LogOptions {
        deadline: a.cluster.deadline(),
        ..LogOptions::default()
    };
    let creates = matches!(a.command, NsCommand::Create { .. });
    let client = match open_log(&cluster, &a.log, opts, creates).await? {
        Some(log) => host_named(log, &a.namespace, Kind::Namespace, creates).await?,
        None => None,
    };
    let Some((t, oid)) = client else {
        return empty(a.command).map_err(failure);
    };
    let ns = NamespaceRef(oid);
    ns.expire_overdue(&t).await.map_err(err)?;
    let out = match a.command {
        NsCommand::Create {
            path,
            data: hex_data,
            ephemeral,
            sequential,
            session_timeout_ms,
            hold,
        } => {
            let data = data(&hex_data)?;
            let timeout = Duration::from_millis(session_timeout_ms);
            let session = match ephemeral {
                true => Some(Session::open(&t, ns, timeout).await.map_err(err)?),
                false => None,
            };
            let created = ns
                .create(&t, &path, &data, session.as_ref(), sequential)
                .await;
            let created = created.map_err(failure)?;
            let mut out = json!({ "path": created });
            if let Some(s) = &session {
                out["session"] = json!(s.id);
                out["session_timeout_ms"] = json!(session_timeout_ms);
            }
            if let (Some(session), true) = (session, hold) {
                outln!("{out}");
                return hold_session(&t, ns, session).await;
            }
            out
        }
        NsCommand::Get { path } => {
            let (data, s) = ns.get(&t, &path).await.map_err(failure)?;
            stat(Some(&data), &s)
        }
        NsCommand::Set { path, hex, version } => {
            let data = data(&hex)?;
            let version = ns.set(&t, &path, &data, version_or_any(version)).await;
            json!({ "version": version.map_err(failure)? })
        }
        NsCommand::Delete { path, version } => {
            let deleted = ns.delete(&t, &path, version_or_any(version)).await;
            deleted.map_err(failure)?;
            json!({ "deleted": path })
        }
        NsCommand::Ls { path } => {
            json!({ "children": ns.children(&t, &path).await.map_err(failure)? })
        }
        NsCommand::Watch { path } => return watch(&t, ns, &path).await,
    };
    outln!("{out}");
    Ok(())
}

/// Answers a read on a namespace nobody has written yet (no log, or no such object): it
/// has the root only, and reading it writes nothing.
fn empty(command: NsCommand) -> Result<(), TangoError> {
    let ns = Namespace::default();
    let path = match &command {
        NsCommand::Get { path }
        | NsCommand::Set { path, .. }
        | NsCommand::Delete { path, .. }
        | NsCommand::Ls { path }
        | NsCommand::Watch { path } => path.clone(),
        NsCommand::Create { .. } => unreachable!("create makes the namespace"),
    };
    tutti_tango::namespace::check_path(&path).map_err(|why| TangoError::BadPath {
        path: path.clone(),
        why,
    })?;
    let out = match command {
        NsCommand::Get { .. } if path == "/" => {
            let (data, s) = ns.get("/").expect("the root");
            stat(Some(&data), &s)
        }
        NsCommand::Ls { .. } if path == "/" => json!({ "children": [] }),
        NsCommand::Watch { .. } => {
            return Err(TangoError::NoSuchObject(
                "the namespace (create a node first, then watch)".into(),
            ))
        }
        _ => {
            return Err(TangoError::Namespace {
                code: Code::NoNode,
                path,
            })
        }
    };
    outln!("{out}");
    Ok(())
}

/// Keeps `session` alive until interrupted, then closes it; fails if it expires first (the
/// process was paused past its timeout, or lost the cluster that long).
async fn hold_session(t: &Tango, ns: NamespaceRef, session: Session) -> Result<(), String> {
    // The beating task ends only when a beat finds the session expired.
    let mut beating = session.keep_alive(t, ns);
    tokio::select! {
        _ = shutdown_signal() => {
            beating.abort();
            session.close(t, ns).await.map_err(err)
        }
        _ = &mut beating => {
            outln!("{}", json!({ "error": Code::SessionExpired.name(), "session": session.id }));
            Err(format!("session {} expired", session.id))
        }
    }
}

/// Prints every change to `path`'s data and children, in log order, until interrupted.
async fn watch(t: &Tango, ns: NamespaceRef, path: &str) -> Result<(), String> {
    let (_, mut seen) = ns.changes_after(t, path, 0).await.map_err(failure)?;
    eprintln!("tutti: watching {path} from position {seen}");
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
        ns.expire_overdue(t).await.map_err(err)?;
        let (changes, now) = ns.changes_after(t, path, seen).await.map_err(err)?;
        // Fallen out of the journal: say that both may have changed.
        let changes = changes.unwrap_or_else(|| {
            [ChangeKind::DataChanged, ChangeKind::ChildrenChanged]
                .into_iter()
                .map(|kind| Change {
                    position: now,
                    path: path.into(),
                    kind,
                })
                .collect()
        });
        for change in changes {
            let line = json!({
                "event": change.kind.name(),
                "path": change.path,
                "position": change.position,
            });
            outln!("{line}");
        }
        seen = now;
    }
}
