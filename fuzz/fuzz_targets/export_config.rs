//! The exporter's `config.json` reader on arbitrary bytes: never panics, and every config
//! it accepts validates and lays out an arena (or says why not) without panicking.
#![no_main]

use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::state::Layout;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&rank, json)) = data.split_first() else { return };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return };
    if let Ok(cfg) = kvm_export::hf_config::parse(&value, u32::from(rank), kvm_export::room::DEFAULT_CONTEXT) {
        assert!(cfg.validate().is_ok(), "parse returned a config that does not validate");
        for reads in SlotReads::ALL {
            let _ = Layout::new(&cfg, cfg.natural_state_len(), CacheDtype::F32, reads);
        }
    }
});
