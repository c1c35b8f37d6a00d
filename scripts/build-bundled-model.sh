#!/usr/bin/env bash
# Rebuilds models/tiny-kjv-q8_0.kvm, the model the README's first command runs, from the
# bf16 checkpoint in models/tiny-kjv (config.json + model.safetensors), as q8_0x16 (the
# default for q8_0), which both the SIMD tiers and the firmware's scalar kernels read faster
# than row-major q8_0.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet -p kvm-export -- convert models/tiny-kjv -o models/tiny-kjv-q8_0.kvm --dtype q8_0 --quiet
