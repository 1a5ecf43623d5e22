//! The bank: accounts of 8 bytes (little-endian u64) spread over the memory nodes, money
//! moved between two of them by one minitransaction that also bumps a per-client counter,
//! and audits that read every balance at once. Optionally each transfer also writes a
//! one-byte receipt on every node whose balance it moves, so the check knows exactly which
//! transfers took effect (the simulator turns this on; long runs with unbounded transfers
//! rely on the counters).
//!
//! Layout on every node (addresses in bytes): the set-up marker at 0 (node 1 only), the
//! accounts of the node from 64, its clients' counters after them, then the receipts.

use crate::{Violation, Workload};
use rand::{Rng, RngCore};
use tutti_client::{ExecError, Minitx, Outcome};
use tutti_wire::{CmpOp, NodeId};

const MARKER_ADDR: u64 = 0;
const ACCOUNTS_BASE: u64 = 64;

/// How a transfer checks and moves money.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferKind {
    /// Read both balances, then compare both and write both (two minitransactions).
    Cas,
    /// `balance >= amount` as an ordered compare, then two `add` items.
    Add,
}

impl std::str::FromStr for TransferKind {
    type Err = String;

    fn from_str(s: &str) -> Result<TransferKind, String> {
        match s {
            "cas" => Ok(TransferKind::Cas),
            "add" => Ok(TransferKind::Add),
            other => Err(format!("unknown transfer kind {other:?}: cas or add")),
        }
    }
}

/// One operation of a client.
#[derive(Clone, Copy, Debug)]
pub enum BankOp {
    /// A compare-and-swap transfer reading its balances first.
    Read { from: u64, to: u64 },
    /// A transfer's minitransaction moving the money; `receipt` indexes the client's
    /// receipts when they are on.
    Move {
        from: u64,
        to: u64,
        amount: u64,
        receipt: Option<u64>,
    },
    /// Reads every balance; a committed audit must see the whole money.
    Audit,
}

/// What a client saw of a transfer that could have moved money.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Committed,
    Aborted,
    Unknown,
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    receipt: u64,
    from: u64,
    to: u64,
    amount: u64,
    seen: Seen,
}

#[derive(Clone, Debug, Default)]
struct Client {
    committed: u64,
    /// Transfers whose outcome the client does not know (errors, kills): each may or may
    /// not have moved money.
    unknown: u64,
    /// With receipts: every transfer that could have moved money.
    transfers: Vec<Transfer>,
    next_receipt: u64,
    /// Totals seen by committed audits.
    audits: Vec<u64>,
    /// A valid minitransaction the cluster refused: always a bug.
    rejected: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Bank {
    accounts: u64,
    nodes: NodeId,
    initial_balance: u64,
    clients: u64,
    kind: TransferKind,
    audit_probability: f64,
    /// Receipts per client (the most transfers a client may run), or none.
    receipts: Option<u64>,
    model: Vec<Client>,
}

impl Bank {
    /// `accounts` accounts holding 1,000 each, spread over `nodes` nodes, moved by
    /// `clients` clients with `add` transfers, no audits, no receipts.
    pub fn new(accounts: u64, nodes: NodeId, clients: u64) -> Bank {
        assert!(accounts >= 2 && nodes >= 1 && clients >= 1);
        Bank {
            accounts,
            nodes,
            initial_balance: 1000,
            clients,
            kind: TransferKind::Add,
            audit_probability: 0.0,
            receipts: None,
            model: vec![Client::default(); clients as usize],
        }
    }

    pub fn initial_balance(mut self, balance: u64) -> Bank {
        self.initial_balance = balance;
        self
    }

    pub fn kind(mut self, kind: TransferKind) -> Bank {
        self.kind = kind;
        self
    }

    /// The share of operations that are audits.
    pub fn audits(mut self, probability: f64) -> Bank {
        self.audit_probability = probability;
        self
    }

    /// Each transfer writes a receipt; a client may run at most `per_client` transfers.
    pub fn receipts(mut self, per_client: u64) -> Bank {
        self.receipts = Some(per_client);
        self
    }

    /// A transfer moves at most a tenth of an initial balance.
    fn max_amount(&self) -> u64 {
        (self.initial_balance / 10).max(1)
    }

    pub fn total(&self) -> u64 {
        self.initial_balance * self.accounts
    }

    /// Accounts per node (the last node may hold fewer).
    fn accounts_per_node(&self) -> u64 {
        self.accounts.div_ceil(u64::from(self.nodes))
    }

