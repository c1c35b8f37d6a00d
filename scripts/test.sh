#!/usr/bin/env bash
# kvm's whole test run, as CI runs it: set-up, lint, unit + integration tests (golden
# vectors, corrupt inputs, no-alloc), bare-metal builds, aarch64 tests under QEMU, the
# C API and its example under valgrind, kvm-core on wasm32 and its JS API (kvm-wasm)
# under Node, the page (examples/web) in headless Chromium, the kernel conformance checks
# and the firmware in QEMU.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "set-up"
bash scripts/setup.sh

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# fuzz/ is outside the workspace (its own lock file and target dir) but keeps its lints.
cargo fmt --manifest-path fuzz/Cargo.toml --check
cargo clippy --manifest-path fuzz/Cargo.toml --bins -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# STYLE rule 11: no function over 80 lines in kvm-core and kvm-runtime, no ISA kernel file
# over 800 (tests and generated tables aside).
python3 scripts/check-size.py

step "tests (host)"
cargo test --workspace

step "bare-metal builds of the core"
for target in thumbv7em-none-eabihf thumbv6m-none-eabi riscv32imac-unknown-none-elf riscv32imc-unknown-none-elf \
    thumbv8m.main-none-eabihf; do
    cargo build -p kvm-core --target "$target" --release --quiet
done
cargo build -p kvm-core --target thumbv7em-none-eabihf --features defmt --quiet

step "aarch64 kernels under QEMU (NEON, then NEON + dotprod)"
cargo test -p kvm-core --target aarch64-unknown-linux-gnu --lib --quiet
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu neoverse-n1" \
    cargo test -p kvm-core --target aarch64-unknown-linux-gnu --lib --quiet

step "C API: header drift, example under valgrind, output equals the CLI's"
bash scripts/gen-header.sh --check
cargo build --release -p kvm-runtime --quiet
prompt="And God said"
want=$(target/release/kvm generate --model models/tiny-kjv-q8_0.kvm --prompt "$prompt" -n 64 --temperature 0 2>/dev/null)
c_out=$(KVM_VALGRIND=1 bash examples/c/run.sh models/tiny-kjv-q8_0.kvm "$prompt" 64)
got=$(printf '%s\n' "$c_out" | sed -n '2p')
if [ "$got" != "$want" ]; then
    printf 'C example printed:\n%s\nkvm generate printed:\n%s\n' "$got" "$want" >&2
    exit 1
fi
echo "C example (valgrind clean) = kvm generate: $want"

step "kvm-core on wasm32 under Node, scalar and simd128: the unit tests, and greedy text equal to the CLI's"
# The library for browsers (no allocator), without and with simd128; then on
# wasm32-wasip1 under Node's WASI, once on scalar wasm and once on the simd128 tier, its
# unit tests (the kernel conformance suite among them) and the bundled model's greedy text,
# which must be `kvm generate`'s above. A failing test aborts the binary (wasm's panics do
# not unwind), hence --nocapture: the message is printed before the abort.
cargo build -p kvm-core --target wasm32-unknown-unknown --release --quiet
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
    cargo build -p kvm-core --target wasm32-unknown-unknown --release --quiet
export CARGO_TARGET_WASM32_WASIP1_RUNNER="node $PWD/scripts/wasi-run.mjs"
for flags in "" "-C target-feature=+simd128"; do
    export CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="$flags"
    cargo test -p kvm-core --lib --target wasm32-wasip1 --quiet -- --nocapture
    got=$(cargo run -p kvm-core --release --example generate --target wasm32-wasip1 --quiet -- \
        models/tiny-kjv-q8_0.kvm "$prompt" 64)
    if [ "$got" != "$want" ]; then
        printf 'wasm32 (%s) printed:\n%s\nkvm generate printed:\n%s\n' "${flags:-scalar}" "$got" "$want" >&2
        exit 1
    fi
    echo "wasm32 ${flags:-scalar}: kvm generate's text"
done
unset CARGO_TARGET_WASM32_WASIP1_RUNNER CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS

step "kvm-wasm: the JS API in Node (simd128): kvm generate's greedy and sampled text, state round trip, bad model"
# Its own workspace (kvm-wasm/), so its format and lints are checked here. The script
# installs the exact wasm-bindgen CLI the crate pins when it is missing.
cargo fmt --manifest-path kvm-wasm/Cargo.toml --check
RUSTFLAGS="-C target-feature=+simd128" cargo clippy --manifest-path kvm-wasm/Cargo.toml --release \
    --target wasm32-unknown-unknown --target-dir target/kvm-wasm --quiet -- -D warnings
bash scripts/wasm-pkg.sh --test

step "the page (examples/web) in headless Chromium: kvm generate's greedy text on the page, a corrupt model's message, a dropped model, Stop"
cargo build --release -p kvm-export --quiet
bash scripts/web-test.sh

