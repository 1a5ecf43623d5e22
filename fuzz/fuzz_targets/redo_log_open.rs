//! `RedoLog::open` on a mutated segment: the input's first byte picks how much of a valid
//! segment of records is kept, the rest overwrites its bytes. Opening must fail with an
//! error or return records that are a prefix of what was written (lsns consecutive), never
//! panic; an opened log must then take an append and read back the same records plus it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tutti_memnode::redo_log::{encode_record, LogRecord, RedoLog};
use tutti_wire::Tid;

fn record(i: u64) -> LogRecord {
    let tid = Tid {
        epoch: 1,
        coordinator: 7,
        seq: i,
    };
    match i % 4 {
        0 => LogRecord::Prepare {
            tid,
            participants: vec![1, 2],
            writes: vec![(i * 8, vec![i as u8; (i % 40) as usize])],
        },
        1 => LogRecord::Decided { tid, commit: i % 8 == 1 },
        2 => LogRecord::ForcedAbort { tid },
        _ => LogRecord::Epoch { epoch: i },
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&keep, mutation)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("scratch directory");
    let written: Vec<(u64, LogRecord)> = (1..=32).map(|i| (i, record(i))).collect();
    {
        let mut log = RedoLog::open(dir.path(), 1 << 20).expect("a new log").log;
        let mut buf = Vec::new();
        for (lsn, r) in &written {
            encode_record(*lsn, r, &mut buf);
        }
        log.append(1, written.len() as u64, &buf).expect("append");
        log.sync().expect("sync");
    }
    let segment = dir.path().join(format!("{:020}.log", 1));
    let mut bytes = std::fs::read(&segment).expect("segment");
    let used = 32 + written.iter().map(|(l, r)| {
        let mut b = Vec::new();
        encode_record(*l, r, &mut b);
        b.len()
    }).sum::<usize>();
    // Mutate from a chosen point inside the records (or the header, for small `keep`).
    let at = used * usize::from(keep) / 255;
    for (i, b) in mutation.iter().enumerate() {
        if let Some(slot) = bytes.get_mut(at + i) {
            *slot = *b;
        }
    }
    std::fs::write(&segment, &bytes).expect("write back");
    let Ok(recovered) = RedoLog::open(dir.path(), 1 << 20) else {
        return;
    };
    let n = recovered.records.len();
    assert!(n <= written.len());
    assert_eq!(recovered.records[..], written[..n], "a prefix of what was written");
    let mut log = recovered.log;
    let next = log.next_lsn();
    assert_eq!(next, n as u64 + 1);
    let mut buf = Vec::new();
    encode_record(next, &record(99), &mut buf);
    log.append(next, 1, &buf).expect("append after open");
    log.sync().expect("sync");
    drop(log);
    let again = RedoLog::open(dir.path(), 1 << 20).expect("reopen");
    assert_eq!(again.records.len(), n + 1);
    assert_eq!(again.records[..n], written[..n]);
    assert_eq!(again.records[n], (next, record(99)));
});