    fn counters_base(&self) -> u64 {
        ACCOUNTS_BASE + self.accounts_per_node() * 8
    }

    fn receipts_base(&self) -> u64 {
        self.counters_base() + self.clients.div_ceil(u64::from(self.nodes)) * 8
    }

    /// Bytes of each node's space the bank uses, from address 0.
    pub fn bytes_per_node(&self) -> u64 {
        self.receipts_base() + self.clients * self.receipts.unwrap_or(0)
    }

    /// Account `i` lives on node `i % nodes + 1`.
    pub fn account(&self, i: u64) -> (NodeId, u64) {
        let nodes = u64::from(self.nodes);
        ((i % nodes) as NodeId + 1, ACCOUNTS_BASE + (i / nodes) * 8)
    }

    pub fn counter(&self, client: u64) -> (NodeId, u64) {
        let nodes = u64::from(self.nodes);
        (
            (client % nodes) as NodeId + 1,
            self.counters_base() + (client / nodes) * 8,
        )
    }

    fn receipt_addr(&self, client: u64, receipt: u64) -> u64 {
        let per_client = self.receipts.expect("receipts are on");
        self.receipts_base() + client * per_client + receipt
    }

    /// The nodes whose balances a transfer moves (one or two).
    fn transfer_nodes(&self, from: u64, to: u64) -> Vec<NodeId> {
        let (nf, nt) = (self.account(from).0, self.account(to).0);
        if nf == nt {
            vec![nf]
        } else {
            vec![nf, nt]
        }
    }

    /// Feeds the model with counts learned elsewhere: a client process that ran transfers
    /// and was killed reports how many it saw commit and how many may have moved money.
    pub fn tally(&mut self, client: u64, committed: u64, unknown: u64) {
        let c = &mut self.model[client as usize];
        c.committed += committed;
        c.unknown += unknown;
    }

    /// Committed, compare-failed and unknown transfers recorded so far.
    pub fn outcomes(&self) -> (u64, u64, u64) {
        let committed = self.model.iter().map(|c| c.committed).sum();
        let unknown = self.model.iter().map(|c| c.unknown).sum();
        let aborted = (self.model.iter().flat_map(|c| &c.transfers))
            .filter(|t| t.seen == Seen::Aborted)
            .count() as u64;
        (committed, aborted, unknown)
    }

    fn transfer(
        &mut self,
        client: u64,
        from: u64,
        to: u64,
        amount: u64,
        tx: Minitx,
    ) -> (BankOp, Minitx) {
        let receipt = self.receipts.map(|per_client| {
            let c = &mut self.model[client as usize];
            assert!(
                c.next_receipt < per_client,
                "client {client} ran out of receipts"
            );
            c.next_receipt += 1;
            c.next_receipt - 1
        });
        let (nc, ac) = self.counter(client);
        let mut tx = tx.add(nc, ac, 1);
        if let Some(r) = receipt {
            let addr = self.receipt_addr(client, r);
            for node in self.transfer_nodes(from, to) {
                tx = tx.write(node, addr, vec![1]);
            }
        }
        let op = BankOp::Move {
            from,
            to,
            amount,
            receipt,
        };
        (op, tx)
    }

    fn record_move(&mut self, client: u64, op: BankOp, ended: Result<&Outcome, &ExecError>) {
        let BankOp::Move {
            from,
            to,
            amount,
            receipt,
        } = op
        else {
            unreachable!("a move")
        };
        let c = &mut self.model[client as usize];
        let seen = match ended {
            Ok(out) if out.committed => Seen::Committed,
            Ok(_) => Seen::Aborted,
            Err(e) => {
                if let ExecError::Rejected { node, message } = e {
                    c.rejected.push(format!("node {node}: {message}"));
                }
                Seen::Unknown
            }
        };
        match seen {
            Seen::Committed => c.committed += 1,
            Seen::Unknown => c.unknown += 1,
            Seen::Aborted => {}
        }
        if let Some(receipt) = receipt {
            c.transfers.push(Transfer {
                receipt,
                from,
                to,
                amount,
                seen,
            });
        }
    }

