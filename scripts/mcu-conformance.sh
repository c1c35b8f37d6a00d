#!/usr/bin/env bash
# Runs kvm's kernel conformance firmware (examples/mcu/src/bin/conformance.rs, through
# `examples/mcu/run-qemu.sh --board B --conformance`) on emulated boards: the tier each
# board's build selects against the scalar oracle, and the oracle against the firmware's
# reference computations, bit for bit, on the board.
#
# usage: scripts/mcu-conformance.sh [--board an386|an385|an505|an547|riscv32|riscv32imc]...
#                                   [--timeout SECS]
#
#   --board B       a board to run on (repeatable; default: every board below)
#   --timeout SECS  QEMU wall-clock limit per board (default 600)
#
# Each board also names the tier its build must select (an386, an505: dsp; an547: helium;
# an385, riscv32, riscv32imc: scalar), so a build that silently falls back to another tier
# fails; an385's firmware must also hold only ARMv6-M instructions
# (scripts/armv6m-check.sh). Prints the firmware's lines, one "ok"/"FAILED" line per board
# with its checks and seconds, and "N passed, N failed"; exits non-zero when any board
# fails (a mismatch, a panic, a fault, a timeout, a failed build, a wrong tier or, on
# an385, an instruction ARMv6-M lacks).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
all_boards=(an386 an385 an505 an547 riscv32 riscv32imc)
boards=()
timeout_s=600
while [[ $# -gt 0 ]]; do
    case "$1" in
        --board) boards+=("${2:?--board needs a value}"); shift 2 ;;
        --board=*) boards+=("${1#*=}"); shift ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "mcu-conformance.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ ${#boards[@]} -gt 0 ]] || boards=("${all_boards[@]}")

passed=0
failed=0
for board in "${boards[@]}"; do
    # The tier the board's build must select.
    case "$board" in
        an386|an505) tier=dsp ;;
        an547) tier=helium ;;
        an385|riscv32|riscv32imc) tier=scalar ;;
        *) echo "mcu-conformance.sh: unknown board '$board' (${all_boards[*]})" >&2; exit 2 ;;
    esac
    log="$(mktemp)"
    rc=0
    start=$SECONDS
    bash "$root/examples/mcu/run-qemu.sh" --board "$board" --conformance --timeout "$timeout_s" >"$log" || rc=$?
    seconds=$((SECONDS - start))
    sed "s/^/$board: /" "$log"
    if [[ $rc -eq 0 ]] && ! grep -qx "kvm-conformance: tier $tier" "$log"; then
        echo "$board: expected tier $tier" >&2
        rc=1
    fi
    if [[ $rc -eq 0 && $board == an385 ]]; then
        bash "$root/scripts/armv6m-check.sh" "$root/examples/mcu/target/thumbv6m-none-eabi/release/kvm-mcu-conformance" \
            | sed "s/^/$board: /" || rc=1
    fi
    checks="$(sed -n 's/^kvm-conformance: \([0-9]*\) checks, .*/\1/p' "$log")"
    rm -f "$log"
    if [[ $rc -eq 0 ]]; then
        passed=$((passed + 1)); echo "ok: $board ($tier, ${checks:-?} checks, ${seconds}s, build included)"
    else
        failed=$((failed + 1)); echo "FAILED: $board ($tier, exit $rc, ${seconds}s)"
    fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
