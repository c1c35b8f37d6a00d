#!/usr/bin/env bash
# Builds the C firmware (arm-none-eabi-gcc + kvm's C API as a no_std staticlib, through
# CMake: CMakeLists.txt, kvm-fw/kvmConfig.cmake) for QEMU mps2-an386 and runs it under a
# timeout.
#
# usage: examples/c-firmware/run-qemu.sh [--dtype D] [--out FILE] [--expect FILE]
#                                        [--timeout SECS] [MODEL]
#
#   MODEL           the .kvm file to link (default: models/tiny-kjv-q8_0.kvm)
#   --dtype D       instead of MODEL, convert models/tiny-kjv with kvm-export --dtype D
#   --out FILE      write the text (exactly the bytes between the markers) to FILE
#   --expect FILE   fail (exit 3) unless the text is exactly FILE's bytes
#   --timeout SECS  QEMU wall-clock limit (default 300); on expiry exit 124
#
# Output contract and exit codes as examples/mcu/run-qemu.sh: the text is the generated
# continuation, between the lines `--- kvm output ---` and `--- end ---` (the newline
# before the end marker is not part of it). Environment: ARENA_BYTES (default 655360)
# sizes the static arena. Needs kvm-runtime/include/kvm.h (the C API) and cmake.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../../scripts/firmware-lib.sh
source "$root/scripts/firmware-lib.sh"

model=""
dtype=""
out=""
expect=""
timeout_s=300
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dtype) dtype="${2:?--dtype needs a value}"; shift 2 ;;
        --out) out="${2:?--out needs a file}"; shift 2 ;;
        --expect) expect="${2:?--expect needs a file}"; shift 2 ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "run-qemu.sh: unknown option $1" >&2; exit 2 ;;
        *) model="$1"; shift ;;
    esac
done

header="$root/kvm-runtime/include/kvm.h"
if [[ ! -f "$header" ]]; then
    echo "run-qemu.sh: $header is missing: this firmware needs kvm's C API" >&2
    exit 2
fi

build="$here/build"
mkdir -p "$build"
if [[ -n "$dtype" ]]; then
    [[ -z "$model" ]] || { echo "run-qemu.sh: give MODEL or --dtype, not both" >&2; exit 2; }
    model="$build/tiny-kjv-$dtype.kvm"
    convert_tiny_kjv "$root" "$dtype" "$model"
fi
model="${model:-$root/models/tiny-kjv-q8_0.kvm}"
[[ -f "$model" ]] || { echo "run-qemu.sh: no model at $model (try --dtype f16)" >&2; exit 2; }
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"

# The firmware through CMake (CMakeLists.txt): kvm-fw's CMake file runs cargo for the
# toolchain file's core (thumbv7em-none-eabihf) and the firmware links the archive.
cmake_args=(-DCMAKE_TOOLCHAIN_FILE="$here/cmake/arm-none-eabi.cmake" -DCMAKE_BUILD_TYPE=
            -DMODEL_FILE="$model" -DARENA_BYTES="${ARENA_BYTES:-}"
            -DKVM_CARGO_TARGET_DIR="$here/kvm-fw/target")
cmake -S "$here" -B "$build/cmake" "${cmake_args[@]}" >/dev/null || exit 2
cmake --build "$build/cmake" >/dev/null || exit 2
elf="$build/cmake/c-firmware.elf"
arm-none-eabi-size -A "$elf" | grep -E '^\.(vectors|text|rodata|ARM\.exidx|data|bss) ' >&2

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
run_qemu "$log" "$timeout_s" -M mps2-an386 -cpu cortex-m4 -kernel "$elf"
check_text "$log" "$out" "$expect"