    /// Checks a backup's cut (the reads of `snapshot()` from the images of the cut) against
    /// this bank, with `before` the bank as it stood when the backup began: the cut holds
    /// every transfer seen committed by then and none seen aborted, each transfer on all of
    /// its nodes or on none, each client's counter between its commits then and its
    /// possible commits now, and all the money.
    pub fn check_cut(&self, before: &Bank, snapshot: &[Vec<u8>]) -> Vec<Violation> {
        let mut cut = self.clone();
        for (now, then) in cut.model.iter_mut().zip(&before.model) {
            now.unknown = now.committed + now.unknown - then.committed;
            now.committed = then.committed;
            now.audits.clear();
            for t in &mut now.transfers {
                let committed_then = (then.transfers.iter())
                    .any(|b| b.receipt == t.receipt && b.seen == Seen::Committed);
                if t.seen == Seen::Committed && !committed_then {
                    t.seen = Seen::Unknown;
                }
            }
        }
        cut.check(snapshot)
    }

    fn receipts_of(&self) -> impl Iterator<Item = (u64, &Transfer)> + '_ {
        (0..self.clients)
            .flat_map(move |c| self.model[c as usize].transfers.iter().map(move |t| (c, t)))
    }
}

fn u64_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("an 8-byte read"))
}

impl Workload for Bank {
    type Op = BankOp;

    fn setup(&self) -> Minitx {
        let mut tx = Minitx::new()
            .class("bank-setup")
            .compare(1, MARKER_ADDR, vec![0; 8])
            .write(1, MARKER_ADDR, 1u64.to_le_bytes().to_vec());
        for i in 0..self.accounts {
            let (n, a) = self.account(i);
            tx = tx.write(n, a, self.initial_balance.to_le_bytes().to_vec());
        }
        tx
    }

    fn next(&mut self, client: u64, rng: &mut dyn RngCore) -> (BankOp, Minitx) {
        if self.audit_probability > 0.0 && rng.gen_bool(self.audit_probability) {
            let tx = (0..self.accounts).fold(Minitx::new().class("bank-audit"), |tx, i| {
                let (n, a) = self.account(i);
                tx.read(n, a, 8)
            });
            return (BankOp::Audit, tx);
        }
        let from = rng.gen_range(0..self.accounts);
        let to = (from + rng.gen_range(1..self.accounts)) % self.accounts;
        let ((nf, af), (nt, at)) = (self.account(from), self.account(to));
        match self.kind {
            TransferKind::Cas => {
                let tx = Minitx::new()
                    .class("bank-read")
                    .read(nf, af, 8)
                    .read(nt, at, 8);
                (BankOp::Read { from, to }, tx)
            }
            TransferKind::Add => {
                let amount = rng.gen_range(1..=self.max_amount());
                let tx = Minitx::new()
                    .class("transfer-add")
                    .compare_u64(nf, af, CmpOp::Ge, amount)
                    .add(nf, af, -(amount as i64))
                    .add(nt, at, amount as i64);
                self.transfer(client, from, to, amount, tx)
            }
        }
    }

    fn record(
        &mut self,
        client: u64,
        op: &mut BankOp,
        ended: Result<&Outcome, &ExecError>,
        rng: &mut dyn RngCore,
    ) -> Option<Minitx> {
        match *op {
            BankOp::Audit => {
                if let Some(out) = ended.ok().filter(|out| out.committed) {
                    let total = out.reads.iter().map(|r| u64_of(r)).sum();
                    self.model[client as usize].audits.push(total);
                }
                None
            }
            BankOp::Read { from, to } => {
                let out = ended.ok().filter(|out| out.committed)?;
                let (ba, bb) = (u64_of(&out.reads[0]), u64_of(&out.reads[1]));
                if ba == 0 {
                    return None;
                }
                let amount = rng.gen_range(1..=ba.min(self.max_amount()));
                let ((nf, af), (nt, at)) = (self.account(from), self.account(to));
                let tx = Minitx::new()
                    .class("transfer-cas")
                    .compare(nf, af, ba.to_le_bytes().to_vec())
                    .compare(nt, at, bb.to_le_bytes().to_vec())
                    .write(nf, af, (ba - amount).to_le_bytes().to_vec())
                    .write(nt, at, bb.wrapping_add(amount).to_le_bytes().to_vec());
                let (next, tx) = self.transfer(client, from, to, amount, tx);
                *op = next;
                Some(tx)
            }
            BankOp::Move { .. } => {
                self.record_move(client, *op, ended);
                None
            }
        }
    }

    /// Every balance, every counter, then each recorded transfer's receipts.
    fn snapshot(&self) -> Minitx {
        let mut tx = Minitx::new().class("bank-snapshot");
        for i in 0..self.accounts {
            let (n, a) = self.account(i);
            tx = tx.read(n, a, 8);
        }
        for c in 0..self.clients {
            let (n, a) = self.counter(c);
            tx = tx.read(n, a, 8);
        }
        for (c, t) in self.receipts_of() {
            let addr = self.receipt_addr(c, t.receipt);
            for node in self.transfer_nodes(t.from, t.to) {
                tx = tx.read(node, addr, 1);
            }
        }
        tx
    }

