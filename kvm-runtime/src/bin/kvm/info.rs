//! `kvm info`: what a model file holds and what running it costs.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kvm_core::cache::CacheDtype;
use kvm_core::config::{flags, Config, StateBudget};
use kvm_core::format::Header;
use kvm_core::state::{growth_stops, Layout};
use kvm_core::Model;
use kvm_runtime::file::{ModelFile, Pages};

/// How far `kvm info` follows a growable state to find where its room stops it: 16.7 M
/// tokens, well under a second.
const GROWTH_HORIZON: usize = 1 << 24;

pub fn run(path: &Path) -> Result<()> {
    let file = ModelFile::open(path, Pages::Mapped)?;
    let model = file.model()?;
    let h = model.header();
    let c = model.config();
    println!("model          {}", path.display());
    println!("format         v{}.{}, {} bytes", kvm_core::format::VERSION_MAJOR, h.minor, h.file_len);
    print_shape(c, h);
    print_state(c, h);
    println!("rope           {} dims, theta {}", c.rope_dim, c.rope_theta);
    let names = [
        (flags::TOKENSHIFT_ATT, "tokenshift_att"),
        (flags::TOKENSHIFT_FFN, "tokenshift_ffn"),
        (flags::VALUE_RESIDUAL, "value_residual"),
        (flags::MERGE_GATE_KEYS, "merge_gate_keys"),
        (flags::MERGE_GATE_VALUES, "merge_gate_values"),
        (flags::HEAD_TEMPS, "head_temps"),
        (flags::VLENS, "vlens"),
        (flags::GATE_INITIAL_STATE, "gate_initial_state"),
        (flags::GATE_APPENDS, "gate_appends"),
    ];
    let on: Vec<&str> = names.iter().filter(|(f, _)| c.has(*f)).map(|(_, n)| *n).collect();
    println!("flags          {}", on.join(" "));
    if c.logit_softcap != 0.0 {
        println!("logit_softcap  {}", c.logit_softcap);
    }
    println!("tokenizer      {:?}", h.tokenizer_kind);
    print_tensors(&model);
    print_arenas(&model);
    println!("slot reads     {}", h.reads.name());
    println!("kernel tier    {} ({} streaming of float rows)", crate::kernel_tier(), crate::kernel_streaming());
    Ok(())
}

/// The stack: its layers and their kinds, the numerics, the widths and the window.
fn print_shape(c: &Config, h: &Header) {
    println!("vocab_len      {}", c.vocab_len);
    println!("n_layers       {}", c.n_layers);
    // Each layer's kind, `kvm` or `swa` (a hybrid stack's alternate layers, spec §5).
    let kinds: Vec<&str> = (0..c.n_layers as usize).map(|l| if c.is_alt(l) { "swa" } else { "kvm" }).collect();
    println!("layers         {}", kinds.join(" "));
    if c.is_hybrid() {
        let share = if c.has(flags::ALT_SHARE_V0) { ", KVM layers share its v_first" } else { "" };
        println!(
            "swa            every {} layers from 0: window {} tokens, rope {} dims, theta {}{share}",
            c.alt_layer_every, c.alt_window, c.alt_rope_dim, c.alt_rope_theta
        );
    }
    let numerics = match (c.has(flags::INT_NUMERICS), h.cache) {
        (true, CacheDtype::Q8) => {
            "int: every step in integers (docs/integer.md): i8 matrices, fixed-point vectors, i8 attention rows"
        }
        (true, _) => {
            "int: every step in integers (docs/integer.md): i8 matrices, fixed-point vectors, i16 attention rows"
        }
        (false, _) => "float: the reference's f32 arithmetic on the stored weights",
    };
    println!("numerics       {numerics}");
    println!("d_model        {}", c.d_model);
    println!("n_heads        {} (d_qk {}, d_v {})", c.n_heads, c.d_qk, c.d_v);
    println!("d_ff           {}", c.d_ff);
    println!("chunk_len      {}", c.chunk_len);
    println!("window_len     {} ({} chunks)", c.window_len(), c.window_chunks);
}

/// The state's budget, its slots and, for a growable state, where its room stops it.
fn print_state(c: &Config, h: &Header) {
    let budget = match c.budget {
        StateBudget::Fixed => format!("fixed, state_min_len {}", c.state_min_len),
        StateBudget::PowerLaw { factor, exponent } => format!("power_law {factor} * ctx^{exponent}"),
        StateBudget::Saturation { n } => format!("kvm_saturation n={n}"),
    };
    println!(
        "state          {budget}; {} slots (--state-slots {}..={}), sink {}",
        h.state_capacity,
        c.chunk_len,
        c.natural_state_len(),
        c.sink_len
    );
    if !matches!(c.budget, StateBudget::Fixed) {
        // The file's room is its state capacity: past the context that fills it, the
        // state stops growing as the budget says and merges every folded token instead.
        let room = match growth_stops(c, h.state_capacity as usize, GROWTH_HORIZON) {
            Some(t) => format!("grows as its budget says through {} tokens of context, then merges without growing (fewer with --state-slots)", t - 1),
            None => format!("grows as its budget says through at least {GROWTH_HORIZON} tokens of context"),
        };
        println!("room           {} slots: {room}", h.state_capacity);
    }
}

/// The tensors' count and bytes per dtype, and the weights' total.
fn print_tensors(model: &Model<'_>) {
    let mut by_dtype: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut total = 0;
    for t in model.tensors() {
        let e = by_dtype.entry(t.dtype.name()).or_default();
        e.0 += 1;
        e.1 += t.len;
        total += t.len;
    }
    for (d, (n, bytes)) in &by_dtype {
        println!("tensors        {n:>4} x {d:<5} {bytes:>12} bytes");
    }
    println!("weights        {total} bytes");
}

/// The arena for each attention cache dtype the model allows.
fn print_arenas(model: &Model<'_>) {
    let (h, c) = (model.header(), model.config());
    // One line per cache dtype, as `--cache` (or `kvm_model_set_cache`) would pick it: the
    // core's arena and the C API's, which adds the session handle and the sampler's
    // scratch (`kvm_arena_size`).
    // An integer model's rows are i16 (`--cache f32`) or i8 (`q8`), never f16.
    let int = c.has(flags::INT_NUMERICS);
    // A state file saved after a prompt holds the logits too (`--save-state`).
    let logits = 4 * c.vocab_len as usize;
    for cache in CacheDtype::ALL {
        let Ok(m) = model.with_cache(cache) else { continue };
        let state = Layout::new(c, h.state_capacity as usize, cache, h.reads).map_or(0, |l| l.snapshot_len());
        let c_api = kvm_runtime::capi::arena_size(&m).unwrap_or(0);
        let default = if cache == h.cache { ", the file's default" } else { "" };
        let name = match (int, cache) {
            (true, CacheDtype::Q8) => "i8",
            (true, _) => "i16",
            _ => cache.name(),
        };
        println!(
            "arena {:<8} {} bytes ({state} of state, {logits} more with logits), {c_api} through the C API{default}",
            format!("({name})"),
            m.arena_len()
        );
    }
}
