//! `tutti up`: a local cluster (a manager and N memory nodes as child processes), restarted
//! when a child dies, until Ctrl-C or SIGTERM.

use super::args::{parse_size, shutdown_signal, ModeArg};
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tutti_harness::local::{Layout, LocalCluster};

#[derive(Args)]
pub(crate) struct UpArgs {
    /// Memory nodes to start (numbered 1..N). Fixed when the data directory is created.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[arg(long, value_enum, default_value_t = ModeArg::Log)]
    mode: ModeArg,
    /// Data directory: cluster.json, the manager's state, one directory per node, logs/.
    #[arg(long, default_value = "./tutti-data")]
    data: PathBuf,
    /// Bytes of address space per memory node (suffixes K, M, G accepted).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
}

pub(crate) async fn run(a: UpArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the tutti executable: {e}"))?;
    let layout = Layout {
        nodes: a.nodes,
        mode: a.mode.name().into(),
        size_bytes: a.size,
        node_flags: vec![],
        manager_flags: vec![],
    };
    if a.nodes == 0 || a.nodes > 1000 {
        return Err("--nodes must be between 1 and 1000".into());
    }
    let mut cluster = LocalCluster::open(&exe, &a.data, layout, true).map_err(|e| e.to_string())?;
    cluster.start_all().map_err(|e| e.to_string())?;
    if let Err(e) = cluster.wait_ready(Duration::from_secs(60)).await {
        let tails: Vec<String> = std::iter::once("manager".to_string())
            .chain(cluster.node_ids().iter().map(|id| format!("node-{id}")))
            .map(|n| format!("--- {n}:\n{}", cluster.log_tail(&n)))
            .collect();
        return Err(format!("{e}\n{}", tails.join("\n")));
    }
    println!(
        "tutti: {} memory nodes ({} mode) up; manager at {}",
        cluster.file.nodes.len(),
        cluster.file.mode,
        cluster.file.manager
    );
    println!(
        "tutti: addresses in {}; logs in {}",
        cluster.dir.join("cluster.json").display(),
        cluster.dir.join("logs").display()
    );
    println!(
        "tutti: try  tutti txn --cluster {} write:1:0:68656c6c6f read:1:0:5",
        cluster.file.manager
    );
    println!("tutti: Ctrl-C stops the cluster");
    let mut signal = Box::pin(shutdown_signal());
    // Per child: when it was last started, how many times in a row it died within
    // QUICK_DEATH of a start, and when it is due to start again.
    const QUICK_DEATH: Duration = Duration::from_secs(10);
    const QUICK_DEATHS_MAX: u32 = 5;
    let mut children: std::collections::HashMap<
        String,
        (std::time::Instant, u32, Option<std::time::Instant>),
    > = Default::default();
    let mut failure = None;
    'supervise: loop {
        tokio::select! {
            _ = &mut signal => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let now = std::time::Instant::now();
        for (name, status) in cluster.reap() {
            let log = cluster.dir.join("logs").join(format!("{name}.log"));
            let (started, quick, due) = children.entry(name.clone()).or_insert((now, 0, None));
            *quick = if started.elapsed() < QUICK_DEATH {
                *quick + 1
            } else {
                1
            };
            if *quick > QUICK_DEATHS_MAX {
                failure = Some(format!(
                    "{name} exited {quick} times right after starting ({status}); see {}",
                    log.display()
                ));
                break 'supervise;
            }
            let delay = Duration::from_millis(200 << *quick).min(Duration::from_secs(10));
            eprintln!(
                "tutti: {name} exited ({status}); restarting it in {delay:?}; see {}",
                log.display()
            );
            *due = Some(now + delay);
        }
        for (name, (started, _, due)) in children
            .iter_mut()
            .filter(|(_, c)| c.2.is_some_and(|d| d <= now))
        {
            *due = None;
            *started = now;
            let result = match name.strip_prefix("node-").and_then(|id| id.parse().ok()) {
                Some(id) => cluster.start_node(id),
                None => cluster.start_manager(),
            };
            if let Err(e) = result {
                eprintln!("tutti: restarting {name}: {e}");
            }
        }
    }
    eprintln!("tutti: stopping");
    cluster.stop_all();
    failure.map_or(Ok(()), Err)
}
