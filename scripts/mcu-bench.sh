#!/usr/bin/env bash
# Instruction counts and memory of the kvm firmware (examples/mcu) on every QEMU board,
# for tiny-kjv in each weight dtype and attention cache.
#
# usage: scripts/mcu-bench.sh [--table]
#
# For each board x dtype (q8_0, q4_0: kvm-export's default layouts, q8_0x16 and q4_0x16) x
# cache (f32, f16, q8), runs `examples/mcu/run-qemu.sh --icount` and prints one JSON line:
#   {"model":"tiny-kjv","board":"an386","numerics":"float","dtype":"q8_0","cache":"f32",
#    "prefill_instructions_per_token":N,"decode_instructions_per_step":N,"model_flash_bytes":N,
#    "arena_bytes":N,"stack_bytes":N}
# then one for tiny-kjv in the integer numerics ("numerics":"int", `run-qemu.sh --numerics
# int`: i8 weights, its own i16 attention rows; "dtype":"i8","cache":"i16"), one for its
# 256 KiB configuration ("model":"tiny-kjv-256k", `--numerics int --ram-kib 256`: i8
# attention rows, slot reads recomputed; "cache":"i8") and one for a
# hybrid stack of tiny-kjv's shapes ("model":"tiny-hybrid": `kvm-export synth
# --preset tiny --state saturation --max-context 256`, layer 0 sliding-window attention over
# 256 tokens, layer 1 KVM; random weights, q8_0, f32 cache)
# (prefill: the 12 prompt tokens; decode: the mean of 64 steps; model_flash_bytes: the
# model file linked into read-only memory; stack_bytes: the painted stack's high-water
# mark). With --table a Markdown table of the same numbers follows. Boards:
# $KVM_MCU_BOARDS, default "an386 an385 an505 an547 riscv32 riscv32imc". Exits non-zero if a
# run fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/examples/mcu/run-qemu.sh"
read -r -a boards <<<"${KVM_MCU_BOARDS:-an386 an385 an505 an547 riscv32 riscv32imc}"
dtypes=(q8_0 q4_0)
caches=(f32 f16 q8)
table=0
case "${1:-}" in
    --table) table=1 ;;
    "") ;;
    *) echo "usage: scripts/mcu-bench.sh [--table]" >&2; exit 2 ;;
esac

log="$(mktemp)"
lines="$(mktemp)"
trap 'rm -f "$log" "$lines"' EXIT
# Runs the firmware on `board` with run-qemu.sh's arguments after the first five and
# prints the JSON line of `model`, `numerics`, `dtype` and `cache`.
bench() {
    local model="$1" board="$2" numerics="$3" dtype="$4" cache="$5"
    shift 5
    if ! "$run" --board "$board" "$@" --icount >"$log" 2>&1; then
        cat "$log" >&2
        echo "mcu-bench.sh: $model $board $dtype $cache failed" >&2
        exit 1
    fi
    MODEL="$model" BOARD="$board" NUMERICS="$numerics" DTYPE="$dtype" CACHE="$cache" perl -ne '
        $model = $1, $arena = $2 if /^kvm-mcu: model (\d+) bytes .* arena (\d+) bytes/;
        $stack = $1 if /^kvm-mcu: stack used (\d+) of/;
        $prefill = $1 if /^run-qemu.sh: icount: prefill .*\((\d+) per token\)/;
        $decode = $1 if /^run-qemu.sh: icount: decode .*\((\d+) per token\)/;
        END {
            die "mcu-bench.sh: a report line is missing\n" unless defined $model && defined $arena
                && defined $stack && defined $prefill && defined $decode;
            printf "{\"model\":\"%s\",\"board\":\"%s\",\"numerics\":\"%s\",\"dtype\":\"%s\",\"cache\":\"%s\","
                . "\"prefill_instructions_per_token\":%d,\"decode_instructions_per_step\":%d,"
                . "\"model_flash_bytes\":%d,\"arena_bytes\":%d,\"stack_bytes\":%d}\n",
                @ENV{qw(MODEL BOARD NUMERICS DTYPE CACHE)}, $prefill, $decode, $model, $arena, $stack;
        }' "$log" | tee -a "$lines"
}

hybrid="$root/examples/mcu/target/tiny-hybrid-q8_0.kvm"
mkdir -p "$(dirname "$hybrid")"
(cd "$root" && cargo run --release --quiet -p kvm-export -- synth --preset tiny --dtype q8_0 --state saturation \
    --max-context 256 -o "$hybrid" --quiet)
for board in "${boards[@]}"; do
    for dtype in "${dtypes[@]}"; do
        for cache in "${caches[@]}"; do
            bench tiny-kjv "$board" float "$dtype" "$cache" --dtype "$dtype" --cache "$cache"
        done
    done
    bench tiny-kjv "$board" int i8 i16 --numerics int
    bench tiny-kjv-256k "$board" int i8 i8 --numerics int --ram-kib 256
    bench tiny-hybrid "$board" float q8_0 f32 "$hybrid"
done

if [[ $table -eq 1 ]]; then
    echo
    echo "| model | board | numerics | dtype | cache | prefill, instructions per token | decode, instructions per step | model (flash), bytes | arena, bytes | stack, bytes |"
    echo "|---|---|---|---|---|---:|---:|---:|---:|---:|"
    perl -ne '
        my %f = /"(\w+)":"?([^",}]+)"?/g;
        sub commas { my $n = reverse shift; $n =~ s/(\d{3})(?=\d)/$1,/g; return scalar reverse $n }
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", @f{qw(model board numerics dtype cache)},
            map { commas($f{$_}) } qw(prefill_instructions_per_token decode_instructions_per_step
                model_flash_bytes arena_bytes stack_bytes);' "$lines"
fi