    fn check(&self, snapshot: &[Vec<u8>]) -> Vec<Violation> {
        let mut out = Vec::new();
        let (balances, rest) = snapshot.split_at(self.accounts as usize);
        let (counters, mut receipts) = rest.split_at(self.clients as usize);
        let balances: Vec<u64> = balances.iter().map(|b| u64_of(b)).collect();
        let total: u128 = balances.iter().map(|&b| u128::from(b)).sum();
        if total != u128::from(self.total()) {
            let detail = format!(
                "money is not conserved: total {total}, not {}",
                self.total()
            );
            out.push(Violation::new("atomicity", detail));
        }
        for (i, &b) in balances.iter().enumerate() {
            if b > self.total() {
                let detail = format!("account {i} went negative ({b} as u64)");
                out.push(Violation::new("serializability", detail));
            }
        }
        for (c, (client, counter)) in self.model.iter().zip(counters).enumerate() {
            let counter = u64_of(counter);
            if counter < client.committed {
                let detail = format!(
                    "client {c}: {} transfers seen committed but its counter holds {counter}",
                    client.committed
                );
                out.push(Violation::new("durability", detail));
            }
            if counter > client.committed + client.unknown {
                let detail = format!(
                    "client {c}: counter {counter} exceeds {} committed + {} unknown",
                    client.committed, client.unknown
                );
                out.push(Violation::new("atomicity", detail));
            }
            for (i, audit) in client.audits.iter().enumerate() {
                if *audit != self.total() {
                    let detail = format!("client {c} audit {i} saw a total of {audit}");
                    out.push(Violation::new("isolation", detail));
                }
            }
            for rejected in &client.rejected {
                let detail = format!("client {c}: a valid minitransaction was refused: {rejected}");
                out.push(Violation::new("protocol", detail));
            }
        }
        if self.receipts.is_none() {
            return out;
        }
        let mut model: Vec<i128> = vec![i128::from(self.initial_balance); self.accounts as usize];
        for (c, t) in self.receipts_of() {
            let nodes = self.transfer_nodes(t.from, t.to);
            let (present, rest) = receipts.split_at(nodes.len());
            receipts = rest;
            let present: Vec<bool> = present.iter().map(|r| r[0] == 1).collect();
            let applied = present.iter().all(|&p| p);
            let name = format!("client {c} transfer {}", t.receipt);
            if present.iter().any(|&p| p) && !applied {
                let detail = format!("{name}: receipts {present:?} on nodes {nodes:?}");
                out.push(Violation::new("atomicity", detail));
            }
            match t.seen {
                Seen::Committed if !applied => {
                    let detail = format!("{name} was reported committed but is not applied");
                    out.push(Violation::new("durability", detail));
                }
                Seen::Aborted if applied => {
                    let detail = format!("{name} was reported aborted but is applied");
                    out.push(Violation::new("atomicity", detail));
                }
                _ => {}
            }
            if applied {
                model[t.from as usize] -= i128::from(t.amount);
                model[t.to as usize] += i128::from(t.amount);
            }
        }
        for (i, (&b, &m)) in balances.iter().zip(&model).enumerate() {
            if i128::from(b) != m {
                let detail = format!("account {i} holds {b}, the reference model {m}");
                out.push(Violation::new("serializability", detail));
            }
        }
        out
    }

