#!/usr/bin/env python3
"""Writes golden cases with the KVM paper's reference code (run from its repository, not
copied): a random-weight checkpoint in the released HF layout plus what the reference
computes for it, in the layout of `tests/data/golden` (spec section 4).

Setup (what generated the cases here; torch runs on the CPU in float32):

    git clone https://github.com/recursal/KVM-paper /tmp/kvmref   # the reference
    printf 'def patch_fla_kda_rocm_autotune(*a, **k):\\n    pass\\n' \\
        > /tmp/kvmref/utils/fla_rocm_patches.py        # a module its utils import but lack
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers==5.3.0 pydantic safetensors
    /tmp/tv/bin/python scripts/reference_golden.py --ref /tmp/kvmref --out tests/data/golden [CASE ...]

`--check DIR` instead re-runs an existing case and prints how far its logits are from the
reference's (0 for the cases in `../shared/golden`: the same code computed them).

`--sweep N` writes N cases of random configurations under `--out` and compares kvm with
each (`target/release/kvm-export convert` at f32, then `kvm logits` with the prompt as
prefill and again with every token as prompt), printing one line per case: `ok`,
`MISMATCH` (max abs logit error over 1e-3; the line also gives how far the reference's
own prefill/decode and full forward are apart), `refused` (kvm's typed error, e.g. a
no-vlens shape the spec rules out) or `ref-fail` (the reference itself raised).
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # plain eager float32 on the CPU

# Each case: config changes against `fixed_basic`'s config, tokens T, prompt length P.
CASES = {
    "window3_chunk4_heads4": (dict(chunk_len=4, n_bswa_chunks=3, num_attention_heads=4, rope_partial_dim=8,
                                   state_min_len=8, n_max_d_chunks=2, sink_len=2), 120, 45),
    "unequal_heads_round_down": (dict(d_qk_head=16, d_v_head=24, state_budget_mode="power_law",
                                      state_growth_factor=1.5, state_round_down=4, n_max_d_chunks=6,
                                      residual_scale=0.8, rope_theta=500.0), 160, 50),
    "window1_saturation_sink0": (dict(n_bswa_chunks=1, state_budget_mode="kvm_saturation", state_saturation_n=24,
                                      state_min_len=2, n_max_d_chunks=4, sink_len=0, num_hidden_layers=3,
                                      kvm_use_merge_gate_values=0), 140, 9),
    "long_fixed_many_folds": (dict(kvm_apply_merge_gate_to_initial_state=1), 300, 100),
    "one_token_prompt_power_law": (dict(state_budget_mode="power_law", state_growth_factor=2.0,
                                        n_max_d_chunks=4), 90, 1),
    "odd_widths": (dict(hidden_size=48, num_attention_heads=3, rope_partial_dim=10, ffn_expansion=3,
                        vocab_size=101, mup_base_dim=48), 110, 40),
    "value_gate_only_growable": (dict(kvm_use_merge_gate_keys=0, state_budget_mode="power_law",
                                      state_growth_factor=2.0, n_max_d_chunks=5), 150, 20),
    "one_head_chunk16": (dict(num_attention_heads=1, chunk_len=16, state_min_len=16, rope_partial_dim=4,
                              use_tokenshift_ffn=0, use_value_residual=0), 130, 50),
    "saturation_round_down3": (dict(state_budget_mode="kvm_saturation", state_saturation_n=40, state_round_down=3,
                                    state_min_len=3, n_max_d_chunks=6, sink_len=3, use_tokenshift_att=0), 170, 33),
}
SEEDS = {name: 1000 + i for i, name in enumerate(CASES)}


def load(case):
    from model.rwkv7_backbone import RWKV7BackboneForCausalLM, MixerConfig
    from safetensors.torch import load_file

    cfg = json.load(open(f"{case}/config.json"))
    m = RWKV7BackboneForCausalLM(MixerConfig(**cfg)).float().eval()
    missing, unexpected = m.load_state_dict(load_file(f"{case}/model.safetensors"), strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in k or "inv_freq" in k for k in missing), missing
    return m


def run(m, ids, prompt_len):
    """Full forward; prefill of the prompt; then one cached token at a time."""
    import torch

    full = m(input_ids=ids[None]).logits[0]
    out = m(input_ids=ids[None, :prompt_len], use_cache=True)
    cache, pre, dec = out.past_key_values, out.logits[0], []
    for t in range(prompt_len, ids.numel()):
        o = m(input_ids=ids[None, t:t + 1], use_cache=True, past_key_values=cache,
              cache_position=torch.tensor([t]))
        cache = o.past_key_values
        dec.append(o.logits[0, -1])
    return full, pre, torch.stack(dec) if dec else torch.zeros(0, full.shape[-1]), cache


def randomize(m, seed, head_temps=(0.8, 0.6), v_gate0=0.4):
    """Weights of the shared cases' scale: matrices N(0, 1/fan_in), embeddings N(0, 1),
    norms 1 +- 0.2 (biases 0.1), token-shift mixes U(0, 1), head temperatures
    `lo + width * U(0, 1)` for `head_temps = (lo, width)`, the value-residual gate's bias
    `v_gate0 * N(0, 1)`. Drawn in parameter order from one generator."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for name, p in m.named_parameters():
        s, leaf = tuple(p.shape), name.split(".")[-1]
        if name.endswith("wte.weight"):
            v = torch.randn(s, generator=g)
        elif p.dim() == 2:
            v = torch.randn(s, generator=g) * s[1] ** -0.5
        elif "ln" in name:
            v = 1.0 + 0.2 * torch.randn(s, generator=g) if leaf == "weight" else 0.1 * torch.randn(s, generator=g)
        elif "head_temp" in leaf:
            v = head_temps[0] + head_temps[1] * torch.rand(s, generator=g)
        elif leaf in ("x_q", "x_k", "x_v"):
            v = torch.rand(s, generator=g)
        elif leaf == "v_gate0":
            v = v_gate0 * torch.randn(s, generator=g)
        else:
            raise SystemExit(f"no rule for parameter {name} {s}")
        with torch.no_grad():
            p.copy_(v)


