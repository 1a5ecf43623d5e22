//! `tutti backup create | verify | restore`: consistent backups taken while the cluster
//! serves (Sinfonia §4.8), checked, and restored as a new local cluster. The protocol and the
//! format are in `tutti-backup`; this parses, calls and prints JSON.

use super::args::ClusterArg;
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tutti_wire::Dialer;

#[derive(Args)]
pub(crate) struct BackupArgs {
    #[command(subcommand)]
    command: BackupCommand,
}

#[derive(Subcommand)]
enum BackupCommand {
    /// Back up every memory node into DEST (a new or empty directory) while the cluster
    /// serves, and print {"backup", "id", "nodes", "base", "regions", "data_bytes", "fenced_ms",
    /// "copy_ms", "total_ms"}.
    ///
    /// The cut is the same point on every node: each node is fenced in node-id order (new
    /// minitransactions that would lock there abort and retry) until the locks held there
    /// drain, then every node keeps its image as of that point by copy-on-write while
    /// minitransactions go on, and the images are copied out. The manifest is written last;
    /// a failed backup removes what it wrote. See docs/backup.md.
    Create {
        dest: PathBuf,
        #[command(flatten)]
        cluster: ClusterArg,
        /// How long the fences wait for locks to drain before the attempt is given up (the
        /// fences come down; it is tried again, up to --attempts times).
        #[arg(long, default_value_t = 5_000)]
        lock_timeout_ms: u64,
        /// Attempts before giving up. An attempt ends without a backup when locks do not
        /// drain, when another backup holds a node (the next attempt then waits 11 s for its
        /// cut to lapse), or when a node is lost under it (a node that restarts loses its cut;
        /// the next attempt starts over, 1 s later, once every node is back).
        #[arg(long, default_value_t = 3)]
        attempts: u32,
        /// How long each attempt waits for every memory node to be up and answering (one
        /// restarting, or failing over to its mirror) before the backup gives up.
        #[arg(long, default_value_t = 20)]
        node_wait_s: u64,
        /// Store at most this many bytes per second (suffixes K, M, G; 0: as fast as it
        /// goes), so that the copy leaves the cluster's disk and CPUs to it. Measured on a
        /// 4-node cluster under load: unlimited (250-320 MiB/s) cost 42-50 % of its
        /// throughput while it ran, 32M 6-15 % (docs/backup.md). The nodes keep the pages
        /// written ahead of a slower copy in memory meanwhile.
        #[arg(long, default_value = "32M", value_parser = super::args::parse_rate)]
        max_rate: u64,
        /// An incremental backup from this one (a backup's directory): a node whose last
        /// completed backup that is gives only the pages written since its cut; a node that
        /// restarted since, or joined, gives all of them. A restore reads the chain of bases,
        /// so keep them.
        #[arg(long, value_name = "BACKUP")]
        since: Option<PathBuf>,
    },
    /// Check a backup: the manifest, every image file's length and CRC, every run's CRC,
    /// and the same of every base an incremental backup starts from. Prints {"backup",
    /// "ok": true, "nodes", "data_bytes", "chain"}; exits 1 if anything is wrong.
    Verify { dest: PathBuf },
    /// Make a new local cluster of the backup in DEST: --data (a new or empty directory)
    /// then holds what `tutti up --data DIR` starts, in log mode on 127.0.0.1, with the
    /// backup's node ids, sizes, images and regions. Checks the backup first.
    Restore {
        dest: PathBuf,
        #[arg(long)]
        data: PathBuf,
    },
}

pub(crate) async fn run(a: BackupArgs, dialer: &Dialer) -> Result<(), String> {
    match a.command {
        BackupCommand::Create {
            dest,
            cluster,
            lock_timeout_ms,
            attempts,
            node_wait_s,
            max_rate,
            since,
        } => {
            let start = Instant::now();
            let handle = cluster.connect(dialer).await?;
            let opts = tutti_backup::CreateOptions {
                lock_timeout: Duration::from_millis(lock_timeout_ms),
                attempts: attempts.max(1),
                node_wait: Duration::from_secs(node_wait_s),
                progress: true,
                max_bytes_per_s: (max_rate > 0).then_some(max_rate),
                since,
                ..tutti_backup::CreateOptions::default()
            };
            let manifest = (tutti_backup::create(&handle, &dest, &opts).await)
                .map_err(|e| format!("backup into {}: {e}", dest.display()))?;
            let out = json!({
                "backup": dest,
                "id": manifest.backup,
                "nodes": manifest.nodes,
                "base": manifest.base,
                "regions": manifest.regions.len(),
                "data_bytes": manifest.nodes.iter().map(|n| n.data_bytes).sum::<u64>(),
                "fenced_ms": manifest.fenced_ms,
                "copy_ms": manifest.copy_ms,
                "total_ms": start.elapsed().as_millis() as u64,
            });
            outln!("{out}");
        }
        BackupCommand::Verify { dest } => {
            let manifest = tutti_backup::verify(&dest).map_err(|e| e.to_string())?;
            let chain = tutti_backup::format::chain(&dest, &manifest).map_err(|e| e.to_string())?;
            let out = json!({
                "backup": dest,
                "ok": true,
                "chain": chain.iter().map(|(dir, _)| dir).collect::<Vec<_>>(),
                "id": manifest.backup,
                "nodes": manifest.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
                "data_bytes": manifest.nodes.iter().map(|n| n.data_bytes).sum::<u64>(),
            });
            outln!("{out}");
        }
        BackupCommand::Restore { dest, data } => {
            let restored = tutti_backup::restore(&dest, &data).map_err(|e| e.to_string())?;
            let out = json!({
                "restored": restored.data,
                "nodes": restored.nodes,
                "data_bytes": restored.data_bytes,
                "restore_ms": restored.took.as_millis() as u64,
                "start": format!("tutti up --data {} --nodes {}", restored.data.display(), restored.nodes.len()),
            });
            outln!("{out}");
        }
    }
    Ok(())
}
