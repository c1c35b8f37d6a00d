//! One decode step (`Session::decode`, one thread) of random-weight models, per weight
//! dtype and attention cache dtype (`q8_0/f16` = q8_0 weights, f16 cache), in the steady
//! state (full window, full state).
//!
//! `cargo bench --bench decode` times the `tiny` preset; set `KVM_BENCH_PRESETS` to a
//! comma-separated list (`tiny,paper-120m`) for others. `KVM_KERNELS` forces a tier.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvm_core::cache::CacheDtype;
use kvm_core::quant::DType;
use kvm_core::state::Phase;
use kvm_core::Session;
use kvm_export::synth::{synth, Preset};
use kvm_runtime::arena::Arena;
use kvm_runtime::file::{ModelFile, Pages};
use kvm_runtime::pool::Pool;
use kvm_runtime::prefill::prefill;
use kvm_write::policy::Policy;

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(0) as u32
}

fn presets() -> Vec<Preset> {
    let names = std::env::var("KVM_BENCH_PRESETS").unwrap_or_else(|_| "tiny".into());
    names.split(',').map(|n| Preset::from_name(n.trim()).unwrap_or_else(|| panic!("unknown preset `{n}`"))).collect()
}

fn decode(c: &mut Criterion) {
    kvm_core::kernels::init_from_env().expect("KVM_KERNELS names a tier this CPU runs");
    let tier = kvm_core::kernels::tier().name();
    for preset in presets() {
        let cfg = preset.config();
        let mut group = c.benchmark_group(format!("decode/{}/{tier}", preset.name()));
        group.throughput(Throughput::Elements(1));
        if preset != Preset::Tiny {
            group.sample_size(10);
        }
        for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
            let path = std::env::temp_dir().join(format!(
                "kvm-bench-{}-{}-{}.kvm",
                preset.name(),
                dtype.name(),
                std::process::id()
            ));
            synth(&path, &cfg, &Policy::uniform(dtype), 0, &mut |_| {}).unwrap();
            let file = ModelFile::open(&path, Pages::Mapped).unwrap();
            for cache in CacheDtype::ALL {
                let model = file.model().unwrap().with_cache(cache).unwrap();
                let mut arena = Arena::new(model.arena_len());
                let mut session = Session::new(model, arena.bytes_mut()).unwrap();
                // Past the window, so every step reads a full state and a steady window.
                let n = cfg.window_len() + cfg.chunk_len as usize;
                let prompt: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(7919) % cfg.vocab_len).collect();
                prefill(&mut session, &prompt, Phase::Prefill, &Pool::new(1).unwrap()).unwrap();
                let mut next = argmax(session.logits());
                let id = format!("{}/{}", dtype.name(), cache.name());
                group.bench_function(BenchmarkId::from_parameter(id), |b| {
                    b.iter(|| next = argmax(session.decode(next).unwrap()))
                });
            }
            std::fs::remove_file(&path).ok();
        }
        group.finish();
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
