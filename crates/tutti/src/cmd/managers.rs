//! `tutti managers`: where each manager of the cluster stands in its Raft group (role,
//! term, leader, log indexes), asked of every one of them, whichever leads.

use super::args::{with_cluster_credentials, ClusterArg};
use super::out::outln;
use clap::Args;
use std::time::Duration;
use tutti_wire::{Connection, Dialer, ManagerStatus, Request, Response};

#[derive(Args)]
pub(crate) struct ManagersArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// One JSON object per manager, in an array: `addr` and either its status (`id`,
    /// `managers`, `role`, `term`, `leader`, `last_index`, `commit`, `applied`, `epoch`)
    /// or `error`.
    #[arg(long)]
    json: bool,
}

/// How long one manager may take to connect and answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

async fn ask(addr: &str, dialer: &Dialer) -> Result<ManagerStatus, String> {
    let asked = async {
        let conn = Connection::connect(addr, tutti_wire::FRAME_BYTES_MAX_DEFAULT, dialer)
            .await
            .map_err(|e| e.to_string())?;
        match conn.call(&Request::ManagerStatus).await {
            Ok(Response::ManagerStatus(s)) => Ok(*s),
            Ok(other) => Err(format!("unexpected reply {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    };
    tokio::time::timeout(ASK_TIMEOUT, asked)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} ms", ASK_TIMEOUT.as_millis())))
}

/// Prints every manager's status; fails (exit status 1) when none of them leads.
pub(crate) async fn run(a: ManagersArgs, dialer: &Dialer) -> Result<(), String> {
    let (list, files) = a.cluster.access()?;
    let dialer = with_cluster_credentials(dialer, &files)?;
    let addrs: Vec<&str> = list.split(',').map(str::trim).collect();
    let answers = futures::future::join_all(addrs.iter().map(|a| ask(a, &dialer))).await;
    let leads = answers
        .iter()
        .any(|s| s.as_ref().is_ok_and(|s| s.role == "leader"));
    if a.json {
        let rows: Vec<serde_json::Value> = (addrs.iter().zip(&answers))
            .map(|(addr, s)| match s {
                Ok(s) => serde_json::json!({
                    "addr": addr, "id": s.id, "managers": s.managers, "role": s.role,
                    "term": s.term, "leader": s.leader, "last_index": s.last_index,
                    "commit": s.commit, "applied": s.applied, "epoch": s.epoch,
                }),
                Err(e) => serde_json::json!({ "addr": addr, "error": e }),
            })
            .collect();
        outln!("{}", serde_json::Value::Array(rows));
    } else {
        outln!(
            "{:<22} {:>3} {:<13} {:>6} {:>10} {:>10} {:>10} {:>6}",
            "manager",
            "id",
            "role",
            "term",
            "last",
            "commit",
            "applied",
            "epoch"
        );
        for (addr, s) in addrs.iter().zip(&answers) {
            match s {
                Ok(s) => outln!(
                    "{addr:<22} {:>3} {:<13} {:>6} {:>10} {:>10} {:>10} {:>6}",
                    s.id,
                    s.role,
                    s.term,
                    s.last_index,
                    s.commit,
                    s.applied,
                    s.epoch
                ),
                Err(e) => outln!("{addr:<22} unreachable: {e}"),
            }
        }
    }
    if leads {
        Ok(())
    } else {
        Err("no manager leads (an election may be under way, or a majority is down)".into())
    }
}
