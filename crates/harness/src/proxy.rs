//! A fault-injecting TCP proxy for `tutti chaos`: one listener per directed link (source
//! process, destination server), and each source process dials its peers through its own
//! listeners (`--route`). Cutting a pair of processes blackholes both directions of every
//! connection between them, established or new, until healed: bytes are held, as a real
//! partition holds them in retransmission queues, so only timeouts notice.

use std::collections::{BTreeMap, BTreeSet};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A process of the run, by name: `manager`, `node-1`, `client-0`, …
pub type Process = String;

pub struct Proxy {
    /// Directed link (from, to) → whether it is cut.
    links: BTreeMap<(Process, Process), watch::Sender<bool>>,
    /// For each source: (real address, proxy address) of every destination.
    routes: BTreeMap<Process, Vec<(String, String)>>,
}

impl Proxy {
    /// Starts listeners from every source to every destination `(name, real address)`;
    /// must run inside a Tokio runtime, which then carries the forwarding.
    pub async fn start(
        sources: &[Process],
        destinations: &[(Process, String)],
    ) -> std::io::Result<Proxy> {
        let mut proxy = Proxy {
            links: BTreeMap::new(),
            routes: BTreeMap::new(),
        };
        // The servers' ports were picked free but are not bound while a server is down:
        // an ephemeral port of ours must not take one.
        let taken: BTreeSet<&str> = destinations.iter().map(|(_, a)| a.as_str()).collect();
        let mut skipped = Vec::new();
        for from in sources {
            for (to, real) in destinations.iter().filter(|(to, _)| to != from) {
                let (listener, via) = loop {
                    let listener = TcpListener::bind("127.0.0.1:0").await?;
                    let via = listener.local_addr()?.to_string();
                    if !taken.contains(via.as_str()) {
                        break (listener, via);
                    }
                    skipped.push(listener);
                };
                let (cut, watch) = watch::channel(false);
                tokio::spawn(accept(listener, real.clone(), watch));
                proxy.links.insert((from.clone(), to.clone()), cut);
                proxy
                    .routes
                    .entry(from.clone())
                    .or_default()
                    .push((real.clone(), via));
            }
        }
        Ok(proxy)
    }

    /// The `--route` flags that make `from` dial every destination through this proxy.
    pub fn route_flags(&self, from: &str) -> Vec<String> {
        self.routes
            .get(from)
            .into_iter()
            .flatten()
            .flat_map(|(real, via)| ["--route".to_string(), format!("{real}={via}")])
            .collect()
    }

    /// Pairs of processes with a link between them (at least one is a destination).
    pub fn pairs(&self) -> Vec<(Process, Process)> {
        let pairs: BTreeSet<(Process, Process)> = self
            .links
            .keys()
            .map(|(a, b)| {
                if a < b {
                    (a.clone(), b.clone())
                } else {
                    (b.clone(), a.clone())
                }
            })
            .collect();
        pairs.into_iter().collect()
    }

    /// Cuts (or heals) both directions between `a` and `b`.
    pub fn set_cut(&self, a: &str, b: &str, cut: bool) {
        for key in [
            (a.to_string(), b.to_string()),
            (b.to_string(), a.to_string()),
        ] {
            if let Some(link) = self.links.get(&key) {
                link.send_replace(cut);
            }
        }
    }

    pub fn heal_all(&self) {
        for link in self.links.values() {
            link.send_replace(false);
        }
    }
}

async fn accept(listener: TcpListener, real: String, cut: watch::Receiver<bool>) {
    while let Ok((inbound, _)) = listener.accept().await {
        let (real, mut cut) = (real.clone(), cut.clone());
        tokio::spawn(async move {
            if cut.wait_for(|c| !c).await.is_err() {
                return;
            }
            let Ok(outbound) = TcpStream::connect(&real).await else {
                return;
            };
            inbound.set_nodelay(true).ok();
            outbound.set_nodelay(true).ok();
            let (in_rd, in_wr) = inbound.into_split();
            let (out_rd, out_wr) = outbound.into_split();
            tokio::join!(pump(in_rd, out_wr, cut.clone()), pump(out_rd, in_wr, cut));
        });
    }
}

/// Copies one direction, holding each chunk while the link is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !c).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Even the end of a connection does not cross a cut link.
    if cut.wait_for(|c| !c).await.is_ok() {
        let _ = to.shutdown().await;
    }
}