def make(out, base, changes, n_tokens, prompt_len, seed):
    import torch
    from model.rwkv7_backbone import RWKV7BackboneForCausalLM, MixerConfig
    from safetensors.torch import save_file

    cfg = dict(base, **changes)
    os.makedirs(out, exist_ok=True)
    m = RWKV7BackboneForCausalLM(MixerConfig(**cfg)).float().eval()
    randomize(m, seed)
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=2, sort_keys=True)
    weights = {k: v.contiguous() for k, v in m.state_dict().items() if "rotary" not in k and "inv_freq" not in k}
    save_file(weights, f"{out}/model.safetensors")
    m = load(out)  # what a reader of the files gets
    ids = torch.randint(0, cfg["vocab_size"], (n_tokens,), generator=torch.Generator().manual_seed(seed + 1))
    taps = {}
    hooks = [m.transformer.ln_emb.register_forward_hook(lambda mod, i, o: taps.__setitem__("embed", o[0].clone()))]
    for l, block in enumerate(m.transformer.h):
        hooks.append(block.register_forward_hook(
            lambda mod, i, o, l=l: taps.__setitem__(f"hidden.{l}", (o[0] if isinstance(o, tuple) else o)[0].clone())))
    full = m(input_ids=ids[None]).logits[0]  # the taps come from this full forward alone
    for h in hooks:
        h.remove()
    _, pre, dec, cache = run(m, ids, prompt_len)
    golden = {"input_ids": ids.int(), "prompt_len": torch.tensor([prompt_len], dtype=torch.int32),
              "logits_full": full, "logits_prefill": pre, "logits_decode": dec, **taps}
    for l, layer in enumerate(cache.layers):
        states = layer.states_dict
        for k in ("s_k", "s_v", "s_vlen", "bswa_k", "bswa_v"):
            golden[f"state.{l}.{k}"] = states[f"kvm_{k}"][0]
        for k in ("state_coverage_len", "bswa_begin"):
            golden[f"state.{l}.{k}"] = torch.tensor([int(states[f"kvm_{k}"])], dtype=torch.int32)
    save_file({k: v.contiguous() for k, v in golden.items()}, f"{out}/golden.safetensors")
    drift = float((full[prompt_len:] - dec).abs().max()) if n_tokens > prompt_len else 0.0
    print(f"{out}: {n_tokens} tokens, prompt {prompt_len}; reference full vs decode {drift:.1e}")