step "kvm packs an f32 model as it loads: the same bits per byte as stored"
cargo build --release -p kvm-export --quiet
target/release/kvm-export convert models/tiny-kjv -o target/tiny-kjv-f32.kvm --dtype f32 >/dev/null
text=models/tiny-kjv/reference/dev_unseen_12k.txt
bpb() { target/release/kvm perplexity --model target/tiny-kjv-f32.kvm "$@" --text "$text" --json | sed 's/.*"bits_per_byte":\([0-9.]*\).*/\1/'; }
packed=$(bpb)
stored=$(bpb --no-pack)
bench=$(target/release/kvm bench --model target/tiny-kjv-f32.kvm --gen 4 --prompt-len 4 --bw-mib 0 --json)
[[ $bench == *'"packed_at_load":true'* ]] || { echo "kvm bench did not pack the f32 model: $bench" >&2; exit 1; }
awk -v a="$packed" -v b="$stored" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-6) }'
echo "bits per byte: packed $packed, as stored $stored"

step "kernel conformance on the boards: the compiled tier against scalar, and scalar against the firmware's references, on an386 (Cortex-M4F, dsp), an385 (ARMv6-M code, scalar), an505 (Cortex-M33, dsp), an547 (Cortex-M55, helium), riscv32 (RV32IMAC, scalar) and riscv32imc (RV32IMC, scalar)"
bash scripts/mcu-conformance.sh

# The boards without an FPU or atomics, an385 (ARMv6-M) and riscv32imc, run the bundled
# model and the 256 KiB configuration; the other dtypes, caches and models run on the first
# four boards only (riscv32 runs the same scalar kernels in soft float), which keeps what
# the two add to CI to about a minute and a half. scripts/mcu-check.sh runs every board.
four_boards="an386 an505 an547 riscv32"
step "firmware in QEMU: Rust on Cortex-M4F (an386), ARMv6-M (an385), Cortex-M33 (an505), Cortex-M55 (an547, Helium), RV32IMAC (riscv32) and RV32IMC (riscv32imc), C on an386, all equal to the host (q8_0x16; on $four_boards also f16/q8 attention caches, row-major q8_0, q4_0x16)"
bash scripts/mcu-check.sh
KVM_MCU_BOARDS="$four_boards" bash scripts/mcu-check.sh --dtype q8_0 --cache f16
KVM_MCU_BOARDS="$four_boards" bash scripts/mcu-check.sh --dtype q8_0 --cache q8
KVM_MCU_BOARDS="$four_boards" bash scripts/mcu-check.sh --dtype q8_0 --no-repack
KVM_MCU_BOARDS="$four_boards" bash scripts/mcu-check.sh --dtype q4_0

step "firmware in 256 KiB of RAM on every board, and the heap build (model loaded apart, cache chosen at run time) on an386: equal to the host"
bash scripts/mcu-check.sh --ram-kib 256
KVM_MCU_BOARDS=an386 bash scripts/mcu-check.sh --heap --cache q8

step "a hybrid stack on $four_boards (the paper's sliding-window layers between saturating KVM layers; tiny, random weights, q8_0): equal to the host, Rust and C"
target/release/kvm-export synth --preset tiny --dtype q8_0 --state saturation --max-context 256 -o target/tiny-hybrid-q8_0.kvm -q
KVM_MCU_BOARDS="$four_boards" bash scripts/mcu-check.sh target/tiny-hybrid-q8_0.kvm

step "the integer numerics (docs/integer.md): tiny-kjv exported with --numerics int on every board, its 256 KiB configuration and a tiny hybrid stack on an385 (ARMv6-M) and riscv32imc (RV32IMC), equal to the host, Rust and C"
target/release/kvm-export convert models/tiny-kjv --numerics int -o target/tiny-kjv-int.kvm -q
target/release/kvm-export convert models/tiny-kjv --numerics int --cache q8 --slot-reads recomputed -o target/tiny-kjv-int-256k.kvm -q
target/release/kvm-export synth --preset tiny --numerics int --state saturation --max-context 256 -o target/tiny-hybrid-int.kvm -q
bash scripts/mcu-check.sh target/tiny-kjv-int.kvm
KVM_MCU_BOARDS="an385 riscv32imc" bash scripts/mcu-check.sh --ram-kib 256 target/tiny-kjv-int-256k.kvm
KVM_MCU_BOARDS="an385 riscv32imc" bash scripts/mcu-check.sh target/tiny-hybrid-int.kvm

step "the Raspberry Pi boards (examples/boards): the Pico image under rp2040js equals the host (32 tokens) and refuses a corrupted or missing model in words; the Pico 2 image builds and fits; no semihosting in either; their budget"
bash scripts/boards-check.sh

step "the STM32F405 and ESP32-C3 boards (examples/boards): the STM32 under QEMU netduinoplus2 equal to the host, linked in and from its model slot, a flipped byte refused in words; the ESP32-C3 image within its chip; no semihosting in either; the STM32's defmt build; kvm's C library for four targets through CMake; their budget"
bash scripts/boards-stm32-esp32c3.sh

step "all checks passed"
