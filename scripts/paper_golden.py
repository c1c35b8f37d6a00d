#!/usr/bin/env python3
"""Writes one golden case per KVM configuration of the paper, with the paper's reference code
(run from its repository, not copied): `tests/data/paper/<case>` (layout in
`tests/data/paper/README.md`), hybrid stacks (`alt_layer_every` >= 2) among them.

Each case is built from one of the reference's own files, every `kvm*.yaml` and
`ablation_kvm*.yaml` of `configs/prolong/{120M,350M}` (its `model:` section merged over
`configs/prolong/base.yaml`'s), named `paper_<size>_<yaml stem>`. Only the widths shrink:
hidden 64, 2 heads, 4 layers, vocabulary 256, `mup_base_dim` = hidden, and the RoPE dims
the file sets scale with the head (`rope_partial_dim` 64 of a 128-wide head -> 16 of a
32-wide one; `alt_rope_partial_dim` 128 -> 32). Chunk, window, budgets, gates and
`residual_scale` stay as trained. Random weights (drawn below, in f32, so that merges,
gates and temperatures matter) are saved in bf16 by the reference's `save_pretrained`
(the released layout: `config.json`, `generation_config.json`, `model.safetensors`);
the reference then loads them back as f32 and computes, on the CPU in float32, the logits
of T = 1000 random tokens: a prompt of P = 500 (`logits_prefill`, [P, V]), then one
cached token at a time (`logits_decode`, [T - P, V]), past the first fold at token 769.
`golden.safetensors` holds those two, `input_ids` (i32 [T]) and `prompt_len` (i32 [1]).

Setup (as in `scripts/reference_golden.py`):

    git clone https://github.com/recursal/KVM-paper /tmp/kvmref   # the reference
    printf 'def patch_fla_kda_rocm_autotune(*a, **k):\\n    pass\\n' \\
        > /tmp/kvmref/utils/fla_rocm_patches.py        # a module its utils import but lack
    python3 -m venv /tmp/tv && /tmp/tv/bin/pip install torch transformers==5.3.0 pydantic safetensors pyyaml

Every case (what generated the ones here; under a minute each on one core):

    /tmp/tv/bin/python scripts/paper_golden.py --ref /tmp/kvmref

Some (`--only` takes case names):

    /tmp/tv/bin/python scripts/paper_golden.py --ref /tmp/kvmref --only paper_120M_kvm_wd

One file with a seed of your choosing, into a directory of your choosing, compared with
another case. This reproduces `../shared/golden/paper_120M_kvm_sqrt16_wd` (seed 41) and
`paper_350M_kvm_swa_saturate1024_wd` (seed 42): weights, tokens and `config.json` bit for
bit, logits to 4.3e-6 and 2.6e-6 (float32 sums in another order: torch's thread count
alone moves them by 1e-7):

    /tmp/tv/bin/python scripts/paper_golden.py --ref /tmp/kvmref \\
        --yaml configs/prolong/120M/kvm_sqrt16_wd.yaml --seed 41 --out /tmp/case \\
        --compare ../shared/golden/paper_120M_kvm_sqrt16_wd

Seeds (`seeds()`): the weights of the case at position i of the sorted names are drawn
with seed 7000 + i, its tokens with the weights' seed + 2000 (the shared cases' rule):
7000-7003 120M's `ablation_kvm_no_{head_temps,merge_gate,sink,vlens}`, 7004
`kvm_no_append_gate_wd`, 7005 `kvm_sqrt16_no_append_gate_wd`, 7006
`kvm_sqrt16_no_merge_gate_wd`, 7007 `kvm_sqrt16_wd`, 7008-7010
`kvm_swa_saturate1024_{no_append_gate_,no_merge_gate_,}wd`, 7011 `kvm_wd`; 350M's 7012
`kvm_no_append_gate_wd`, 7013 `kvm_no_merge_gate_wd`, 7014 `kvm_sqrt16_no_append_gate_wd`,
7015 `kvm_sqrt16_wd`, 7016-7017 `kvm_swa_saturate1024_{no_append_gate_,}wd`, 7018 `kvm_wd`.
`--full-size TOKENIZER_JSON` with `--yaml`, `--seed` and `--out` writes only a checkpoint
at the paper's own widths (random weights as above, bf16, `save_pretrained`, no logits)
with that `tokenizer.json`, for end-to-end runs of the full-size models:

    /tmp/tv/bin/python scripts/paper_golden.py --ref /tmp/kvmref --yaml configs/prolong/120M/kvm_sqrt16_wd.yaml \\
        --seed 1 --out /tmp/sqrt16-120m --full-size tests/data/tokenizers/gpt2/tokenizer.json

`--drift` also prints how far the reference's own decode is from its full forward over
the same tokens (a check on near-ties; nothing stored).
"""
import argparse
import glob
import json
import os
import shutil
import sys

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # plain eager float32 on the CPU

