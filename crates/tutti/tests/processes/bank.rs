//! Isolation under concurrency: 16 clients (each its own coordinator and connections) move
//! money between 1,000 accounts on 4 memory nodes, running the bank workload the simulator
//! runs. The total never changes, no balance goes negative, and every client's counter
//! (updated in the same minitransaction) equals the transfers it saw commit.

use crate::common;

use rand::SeedableRng;
use std::time::{Duration, Instant};
use tutti_client::{ClientOptions, Cluster};
use tutti_workload::{Bank, BankOp, TransferKind};

const CLIENTS: u64 = 16;

fn run(mode: &str, kind: TransferKind) {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start(&format!("bank-{mode}-{kind:?}"), 4, mode, &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let mut bank = Bank::new(1000, 4, CLIENTS).kind(kind);
        tutti_harness::workload::setup(&cluster, &bank).await.unwrap();
        let until = Instant::now() + Duration::from_secs(4);
        let mut tasks = Vec::new();
        for client in 0..CLIENTS {
            let manager = c.local.file.manager.clone();
            let mut bank = bank.clone();
            tasks.push(tokio::spawn(async move {
                let cluster = Cluster::connect(&manager, ClientOptions::default())
                    .await
                    .unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(client);
                let (mut committed, mut failed) = (0u64, 0u64);
                while Instant::now() < until {
                    let ran = tutti_harness::workload::run_op(&cluster, &mut bank, client, &mut rng);
                    match ran.await {
                        (BankOp::Move { .. }, Ok(out)) => match out.committed {
                            true => committed += 1,
                            false => failed += 1,
                        },
                        (_, Ok(_)) => failed += 1,
                        (op, Err(e)) => panic!("{op:?}: {e}"),
                    }
                }
                (committed, failed)
            }));
        }
        let mut seen = Vec::new();
        for t in tasks {
            seen.push(t.await.unwrap());
        }
        for (client, (committed, _)) in seen.iter().enumerate() {
            bank.tally(client as u64, *committed, 0);
        }
        let violations = tutti_harness::workload::check(&cluster, &bank).await.unwrap();
        assert_eq!(violations, vec![], "money conserved, no balance below zero, each counter equals the commits its client saw");
        let total: u64 = seen.iter().map(|s| s.0).sum();
        assert!(
            total > 100,
            "the workload made progress ({total} transfers)"
        );
        eprintln!(
            "{mode} {kind:?}: {total} transfers committed, {} compare failures",
            seen.iter().map(|s| s.1).sum::<u64>()
        );
        common::assert_idle(&cluster, Duration::from_secs(2)).await;
    });
}

#[test]
fn cas_transfers_in_ram_mode() {
    run("ram", TransferKind::Cas);
}

#[test]
fn cas_transfers_in_log_mode() {
    run("log", TransferKind::Cas);
}

#[test]
fn add_transfers_in_ram_mode() {
    run("ram", TransferKind::Add);
}

#[test]
fn add_transfers_in_log_mode() {
    run("log", TransferKind::Add);
}
