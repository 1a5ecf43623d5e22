//! Arbitrary bytes into the frame decoder: it must return a value or an error, never panic
//! or allocate past the frame limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tutti_wire::{decode_envelope, Request, Response};

fuzz_target!(|data: &[u8]| {
    let _ = decode_envelope::<Request>(data);
    let _ = decode_envelope::<Response>(data);
});