    /// Every transfer already seen committed that moved money on `node` has its receipt
    /// there (the node synced its vote before the client heard of the commit).
    fn check_node(&self, node: NodeId, read: &crate::ReadNode<'_>) -> Vec<Violation> {
        if self.receipts.is_none() {
            return Vec::new();
        }
        self.receipts_of()
            .filter(|(_, t)| t.seen == Seen::Committed)
            .filter(|(_, t)| self.transfer_nodes(t.from, t.to).contains(&node))
            .filter(|(c, t)| read(self.receipt_addr(*c, t.receipt), 1).is_some_and(|b| b[0] != 1))
            .map(|(c, t)| {
                let detail = format!(
                    "node {node} recovered without client {c}'s committed transfer {}",
                    t.receipt
                );
                Violation::new("durability", detail)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;
    use tutti_wire::Item;

    /// A perfect single-copy cluster: every minitransaction applies atomically.
    #[derive(Default)]
    struct Memory(BTreeMap<(NodeId, u64), u8>);

    impl Memory {
        fn get(&self, node: NodeId, addr: u64, len: u32) -> Vec<u8> {
            (addr..addr + u64::from(len))
                .map(|a| self.0.get(&(node, a)).copied().unwrap_or(0))
                .collect()
        }

        fn put(&mut self, node: NodeId, addr: u64, bytes: &[u8]) {
            for (i, b) in bytes.iter().enumerate() {
                self.0.insert((node, addr + i as u64), *b);
            }
        }

        fn exec(&mut self, tx: &Minitx) -> Outcome {
            let mut reads = Vec::new();
            let mut committed = true;
            for (node, item) in tx.items() {
                match item {
                    Item::Read { addr, len } => reads.push(self.get(*node, *addr, *len)),
                    Item::Compare { addr, op, bytes } => {
                        let stored = self.get(*node, *addr, bytes.len() as u32);
                        committed &= op.holds(&stored, bytes);
                    }
                    _ => {}
                }
            }
            for (node, item) in tx.items().iter().filter(|_| committed) {
                match item {
                    Item::Write { addr, bytes } => self.put(*node, *addr, bytes),
                    Item::Add { addr, delta } => {
                        let v = u64_of(&self.get(*node, *addr, 8)).wrapping_add(*delta as u64);
                        self.put(*node, *addr, &v.to_le_bytes());
                    }
                    _ => {}
                }
            }
            Outcome {
                committed,
                reads,
                failed_compares: Vec::new(),
            }
        }

        fn snapshot(&mut self, bank: &Bank) -> Vec<Vec<u8>> {
            self.exec(&bank.snapshot()).reads
        }
    }

    fn run(bank: &mut Bank, memory: &mut Memory, ops: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        memory.exec(&bank.setup());
        for i in 0..ops {
            let client = i % bank.clients;
            let (mut op, mut tx) = bank.next(client, &mut rng);
            loop {
                let out = memory.exec(&tx);
                match bank.record(client, &mut op, Ok(&out), &mut rng) {
                    Some(next) => tx = next,
                    None => break,
                }
            }
        }
    }

    #[test]
    fn a_correct_cluster_passes_every_check() {
        for kind in [TransferKind::Add, TransferKind::Cas] {
            let mut bank = Bank::new(12, 3, 3).kind(kind).audits(0.2).receipts(100);
            let mut memory = Memory::default();
            run(&mut bank, &mut memory, 300);
            assert_eq!(bank.check(&memory.snapshot(&bank)), vec![], "{kind:?}");
            assert!(bank.outcomes().0 > 100, "{kind:?}: transfers committed");
        }
    }

    #[test]
    fn a_lost_transfer_is_caught() {
        let mut bank = Bank::new(12, 3, 3).receipts(100);
        let mut memory = Memory::default();
        run(&mut bank, &mut memory, 50);
        // Undo the last committed transfer on the node of its source account only.
        let (c, t) = bank
            .receipts_of()
            .filter(|(_, t)| t.seen == Seen::Committed)
            .last()
            .unwrap();
        let (node, addr) = bank.account(t.from);
        let restored = u64_of(&memory.get(node, addr, 8)) + t.amount;
        memory.put(node, addr, &restored.to_le_bytes());
        memory.put(node, bank.receipt_addr(c, t.receipt), &[0]);
        let kinds: Vec<&str> = bank
            .check(&memory.snapshot(&bank))
            .iter()
            .map(|v| v.kind)
            .collect();
        assert!(
            kinds.contains(&"atomicity") && kinds.contains(&"durability"),
            "{kinds:?}"
        );
        let read = |addr, len| Some(memory.get(node, addr, len));
        assert_eq!(bank.check_node(node, &read).len(), 1);
        let in_flight = |_, _| None;
        assert!(bank.check_node(node, &in_flight).is_empty());
    }

    #[test]
    fn counters_bound_what_clients_saw() {
        let mut bank = Bank::new(8, 2, 2);
        let mut memory = Memory::default();
        run(&mut bank, &mut memory, 40);
        assert_eq!(bank.check(&memory.snapshot(&bank)), vec![]);
        let (nc, ac) = bank.counter(1);
        let bumped = u64_of(&memory.get(nc, ac, 8)) + 1;
        memory.put(nc, ac, &bumped.to_le_bytes());
        let found = bank.check(&memory.snapshot(&bank));
        assert_eq!(found.len(), 1, "{found:?}");
        bank.tally(1, 0, 1);
        assert_eq!(
            bank.check(&memory.snapshot(&bank)),
            vec![],
            "an unknown outcome may have applied"
        );
    }
}
