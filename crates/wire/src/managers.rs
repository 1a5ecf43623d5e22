//! The managers of a cluster as the processes that ask them see them: one address, or the
//! addresses of a Raft group (`a,b,c`). A request goes to the one last found leading; a
//! `NotLeader` reply names the leader to ask instead, and one that does not answer hands the
//! request to the next address.

use crate::{Connection, Dialer, Request, Response, RpcError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one attempt to connect to a manager may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(700);
/// How long to wait after every manager of the group was asked without finding a leader.
const ELECTION_PAUSE: Duration = Duration::from_millis(50);

pub struct Managers {
    addrs: Vec<String>,
    frame_bytes_max: usize,
    dialer: Dialer,
    /// The index of the manager last found leading.
    leader: AtomicUsize,
    /// A connection to it, reused by later requests.
    conn: Mutex<Option<(usize, Arc<Connection>)>>,
}

impl Managers {
    /// `list`: one address or several, separated by commas.
    pub fn parse(list: &str, frame_bytes_max: usize, dialer: Dialer) -> Result<Managers, String> {
        let addrs: Vec<String> = list
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err(format!("no manager address in {list:?}"));
        }
        Ok(Managers {
            addrs,
            frame_bytes_max,
            dialer,
            leader: AtomicUsize::new(0),
            conn: Mutex::new(None),
        })
    }

    /// The addresses as `parse` takes them.
    pub fn list(&self) -> String {
        self.addrs.join(",")
    }

    async fn connection(&self, i: usize) -> Result<Arc<Connection>, RpcError> {
        if let Some((at, c)) = &*self.conn.lock().expect("managers poisoned") {
            if *at == i && !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr = &self.addrs[i];
        let connect = Connection::connect(addr, self.frame_bytes_max, &self.dialer);
        let conn = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(conn) => Arc::new(conn?),
            Err(_) => {
                return Err(RpcError::Timeout {
                    addr: addr.clone(),
                    ms: CONNECT_TIMEOUT.as_millis() as u64,
                })
            }
        };
        *self.conn.lock().expect("managers poisoned") = Some((i, conn.clone()));
        Ok(conn)
    }

    /// Sends `req` to the leading manager within `timeout`: follows `NotLeader` hints,
    /// moves past managers that do not answer, and waits out an election (a pause after
    /// each round of the group without a leader). The manager's errors come back as
    /// `RpcError::Remote`.
    pub async fn call(&self, req: &Request, timeout: Duration) -> Result<Response, RpcError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let n = self.addrs.len();
        let mut i = self.leader.load(Ordering::Relaxed) % n;
        let mut tried = 0;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let answer = match self.connection(i).await {
                Ok(conn) => {
                    conn.call_within(req, left.max(Duration::from_millis(1)))
                        .await
                }
                Err(e) => Err(e),
            };
            let last = match answer {
                Ok(Response::NotLeader { leader }) => {
                    let hinted = leader.and_then(|a| self.addrs.iter().position(|x| *x == a));
                    let next = hinted.filter(|&h| h != i).unwrap_or((i + 1) % n);
                    i = next;
                    RpcError::NoLeader { addrs: self.list() }
                }
                Ok(resp) => {
                    self.leader.store(i, Ordering::Relaxed);
                    return Ok(resp);
                }
                Err(e) if final_error(&e) => return Err(e),
                Err(e) => {
                    *self.conn.lock().expect("managers poisoned") = None;
                    i = (i + 1) % n;
                    e
                }
            };
            tried += 1;
            if tried % n == 0 {
                tokio::time::sleep(ELECTION_PAUSE).await;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(last);
            }
        }
    }
}

/// An error that asking another manager would not change: the manager refused the request,
/// or this process's credentials.
fn final_error(e: &RpcError) -> bool {
    match e {
        RpcError::Remote { .. } => true,
        RpcError::Handshake { reason, .. } => reason.is_permanent(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_split_on_commas() {
        let m = Managers::parse(" a:1, b:2,,c:3 ", 1 << 20, Dialer::default()).unwrap();
        assert_eq!(m.list(), "a:1,b:2,c:3");
        assert!(Managers::parse(" , ", 1 << 20, Dialer::default()).is_err());
    }
}
