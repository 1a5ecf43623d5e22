//! Tango's objects over real processes (`tutti chaos --workload objects`): the loops of a
//! client process (`tutti objects-workload`), each with its own views, the supervisor of
//! those processes, the maintainer that checkpoints, forgets and trims, and the final check.
//!
//! Each client hosts the register `reg`, the map `kv` and three of the eight bank maps
//! (layered partitions: client N hosts `bank-2N`, `bank-2N+1`, `bank-2N+2`, modulo 8). Its
//! register tasks read and write `reg` and `kv`'s keys, recorded as a history of per-key
//! registers (key 0 is `reg`, key K the map's `kK`) that Porcupine checks; its bank tasks
//! move money between accounts of its maps in transactions, each leaving a receipt in the
//! source map, so that the final check can account for every unit; every fourth is large
//! enough to need speculative entries, so that kills leave orphans behind.

use crate::registers::{now_ns, Event, History, Op, Out};
use crate::supervisor::Supervisor;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tutti_log::Log;
use tutti_tango::{Kind, MapRef, RegisterRef, Tango, TangoError, TangoOptions, Tx};

/// The log's name in a chaos run.
pub const LOG: &str = "objects";
pub const BANK_MAPS: u32 = 8;
/// Accounts per bank map (`a0`..), each starting with `OPENING` units.
pub const ACCOUNTS: u32 = 4;
pub const OPENING: i64 = 1000;
/// Keys of `kv` the register tasks use (`k1`..); key 0 is `reg`.
pub const KV_KEYS: u64 = 8;
const REGISTER_TASKS: usize = 2;
const BANK_TASKS: usize = 2;
/// Every this many transfers of a task, one carries pads that put it in speculative entries.
const PADDED_EVERY: u64 = 4;
const PAD_BYTES: usize = 600;

type Table = std::collections::HashMap<Vec<u8>, Vec<u8>>;

fn bank(m: u32) -> String {
    format!("bank-{m}")
}

fn account(a: u32) -> Vec<u8> {
    format!("a{a}").into_bytes()
}

/// The bank maps client `client` hosts.
pub fn hosted_maps(client: u64) -> Vec<u32> {
    let first = (client * 2) as u32;
    (first..first + 3).map(|m| m % BANK_MAPS).collect()
}

/// Every object of the run and its kind.
pub fn objects() -> Vec<(String, Kind)> {
    [
        ("reg".to_string(), Kind::Register),
        ("kv".into(), Kind::Map),
    ]
    .into_iter()
    .chain((0..BANK_MAPS).map(|m| (bank(m), Kind::Map)))
    .collect()
}

fn as_refs(objects: &[(String, Kind)]) -> Vec<(&str, Kind)> {
    objects.iter().map(|(n, k)| (n.as_str(), *k)).collect()
}

fn decode_i64(bytes: Option<Vec<u8>>) -> Option<i64> {
    Some(i64::from_le_bytes(bytes?.try_into().ok()?))
}

/// Creates the objects and opens every account (before any client starts).
pub async fn setup(log: Log) -> Result<(), TangoError> {
    let objects = objects();
    // Clients that host a transfer's written map but not all it read learn its outcome
    // from the decision record its writer (or, if that died, the maintainer) appends.
    let directory = Tango::open(log.clone(), &[], TangoOptions::default()).await?;
    for m in 0..BANK_MAPS {
        directory.create(&bank(m), Kind::Map, true).await?;
    }
    let t = Tango::open(log, &as_refs(&objects), TangoOptions::default()).await?;
    for m in 0..BANK_MAPS {
        let map: MapRef<Table> = MapRef::new(t.hosted_as(&bank(m), Kind::Map)?);
        for a in 0..ACCOUNTS {
            map.put_blind(&t, &account(a), &OPENING.to_le_bytes())
                .await?;
        }
    }
    t.sync().await
}

/// A client's views, reopened from their checkpoints when the log was trimmed past them
/// (a client partitioned away for longer than the maintainer waits).
struct Views {
    log: Log,
    objects: Vec<(String, Kind)>,
    current: tokio::sync::Mutex<(u64, Tango)>,
}

impl Views {
    async fn get(&self) -> (u64, Tango) {
        self.current.lock().await.clone()
    }

    async fn reopen(&self, generation: u64) {
        let mut current = self.current.lock().await;
        if current.0 != generation {
            return;
        }
        let opts = TangoOptions::default();
        if let Ok(t) = Tango::open(self.log.clone(), &as_refs(&self.objects), opts).await {
            *current = (generation + 1, t);
        }
    }
}

