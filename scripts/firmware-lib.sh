# Shared by examples/mcu/run-qemu.sh, examples/c-firmware/run-qemu.sh and
# scripts/boards-check.sh (sourced, not run): converting the tiny-kjv checkpoint, running a
# firmware image under QEMU with a timeout, cutting the generated text out of its output,
# and checking a board image for semihosting calls. Exit codes: 2 for a failed
# build or conversion, 124 on timeout, the firmware's own code when it fails, 1 when the
# output markers are missing, 3 when the text differs from the expected one.

# convert_tiny_kjv ROOT DTYPE OUT [EXPORT_ARGS...]: models/tiny-kjv as a DTYPE model file
# at OUT, with kvm-export's further EXPORT_ARGS (--cache C, --no-repack).
convert_tiny_kjv() {
    local root="$1" dtype="$2" out="$3"
    shift 3
    convert_checkpoint "$root" "$root/models/tiny-kjv" "$dtype" "$out" "$@"
}

# convert_checkpoint ROOT DIR DTYPE OUT [EXPORT_ARGS...]: as convert_tiny_kjv, from the
# checkpoint directory DIR.
convert_checkpoint() {
    local root="$1" dir="$2" dtype="$3" out="$4"
    shift 4
    (cd "$root" && cargo run --quiet --release -p kvm-export -- \
        convert "$dir" -o "$out" --dtype "$dtype" "$@" --quiet) || exit 2
}

# tiny_kjv_256k ROOT WORK: converts the 256 KiB configuration of tiny-kjv (examples/mcu/
# README.md: the checkpoint unchanged, q8_0 weights, the q8 cache, slot reads recomputed)
# into WORK and prints the model file's path.
tiny_kjv_256k() {
    local root="$1" work="$2"
    convert_tiny_kjv "$root" q8_0 "$work/tiny-kjv-256k.kvm" --cache q8 --slot-reads recomputed
    echo "$work/tiny-kjv-256k.kvm"
}

# run_qemu LOG TIMEOUT [QEMU_BINARY] QEMU_ARGS...: runs QEMU_BINARY (a `qemu-system-*`;
# default qemu-system-arm) with no display, no monitor and semihosting, with QEMU_ARGS, its
# output into LOG and echoed; exits on timeout or on a failing firmware.
run_qemu() {
    local log="$1" timeout_s="$2" qemu=qemu-system-arm rc
    shift 2
    if [[ "${1:-}" == qemu-system-* ]]; then
        qemu="$1"
        shift
    fi
    set +e
    timeout --foreground "$timeout_s" "$qemu" -nographic -monitor none \
        -semihosting-config enable=on,target=native "$@" </dev/null >"$log"
    rc=$?
    set -e
    cat "$log"
    if [[ $rc -eq 124 ]]; then
        echo "run-qemu.sh: QEMU timed out after ${timeout_s}s" >&2
        exit 124
    fi
    [[ $rc -eq 0 ]] || { echo "run-qemu.sh: firmware exited with $rc" >&2; exit "$rc"; }
}

# check_text LOG OUT EXPECT: the text after the line `--- kvm output ---`, up to (not
# including) the newline before the line `--- end ---`; copied to OUT and compared with
# EXPECT's bytes, each when given (non-empty).
check_text() {
    local log="$1" out="$2" expect="$3" text
    text="$(mktemp)"
    perl -0777 -ne 'exit 1 unless /^--- kvm output ---\n(.*)\n--- end ---$/ms; print $1' "$log" >"$text" \
        || { rm -f "$text"; echo "run-qemu.sh: no output markers in the firmware's output" >&2; exit 1; }
    [[ -z "$out" ]] || cp "$text" "$out"
    if [[ -n "$expect" ]]; then
        if cmp -s "$text" "$expect"; then
            echo "run-qemu.sh: text matches $expect" >&2
        else
            rm -f "$text"
            echo "run-qemu.sh: text differs from $expect" >&2
            exit 3
        fi
    fi
    rm -f "$text"
}

# check_no_semihosting ELF: fails, naming the calls, when an Arm firmware image holds a
# semihosting call (`bkpt 0xab`, which objdump shows as `bkpt 0x00ab`): on a chip with no
# debugger attached it stops the core in a fault. For the board images, which must run
# without one.
check_no_semihosting() {
    local elf="$1" hits
    hits="$(arm-none-eabi-objdump -d "$elf" | grep -Ei 'bkpt[[:space:]]+0x(00)?ab\b' || true)"
    if [[ -n $hits ]]; then
        echo "check_no_semihosting: $elf makes semihosting calls:" >&2
        head -3 <<<"$hits" >&2
        return 1
    fi
}
