#!/usr/bin/env bash
# Runs kvm's kernel conformance checks on emulated boards (examples/mcu-conformance): the
# tier each board's build selects against the scalar oracle, bit for bit, on the board.
#
# usage: scripts/mcu-conformance.sh [--board an386|an505]... [--timeout SECS]
#
#   --board B       a board to run on (repeatable; default: every board below)
#   --timeout SECS  QEMU wall-clock limit per board (default 120)
#
# Each board also names the tier its build must select, so a build that silently falls
# back to scalar fails. Prints the firmware's lines and "N passed, N failed"; exits
# non-zero when any board fails (a mismatch, a panic, a fault, a timeout or a wrong tier).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/examples/mcu-conformance"
all_boards=(an386 an505)
boards=()
timeout_s=120
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
    # One line per board: Rust target, QEMU binary and its machine arguments, the tier.
    case "$board" in
        an386) target=thumbv7em-none-eabihf; qemu=(qemu-system-arm -M mps2-an386 -cpu cortex-m4); tier=dsp ;;
        an505) target=thumbv8m.main-none-eabihf; qemu=(qemu-system-arm -M mps2-an505 -cpu cortex-m33); tier=dsp ;;
        *) echo "mcu-conformance.sh: unknown board '$board' (${all_boards[*]})" >&2; exit 2 ;;
    esac
    log="$(mktemp)"
    rc=0
    if (cd "$dir" && KVM_MCU_BOARD="$board" cargo build --quiet --release --target "$target"); then
        timeout --foreground "$timeout_s" "${qemu[@]}" -nographic -monitor none \
            -semihosting-config enable=on,target=native \
            -kernel "$dir/target/$target/release/kvm-mcu-conformance" </dev/null >"$log" || rc=$?
    else
        rc=2
    fi
    sed "s/^/$board: /" "$log"
    if [[ $rc -eq 0 ]] && ! grep -qx "kvm-conformance: tier $tier" "$log"; then
        echo "$board: expected tier $tier" >&2
        rc=1
    fi
    rm -f "$log"
    if [[ $rc -eq 0 ]]; then
        passed=$((passed + 1)); echo "ok: $board ($tier)"
    else
        failed=$((failed + 1)); echo "FAILED: $board (exit $rc)"
    fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
