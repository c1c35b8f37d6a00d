#!/usr/bin/env bash
# Runs the kvm firmware on both QEMU boards and checks its text.
#
# usage: scripts/mcu-check.sh [--dtype D | MODEL]
#
# With --dtype (default f16), models/tiny-kjv is converted with kvm-export first. The text of
# an386 and an505 must be identical. It must also equal the reference implementation's
# greedy continuation (models/tiny-kjv/reference/greedy.json) when the weights are exact
# (f32, f16, bf16: the checkpoint is bf16), and the host's `kvm generate` output when that
# command is built (target/release/kvm). Prints "N passed, N failed".
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/examples/mcu/run-qemu.sh"
dtype=f16
model=""
case "${1:-}" in
    --dtype) dtype="${2:?--dtype needs a value}" ;;
    "") ;;
    *) model="$1"; dtype="" ;;
esac

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -n "$dtype" ]]; then
    model="$root/examples/mcu/target/tiny-kjv-$dtype.kvm"
    mkdir -p "$(dirname "$model")"
    (cd "$root" && cargo run --quiet --release -p kvm-export -- \
        convert models/tiny-kjv -o "$model" --dtype "$dtype" --quiet)
fi

passed=0
failed=0
check() { # name, command...
    local name="$1"; shift
    if "$@"; then passed=$((passed + 1)); echo "ok: $name"; else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

check "an386 runs" "$run" --board an386 --out "$work/an386.txt" "$model"
check "an505 runs" "$run" --board an505 --out "$work/an505.txt" "$model"
check "an386 and an505 agree" cmp "$work/an386.txt" "$work/an505.txt"

prompt="And God said"
case "$dtype" in
    f32|f16|bf16)
        python3 - "$root/models/tiny-kjv/reference/greedy.json" "$prompt" >"$work/ref.txt" <<'EOF'
import json, sys
cases = {c["prompt"]: c for c in json.load(open(sys.argv[1]))}
sys.stdout.buffer.write(bytes(cases[sys.argv[2]]["greedy_ids"]))
EOF
        check "an386 equals the reference continuation" cmp "$work/an386.txt" "$work/ref.txt" ;;
esac

kvm="$root/target/release/kvm"
if [[ -x "$kvm" ]] && "$kvm" generate --help >/dev/null 2>&1; then
    # Prompt then 64 one-byte tokens; anything after them (a final newline) is not text.
    "$kvm" generate --model "$model" --prompt "$prompt" -n 64 --temperature 0 | head -c $((${#prompt} + 64)) >"$work/host.txt"
    check "an386 (with prompt) equals kvm generate" \
        "$run" --board an386 --echo-prompt --expect "$work/host.txt" "$model"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
