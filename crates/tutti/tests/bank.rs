//! Isolation under concurrency: 16 clients (each its own coordinator and connections) move
//! money between 1,000 accounts on 4 memory nodes with 2-node minitransactions. The total
//! never changes, no balance goes negative, and every client's counter (updated in the
//! same minitransaction) equals the transfers it saw commit.

mod common;

use rand::SeedableRng;
use std::time::{Duration, Instant};
use tutti::bank::{Bank, TransferKind};
use tutti_client::{ClientOptions, Cluster};

const CLIENTS: u64 = 16;

fn run(mode: &str, kind: TransferKind) {
    let rt = common::runtime();
    let c = common::start(&format!("bank-{mode}-{kind:?}"), 4, mode, &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let bank = Bank {
            accounts: 1000,
            nodes: 4,
            initial_balance: 1000,
            clients: CLIENTS,
        };
        bank.init(&cluster).await.unwrap();
        let until = Instant::now() + Duration::from_secs(4);
        let mut tasks = Vec::new();
        for client in 0..CLIENTS {
            let manager = c.local.file.manager.clone();
            tasks.push(tokio::spawn(async move {
                let cluster = Cluster::connect(&manager, ClientOptions::default())
                    .await
                    .unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(client);
                let (mut committed, mut failed) = (0u64, 0u64);
                while Instant::now() < until {
                    match bank
                        .transfer(&cluster, client, kind, &mut rng)
                        .await
                        .unwrap()
                    {
                        true => committed += 1,
                        false => failed += 1,
                    }
                }
                (committed, failed)
            }));
        }
        let mut seen = Vec::new();
        for t in tasks {
            seen.push(t.await.unwrap());
        }
        let audit = bank.audit(&cluster).await.unwrap();
        assert_eq!(audit.total, 1000 * 1000, "money is conserved");
        assert!(
            audit.min_balance <= 1000 * 1000,
            "no balance wrapped below zero"
        );
        let committed: Vec<u64> = seen.iter().map(|s| s.0).collect();
        assert_eq!(
            audit.counters, committed,
            "each counter equals the commits its client saw"
        );
        let total: u64 = committed.iter().sum();
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