/// A client process: register and bank tasks until killed. The history goes to `history`;
/// each transfer prints `begin TAG`, then `committed TAG`, `aborted TAG` or `unknown TAG WHY`.
pub async fn run_client(log: Log, client: u64, incarnation: u64, history: &Path) {
    let history = History::create(history).expect("history file");
    let objects: Vec<(String, Kind)> = (objects().into_iter())
        .filter(|(n, _)| {
            n == "reg" || n == "kv" || hosted_maps(client).iter().any(|&m| *n == bank(m))
        })
        .collect();
    let t = loop {
        match Tango::open(log.clone(), &as_refs(&objects), TangoOptions::default()).await {
            Ok(t) => break t,
            Err(e) => {
                println!("error opening: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let views = std::sync::Arc::new(Views {
        log,
        objects,
        current: tokio::sync::Mutex::new((0, t)),
    });
    let history = std::sync::Arc::new(history);
    let registers = (0..REGISTER_TASKS).map(|task| {
        let (views, history) = (views.clone(), history.clone());
        let name = format!("{client}.{incarnation}.{task}");
        tokio::spawn(async move { register_task(&views, &history, name).await })
    });
    let transfers = (0..BANK_TASKS).map(|task| {
        let views = views.clone();
        let tag = format!("{client}.{incarnation}.t{task}");
        tokio::spawn(async move { bank_task(&views, client, tag).await })
    });
    let tasks: Vec<_> = registers.chain(transfers).collect();
    futures::future::join_all(tasks).await;
}

async fn register_task(views: &Views, history: &History, name: String) {
    let mut rng = rand::rngs::StdRng::from_entropy();
    for seq in 0u64.. {
        let (generation, t) = views.get().await;
        let reg = RegisterRef(t.hosted_as("reg", Kind::Register).expect("hosted"));
        let kv: MapRef<Table> = MapRef::new(t.hosted_as("kv", Kind::Map).expect("hosted"));
        let key = rng.gen_range(0..=KV_KEYS);
        let map_key = format!("k{key}").into_bytes();
        let op = match rng.gen_bool(0.5) {
            true => Op::Read,
            false => Op::Write {
                value: rng.gen_range(1..u64::MAX),
            },
        };
        let id = format!("{name}.{seq}");
        history.record(&Event::Call {
            id: id.clone(),
            t: now_ns(),
            key,
            op,
            part_of: None,
        });
        let result = match (op, key) {
            (Op::Read, 0) => reg.get(&t).await.map(|v| Some(v).filter(|v| !v.is_empty())),
            (Op::Read, _) => kv.get(&t, &map_key).await,
            (Op::Write { value }, 0) => reg.set(&t, &value.to_le_bytes()).await.map(|_| None),
            (Op::Write { value }, _) => {
                (kv.put_blind(&t, &map_key, &value.to_le_bytes()).await).map(|_| None)
            }
            (Op::Cas { .. }, _) => unreachable!("no compare-and-swap on tango's registers"),
        };
        let (out, value) = match (&result, op) {
            (Ok(v), Op::Read) => (
                Out::Ok,
                Some(
                    v.clone()
                        .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap_or_default())),
                ),
            ),
            (Ok(_), _) => (Out::Ok, None),
            // A read that failed had no effect; a write that failed may be in the log.
            (Err(_), Op::Read) => (Out::Aborted, None),
            (Err(_), _) => (Out::Unknown, None),
        };
        history.record(&Event::Return {
            id,
            t: now_ns(),
            out,
            value,
        });
        if let Err(e) = result {
            if matches!(e, TangoError::Trimmed { .. }) {
                views.reopen(generation).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn bank_task(views: &Views, client: u64, tag: String) {
    let mut rng = rand::rngs::StdRng::from_entropy();
    let maps = hosted_maps(client);
    for seq in 0u64.. {
        let (generation, t) = views.get().await;
        let pick = |rng: &mut rand::rngs::StdRng| {
            (
                maps[rng.gen_range(0..maps.len())],
                rng.gen_range(0..ACCOUNTS),
            )
        };
        let from = pick(&mut rng);
        let to = loop {
            let to = pick(&mut rng);
            if to != from {
                break to;
            }
        };
        let amount = rng.gen_range(1..=10i64);
        let tag = format!("{tag}.{seq}");
        println!("begin {tag}");
        let padded = (seq % PADDED_EVERY == PADDED_EVERY - 1).then_some(client);
        match transfer(&t, from, to, amount, &tag, padded).await {
            Ok(true) => println!("committed {tag}"),
            Ok(false) => println!("aborted {tag}"),
            Err(e) => {
                println!("unknown {tag} {e}");
                if matches!(e, TangoError::Trimmed { .. }) {
                    views.reopen(generation).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A receipt: `FROM_MAP FROM_ACCOUNT TO_MAP TO_ACCOUNT AMOUNT`.
fn receipt(from: Account, to: Account, amount: i64) -> Vec<u8> {
    format!("{} {} {} {} {amount}", from.0, from.1, to.0, to.1).into_bytes()
}

fn parse_receipt(bytes: &[u8]) -> Option<Receipt> {
    let text = std::str::from_utf8(bytes).ok()?;
    let w: Vec<&str> = text.split(' ').collect();
    let [fm, fa, tm, ta, amount] = w[..] else {
        return None;
    };
    Some((
        (fm.parse().ok()?, fa.parse().ok()?),
        (tm.parse().ok()?, ta.parse().ok()?),
        amount.parse().ok()?,
    ))
}

/// One transfer as a transaction. `padded`: the client's two pads in the source map are
/// rewritten around the transfer's writes, so that they go in a speculative entry ahead of
/// the commit record (the chaos log's 1 KiB slots hold neither whole).
async fn transfer(
    t: &Tango,
    from: Account,
    to: Account,
    amount: i64,
    tag: &str,
    padded: Option<u64>,
) -> Result<bool, TangoError> {
    let map = |m: u32| t.hosted_as(&bank(m), Kind::Map).map(MapRef::<Table>::new);
    let (fm, tm) = (map(from.0)?, map(to.0)?);
    t.sync().await?;
    let mut tx = t.begin();
    let a = decode_i64(fm.get_in(t, &mut tx, &account(from.1))?).unwrap_or(0);
    let b = decode_i64(tm.get_in(t, &mut tx, &account(to.1))?).unwrap_or(0);
    let pad = |tx: &mut Tx, client: u64, n: u32| {
        fm.put_in(tx, format!("p/{client}/{n}").as_bytes(), &[b'.'; PAD_BYTES]);
    };
    if let Some(client) = padded {
        pad(&mut tx, client, 1);
    }
    fm.put_in(&mut tx, &account(from.1), &(a - amount).to_le_bytes());
    tm.put_in(&mut tx, &account(to.1), &(b + amount).to_le_bytes());
    let receipt_key = format!("r/{tag}").into_bytes();
    fm.put_in(&mut tx, &receipt_key, &receipt(from, to, amount));
    if let Some(client) = padded {
        pad(&mut tx, client, 2);
    }
    Ok(t.end(tx).await?.committed)
}

/// The objects' client processes: `objects-N`, each restarted as a new incarnation with its
/// own output and history files.
pub struct ObjectClients {
    exe: PathBuf,
    manager: String,
    dir: PathBuf,
    pub count: u64,
    processes: Supervisor,
    incarnations: BTreeMap<u64, u64>,
    /// Extra flags of each process (its routes through the chaos proxy).
    pub flags: BTreeMap<String, Vec<String>>,
}

impl ObjectClients {
    pub fn new(exe: &Path, manager: &str, dir: &Path, count: u64) -> ObjectClients {
        ObjectClients {
            exe: exe.to_path_buf(),
            manager: manager.into(),
            dir: dir.to_path_buf(),
            count,
            processes: Supervisor::new(),
            incarnations: BTreeMap::new(),
            flags: BTreeMap::new(),
        }
    }

    pub fn names(&self) -> Vec<String> {
        (0..self.count).map(|i| format!("objects-{i}")).collect()
    }

    pub fn start(&mut self, client: u64) -> std::io::Result<()> {
        let name = format!("objects-{client}");
        let incarnation = self.incarnations.entry(client).or_default();
        *incarnation += 1;
        let out = self.dir.join(format!("{name}-{incarnation}.out"));
        let history = self.dir.join(format!("history-{name}-{incarnation}.jsonl"));
        let mut cmd = Command::new(&self.exe);
        cmd.args(["objects-workload", "--cluster", &self.manager, "--log", LOG])
            .args(["--deadline-ms", "30000", "--client", &client.to_string()])
            .args(["--incarnation", &incarnation.to_string()])
            .arg("--history")
            .arg(&history)
            .args(self.flags.get(&name).into_iter().flatten());
        self.processes.start(&name, cmd, &out)?;
        Ok(())
    }

    pub fn start_all(&mut self) -> std::io::Result<()> {
        (0..self.count).try_for_each(|c| self.start(c))
    }

    pub fn kill(&mut self, client: u64) {
        self.processes.kill(&format!("objects-{client}"));
    }

    pub fn kill_all(&mut self) {
        (0..self.count).for_each(|c| self.kill(c));
    }

    /// Transfers seen committed so far, over every incarnation.
    pub fn committed(&self) -> usize {
        transfers(&self.dir).committed.len()
    }
}

impl Drop for ObjectClients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// What the clients printed about their transfers.
#[derive(Debug, Default)]
pub struct Transfers {
    pub committed: BTreeSet<String>,
    pub aborted: BTreeSet<String>,
    /// Begun and never known to have committed or aborted.
    pub unknown: BTreeSet<String>,
}

/// What every incarnation of every client whose output is in `dir` printed.
pub fn transfers(dir: &Path) -> Transfers {
    let mut t = Transfers::default();
    let files = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_str()?;
            (name.starts_with("objects-") && name.ends_with(".out")).then_some(path)
        });
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            let (Some(what), Some(tag)) = (words.next(), words.next()) else {
                continue;
            };
            let tag = tag.to_string();
            match what {
                "begin" => {
                    t.unknown.insert(tag);
                }
                "committed" if t.unknown.remove(&tag) => {
                    t.committed.insert(tag);
                }
                "aborted" if t.unknown.remove(&tag) => {
                    t.aborted.insert(tag);
                }
                _ => {}
            }
        }
    }
    t
}

/// What the final check found.
#[derive(Debug, Default)]
pub struct ObjectsCheck {
    pub committed: usize,
    pub aborted: usize,
    pub unknown: usize,
    /// Transfers of unknown outcome that the log shows committed.
    pub unknown_committed: usize,
}

/// An account: its map and its number.
type Account = (u32, u32);
/// A receipt's transfer: from, to, amount.
type Receipt = (Account, Account, i64);

/// Checks the bank against the transfers the clients saw (`judge`), as the log has it once
/// every client is stopped.
pub async fn check(log: Log, dir: &Path) -> Result<ObjectsCheck, Vec<String>> {
    let seen = transfers(dir);
    let objects = objects();
    let t = Tango::open(log, &as_refs(&objects), TangoOptions::default())
        .await
        .map_err(|e| vec![format!("open the objects: {e}")])?;
    let mut balances: BTreeMap<Account, i64> = BTreeMap::new();
    let mut receipts: BTreeMap<String, Receipt> = BTreeMap::new();
    let mut violations = vec![];
    for m in 0..BANK_MAPS {
        let oid = (t.hosted_as(&bank(m), Kind::Map)).map_err(|e| vec![e.to_string()])?;
        let entries =
            (MapRef::<Table>::new(oid).list(&t).await).map_err(|e| vec![e.to_string()])?;
        for (key, value) in entries {
            let key = String::from_utf8_lossy(&key).to_string();
            if let Some(tag) = key.strip_prefix("r/") {
                match parse_receipt(&value) {
                    Some(r) if r.0 .0 == m => {
                        receipts.insert(tag.to_string(), r);
                    }
                    _ => violations.push(format!("bank-{m}: a malformed receipt at {key}")),
                }
            } else if let Some(a) = key.strip_prefix('a').and_then(|a| a.parse().ok()) {
                let balance = decode_i64(Some(value));
                balances.insert((m, a), balance.unwrap_or(i64::MIN));
            }
        }
    }
    violations.extend(judge(&seen, &balances, &receipts));
    if !violations.is_empty() {
        return Err(violations);
    }
    Ok(ObjectsCheck {
        committed: seen.committed.len(),
        aborted: seen.aborted.len(),
        unknown: seen.unknown.len(),
        unknown_committed: seen
            .unknown
            .iter()
            .filter(|t| receipts.contains_key(*t))
            .count(),
    })
}

/// What is wrong with a bank whose accounts hold `balances` and whose maps hold `receipts`,
/// given what the clients saw: money not conserved, an account whose balance is not its
/// opening plus its receipts, a transfer seen committed without a receipt or seen aborted
/// with one, a receipt of a transfer nobody began.
pub fn judge(
    seen: &Transfers,
    balances: &BTreeMap<Account, i64>,
    receipts: &BTreeMap<String, Receipt>,
) -> Vec<String> {
    let mut violations = vec![];
    let total: i64 = balances.values().sum();
    let opened = i64::from(BANK_MAPS * ACCOUNTS) * OPENING;
    if total != opened {
        violations.push(format!(
            "money not conserved: {total} in the bank, {opened} opened"
        ));
    }
    let mut expected: BTreeMap<Account, i64> = (0..BANK_MAPS)
        .flat_map(|m| (0..ACCOUNTS).map(move |a| ((m, a), OPENING)))
        .collect();
    for (from, to, amount) in receipts.values() {
        *expected.entry(*from).or_default() -= amount;
        *expected.entry(*to).or_default() += amount;
    }
    for (account, want) in &expected {
        let have = balances.get(account).copied();
        if have != Some(*want) {
            violations.push(format!(
                "account {account:?} holds {have:?}; its receipts say {want}"
            ));
        }
    }
    for tag in &seen.committed {
        if !receipts.contains_key(tag) {
            violations.push(format!(
                "transfer {tag} was seen committed and has no receipt"
            ));
        }
    }
    for tag in &seen.aborted {
        if receipts.contains_key(tag) {
            violations.push(format!("transfer {tag} was seen aborted and has a receipt"));
        }
    }
    for tag in receipts.keys() {
        if !seen.committed.contains(tag) && !seen.unknown.contains(tag) {
            violations.push(format!(
                "a receipt for {tag}, which no client saw begin uncommitted"
            ));
        }
    }
    violations
}

/// The maintainer's client: every object hosted.
pub async fn maintainer(log: Log) -> Result<Tango, TangoError> {
    let objects = objects();
    Tango::open(log, &as_refs(&objects), TangoOptions::default()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bank after two transfers, one seen committed and one of unknown outcome that
    /// committed: sound as it is, and each kind of damage is named.
    #[test]
    fn the_judge_names_every_way_a_bank_can_be_wrong() {
        let mut balances: BTreeMap<Account, i64> = (0..BANK_MAPS)
            .flat_map(|m| (0..ACCOUNTS).map(move |a| ((m, a), OPENING)))
            .collect();
        let mut receipts = BTreeMap::new();
        for (tag, from, to, amount) in [
            ("0.1.t0.0", (0, 0), (2, 1), 7),
            ("1.1.t1.0", (2, 1), (3, 0), 3),
        ] {
            *balances.get_mut(&from).unwrap() -= amount;
            *balances.get_mut(&to).unwrap() += amount;
            receipts.insert(tag.to_string(), (from, to, amount));
        }
        let mut seen = Transfers::default();
        seen.committed.insert("0.1.t0.0".into());
        seen.unknown.insert("1.1.t1.0".into());
        seen.aborted.insert("1.1.t1.1".into());
        assert_eq!(judge(&seen, &balances, &receipts), Vec::<String>::new());

        let mut lost = receipts.clone();
        lost.remove("0.1.t0.0");
        let v = judge(&seen, &balances, &lost);
        assert!(
            v.iter()
                .any(|v| v.contains("0.1.t0.0 was seen committed and has no receipt")),
            "{v:?}"
        );
        assert!(v.iter().any(|v| v.contains("account (0, 0)")), "{v:?}");

        let mut leaked = balances.clone();
        *leaked.get_mut(&(5, 2)).unwrap() += 1;
        let v = judge(&seen, &leaked, &receipts);
        assert!(
            v.iter().any(|v| v.starts_with("money not conserved")),
            "{v:?}"
        );

        let mut visible = receipts.clone();
        visible.insert("1.1.t1.1".into(), ((4, 0), (4, 1), 0));
        let v = judge(&seen, &balances, &visible);
        assert!(
            v.iter()
                .any(|v| v.contains("1.1.t1.1 was seen aborted and has a receipt")),
            "{v:?}"
        );
    }

    #[test]
    fn outputs_cut_anywhere_parse_into_what_was_seen() {
        let dir = tempfile::tempdir().unwrap();
        let text = "begin 0.1.t0.0\ncommitted 0.1.t0.0\nbegin 0.1.t0.1\naborted 0.1.t0.1\nbegin 0.1.t0.2\nunknown 0.1.t0.2 why\nbegin 0.1.t1.0\ncommit";
        std::fs::write(dir.path().join("objects-0-1.out"), text).unwrap();
        let seen = transfers(dir.path());
        assert_eq!(seen.committed.iter().collect::<Vec<_>>(), ["0.1.t0.0"]);
        assert_eq!(seen.aborted.iter().collect::<Vec<_>>(), ["0.1.t0.1"]);
        assert_eq!(
            seen.unknown.iter().collect::<Vec<_>>(),
            ["0.1.t0.2", "0.1.t1.0"]
        );
    }
}
