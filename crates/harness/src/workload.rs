//! Runs the workloads of `tutti-workload` (the ones the simulator runs) against a real
//! cluster: an operation's minitransactions one after another, and the final check from a
//! snapshot taken in one minitransaction.

use rand::RngCore;
use tutti_client::{Cluster, ExecError, Outcome};
use tutti_workload::{Violation, Workload};

/// Sets up the workload's initial state; a second call changes nothing.
pub async fn setup<W: Workload>(cluster: &Cluster, workload: &W) -> Result<(), ExecError> {
    cluster.exec_and_commit(&workload.setup()).await.map(|_| ())
}

/// Runs `client`'s next operation to its end: the operation, and how its last
/// minitransaction ended.
pub async fn run_op<W: Workload>(
    cluster: &Cluster,
    workload: &mut W,
    client: u64,
    rng: &mut (impl RngCore + Send),
) -> (W::Op, Result<Outcome, ExecError>) {
    let (mut op, mut tx) = workload.next(client, rng);
    loop {
        let ended = cluster.exec_and_commit(&tx).await;
        match workload.record(client, &mut op, ended.as_ref(), rng) {
            Some(next) => tx = next,
            None => return (op, ended),
        }
    }
}

/// Checks the cluster against the workload's model (faults over, cluster idle).
pub async fn check<W: Workload>(
    cluster: &Cluster,
    workload: &W,
) -> Result<Vec<Violation>, ExecError> {
    let snapshot = cluster.exec_and_commit(&workload.snapshot()).await?;
    Ok(workload.check(&snapshot.reads))
}
