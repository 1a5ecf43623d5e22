//! The bank workload: accounts of 8 bytes (little-endian u64) spread over the memory nodes,
//! transfers as multi-node minitransactions, and a per-client counter of committed
//! transfers updated by the same minitransaction, so an audit can check both conservation
//! and that no transfer a client saw commit was lost.

use rand::Rng;
use tutti_client::{Cluster, ExecError, Minitx};
use tutti_wire::{CmpOp, NodeId};

/// Node 1, address 0: set to 1 once accounts are initialised.
const MARKER_ADDR: u64 = 0;
const ACCOUNTS_BASE: u64 = 4096;
const COUNTERS_BASE: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
pub struct Bank {
    pub accounts: u64,
    pub nodes: NodeId,
    pub initial_balance: u64,
    /// Client ids are 0..clients; each has a counter.
    pub clients: u64,
}

/// How a transfer checks and moves money.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransferKind {
    /// Read both balances, then compare both and write both.
    Cas,
    /// `balance >= amount` as an ordered compare, then two `add` items.
    Add,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Audit {
    pub total: u64,
    pub min_balance: u64,
    pub counters: Vec<u64>,
}

impl Bank {
    pub fn account(&self, i: u64) -> (NodeId, u64) {
        (
            (i % u64::from(self.nodes)) as NodeId + 1,
            ACCOUNTS_BASE + (i / u64::from(self.nodes)) * 8,
        )
    }

    pub fn counter(&self, client: u64) -> (NodeId, u64) {
        (
            (client % u64::from(self.nodes)) as NodeId + 1,
            COUNTERS_BASE + client * 8,
        )
    }

    /// Sets every balance, once: a second call finds the marker and does nothing.
    pub async fn init(&self, cluster: &Cluster) -> Result<(), ExecError> {
        let mut tx = Minitx::new()
            .class("bank-init")
            .compare(1, MARKER_ADDR, vec![0; 8])
            .write(1, MARKER_ADDR, 1u64.to_le_bytes().to_vec());
        for i in 0..self.accounts {
            let (n, a) = self.account(i);
            tx = tx.write(n, a, self.initial_balance.to_le_bytes().to_vec());
        }
        cluster.exec_and_commit(&tx).await.map(|_| ())
    }

    fn pick_pair(&self, rng: &mut impl Rng) -> (u64, u64) {
        loop {
            let (a, b) = (
                rng.gen_range(0..self.accounts),
                rng.gen_range(0..self.accounts),
            );
            if self.account(a).0 != self.account(b).0 {
                return (a, b);
            }
        }
    }

    /// One transfer by `client`: `Ok(true)` committed, `Ok(false)` a compare failed (no
    /// money moved), `Err` the outcome may be unknown.
    pub async fn transfer(
        &self,
        cluster: &Cluster,
        client: u64,
        kind: TransferKind,
        rng: &mut (impl Rng + Send),
    ) -> Result<bool, ExecError> {
        let (a, b) = self.pick_pair(rng);
        let ((na, aa), (nb, ab)) = (self.account(a), self.account(b));
        let (nc, ac) = self.counter(client);
        let tx = match kind {
            TransferKind::Cas => {
                let read = Minitx::new()
                    .class("bank-read")
                    .read(na, aa, 8)
                    .read(nb, ab, 8);
                let out = cluster.exec_and_commit(&read).await?;
                let (ba, bb) = (u64_of(&out.reads[0]), u64_of(&out.reads[1]));
                if ba == 0 {
                    return Ok(false);
                }
                let amount = rng.gen_range(1..=ba.min(100));
                Minitx::new()
                    .class("transfer-cas")
                    .compare(na, aa, ba.to_le_bytes().to_vec())
                    .compare(nb, ab, bb.to_le_bytes().to_vec())
                    .write(na, aa, (ba - amount).to_le_bytes().to_vec())
                    .write(nb, ab, (bb + amount).to_le_bytes().to_vec())
                    .add(nc, ac, 1)
            }
            TransferKind::Add => {
                let amount = rng.gen_range(1..=100u64);
                Minitx::new()
                    .class("transfer-add")
                    .compare_u64(na, aa, CmpOp::Ge, amount)
                    .add(na, aa, -(amount as i64))
                    .add(nb, ab, amount as i64)
                    .add(nc, ac, 1)
            }
        };
        Ok(cluster.exec_and_commit(&tx).await?.committed)
    }

    /// Reads every balance and counter in one minitransaction (a consistent snapshot).
    pub async fn audit(&self, cluster: &Cluster) -> Result<Audit, ExecError> {
        let mut tx = Minitx::new().class("bank-audit");
        for i in 0..self.accounts {
            let (n, a) = self.account(i);
            tx = tx.read(n, a, 8);
        }
        for c in 0..self.clients {
            let (n, a) = self.counter(c);
            tx = tx.read(n, a, 8);
        }
        let out = cluster.exec_and_commit(&tx).await?;
        let balances: Vec<u64> = out.reads[..self.accounts as usize]
            .iter()
            .map(|r| u64_of(r))
            .collect();
        Ok(Audit {
            total: balances.iter().sum(),
            min_balance: balances.iter().copied().min().unwrap_or(0),
            counters: out.reads[self.accounts as usize..]
                .iter()
                .map(|r| u64_of(r))
                .collect(),
        })
    }
}

/// The little-endian u64 an 8-byte read returned.
pub(crate) fn u64_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8-byte read"))
}
