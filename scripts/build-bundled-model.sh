#!/usr/bin/env bash
# Rebuilds models/tiny-kjv-q8_0.kvm, the model the README's first command runs, from the
# bf16 checkpoint in models/tiny-kjv (config.json + model.safetensors). Row-major q8_0
# (--no-repack), the layout examples/mcu/README.md's firmware measurements were taken with
# (the interleaved default gives the same bits).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --quiet -p kvm-export -- convert models/tiny-kjv -o models/tiny-kjv-q8_0.kvm --dtype q8_0 --no-repack --quiet
