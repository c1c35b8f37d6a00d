//! One sampling step over a GPT-2-sized vocabulary (50304 logits), per sampler setting:
//! llama.cpp's defaults (top-k 40: only a shortlist is weighed), greedy, a top-k above
//! the one-pass buffer (100: a partial selection first), and top-p alone (every logit
//! weighed).
//!
//! `cargo bench --bench sampler`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvm_core::sampler::{sample_with_coin, scratch_len, Candidate, Pcg32, SamplerConfig};

const VOCAB_LEN: usize = 50304;

fn sampler(c: &mut Criterion) {
    // Logits spread as a trained model's roughly are: most far below the top few.
    let mut rng = Pcg32::new(5);
    let logits: Vec<f32> = (0..VOCAB_LEN).map(|_| rng.next_f32() * 12.0 - 8.0).collect();
    let recent: Vec<u32> = (0..64).map(|i| i * 37).collect();
    let mut scratch = vec![Candidate::EMPTY; scratch_len(VOCAB_LEN)];
    let settings = [
        ("default", SamplerConfig::DEFAULT),
        ("greedy", SamplerConfig::greedy()),
        ("top_k_100", SamplerConfig { top_k: 100, ..SamplerConfig::DEFAULT }),
        ("top_p_only", SamplerConfig { top_k: 0, min_p: 0.0, ..SamplerConfig::DEFAULT }),
    ];
    let mut group = c.benchmark_group(format!("sample/{VOCAB_LEN}"));
    group.throughput(Throughput::Elements(1));
    for (name, cfg) in settings {
        let mut coin = Pcg32::new(9);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| sample_with_coin(&cfg, &logits, &recent, &mut scratch, coin.next_f32()).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, sampler);
criterion_main!(benches);
