//! `tutti obj`: Tango's objects from the command line: registers, counters and maps over a
//! shared log (default `tango`, created over every memory node on first use), one JSON
//! object per call. See docs/objects.md.

use super::args::ClusterArg;
use super::items::{hex, to_hex};
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tutti_client::Cluster;
use tutti_log::{Log, LogError, LogOptions, LogShape};
use tutti_tango::{CounterRef, Kind, MapRef, RegisterRef, Tango, TangoError, TangoOptions};
use tutti_wire::Dialer;

/// Bytes of each memory node a log created by `tutti obj` takes.
const LOG_CAPACITY_BYTES: u64 = 64 << 20;

#[derive(Args)]
pub(crate) struct ObjArgs {
    #[command(subcommand)]
    command: ObjCommand,
    #[command(flatten)]
    cluster: ClusterArg,
    /// The log the objects live in; created (4 KiB slots, every memory node, 64 MiB each)
    /// when it does not exist.
    #[arg(long, global = true, default_value = "tango")]
    log: String,
}

#[derive(Subcommand)]
enum ObjCommand {
    /// A register: one value, replaced as a whole.
    Register {
        #[command(subcommand)]
        op: RegisterOp,
    },
    /// A signed 64-bit counter.
    Counter {
        #[command(subcommand)]
        op: CounterOp,
    },
    /// A map from keys (UTF-8) to values, with a version per key.
    Map {
        #[command(subcommand)]
        op: MapOp,
    },
    /// Every object in the log's directory: name, kind, id, forget position.
    Ls,
    /// Store a checkpoint of an object's view in the log; with --forget, give up its
    /// history below the checkpoint; with --trim, trim the log below every object's forget
    /// position.
    Checkpoint {
        name: String,
        #[arg(long)]
        forget: bool,
        #[arg(long)]
        trim: bool,
    },
    /// Checkpoint every object and the directory at one position, forget their history
    /// below it and trim the log there: {"as_of": P, "trim": T, "objects": N}. With
    /// --every, again each period (a line each) until interrupted, taking in new objects.
    Maintain {
        /// Seconds between rounds (default: one round).
        #[arg(long)]
        every: Option<f64>,
    },
}

#[derive(Subcommand)]
enum RegisterOp {
    /// Print the value: {"data": HEX}.
    Get { name: String },
    /// Set the value (HEX; creates the register): {"position": P}.
    Set { name: String, hex: String },
}

#[derive(Subcommand)]
enum CounterOp {
    /// Print the value: {"value": N}.
    Get { name: String },
    /// Add N (may be negative; creates the counter); print the value it made.
    Add {
        name: String,
        #[arg(allow_negative_numbers = true)]
        n: i64,
    },
}

#[derive(Subcommand)]
enum MapOp {
    /// Print a key's value: {"key": K, "data": HEX or null}.
    Get { name: String, key: String },
    /// Put a value (HEX; creates the map): {"key": K, "previous": HEX or null}.
    Put {
        name: String,
        key: String,
        hex: String,
    },
    /// Delete a key: {"key": K, "previous": HEX or null}.
    Delete { name: String, key: String },
    /// Every entry in key order: {"entries": [{"key": K, "data": HEX}, ...]}.
    List { name: String },
}

type HashTable = std::collections::HashMap<Vec<u8>, Vec<u8>>;

pub(crate) fn err(e: TangoError) -> String {
    e.to_string()
}

