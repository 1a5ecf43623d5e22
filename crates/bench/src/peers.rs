//! The Fig. 16 workload on the systems a user would pick instead of tutti, each started
//! here on loopback with a scratch data directory and stopped by its PID: Redis (a Lua
//! script, `appendfsync always` or no persistence), PostgreSQL (one transaction of three
//! conditional UPDATEs, `synchronous_commit` on or off), etcd (one Txn, fsync always) and an
//! embedded SQLite (WAL, `synchronous=FULL`). Each operation compare-and-swaps 3 of 50,000
//! 4-byte items, like tutti's minitransaction; `driver::closed_loop` measures them.

use super::driver::{Session, Swap};
use base64::Engine;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tutti_client::ClientOptions;
use tutti_harness::supervisor::Supervisor;

/// A server started by the bench, stopped and its data removed when dropped.
pub struct Daemon {
    name: String,
    process: Supervisor,
    pub dir: PathBuf,
    pub port: u16,
}

impl Drop for Daemon {
    /// SIGINT (a fast shutdown for each of them: PostgreSQL's backends leave with their
    /// postmaster), then SIGKILL if it is still there after 10 s.
    fn drop(&mut self) {
        self.process
            .stop(&self.name, libc::SIGINT, Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    /// Starts `cmd` as `name`, its output in `dir.log`.
    pub(crate) fn spawn(
        name: &str,
        dir: PathBuf,
        port: u16,
        cmd: Command,
    ) -> Result<Daemon, String> {
        let mut process = Supervisor::new();
        process
            .start(name, cmd, &dir.with_extension("log"))
            .map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Daemon {
            name: name.into(),
            process,
            dir,
            port,
        })
    }

    /// Waits until `ready` succeeds, or the daemon exits, or 60 s pass.
    pub(crate) async fn wait<T, F: Future<Output = Result<T, String>>>(
        &mut self,
        ready: impl Fn() -> F,
    ) -> Result<T, String> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let err = match ready().await {
                Ok(t) => return Ok(t),
                Err(e) => e,
            };
            if let Some((_, status)) = self.process.reap().pop() {
                return Err(format!(
                    "{} exited ({status}); see {}",
                    self.name,
                    self.dir.with_extension("log").display()
                ));
            }
            if Instant::now() > until {
                return Err(format!("{} not ready after 60 s: {err}", self.name));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    tutti_harness::local::free_port().map_err(|e| e.to_string())
}

pub(crate) fn scratch(root: &Path, name: &str) -> Result<PathBuf, String> {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Finds `program`, installing the Debian `package` that has it if it is missing.
pub fn ensure_installed(program: &str, package: &str) -> Result<PathBuf, String> {
    let find = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .chain([PathBuf::from("/usr/lib/postgresql/15/bin")])
                .map(|p| p.join(program))
                .find(|p| p.is_file())
        })
    };
    ensure(find, program, package)
}

/// `file`, installing the Debian `package` that has it if it is missing.
pub fn ensure_file(file: &Path, package: &str) -> Result<PathBuf, String> {
    let find = || file.is_file().then(|| file.to_path_buf());
    ensure(find, &file.display().to_string(), package)
}

fn ensure(
    find: impl Fn() -> Option<PathBuf>,
    program: &str,
    package: &str,
) -> Result<PathBuf, String> {
    if let Some(p) = find() {
        return Ok(p);
    }
    let install = |update: bool| {
        if update {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
        }
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
    };
    if !matches!(install(false), Ok(s) if s.success()) {
        let _ = install(true);
    }
    find().ok_or_else(|| {
        format!("{program} not found and `apt-get install {package}` did not provide it")
    })
}

// ---------------------------------------------------------------- Redis

/// KEYS: the items; ARGV: their expected values, then their new ones.
const REDIS_SWAP: &str = r"
local n = #KEYS
for i = 1, n do
  if redis.call('GET', KEYS[i]) ~= ARGV[i] then return 0 end
end
for i = 1, n do redis.call('SET', KEYS[i], ARGV[i + n]) end
return 1";

#[derive(Clone)]
pub struct RedisSession {
    pub(crate) con: redis::aio::MultiplexedConnection,
    script: Arc<redis::Script>,
}

/// Starts `redis-server` with `appendfsync always` (`always`) or no persistence (`none`)
/// and loads the items. Sessions share pipelined connections, as Redis clients do, as many
/// as tutti's client opens to a single memory node, so that both let client and server
/// work at once alike.
pub async fn redis(
    root: &Path,
    mode: &str,
    items: u32,
) -> Result<(Daemon, Vec<RedisSession>), String> {
    let (daemon, client, mut con) = redis_server(root, mode).await?;
    for chunk in (0..items).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("MSET");
        for k in chunk {
            cmd.arg(format!("k{k}")).arg("0");
        }
        cmd.query_async::<()>(&mut con)
            .await
            .map_err(|e| e.to_string())?;
    }
    let script = Arc::new(redis::Script::new(REDIS_SWAP));
    let mut sessions = vec![RedisSession {
        con,
        script: script.clone(),
    }];
    for _ in 1..ClientOptions::default().connections {
        let con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        sessions.push(RedisSession {
            con,
            script: script.clone(),
        });
    }
    Ok((daemon, sessions))
}

