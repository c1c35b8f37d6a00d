//! `Model::from_bytes` on arbitrary bytes: never panics; whatever it accepts decodes a
//! token without panicking either.
#![no_main]

use kvm_core::{Model, Session};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = Model::from_bytes(data) {
        let len = model.arena_len();
        if len <= 1 << 24 {
            let mut buf = vec![0u128; len / 16 + 4];
            // SAFETY: u128 storage viewed as bytes; any bytes are valid u8.
            let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 16) };
            let off = bytes.as_ptr().align_offset(64);
            if let Ok(mut s) = Session::new(model, &mut bytes[off..off + len]) {
                let _ = s.decode(0);
            }
        }
    }
});