def random_config(r):
    """A configuration the spec allows, drawn from `r` (a random.Random)."""
    heads = r.choice([1, 2, 4])
    hidden = heads * r.choice([16, 32]) if r.random() < 0.5 else r.choice([32, 48, 64])
    hidden += (-hidden) % heads
    c = dict(num_attention_heads=heads, hidden_size=hidden, mup_base_dim=hidden, chunk_len=r.choice([4, 8, 16]),
             n_bswa_chunks=r.choice([1, 2, 3]), num_hidden_layers=r.choice([1, 2, 3]),
             vocab_size=r.choice([50, 96, 130]), ffn_expansion=r.choice([2, 3, 4]), sink_len=r.choice([0, 1, 2, 3]),
             logit_softcap=r.choice([0, 0, 30.0]), residual_scale=r.choice([1.0, 1.0, 0.7]),
             rope_theta=r.choice([10000.0, 500.0]))
    if r.random() < 0.3:
        c["d_qk_head"], c["d_v_head"] = r.choice([8, 16, 24]), r.choice([8, 16, 24])
    dqk = c.get("d_qk_head") or hidden // heads
    c["rope_partial_dim"] = r.choice([x for x in (2, 4, 8, dqk) if x <= dqk and x % 2 == 0])
    for flag in ("kvm_use_vlens", "kvm_use_head_temps", "kvm_use_merge_gate_keys", "kvm_use_merge_gate_values",
                 "kvm_apply_merge_gate_to_appends", "kvm_apply_merge_gate_to_initial_state", "use_tokenshift_att",
                 "use_tokenshift_ffn", "use_value_residual"):
        c[flag] = int(r.random() < 0.7)
    chunk, mode = c["chunk_len"], r.choice(["fixed", "power_law", "kvm_saturation"])
    c.update(state_budget_mode=mode, state_round_down=r.choice([1, 1, 2, 3, 4]))
    if mode == "fixed":
        d = r.choice([1, 2])
        c.update(n_max_d_chunks=d, state_min_len=d * chunk)
    else:
        c.update(n_max_d_chunks=r.choice([2, 4, 6]), state_min_len=r.choice([1, 2, chunk]))
        if mode == "power_law":
            c.update(state_growth_factor=r.choice([1.0, 1.5, 2.0, 3.0]), state_growth_exponent=r.choice([0.5, 0.6]))
        else:
            c["state_saturation_n"] = r.choice([16, 24, 48])
    return c


def sweep(out, base, count, kvm_dir):
    import random
    import subprocess

    import numpy as np
    import torch
    from safetensors.torch import load_file

    for i in range(count):
        r = random.Random(i)
        cfg, case = random_config(r), os.path.join(out, f"sweep{i}")
        n_tokens = r.randint(20, 300)
        prompt_len = r.randint(1, n_tokens)
        try:
            make(case, base, cfg, n_tokens, prompt_len, seed=5000 + i)
        except Exception as e:  # the reference's own limits (e.g. no-vlens growable states)
            print(i, "ref-fail", type(e).__name__, str(e)[:100], flush=True)
            continue
        g = load_file(f"{case}/golden.safetensors")
        ids = ",".join(str(int(x)) for x in g["input_ids"])
        p = subprocess.run([f"{kvm_dir}/kvm-export", "convert", case, "-o", f"{case}/m.kvm", "--dtype", "f32", "-q"],
                           capture_output=True, text=True)
        if p.returncode:
            print(i, "refused", p.stderr.strip()[-120:], flush=True)
            continue
        errors = {}
        for name, plen, want in [("split", prompt_len, torch.cat([g["logits_prefill"], g["logits_decode"]])),
                                 ("full", n_tokens, g["logits_full"])]:
            subprocess.run([f"{kvm_dir}/kvm", "logits", "--model", f"{case}/m.kvm", "--tokens", ids, "--prompt-len",
                            str(plen), "--out", f"{case}/{name}.npy", "--threads", "1"], check=True)
            errors[name] = float(np.abs(np.load(f"{case}/{name}.npy") - want.numpy()).max())
        own = float((g["logits_full"][prompt_len:] - g["logits_decode"]).abs().max()) if n_tokens > prompt_len else 0.0
        verdict = "ok" if max(errors.values()) <= 1e-3 else "MISMATCH"
        print(i, verdict, " ".join(f"{k} {v:.1e}" for k, v in errors.items()), f"reference's own {own:.1e}",
              "" if verdict == "ok" else json.dumps(cfg), flush=True)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="checkout of recursal/KVM-paper")
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--check", help="a case directory to re-run")
    ap.add_argument("--sweep", type=int, metavar="N", help="compare kvm with N random configurations")
    ap.add_argument("--kvm", default="target/release", help="where kvm and kvm-export are (for --sweep)")
    ap.add_argument("cases", nargs="*", help=f"default: all of {', '.join(CASES)}")
    a = ap.parse_args()
    sys.path.insert(0, a.ref)
    import torch

    torch.set_grad_enabled(False)
    if a.check:
        from safetensors.torch import load_file

        g = load_file(f"{a.check}/golden.safetensors")
        full, pre, dec, _ = run(load(a.check), g["input_ids"].long(), int(g["prompt_len"][0]))
        for k, v in [("logits_full", full), ("logits_prefill", pre), ("logits_decode", dec)]:
            print(k, float((v - g[k]).abs().max()))
        return
    base = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "golden",
                                       "fixed_basic", "config.json")))
    if a.sweep:
        sweep(a.out, base, a.sweep, a.kvm)
        return
    for name in a.cases or CASES:
        changes, n_tokens, prompt_len = CASES[name]
        make(os.path.join(a.out, name), base, changes, n_tokens, prompt_len, SEEDS[name])


if __name__ == "__main__":
    main()