impl Session for RedisSession {
    async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
        let mut inv = self.script.prepare_invoke();
        for s in swaps {
            inv.key(format!("k{}", s.key));
        }
        for s in swaps {
            inv.arg(s.old.to_string());
        }
        for s in swaps {
            inv.arg(s.new.to_string());
        }
        let swapped: i64 = inv
            .invoke_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        Ok(swapped == 1)
    }

    async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(keys.iter().map(|k| format!("k{k}")).collect::<Vec<_>>())
            .query_async(&mut self.con)
            .await
            .map_err(|e| e.to_string())?;
        values.into_iter().map(parse_value).collect()
    }
}

/// An item's value as a peer stores it: decimal text.
fn parse_value(text: Option<String>) -> Result<u32, String> {
    let text = text.ok_or("an item is missing")?;
    text.parse()
        .map_err(|e| format!("an item holds {text:?}, not a number: {e}"))
}

/// Starts `redis-server` on a free loopback port with `appendfsync always` (`always`) or no
/// persistence (`none`); answers once it answers PING.
pub(crate) async fn redis_server(
    root: &Path,
    mode: &str,
) -> Result<(Daemon, redis::Client, redis::aio::MultiplexedConnection), String> {
    let exe = ensure_installed("redis-server", "redis-server")?;
    let dir = scratch(root, &format!("redis-{mode}"))?;
    let port = free_port()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .arg("--dir")
    .arg(&dir)
    .args(match mode {
        "always" => ["--appendonly", "yes", "--appendfsync", "always"],
        _ => ["--appendonly", "no", "--appendfsync", "no"],
    });
    let mut daemon = Daemon::spawn("redis-server", dir, port, cmd)?;
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(|e| e.to_string())?;
    let con = daemon
        .wait(|| {
            let client = client.clone();
            async move {
                let mut con = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                redis::cmd("PING")
                    .query_async::<String>(&mut con)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(con)
            }
        })
        .await?;
    Ok((daemon, client, con))
}

// ---------------------------------------------------------------- PostgreSQL

pub struct PostgresSession {
    client: tokio_postgres::Client,
    update: tokio_postgres::Statement,
    select: tokio_postgres::Statement,
}

/// A scratch PostgreSQL cluster (`initdb`, run as the `postgres` user when this is root),
/// `synchronous_commit` `on` or `off`, fsync on, and the items in table `kv`.
pub async fn postgres(root: &Path, mode: &str, items: u32) -> Result<(Daemon, u16), String> {
    let initdb = ensure_installed("initdb", "postgresql")?;
    let postgres = initdb.with_file_name("postgres");
    let dir = scratch(root, &format!("postgres-{mode}"))?;
    // PostgreSQL refuses to run as root: then run it (not a wrapper such as runuser, so
    // that its PID is the one stopped) as the `postgres` user.
    let owner = if unsafe { libc::geteuid() } == 0 {
        Some(postgres_user()?)
    } else {
        None
    };
    let run_as = |exe: &Path| {
        let mut c = Command::new(exe);
        if let Some((uid, gid)) = owner {
            use std::os::unix::process::CommandExt;
            c.uid(uid).gid(gid);
        }
        c
    };
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        // The data directory's parents must be traversable by that user.
        use std::os::unix::fs::PermissionsExt;
        for parent in [root, root.parent().unwrap_or(root)] {
            if let Ok(meta) = std::fs::metadata(parent) {
                let mut perms = meta.permissions();
                perms.set_mode(perms.mode() | 0o001);
                let _ = std::fs::set_permissions(parent, perms);
            }
        }
    }
    let out = run_as(&initdb)
        .args(["-D"])
        .arg(&dir)
        .args(["--auth=trust", "-U", "postgres", "--no-sync"])
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let port = free_port()?;
    let mut cmd = run_as(&postgres);
    cmd.arg("-D")
        .arg(&dir)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=300",
        ])
        .args([
            "-c",
            "fsync=on",
            "-c",
            &format!("synchronous_commit={mode}"),
        ])
        .args(["-c", "shared_buffers=256MB"]);
    let mut daemon = Daemon::spawn("postgres", dir, port, cmd)?;
    let client = daemon.wait(|| postgres_connect(port)).await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE kv (k int PRIMARY KEY, v bigint NOT NULL);
             INSERT INTO kv SELECT g, 0 FROM generate_series(0, {}) g;",
            items - 1
        ))
        .await
        .map_err(pg_err)?;
    client
        .batch_execute("VACUUM ANALYZE kv")
        .await
        .map_err(pg_err)?;
    Ok((daemon, port))
}