SIZES = ("120M", "350M")
# The small widths: a 32-wide head as the paper's 128-wide one.
SMALL = dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=4, vocab_size=256, mup_base_dim=64)
N_TOKENS, PROMPT_LEN = 1000, 500  # the first fold at token 769 falls in the decode
IDS_SEED_OFFSET = 2000  # tokens are drawn with the weights' seed + this


def yaml_files(ref):
    """`{case name: yaml path}` for every KVM configuration of the paper."""
    files = {}
    for size in SIZES:
        for pattern in ("kvm*.yaml", "ablation_kvm*.yaml"):
            for path in glob.glob(os.path.join(ref, "configs", "prolong", size, pattern)):
                files[f"paper_{size}_{os.path.splitext(os.path.basename(path))[0]}"] = path
    return dict(sorted(files.items()))


def seeds(names):
    """The weights' seed of each case: 7000 + its position in the sorted names."""
    return {name: 7000 + i for i, name in enumerate(sorted(names))}


def full_config(ref, path):
    """The `model:` section of `path` merged over base.yaml's, as the paper trains it."""
    import yaml

    base = yaml.safe_load(open(os.path.join(ref, "configs", "prolong", "base.yaml")))["model"]
    return dict(base, **yaml.safe_load(open(path))["model"])


def small_config(ref, path):
    """The `model:` section of `path` merged over base.yaml's, widths shrunk."""
    import yaml

    own = yaml.safe_load(open(path))["model"]
    cfg = full_config(ref, path)
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    small_head = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    for key in ("rope_partial_dim", "alt_rope_partial_dim"):
        if key in own:
            cfg[key] = own[key] * small_head // head
    cfg.update(SMALL)
    return cfg


def randomize(m, seed):
    """`reference_golden.randomize` with the paper cases' head temperatures, U(0.5, 1.5),
    and value-residual gate bias, N(0, 0.25)."""
    import reference_golden

    reference_golden.randomize(m, seed, head_temps=(0.5, 1.0), v_gate0=0.5)


def make(out, cfg, seed, drift):
    """Writes the case `out` (into `out`.partial, then renamed over it); with `drift`, also
    prints how far the reference's own decode is from its full forward."""
    import torch
    from model.rwkv7_backbone import RWKV7BackboneForCausalLM, MixerConfig
    from safetensors.torch import save_file

    import reference_golden

    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    m = RWKV7BackboneForCausalLM(MixerConfig(**cfg)).float().eval()
    randomize(m, seed)
    m.to(torch.bfloat16).save_pretrained(tmp)
    for extra in glob.glob(os.path.join(tmp, "*.py")):  # the reference's code: not ours to keep
        os.remove(extra)
    m = reference_golden.load(tmp)  # what a reader of the released files gets, as f32
    gen = torch.Generator().manual_seed(seed + IDS_SEED_OFFSET)
    ids = torch.randint(0, cfg["vocab_size"], (N_TOKENS,), generator=gen)
    pre, dec = prefill_decode(m, ids)
    golden = {"input_ids": ids.int(), "prompt_len": torch.tensor([PROMPT_LEN], dtype=torch.int32),
              "logits_prefill": pre, "logits_decode": dec}
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(tmp, "golden.safetensors"))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    os.rename(tmp, out)
    own = ""
    if drift:
        own = f"; reference full vs decode {float((m(input_ids=ids[None]).logits[0, PROMPT_LEN:] - dec).abs().max()):.1e}"
    print(f"{out}: seed {seed}{own}", flush=True)


