#!/usr/bin/env bash
# Runs the kvm firmware (examples/mcu) on every QEMU board and checks its text.
#
# usage: scripts/mcu-check.sh [--no-host] [--ram-kib K | --heap] [--cache C]
#                             [--dtype D [--no-repack] | MODEL]
#
# MODEL defaults to the bundled models/tiny-kjv-q8_0.kvm; --dtype converts models/tiny-kjv
# with kvm-export first (--cache f16: sessions store attention rows as f16; --no-repack:
# q8_0/q4_0 matrices row-major instead of interleaved). --ram-kib K links every board with
# K KiB of RAM; without MODEL or --dtype it runs the 256 KiB configuration of tiny-kjv
# (examples/mcu/README.md). --heap runs the heap build, which loads MODEL apart from the
# firmware and chooses the cache C at run time (the host runs with --cache C). Boards:
# $KVM_MCU_BOARDS, default "an386 an385 an505 an547 riscv32 riscv32imc". Checks:
# - every board's text is the first board's;
# - an385's firmware holds only ARMv6-M instructions (scripts/armv6m-check.sh);
# - it equals the reference implementation's greedy continuation
#   (models/tiny-kjv/reference/greedy.json) when the weights are exact (--dtype f32, f16
#   or bf16: the checkpoint is bf16);
# - the C firmware on kvm's C API (examples/c-firmware) prints the same text, once
#   kvm-runtime/include/kvm.h exists;
# - prompt + text equals the first 76 bytes of the host's
#   `kvm generate --prompt "And God said" -n 64 --temperature 0 --raw` (the exact bytes, as
#   the firmware prints them, whatever a random model emits), run with the host's best
#   kernel tier for integer formats (q8_0, q4_0: every tier gives the firmware's scalar
#   kernels' bits) and with the scalar tier for float ones (--dtype f32/f16/bf16, whose
#   SIMD tiers sum in another order and may pick another token at a near tie). Builds the
#   host `kvm` (skip: --no-host).
# Prints "N passed, N failed"; exits non-zero on any failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/examples/mcu/run-qemu.sh"
# shellcheck source=firmware-lib.sh
source "$root/scripts/firmware-lib.sh"
read -r -a boards <<<"${KVM_MCU_BOARDS:-an386 an385 an505 an547 riscv32 riscv32imc}"
ram=()
heap=0
dtype=""
cache=f32
repack=()
model=""
host=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dtype) dtype="${2:?--dtype needs a value}"; shift 2 ;;
        --cache) cache="${2:?--cache needs a value}"; shift 2 ;;
        --no-host) host=0; shift ;;
        --ram-kib) ram=(--ram-kib "${2:?--ram-kib needs a size}"); shift 2 ;;
        --heap) heap=1; shift ;;
        --no-repack) repack=(--no-repack); shift ;;
        *) model="$1"; shift ;;
    esac
done

# The heap build's cache is chosen at run time: its model keeps the default f32 cache.
variant=()
host_cache=()
export_cache="$cache"
if [[ $heap -eq 1 ]]; then
    variant=(--heap --cache "$cache")
    host_cache=(--cache "$cache")
    export_cache=f32
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -n "$dtype" ]]; then
    model="$root/examples/mcu/target/tiny-kjv-$dtype-$export_cache-cache${repack:+-plain}.kvm"
    mkdir -p "$(dirname "$model")"
    (cd "$root" && cargo run --quiet --release -p kvm-export -- \
        convert models/tiny-kjv -o "$model" --dtype "$dtype" --cache "$export_cache" "${repack[@]}" --quiet)
fi
if [[ ${#ram[@]} -gt 0 && -z "$model" ]]; then
    mkdir -p "$root/examples/mcu/target"
    model="$(tiny_kjv_256k "$root" "$root/examples/mcu/target")"
fi
model="${model:-$root/models/tiny-kjv-q8_0.kvm}"

passed=0
failed=0
check() { # name, command...
    local name="$1"; shift
    if "$@"; then passed=$((passed + 1)); echo "ok: $name"; else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

first="${boards[0]}"
for board in "${boards[@]}"; do
    how="${ram[*]}${variant[*]}"
    check "$board runs${how:+ ($how)}" "$run" --board "$board" ${ram[@]+"${ram[@]}"} ${variant[@]+"${variant[@]}"} \
        --out "$work/$board.txt" "$model"
    [[ $board == "$first" ]] || check "$board and $first agree" cmp "$work/$board.txt" "$work/$first.txt"
    [[ $board != an385 ]] || check "an385's firmware is ARMv6-M code" \
        "$root/scripts/armv6m-check.sh" "$root/examples/mcu/target/thumbv6m-none-eabi/release/kvm-mcu"
done

prompt="And God said"
case "$dtype-$cache" in
    f32-f32|f16-f32|bf16-f32)
        python3 - "$root/models/tiny-kjv/reference/greedy.json" "$prompt" >"$work/ref.txt" <<'EOF'
import json, sys
cases = {c["prompt"]: c for c in json.load(open(sys.argv[1]))}
sys.stdout.buffer.write(bytes(cases[sys.argv[2]]["greedy_ids"]))
EOF
        check "$first equals the reference continuation" cmp "$work/$first.txt" "$work/ref.txt" ;;
esac

if [[ -f "$root/kvm-runtime/include/kvm.h" && ${#ram[@]} -eq 0 && $heap -eq 0 ]]; then
    check "the C firmware (examples/c-firmware) prints the same text" \
        "$root/examples/c-firmware/run-qemu.sh" --expect "$work/$first.txt" "$model"
fi

if [[ $host -eq 1 ]]; then
    (cd "$root" && cargo build --quiet --release -p kvm-runtime --bin kvm)
    # Prompt then 64 one-byte tokens; what follows them (a final newline) is not text.
    kernels=()
    case "$dtype" in f32|f16|bf16) kernels=(KVM_KERNELS=scalar) ;; esac
    env -u KVM_KERNELS "${kernels[@]}" "$root/target/release/kvm" generate --model "$model" ${host_cache[@]+"${host_cache[@]}"} \
        --prompt "$prompt" -n 64 --temperature 0 --raw >"$work/host-stdout.txt" 2>/dev/null
    head -c $((${#prompt} + 64)) "$work/host-stdout.txt" >"$work/host.txt"
    printf '%s' "$prompt" | cat - "$work/$first.txt" >"$work/$first-full.txt"
    check "prompt + $first text equals kvm generate (${kernels[*]:-default kernel tier})" cmp "$work/$first-full.txt" "$work/host.txt"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
