#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/), or the TARGETs named, for SECONDS each,
# default 60, seeded from small models of every dtype (a fixed state, a growable one and a
# hybrid stack), a GPT-2 tokenizer section and the golden checkpoints:
#
#   scripts/fuzz.sh 600
#   scripts/fuzz.sh 600 capi_sequence session_restore
#
# Installs what it needs when missing: the nightly toolchain (rustup) and cargo-fuzz
# (cargo install). Prints one line per target (time, executions, result) for
# fuzz/README.md. A crash stops the script; libFuzzer leaves the input in
# fuzz/artifacts/TARGET/: turn it into a plain regression test under tests/ with the
# input committed.
set -euo pipefail

secs=${1:-60}
shift $(($# > 0 ? 1 : 0))
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

corpus=fuzz/corpus
all=(model_from_bytes tokenizer_from_bytes session_restore capi_sequence export_config export_checkpoint)
for t in "${all[@]}"; do mkdir -p "$corpus/$t"; done
targets=("${@:-${all[@]}}")
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz: unknown target $t (${all[*]})" >&2; exit 2; }
done

cargo build --release -q -p kvm-export
export_=target/release/kvm-export
# The hybrid: sliding-window layers between saturating (growable) KVM layers. Every
# storage a file can have: each dtype, q4_0 and q8_0 row-major (--no-repack), the integer
# numerics with i16 and i8 attention rows, recomputed slot reads.
kinds=(f32 f32p f16 q8_0 q4_0 "q4_0 --no-repack" "q8_0 --no-repack" "f32 --numerics int"
    "f32 --numerics int --cache q8" "f16 --cache q8 --slot-reads recomputed")
for case in fixed_basic growable_power_law hybrid_swa_saturation; do
    for kind in "${kinds[@]}"; do
        read -r d flags <<< "$kind"
        seed=$corpus/model_from_bytes/$case-$(tr -d ' -' <<< "$kind").kvm
        # shellcheck disable=SC2086
        [ -f "$seed" ] || "$export_" convert "tests/data/golden/$case" -o "$seed" --dtype "$d" $flags -q
    done
done
cp models/tiny-kjv-q8_0.kvm "$corpus/model_from_bytes/"
seed=$corpus/tokenizer_from_bytes/gpt2.bin
[ -f "$seed" ] || "$export_" tokenizer tests/data/tokenizers/gpt2/tokenizer.json -o "$seed"
# export_config: a value-gate rank byte, then a config; export_checkpoint: the config's
# length (u16, little-endian), the config, the safetensors.
for case in tests/data/golden/*/; do
    name=$(basename "$case")
    config=$case/config.json
    { printf '\x20'; cat "$config"; } > "$corpus/export_config/$name"
    len=$(wc -c < "$config")
    { printf "\\x$(printf %02x $((len & 255)))\\x$(printf %02x $((len >> 8)))"; cat "$config" "$case/model.safetensors"; } \
        > "$corpus/export_checkpoint/$name"
done
printf '\x20\x00\x00\x00\x00' > "$corpus/session_restore/prompt-32"
printf '\xb0\x00\x00\x00\x00' > "$corpus/session_restore/hybrid-prompt-48"
printf '\x00\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x05\x00\x06\x07\x00\x00\x00\x00\x01\x01\x03\x02' \
    > "$corpus/capi_sequence/prefill-decode-save-restore"

# Inputs long enough for the largest seed of each target.
max_len() {
    case $1 in
        model_from_bytes) echo 1000000 ;;
        tokenizer_from_bytes) echo 1600000 ;;
        export_checkpoint) echo 1100000 ;;
        *) echo 4096 ;;
    esac
}

cd fuzz
cargo +nightly fuzz build -O
summary=()
for t in "${targets[@]}"; do
    log=$(mktemp)
    cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -max_len="$(max_len "$t")" \
        -print_final_stats=1 2> "$log" || { tail -40 "$log"; echo "fuzz: $t FAILED (input in fuzz/artifacts/$t/)"; exit 1; }
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    summary+=("$t: ${secs} s, ${execs:-?} executions, no crash")
    rm -f "$log"
done
printf '%s\n' "${summary[@]}"
