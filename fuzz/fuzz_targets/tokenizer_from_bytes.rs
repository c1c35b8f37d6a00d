//! `Tokenizer::from_bytes` on arbitrary bytes: never panics; an accepted section encodes
//! and decodes text without panicking.
#![no_main]

use kvm_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tok) = Tokenizer::from_bytes(data) {
        let mut ids = [0u32; 64];
        if let Ok(n) = tok.encode("Hello, wörld! 123 <|endoftext|>", &mut ids) {
            let mut out = [0u8; 1024];
            let _ = tok.decode_into(&ids[..n], &mut out);
        }
    }
});
