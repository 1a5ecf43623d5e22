//! Load statistics per minitransaction class over sliding windows (5 s, 1 min, 10 min, 1 h),
//! kept as one-second buckets so that every window is exact to the second.

use std::collections::HashMap;
use tutti_wire::{ClassLoad, LoadCounters};

pub const WINDOWS_S: [u64; 4] = [5, 60, 600, 3600];
const BUCKETS: usize = 3600;
/// Distinct classes tracked; later ones are counted under `OVERFLOW_CLASS`.
pub const CLASSES_MAX: usize = 64;
pub const OVERFLOW_CLASS: &str = "other";

struct ClassRing {
    name: String,
    buckets: Vec<LoadCounters>,
    /// Second that each bucket currently counts.
    seconds: Vec<u64>,
}

#[derive(Default)]
pub struct Load {
    classes: Vec<ClassRing>,
    index: HashMap<String, usize>,
}

impl Load {
    pub fn class_index(&mut self, class: &str) -> usize {
        if let Some(&i) = self.index.get(class) {
            return i;
        }
        let name = if self.classes.len() + 1 >= CLASSES_MAX {
            OVERFLOW_CLASS
        } else {
            class
        };
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.classes.push(ClassRing {
            name: name.to_string(),
            buckets: vec![LoadCounters::default(); BUCKETS],
            seconds: vec![u64::MAX; BUCKETS],
        });
        self.index.insert(name.to_string(), self.classes.len() - 1);
        self.classes.len() - 1
    }

    /// The counters of `class` for the second containing `now_ms`.
    pub fn at(&mut self, class: usize, now_ms: u64) -> &mut LoadCounters {
        let second = now_ms / 1000;
        let ring = &mut self.classes[class];
        let slot = (second % BUCKETS as u64) as usize;
        if ring.seconds[slot] != second {
            ring.seconds[slot] = second;
            ring.buckets[slot] = LoadCounters::default();
        }
        &mut ring.buckets[slot]
    }

    pub fn report(&self, now_ms: u64) -> Vec<ClassLoad> {
        let now_s = now_ms / 1000;
        self.classes
            .iter()
            .map(|ring| ClassLoad {
                class: ring.name.clone(),
                windows: WINDOWS_S
                    .iter()
                    .map(|&w| {
                        let mut sum = LoadCounters::default();
                        for (c, &s) in ring.buckets.iter().zip(&ring.seconds) {
                            if s != u64::MAX && s + w > now_s && s <= now_s {
                                sum.bytes_read += c.bytes_read;
                                sum.bytes_written += c.bytes_written;
                                sum.committed += c.committed;
                                sum.aborted_lock += c.aborted_lock;
                                sum.aborted_compare += c.aborted_compare;
                                sum.forced_abort += c.forced_abort;
                            }
                        }
                        sum
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_slide() {
        let mut load = Load::default();
        let c = load.class_index("transfer");
        load.at(c, 1_000).committed += 1;
        load.at(c, 10_000).committed += 2;
        let report = load.report(10_500);
        assert_eq!(report[0].windows[0].committed, 2);
        assert_eq!(report[0].windows[1].committed, 3);
        let report = load.report(3_600_000 + 5_000);
        assert_eq!(
            report[0].windows[3].committed, 2,
            "the 1 h window drops the first second"
        );
    }
}
