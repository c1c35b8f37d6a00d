//! The exporter's `config.json` reader on arbitrary bytes: never panics, and every config
//! it accepts validates, lays out an arena (or says why not) without panicking, and obeys
//! the reader's own ranges: its switches were 0/1 (or booleans), its softcap >= 0 and its
//! residual scale > 0.
#![no_main]

use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::state::Layout;
use libfuzzer_sys::fuzz_target;

/// The keys `hf_config::parse` reads as switches.
const SWITCHES: [&str; 11] = [
    "use_skip_connections",
    "use_block_lambdas",
    "use_value_residual",
    "use_tokenshift_att",
    "use_tokenshift_ffn",
    "kvm_use_merge_gate_keys",
    "kvm_use_merge_gate_values",
    "kvm_use_head_temps",
    "kvm_use_vlens",
    "kvm_apply_merge_gate_to_initial_state",
    "kvm_apply_merge_gate_to_appends",
];

fuzz_target!(|data: &[u8]| {
    let Some((&rank, json)) = data.split_first() else { return };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else { return };
    if let Ok(cfg) = kvm_export::hf_config::parse(&value, u32::from(rank), kvm_export::room::DEFAULT_CONTEXT) {
        assert!(cfg.validate().is_ok(), "parse returned a config that does not validate");
        assert!(cfg.logit_softcap >= 0.0 && cfg.residual_scale > 0.0, "softcap or residual scale out of range");
        for key in SWITCHES {
            let ok = match &value[key] {
                serde_json::Value::Null | serde_json::Value::Bool(_) => true,
                v => v.as_f64().is_some_and(|x| x == 0.0 || x == 1.0),
            };
            assert!(ok, "switch `{key}` accepted as {}", value[key]);
        }
        for reads in SlotReads::ALL {
            let _ = Layout::new(&cfg, cfg.natural_state_len(), CacheDtype::F32, reads);
        }
    }
});