def checkpoint(out, cfg, seed, tokenizer):
    """Writes only the checkpoint of `cfg` at full size (no logits): random weights as
    `randomize` draws them, saved in bf16 by `save_pretrained`, plus `tokenizer` as its
    `tokenizer.json`; into `out`.partial, then renamed over `out`."""
    import torch
    from model.rwkv7_backbone import RWKV7BackboneForCausalLM, MixerConfig

    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    m = RWKV7BackboneForCausalLM(MixerConfig(**cfg)).float().eval()
    randomize(m, seed)
    m.to(torch.bfloat16).save_pretrained(tmp)
    for extra in glob.glob(os.path.join(tmp, "*.py")):
        os.remove(extra)
    shutil.copy(tokenizer, os.path.join(tmp, "tokenizer.json"))
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    n = sum(p.numel() for p in m.parameters())
    print(f"{out}: {n / 1e6:.1f}M parameters, seed {seed}", flush=True)


def prefill_decode(m, ids):
    """The prompt's logits ([P, V]) in one call, then each next token's ([T - P, V]) cached."""
    import torch

    out = m(input_ids=ids[None, :PROMPT_LEN], use_cache=True)
    cache, dec = out.past_key_values, []
    for t in range(PROMPT_LEN, ids.numel()):
        o = m(input_ids=ids[None, t:t + 1], use_cache=True, past_key_values=cache, cache_position=torch.tensor([t]))
        cache = o.past_key_values
        dec.append(o.logits[0, -1])
    return out.logits[0], torch.stack(dec)


def compare(a, b):
    """Prints how far case `a`'s files are from case `b`'s."""
    from safetensors.torch import load_file

    for name in ("model.safetensors", "golden.safetensors"):
        x, y = load_file(os.path.join(a, name)), load_file(os.path.join(b, name))
        assert x.keys() == y.keys(), (name, sorted(x.keys() ^ y.keys()))
        worst = max(float((x[k].double() - y[k].double()).abs().max()) for k in x)
        print(f"{name}: max abs difference {worst:.1e}")
    ca, cb = (json.load(open(os.path.join(d, "config.json"))) for d in (a, b))
    print("config.json:", "same" if ca == cb else f"differs in {sorted(k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="checkout of recursal/KVM-paper")
    ap.add_argument("--data", default="tests/data", help="where paper/ goes")
    ap.add_argument("--only", nargs="*", help="case names (default: every one)")
    ap.add_argument("--yaml", help="one configuration file (relative to --ref) instead of every one")
    ap.add_argument("--seed", type=int, help="with --yaml: the weights' seed")
    ap.add_argument("--out", help="with --yaml: the case directory")
    ap.add_argument("--drift", action="store_true", help="also run the reference's full forward and print "
                    "how far its decode is from it (a check on near-ties; nothing stored)")
    ap.add_argument("--threads", type=int, default=1, help="torch's threads (the cases here: 1)")
    ap.add_argument("--compare", help="with --yaml: a case directory to compare the new one with")
    ap.add_argument("--full-size", metavar="TOKENIZER_JSON", help="with --yaml: write only the checkpoint, "
                    "at the paper's own widths (no logits), with this tokenizer.json (GPT-2's)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, a.ref)
    import torch

    torch.set_grad_enabled(False)
    torch.set_num_threads(a.threads)
    if a.yaml:
        if a.seed is None or not a.out:
            ap.error("--yaml needs --seed and --out")
        if a.full_size:
            checkpoint(a.out, full_config(a.ref, os.path.join(a.ref, a.yaml)), a.seed, a.full_size)
            return
        make(a.out, small_config(a.ref, os.path.join(a.ref, a.yaml)), a.seed, a.drift)
        if a.compare:
            compare(a.out, a.compare)
        return
    files = yaml_files(a.ref)
    unknown = set(a.only or ()) - files.keys()
    if unknown:
        ap.error(f"no such case: {', '.join(sorted(unknown))}")
    for name, seed in seeds(files).items():
        if a.only and name not in a.only:
            continue
        cfg = small_config(a.ref, files[name])
        make(os.path.join(a.data, "paper", name), cfg, seed, a.drift)


if __name__ == "__main__":
    main()
