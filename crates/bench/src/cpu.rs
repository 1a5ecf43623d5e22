//! CPU time per minitransaction, by process (`/proc/PID/stat`): where each mode's work goes
//! on this machine's cores. With every process on the same cores, that total bounds the
//! throughput any mode can reach here, whatever its latency.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// One mode's CPU time per minitransaction at a point, by kind of process.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CpuShare {
    pub mode: String,
    pub nodes: usize,
    pub outstanding: usize,
    pub throughput_per_s: f64,
    /// µs of CPU (user and system, every thread) per minitransaction: `client` (the bench's
    /// own process), `primary` (a memory node's first process: the node in `log` and `ram`,
    /// its primary in the replicated modes), `mirror` (a replicated node's second process),
    /// `manager` (the managers and the sequencer).
    pub us_per_minitx: BTreeMap<String, f64>,
    /// CPU seconds per second, every process together: how many cores the point kept busy.
    pub busy_cores: f64,
}

impl CpuShare {
    /// µs of CPU per minitransaction, every process together.
    pub fn total_us(&self) -> f64 {
        self.us_per_minitx.values().sum()
    }
}

/// The kind a process of a local cluster counts under (`CpuShare::us_per_minitx`), by its
/// name (`tutti_harness::local::ProcessEntry::name`).
fn kind_of(name: &str) -> &'static str {
    if name.starts_with("node-") && name.ends_with("-mirror") {
        "mirror"
    } else if name.starts_with("node-") {
        "primary"
    } else {
        "manager"
    }
}

/// User and system CPU time `pid` has taken so far, all its threads, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: the fields that follow start after its ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) as f64 / ticks as f64)
}

/// Each process's CPU seconds at one moment.
pub struct CpuSample {
    at: Instant,
    seconds: Vec<Option<f64>>,
}

/// The processes measured: `client` (this one) and a cluster's, by name.
pub struct CpuMeter {
    processes: Vec<(&'static str, u32)>,
}

impl CpuMeter {
    /// This process as the client, and `cluster`'s processes (name, pid) by kind.
    pub fn new(cluster: impl IntoIterator<Item = (String, u32)>) -> CpuMeter {
        let mut processes = vec![("client", std::process::id())];
        processes.extend(cluster.into_iter().map(|(name, pid)| (kind_of(&name), pid)));
        CpuMeter { processes }
    }

    pub fn sample(&self) -> CpuSample {
        CpuSample {
            at: Instant::now(),
            seconds: (self.processes.iter())
                .map(|&(_, pid)| cpu_seconds(pid))
                .collect(),
        }
    }

    /// The share of `minitxs` minitransactions done between `before` and `after`. None if a
    /// process went away (or was replaced) in between, or nothing was done.
    pub fn share(
        &self,
        before: &CpuSample,
        after: &CpuSample,
        minitxs: u64,
    ) -> Option<BTreeMap<String, f64>> {
        if minitxs == 0 {
            return None;
        }
        let mut us = BTreeMap::new();
        for (i, &(kind, _)) in self.processes.iter().enumerate() {
            let spent = after.seconds[i]? - before.seconds[i]?;
            if spent < 0.0 {
                return None;
            }
            *us.entry(kind.to_string()).or_insert(0.0) += spent * 1e6 / minitxs as f64;
        }
        Some(us)
    }

    /// CPU seconds per second between the two samples, every process together.
    pub fn busy_cores(&self, before: &CpuSample, after: &CpuSample) -> f64 {
        let wall = after.at.duration_since(before.at).as_secs_f64();
        let spent: f64 = (before.seconds.iter().zip(&after.seconds))
            .filter_map(|(b, a)| Some(a.as_ref()? - b.as_ref()?))
            .sum();
        if wall > 0.0 {
            spent / wall
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU time of the calling thread alone, in seconds.
    fn thread_seconds() -> f64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given, which lives through the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        assert_eq!(rc, 0);
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    }

    #[test]
    fn a_busy_thread_shows_in_its_process_cpu_time() {
        let meter = CpuMeter::new([]);
        let before = meter.sample();
        // 100 ms of CPU on this thread, however long the machine takes to give it.
        let start = thread_seconds();
        let mut x = 0u64;
        while thread_seconds() - start < 0.1 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = meter.sample();
        let us = meter
            .share(&before, &after, 1000)
            .expect("this process is there");
        // At least 100 µs for each of 1000 minitransactions, less two 10 ms ticks of
        // rounding; other tests' threads may add to it.
        assert!(us["client"] >= 80.0, "{us:?}");
        assert!(meter.busy_cores(&before, &after) > 0.0);
    }

    #[test]
    fn processes_count_under_their_kind() {
        assert_eq!(kind_of("node-3"), "primary");
        assert_eq!(kind_of("node-3-mirror"), "mirror");
        assert_eq!(kind_of("manager-2"), "manager");
        assert_eq!(kind_of("sequencer"), "manager");
    }
}
