# Shared by examples/mcu/run-qemu.sh and examples/c-firmware/run-qemu.sh (sourced, not
# run): converting the tiny-kjv checkpoint, running a firmware image under QEMU with a
# timeout, and cutting the generated text out of its output. Exit codes: 2 for a failed
# build or conversion, 124 on timeout, the firmware's own code when it fails, 1 when the
# output markers are missing, 3 when the text differs from the expected one.

# convert_tiny_kjv ROOT DTYPE OUT: models/tiny-kjv as a DTYPE model file at OUT.
convert_tiny_kjv() {
    (cd "$1" && cargo run --quiet --release -p kvm-export -- \
        convert models/tiny-kjv -o "$3" --dtype "$2" --quiet) || exit 2
}

# run_qemu LOG TIMEOUT QEMU_ARGS...: runs qemu-system-arm (no display, no monitor,
# semihosting) with QEMU_ARGS, its output into LOG and echoed; exits on timeout or on a
# failing firmware.
run_qemu() {
    local log="$1" timeout_s="$2" rc
    shift 2
    set +e
    timeout --foreground "$timeout_s" qemu-system-arm -nographic -monitor none \
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
