#!/usr/bin/env bash
# Runs the kvm firmware (examples/mcu) on the QEMU boards and checks its text.
#
# usage: scripts/mcu-check.sh [--no-host] [--icount] [--dtype D [--cache C] [--no-repack] | MODEL]
#
# MODEL defaults to the bundled models/tiny-kjv-q8_0.kvm; --dtype converts models/tiny-kjv
# with kvm-export first (--cache f16: sessions store attention rows as f16; --no-repack:
# q8_0/q4_0 matrices row-major instead of interleaved). Checks:
# - the text of an386 (Cortex-M4F, scalar kernels), an505 (Cortex-M33) and an547 (Cortex-M55,
#   Helium kernels) is identical;
# - it equals the reference implementation's greedy continuation
#   (models/tiny-kjv/reference/greedy.json) when the weights are exact (--dtype f32, f16
#   or bf16: the checkpoint is bf16);
# - the C firmware on kvm's C API (examples/c-firmware) prints the same text, once
#   kvm-runtime/include/kvm.h exists;
# - prompt + text equals the first 76 bytes of the host's
#   `kvm generate --prompt "And God said" -n 64 --temperature 0`, run with the host's best
#   kernel tier for integer formats (q8_0, q4_0: every tier gives the firmware's scalar
#   kernels' bits) and with the scalar tier for float ones (--dtype f32/f16/bf16, whose
#   SIMD tiers sum in another order and may pick another token at a near tie). Builds the
#   host `kvm` (skip: --no-host).
# --icount runs the boards under QEMU -icount and prints their instruction counts
# (run-qemu.sh --icount). Prints "N passed, N failed"; exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/examples/mcu/run-qemu.sh"
dtype=""
cache=f32
repack=()
model=""
host=1
icount=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dtype) dtype="${2:?--dtype needs a value}"; shift 2 ;;
        --cache) cache="${2:?--cache needs a value}"; shift 2 ;;
        --no-host) host=0; shift ;;
        --icount) icount=(--icount); shift ;;
        --no-repack) repack=(--no-repack); shift ;;
        *) model="$1"; shift ;;
    esac
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -n "$dtype" ]]; then
    model="$root/examples/mcu/target/tiny-kjv-$dtype-$cache-cache${repack:+-plain}.kvm"
    mkdir -p "$(dirname "$model")"
    (cd "$root" && cargo run --quiet --release -p kvm-export -- \
        convert models/tiny-kjv -o "$model" --dtype "$dtype" --cache "$cache" "${repack[@]}" --quiet)
fi
model="${model:-$root/models/tiny-kjv-q8_0.kvm}"

passed=0
failed=0
check() { # name, command...
    local name="$1"; shift
    if "$@"; then passed=$((passed + 1)); echo "ok: $name"; else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

check "an386 runs" "$run" --board an386 ${icount[@]+"${icount[@]}"} --out "$work/an386.txt" "$model"
check "an505 runs" "$run" --board an505 ${icount[@]+"${icount[@]}"} --out "$work/an505.txt" "$model"
check "an386 and an505 agree" cmp "$work/an386.txt" "$work/an505.txt"
check "an547 runs" "$run" --board an547 --out "$work/an547.txt" "$model"
check "an386 and an547 agree" cmp "$work/an386.txt" "$work/an547.txt"

prompt="And God said"
case "$dtype-$cache" in
    f32-f32|f16-f32|bf16-f32)
        python3 - "$root/models/tiny-kjv/reference/greedy.json" "$prompt" >"$work/ref.txt" <<'EOF'
import json, sys
cases = {c["prompt"]: c for c in json.load(open(sys.argv[1]))}
sys.stdout.buffer.write(bytes(cases[sys.argv[2]]["greedy_ids"]))
EOF
        check "an386 equals the reference continuation" cmp "$work/an386.txt" "$work/ref.txt" ;;
esac

if [[ -f "$root/kvm-runtime/include/kvm.h" ]]; then
    check "the C firmware (examples/c-firmware) prints the same text" \
        "$root/examples/c-firmware/run-qemu.sh" --expect "$work/an386.txt" "$model"
fi

if [[ $host -eq 1 ]]; then
    (cd "$root" && cargo build --quiet --release -p kvm-runtime --bin kvm)
    # Prompt then 64 one-byte tokens; what follows them (a final newline) is not text.
    kernels=()
    case "$dtype" in f32|f16|bf16) kernels=(KVM_KERNELS=scalar) ;; esac
    env -u KVM_KERNELS "${kernels[@]}" "$root/target/release/kvm" generate --model "$model" --prompt "$prompt" -n 64 \
        --temperature 0 >"$work/host-stdout.txt" 2>/dev/null
    head -c $((${#prompt} + 64)) "$work/host-stdout.txt" >"$work/host.txt"
    printf '%s' "$prompt" | cat - "$work/an386.txt" >"$work/an386-full.txt"
    check "prompt + an386 text equals kvm generate (${kernels[*]:-default kernel tier})" cmp "$work/an386-full.txt" "$work/host.txt"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