/// The uid and gid of the `postgres` user.
fn postgres_user() -> Result<(u32, u32), String> {
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: getpwnam gets a valid C string; the record it returns is read before any
    // other call could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err("no `postgres` user to run PostgreSQL as (it refuses to run as root)".into());
    }
    // SAFETY: non-null, as checked.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

/// tokio-postgres displays server errors as just "db error": say what the server said.
fn pg_err(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("PostgreSQL: {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

async fn postgres_connect(port: u16) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
        tokio_postgres::NoTls,
    )
    .await
    .map_err(pg_err)?;
    tokio::spawn(conn);
    Ok(client)
}

/// One connection per outstanding operation (PostgreSQL runs one transaction per
/// connection); statements of a transaction are pipelined.
pub async fn postgres_session(port: u16) -> Result<PostgresSession, String> {
    let client = postgres_connect(port).await?;
    let update = client
        .prepare("UPDATE kv SET v = $3 WHERE k = $1 AND v = $2")
        .await
        .map_err(pg_err)?;
    let select = client
        .prepare("SELECT k, v FROM kv WHERE k = ANY($1)")
        .await
        .map_err(pg_err)?;
    Ok(PostgresSession {
        client,
        update,
        select,
    })
}

impl Session for PostgresSession {
    async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
        let c = &self.client;
        let args: Vec<(i32, i64, i64)> = swaps
            .iter()
            .map(|s| (s.key as i32, i64::from(s.old), i64::from(s.new)))
            .collect();
        let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 3]> = args
            .iter()
            .map(|(k, old, new)| [k as _, old as _, new as _])
            .collect();
        // Polled in this order, so BEGIN goes first and the updates follow it pipelined.
        let (begin, updated) = futures::join!(
            c.batch_execute("BEGIN"),
            futures::future::join_all(params.iter().map(|p| c.execute(&self.update, p))),
        );
        begin.map_err(pg_err)?;
        let all = updated.into_iter().all(|r| matches!(r, Ok(1)));
        c.batch_execute(if all { "COMMIT" } else { "ROLLBACK" })
            .await
            .map_err(pg_err)?;
        Ok(all)
    }

    async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
        let ks: Vec<i32> = keys.iter().map(|&k| k as i32).collect();
        let rows = self
            .client
            .query(&self.select, &[&ks])
            .await
            .map_err(pg_err)?;
        let values: std::collections::HashMap<i32, i64> =
            rows.iter().map(|row| (row.get(0), row.get(1))).collect();
        ks.iter()
            .map(|k| {
                values
                    .get(k)
                    .map(|&v| v as u32)
                    .ok_or_else(|| format!("item {k} is missing"))
            })
            .collect()
    }
}

// ---------------------------------------------------------------- etcd

#[derive(Clone)]
pub struct EtcdSession {
    http: reqwest::Client,
    url: String,
}

pub(crate) fn b64(s: &str) -> String {
    b64_bytes(s.as_bytes())
}

pub(crate) fn b64_bytes(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A single-member etcd (it always fsyncs its WAL), driven through its JSON gateway with
/// one HTTP connection per outstanding operation; the items are loaded in Txns of 128 puts.
pub async fn etcd(root: &Path, items: u32) -> Result<(Daemon, EtcdSession), String> {
    let exe = ensure_installed("etcd", "etcd-server")?;
    let dir = scratch(root, "etcd")?;
    let (port, peer) = (free_port()?, free_port()?);
    let client_url = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(exe);
    cmd.args(["--name", "bench", "--data-dir"])
        .arg(dir.join("data"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("bench={peer_url}")])
        .args(["--quota-backend-bytes", "8589934592"]);
    let mut daemon = Daemon::spawn("etcd", dir, port, cmd)?;
    let session = EtcdSession {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .build()
            .map_err(|e| e.to_string())?,
        url: format!("{client_url}/v3/kv/txn"),
    };
    let s = session.clone();
    daemon
        .wait(|| {
            let s = s.clone();
            async move { s.txn(serde_json::json!({})).await.map(|_| ()) }
        })
        .await?;
    for chunk in (0..items).collect::<Vec<_>>().chunks(128) {
        let puts: Vec<_> = chunk
            .iter()
            .map(|k| serde_json::json!({"requestPut": {"key": b64(&format!("k{k}")), "value": b64("0")}}))
            .collect();
        session.txn(serde_json::json!({ "success": puts })).await?;
    }
    Ok((daemon, session))
}

impl EtcdSession {
    pub(crate) async fn txn(&self, body: serde_json::Value) -> Result<serde_json::Value, String> {
        let resp = self
            .http
            .post(&self.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("etcd answered {}", resp.status()));
        }
        resp.json().await.map_err(|e| e.to_string())
    }
}

