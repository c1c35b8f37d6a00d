//! `config.json` of an HF KVM checkpoint -> [`kvm_core::Config`] (spec §1).
//!
//! Missing fields take the reference's defaults; fields of other mixers are ignored;
//! configs that need code paths kvm does not implement are refused by name.

use anyhow::{anyhow, bail, Context, Result};
use kvm_core::config::{flags, Config, StateBudget};
use kvm_core::error::{ConfigField, Error};
use serde_json::Value;

use crate::room;

/// Reads the KVM-relevant fields of a parsed `config.json`. `d_vgate` (the value-gate
/// LoRA rank) is not in the config; the caller passes the checkpoint's. A growable state
/// gets room for `context` tokens ([`room::fit`]).
pub fn parse(json: &Value, d_vgate: u32, context: usize) -> Result<Config> {
    let obj = json.as_object().ok_or_else(|| anyhow!("config.json is not a JSON object"))?;
    let get = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let num = |k: &str, default: Option<f64>| -> Result<f64> {
        match get(k) {
            Some(Value::Bool(b)) => Ok(*b as u8 as f64),
            Some(v) => v.as_f64().ok_or_else(|| anyhow!("config field `{k}` is not a number: {v}")),
            None => default.ok_or_else(|| anyhow!("config field `{k}` is missing")),
        }
    };
    let uint = |k: &str, default: Option<f64>| -> Result<u32> {
        let v = num(k, default)?;
        if v < 0.0 || v.fract() != 0.0 {
            bail!("config field `{k}` must be a non-negative integer, got {v}");
        }
        if v > u32::MAX as f64 {
            bail!("config field `{k}` is {v}: more than the largest kvm supports, {}", u32::MAX);
        }
        Ok(v as u32)
    };
    // A switch is true or false, 0 or 1: anything else is no setting the reference knows.
    let flag = |k: &str, default: bool| -> Result<bool> {
        match get(k) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => match v.as_f64() {
                Some(0.0) => Ok(false),
                Some(1.0) => Ok(true),
                _ => bail!("config field `{k}` is {v}: expected true, false, 0 or 1"),
            },
        }
    };
    let string = |k: &str, default: &str| -> Result<String> {
        match get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => bail!("config field `{k}` is not a string: {v}"),
            None => Ok(default.to_string()),
        }
    };

    // Refuse what the KVM path of the reference does not compute as spec'd.
    let mixer = string("token_mixer", "kvm")?;
    if mixer != "kvm" {
        bail!("config field `token_mixer` is {mixer:?}: only \"kvm\" is supported");
    }
    if flag("use_skip_connections", false)? {
        bail!("config field `use_skip_connections` is set: U-Net skip connections are not supported");
    }
    if flag("use_block_lambdas", false)? {
        bail!("config field `use_block_lambdas` is set: block lambdas are not supported");
    }
    // Hybrid stacks (spec §5): every `alt_layer_every`-th layer a sliding-window layer.
    let alt = num("alt_layer_every", Some(-1.0))?;
    if alt.fract() != 0.0 || alt == 1.0 || alt > u32::MAX as f64 {
        bail!("config field `alt_layer_every` is {alt}: expected an integer >= 2 (or <= 0: no alternate layers)");
    }
    let hybrid = alt >= 2.0;
    if hybrid {
        let alt_mixer = string("alt_token_mixer", "swa")?;
        if alt_mixer != "swa" {
            bail!("config field `alt_token_mixer` is {alt_mixer:?}: only \"swa\" is supported");
        }
    }
    let value_residual = flag("use_value_residual", true)?;
    let vres_mode = string("kvm_value_residual_mode", "rwkv")?;
    if value_residual && vres_mode != "rwkv" {
        bail!("config field `kvm_value_residual_mode` is {vres_mode:?}: only \"rwkv\" is supported");
    }
    let tokenshift_att = flag("use_tokenshift_att", false)?;
    let ts_mode = string("kvm_token_shift_mode", "rwkv")?;
    if tokenshift_att && ts_mode != "rwkv" {
        bail!("config field `kvm_token_shift_mode` is {ts_mode:?}: only \"rwkv\" is supported");
    }

    if hybrid {
        let mode = string("swa_value_residual_mode", "rwkv")?;
        if value_residual && mode != "rwkv" {
            bail!("config field `swa_value_residual_mode` is {mode:?}: only \"rwkv\" is supported");
        }
        let mode = string("swa_token_shift_mode", "rwkv")?;
        if tokenshift_att && mode != "rwkv" {
            bail!("config field `swa_token_shift_mode` is {mode:?}: only \"rwkv\" is supported");
        }
    }

    let d_model = uint("hidden_size", None)?;
    let n_heads = uint("num_attention_heads", None)?;
    if n_heads == 0 {
        bail!("config field `num_attention_heads` is 0");
    }
    let d_head = get("d_head").map(|_| uint("d_head", None)).transpose()?;
    let d_qk = get("d_qk_head").map(|_| uint("d_qk_head", None)).transpose()?.or(d_head).unwrap_or(d_model / n_heads);
    let d_v = get("d_v_head").map(|_| uint("d_v_head", None)).transpose()?.or(d_head).unwrap_or(d_model / n_heads);
    let ffn = num("ffn_expansion", Some(4.0))?;
    let d_ff = (ffn * d_model as f64).floor() as u64 / 32 * 32;
    let d_ff = u32::try_from(d_ff).map_err(|_| {
        anyhow!(
            "config field `ffn_expansion` is {ffn}: d_ff = {d_ff} is more than the largest kvm supports, {}",
            u32::MAX
        )
    })?;
    let rope_dim = num("rope_partial_dim", Some(64.0))?;
    if rope_dim < 2.0 || rope_dim.fract() != 0.0 || rope_dim as u32 % 2 != 0 || rope_dim as u32 > d_qk {
        bail!("config field `rope_partial_dim` is {rope_dim}: it must be even and in [2, d_qk = {d_qk}]");
    }
    let budget = match string("state_budget_mode", "fixed")?.as_str() {
        "fixed" => StateBudget::Fixed,
        "power_law" => StateBudget::PowerLaw {
            factor: num("state_growth_factor", Some(1.0))?,
            exponent: num("state_growth_exponent", Some(0.5))?,
        },
        "kvm_saturation" => StateBudget::Saturation {
            n: num("state_saturation_n", None).context("`state_budget_mode` \"kvm_saturation\" needs it")?,
        },
        other => bail!("config field `state_budget_mode` is {other:?}: expected fixed, power_law or kvm_saturation"),
    };
    let state_min_len = num("state_min_len", Some(-1.0))?;
    if state_min_len.fract() != 0.0 || state_min_len < -1.0 || state_min_len > i32::MAX as f64 {
        bail!("config field `state_min_len` is {state_min_len}: expected an integer >= -1");
    }
    let chunk_len = uint("chunk_len", Some(256.0))?;
    let (alt_layer_every, alt_window, alt_rope_dim, alt_rope_theta) = if hybrid {
        let w = num("swa_window_size", Some(-1.0))?;
        if w.fract() != 0.0 || w > u32::MAX as f64 {
            bail!("config field `swa_window_size` is {w}: expected an integer");
        }
        let r = num("alt_rope_partial_dim", Some(64.0))?;
        if r < 2.0 || r.fract() != 0.0 || r as u32 % 2 != 0 || r as u32 > d_qk {
            bail!("config field `alt_rope_partial_dim` is {r}: it must be even and in [2, d_qk = {d_qk}]");
        }
        // `swa_window_size <= 0` means `chunk_len`.
        let window = if w <= 0.0 { chunk_len } else { w as u32 };
        (alt as u32, window, r as u32, num("alt_rope_theta", Some(10000.0))?)
    } else {
        (0, 0, 0, 0.0)
    };

    // The reference reads `residual_scale or 1.0`, so 0 would silently mean 1: refused,
    // as the scale that would zero every layer's output it looks like. Both are checked
    // as the file stores them, f32: 1e-46 would be stored as 0.
    let residual_scale = single("residual_scale", num("residual_scale", Some(1.0))?)?;
    if !(residual_scale.is_finite() && residual_scale > 0.0) {
        bail!("config field `residual_scale` is {residual_scale}: it must be finite and > 0 (null means 1)");
    }
    let logit_softcap = single("logit_softcap", num("logit_softcap", Some(0.0))?)?;
    if !(logit_softcap.is_finite() && logit_softcap >= 0.0) {
        bail!("config field `logit_softcap` is {logit_softcap}: it must be 0 (off) or a finite cap > 0");
    }

    let mut f = 0;
    for (on, bit) in [
        (tokenshift_att, flags::TOKENSHIFT_ATT),
        (flag("use_tokenshift_ffn", false)?, flags::TOKENSHIFT_FFN),
        (value_residual, flags::VALUE_RESIDUAL),
        (flag("kvm_use_merge_gate_keys", true)?, flags::MERGE_GATE_KEYS),
        (flag("kvm_use_merge_gate_values", true)?, flags::MERGE_GATE_VALUES),
        (flag("kvm_use_head_temps", true)?, flags::HEAD_TEMPS),
        (flag("kvm_use_vlens", true)?, flags::VLENS),
        (flag("kvm_apply_merge_gate_to_initial_state", false)?, flags::GATE_INITIAL_STATE),
        (flag("kvm_apply_merge_gate_to_appends", true)?, flags::GATE_APPENDS),
        (hybrid && flag("alt_share_v0", false)?, flags::ALT_SHARE_V0),
    ] {
        if on {
            f |= bit;
        }
    }
    let cfg = Config {
        vocab_len: uint("vocab_size", None)?,
        n_layers: uint("num_hidden_layers", None)?,
        n_heads,
        d_model,
        d_qk,
        d_v,
        d_ff,
        d_vgate: if value_residual { d_vgate } else { 0 },
        rope_dim: rope_dim as u32,
        rope_theta: num("rope_theta", Some(10000.0))?,
        chunk_len,
        window_chunks: uint("n_bswa_chunks", Some(2.0))?,
        max_state_chunks: 0,
        budget,
        state_min_len: state_min_len as i32,
        state_round_down: uint("state_round_down", Some(1.0))?,
        sink_len: uint("sink_len", Some(1.0))?,
        logit_softcap,
        residual_scale,
        flags: f,
        alt_layer_every,
        alt_window,
        alt_rope_dim,
        alt_rope_theta,
    };
    let cfg = room::fit(cfg, uint("n_max_d_chunks", Some(1.0))?, context).map_err(|e| match e.downcast::<Error>() {
        Ok(e) => config_error(obj, e),
        Err(e) => e,
    })?;
    Ok(cfg)
}