/// The log `name`, created over every memory node if it does not exist and `create`;
/// `None` if it does not exist and not `create`.
pub(crate) async fn open_log(
    cluster: &Cluster,
    name: &str,
    opts: LogOptions,
    create: bool,
) -> Result<Option<Log>, String> {
    match Log::open(cluster, name, opts.clone()).await {
        Ok(log) => Ok(Some(log)),
        Err(LogError::NoSuchLog(_)) if create => {
            let nodes = cluster.nodes().iter().map(|n| n.id).collect();
            let shape = LogShape::new(nodes, LOG_CAPACITY_BYTES);
            let log = Log::create(cluster, name, &shape, opts).await;
            log.map(Some).map_err(|e| e.to_string())
        }
        Err(LogError::NoSuchLog(_)) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A client hosting `name` of `kind`. `create`: make the object if it does not exist;
/// otherwise a missing name is an error and nothing is written.
async fn host(log: Log, name: &str, kind: Kind, create: bool) -> Result<(Tango, u32), String> {
    (host_named(log, name, kind, create).await?)
        .ok_or_else(|| err(TangoError::NoSuchObject(name.into())))
}

/// A client hosting `name` of `kind`, made if it does not exist and `create`; `None` when it
/// does not exist and not `create` (nothing written then).
pub(crate) async fn host_named(
    log: Log,
    name: &str,
    kind: Kind,
    create: bool,
) -> Result<Option<(Tango, u32)>, String> {
    let opts = TangoOptions::default();
    if !create {
        let directory = Tango::open(log.clone(), &[], opts.clone())
            .await
            .map_err(err)?;
        if directory.lookup(name).await.map_err(err)?.is_none() {
            return Ok(None);
        }
    }
    let tango = Tango::open(log, &[(name, kind)], opts).await.map_err(err)?;
    let oid = tango.hosted_as(name, kind).map_err(err)?;
    Ok(Some((tango, oid)))
}

fn opt_hex(bytes: Option<Vec<u8>>) -> Value {
    bytes.map_or(Value::Null, |b| Value::String(to_hex(&b)))
}

pub(crate) async fn run(a: ObjArgs, dialer: &Dialer) -> Result<(), String> {
    let cluster = a.cluster.connect(dialer).await?;
    let opts = LogOptions {
        deadline: a.cluster.deadline(),
        ..LogOptions::default()
    };
    let creates = matches!(
        a.command,
        ObjCommand::Register {
            op: RegisterOp::Set { .. }
        } | ObjCommand::Counter {
            op: CounterOp::Add { .. }
        } | ObjCommand::Map {
            op: MapOp::Put { .. }
        }
    );
    let log = (open_log(&cluster, &a.log, opts, creates).await?).ok_or_else(|| {
        format!(
            "no log called {:?}, so no objects yet (the first write creates it: `tutti obj \
             register set`, `counter add`, `map put`)",
            a.log
        )
    })?;
    let out = match a.command {
        ObjCommand::Register { op } => register(log, op).await?,
        ObjCommand::Counter { op } => counter(log, op).await?,
        ObjCommand::Map { op } => map(log, op).await?,
        ObjCommand::Ls => {
            let tango = Tango::open(log, &[], TangoOptions::default())
                .await
                .map_err(err)?;
            let names = tango.names().await.map_err(err)?;
            let objects: Vec<Value> = (names.into_iter())
                .map(|(name, m)| {
                    json!({ "name": name, "kind": m.kind.name(), "id": m.oid, "forget": m.forget })
                })
                .collect();
            json!({ "objects": objects })
        }
        ObjCommand::Maintain { every } => return maintain(log, every).await,
        ObjCommand::Checkpoint { name, forget, trim } => {
            let directory = Tango::open(log.clone(), &[], TangoOptions::default())
                .await
                .map_err(err)?;
            let meta = (directory.lookup(&name).await.map_err(err)?)
                .ok_or_else(|| err(TangoError::NoSuchObject(name.clone())))?;
            let (tango, oid) = host(log, &name, meta.kind, false).await?;
            let as_of = tango.checkpoint(oid).await.map_err(err)?;
            let mut out = json!({ "name": name, "as_of": as_of });
            if forget {
                out["forget"] = json!(tango.forget(&name, as_of).await.map_err(err)?);
            }
            if trim {
                out["trim"] = json!(tango.trim().await.map_err(err)?);
            }
            out
        }
    };
    outln!("{out}");
    Ok(())
}

async fn register(log: Log, op: RegisterOp) -> Result<Value, String> {
    Ok(match op {
        RegisterOp::Get { name } => {
            let (t, oid) = host(log, &name, Kind::Register, false).await?;
            json!({ "data": to_hex(&RegisterRef(oid).get(&t).await.map_err(err)?) })
        }
        RegisterOp::Set { name, hex: data } => {
            let data = hex(&data)?;
            let (t, oid) = host(log, &name, Kind::Register, true).await?;
            json!({ "position": RegisterRef(oid).set(&t, &data).await.map_err(err)? })
        }
    })
}

async fn counter(log: Log, op: CounterOp) -> Result<Value, String> {
    Ok(match op {
        CounterOp::Get { name } => {
            let (t, oid) = host(log, &name, Kind::Counter, false).await?;
            json!({ "value": CounterRef(oid).get(&t).await.map_err(err)? })
        }
        CounterOp::Add { name, n } => {
            let (t, oid) = host(log, &name, Kind::Counter, true).await?;
            json!({ "value": CounterRef(oid).add(&t, n).await.map_err(err)? })
        }
    })
}

async fn map(log: Log, op: MapOp) -> Result<Value, String> {
    Ok(match op {
        MapOp::Get { name, key } => {
            let (t, oid) = host(log, &name, Kind::Map, false).await?;
            let map = MapRef::<HashTable>::new(oid);
            json!({ "key": key, "data": opt_hex(map.get(&t, key.as_bytes()).await.map_err(err)?) })
        }
        MapOp::Put {
            name,
            key,
            hex: data,
        } => {
            let data = hex(&data)?;
            let (t, oid) = host(log, &name, Kind::Map, true).await?;
            let map = MapRef::<HashTable>::new(oid);
            let previous = map.put(&t, key.as_bytes(), &data).await.map_err(err)?;
            json!({ "key": key, "previous": opt_hex(previous) })
        }
        MapOp::Delete { name, key } => {
            let (t, oid) = host(log, &name, Kind::Map, false).await?;
            let map = MapRef::<HashTable>::new(oid);
            let previous = map.delete(&t, key.as_bytes()).await.map_err(err)?;
            json!({ "key": key, "previous": opt_hex(previous) })
        }
        MapOp::List { name } => {
            let (t, oid) = host(log, &name, Kind::Map, false).await?;
            let entries: Vec<Value> = (MapRef::<HashTable>::new(oid).list(&t).await)
                .map_err(err)?
                .into_iter()
                .map(|(k, v)| json!({ "key": String::from_utf8_lossy(&k), "data": to_hex(&v) }))
                .collect();
            json!({ "entries": entries })
        }
    })
}

/// One round of `maintain`: every object in the directory hosted, compacted.
async fn compact(log: Log) -> Result<Value, String> {
    let directory = Tango::open(log.clone(), &[], TangoOptions::default())
        .await
        .map_err(err)?;
    let names = directory.names().await.map_err(err)?;
    let objects: Vec<(&str, Kind)> = names.iter().map(|(n, m)| (n.as_str(), m.kind)).collect();
    let tango = Tango::open(log, &objects, TangoOptions::default())
        .await
        .map_err(err)?;
    let (as_of, trim) = tango.compact().await.map_err(err)?;
    Ok(json!({ "as_of": as_of, "trim": trim, "objects": objects.len() }))
}

async fn maintain(log: Log, every: Option<f64>) -> Result<(), String> {
    let Some(every) = every else {
        outln!("{}", compact(log).await?);
        return Ok(());
    };
    let period = std::time::Duration::try_from_secs_f64(every)
        .ok()
        .filter(|p| !p.is_zero())
        .ok_or_else(|| format!("--every {every}: a positive number of seconds"))?;
    let shutdown = super::args::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        // A round that fails (a node down, the deadline) is reported and tried again next
        // period: the log keeps its history meanwhile.
        match compact(log.clone()).await {
            Ok(out) => outln!("{out}"),
            Err(e) => eprintln!("tutti: this round failed: {e}"),
        }
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(period) => {}
        }
    }
}