impl Session for EtcdSession {
    async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
        let compare: Vec<_> = swaps
            .iter()
            .map(|s| {
                serde_json::json!({"key": b64(&format!("k{}", s.key)), "target": "VALUE", "result": "EQUAL", "value": b64(&s.old.to_string())})
            })
            .collect();
        let success: Vec<_> = swaps
            .iter()
            .map(|s| serde_json::json!({"requestPut": {"key": b64(&format!("k{}", s.key)), "value": b64(&s.new.to_string())}}))
            .collect();
        let out = self
            .txn(serde_json::json!({"compare": compare, "success": success}))
            .await?;
        Ok(out
            .get("succeeded")
            .and_then(|v| v.as_bool())
            .unwrap_or(false))
    }

    async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
        let ranges: Vec<_> = keys
            .iter()
            .map(|k| serde_json::json!({"requestRange": {"key": b64(&format!("k{k}"))}}))
            .collect();
        let out = self.txn(serde_json::json!({"success": ranges})).await?;
        let empty = vec![];
        let responses = out
            .get("responses")
            .and_then(|r| r.as_array())
            .unwrap_or(&empty);
        if responses.len() != keys.len() {
            return Err(format!(
                "etcd answered {} of {} ranges",
                responses.len(),
                keys.len()
            ));
        }
        responses
            .iter()
            .map(|r| {
                let range = r.get("response_range").or_else(|| r.get("responseRange"));
                parse_value(
                    range
                        .and_then(|r| r.pointer("/kvs/0/value"))
                        .and_then(|v| v.as_str())
                        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
                        .and_then(|v| String::from_utf8(v).ok()),
                )
            })
            .collect()
    }
}

// ---------------------------------------------------------------- embedded SQLite

#[derive(Clone)]
pub struct SqliteSession {
    db: Arc<Mutex<rusqlite::Connection>>,
}

/// An embedded single-node baseline (as the paper used Berkeley DB): SQLite in WAL mode
/// with `synchronous=FULL`, one writer at a time.
pub fn sqlite(root: &Path, items: u32) -> Result<(PathBuf, SqliteSession), String> {
    let dir = scratch(root, "sqlite")?;
    let db = rusqlite::Connection::open(dir.join("bench.db")).map_err(|e| e.to_string())?;
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;
         CREATE TABLE kv (k INTEGER PRIMARY KEY, v INTEGER NOT NULL);",
    )
    .map_err(|e| e.to_string())?;
    {
        let tx = db.unchecked_transaction().map_err(|e| e.to_string())?;
        let mut insert = tx
            .prepare("INSERT INTO kv (k, v) VALUES (?1, 0)")
            .map_err(|e| e.to_string())?;
        for k in 0..items {
            insert.execute([k]).map_err(|e| e.to_string())?;
        }
        drop(insert);
        tx.commit().map_err(|e| e.to_string())?;
    }
    Ok((
        dir,
        SqliteSession {
            db: Arc::new(Mutex::new(db)),
        },
    ))
}

impl Session for SqliteSession {
    async fn swap(&mut self, swaps: &[Swap]) -> Result<bool, String> {
        let (db, swaps) = (self.db.clone(), swaps.to_vec());
        tokio::task::spawn_blocking(move || {
            let mut db = db.lock().expect("sqlite poisoned");
            let tx = db
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(|e| e.to_string())?;
            for s in swaps {
                let n = tx
                    .prepare_cached("UPDATE kv SET v = ?3 WHERE k = ?1 AND v = ?2")
                    .and_then(|mut st| {
                        st.execute([s.key as i64, i64::from(s.old), i64::from(s.new)])
                    })
                    .map_err(|e| e.to_string())?;
                if n != 1 {
                    return Ok(false);
                }
            }
            tx.commit().map_err(|e| e.to_string())?;
            Ok(true)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    async fn read(&mut self, keys: &[u64]) -> Result<Vec<u32>, String> {
        let (db, keys) = (self.db.clone(), keys.to_vec());
        tokio::task::spawn_blocking(move || {
            let db = db.lock().expect("sqlite poisoned");
            keys.iter()
                .map(|&k| {
                    db.prepare_cached("SELECT v FROM kv WHERE k = ?1")
                        .and_then(|mut st| st.query_row([k as i64], |r| r.get(0)))
                        .map_err(|e| e.to_string())
                })
                .collect()
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