/// `v`, the value of config field `k`, as the f32 the file stores; refused where that
/// changes what it means: a non-zero value that becomes 0, a finite one that becomes
/// infinite.
fn single(k: &str, v: f64) -> Result<f32> {
    let s = v as f32;
    if (s == 0.0 && v != 0.0) || (s.is_infinite() && v.is_finite()) {
        bail!("config field `{k}` is {v:?}: as the f32 a model file stores it is {s}, another setting");
    }
    Ok(s)
}

/// The message of an invalid config, naming its `config.json` key.
fn config_error(obj: &serde_json::Map<String, Value>, e: Error) -> anyhow::Error {
    match e {
        Error::BadConfig(field) => {
            let key = json_key(field);
            match obj.get(key) {
                Some(v) => anyhow!("config field `{key}` is {v}: kvm cannot run a model with that value"),
                None => anyhow!("config field `{key}` (its default): kvm cannot run a model with that value"),
            }
        }
        e => anyhow!("config.json: {e}"),
    }
}

/// The `config.json` key a config field comes from.
fn json_key(field: ConfigField) -> &'static str {
    match field {
        ConfigField::VocabLen => "vocab_size",
        ConfigField::Layers => "num_hidden_layers",
        ConfigField::Heads => "num_attention_heads",
        ConfigField::DModel => "hidden_size",
        ConfigField::DQk => "d_qk_head",
        ConfigField::DV => "d_v_head",
        ConfigField::DFf => "ffn_expansion",
        ConfigField::DVGate => "v_gate1.weight (its rank)",
        ConfigField::RopePartialDim => "rope_partial_dim",
        ConfigField::RopeTheta => "rope_theta",
        ConfigField::ChunkLen => "chunk_len",
        ConfigField::WindowChunks => "n_bswa_chunks",
        ConfigField::MaxStateChunks => "n_max_d_chunks",
        ConfigField::StateBudget => "state_budget_mode",
        ConfigField::StateMinLen => "state_min_len",
        ConfigField::StateRoundDown => "state_round_down",
        ConfigField::StateGrowth => "state_growth_factor",
        ConfigField::StateSaturation => "state_saturation_n",
        ConfigField::SinkLen => "sink_len",
        ConfigField::LogitSoftcap => "logit_softcap",
        ConfigField::ResidualScale => "residual_scale",
        ConfigField::StateCapacity => "n_max_d_chunks",
        ConfigField::AltLayerEvery => "alt_layer_every",
        ConfigField::AltWindow => "swa_window_size",
        ConfigField::AltRopePartialDim => "alt_rope_partial_dim",
        ConfigField::AltRopeTheta => "alt_rope_theta",
        _ => "(a field of the model's config)",
    }
}
