//! `tutti workload` (hidden): a client process of `tutti chaos` and the crash tests, running
//! bank transfers and register operations until killed, one line per committed transfer.

use super::args::ClusterArg;
use clap::Args;
use rand::SeedableRng;
use std::path::PathBuf;
use std::time::Duration;
use tutti_wire::Dialer;
use tutti_workload::{BankOp, TransferKind};

#[derive(Args)]
pub(crate) struct WorkloadArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    #[arg(long, default_value_t = 16)]
    clients: u64,
    #[arg(long)]
    client_id: u64,
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// How transfers move money: `cas` (read both balances, then compare and write both)
    /// or `add` (an ordered compare and two adds).
    #[arg(long, default_value = "cas")]
    kind: TransferKind,
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Relative frequencies of the operations.
    #[arg(long, default_value = "transfer=1")]
    mix: tutti_harness::chaos::Mix,
    /// Record register operations here (required if the mix has any).
    #[arg(long)]
    history: Option<PathBuf>,
}

pub(crate) async fn run(a: WorkloadArgs, dialer: &Dialer) -> Result<(), String> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tutti_harness::chaos::MixOp;
    use tutti_harness::registers::{History, RegisterClient};
    let cluster = a.cluster.connect(dialer).await?;
    let bank = tutti_workload::Bank::new(a.accounts, a.nodes, a.clients).kind(a.kind);
    let history = match (&a.history, a.mix.has_registers()) {
        (Some(path), _) => Some(Arc::new(
            History::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        (None, true) => return Err("a mix with register operations needs --history".into()),
        (None, false) => None,
    };
    let committed = Arc::new(AtomicU64::new(0));
    let until = std::time::Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut tasks = Vec::new();
    for task in 0..a.tasks {
        let (cluster, committed, history) = (cluster.clone(), committed.clone(), history.clone());
        let (client, mix, nodes) = (a.client_id, a.mix, a.nodes);
        let mut bank = bank.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::from_entropy();
            let name = format!("{client}.{}.{task}", std::process::id());
            let mut registers = history
                .as_deref()
                .map(|h| RegisterClient::new(&cluster, h, nodes, name));
            while std::time::Instant::now() < until {
                let op = mix.pick(&mut rng);
                let line = match (op, registers.as_mut()) {
                    (MixOp::Register(op), Some(r)) => {
                        r.run(op, &mut rng).await;
                        continue;
                    }
                    (MixOp::Register(_), None) => unreachable!("checked above"),
                    (MixOp::Transfer, _) => {
                        let ran =
                            tutti_harness::workload::run_op(&cluster, &mut bank, client, &mut rng);
                        match ran.await {
                            (BankOp::Move { .. }, Ok(out)) if out.committed => {
                                let n = committed.fetch_add(1, Ordering::SeqCst) + 1;
                                format!("committed {n}")
                            }
                            (BankOp::Move { .. }, Err(e)) => format!("error {e}"),
                            _ => continue,
                        }
                    }
                };
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
