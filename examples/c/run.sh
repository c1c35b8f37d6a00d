#!/bin/sh
# Builds kvm-runtime as a C static library, compiles examples/c/main.c against
# include/kvm.h and runs it.
#
#   examples/c/run.sh [--valgrind] [model.kvm] [prompt] [n_tokens] [threads]
#
# --valgrind (or KVM_VALGRIND=1) runs the program under
# `valgrind --error-exitcode=1 --leak-check=full`. The model defaults to
# models/tiny-kjv-q8_0.kvm; any other kvm file works, e.g. an f32 export:
#   cargo run --release -p kvm-export -- convert models/tiny-kjv -o /tmp/tiny-kjv-f32.kvm --dtype f32
# CARGO_TARGET_DIR and CC are honoured. The program's exit status is the script's.
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
build="$root/examples/c/build"
target_dir=${CARGO_TARGET_DIR:-$root/target}
cargo=${CARGO:-cargo}
cc=${CC:-cc}

valgrind=${KVM_VALGRIND:-0}
if [ "${1:-}" = "--valgrind" ]; then
    valgrind=1
    shift
fi
model=${1:-$root/models/tiny-kjv-q8_0.kvm}
prompt=${2:-And God said}
n=${3:-64}
threads=${4:-1}

if [ ! -f "$model" ]; then
    echo "run.sh: no model at $model; export one (q8_0, or f32 until q8_0 export lands) with" >&2
    echo "  cargo run --release -p kvm-export -- convert models/tiny-kjv -o $model --dtype q8_0" >&2
    echo "or pass another kvm file: $0 path/to/model.kvm" >&2
    exit 2
fi

mkdir -p "$build"
# A staticlib is a final artifact, so it is asked for here rather than in Cargo.toml
# (see kvm-runtime/Cargo.toml). rustc prints the system libraries it needs only when it
# actually compiles, so the list is kept for the runs where cargo finds it fresh.
if ! "$cargo" rustc --quiet --release -p kvm-runtime --lib --crate-type staticlib \
    --manifest-path "$root/Cargo.toml" -- --print native-static-libs 2>"$build/cargo.log"; then
    cat "$build/cargo.log" >&2
    exit 1
fi
libs=$(sed -n 's/.*native-static-libs: //p' "$build/cargo.log" | tail -n 1)
if [ -n "$libs" ]; then
    echo "$libs" >"$build/native-libs"
elif [ -f "$build/native-libs" ]; then
    libs=$(cat "$build/native-libs")
else
    libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
fi

# shellcheck disable=SC2086 # $libs is a list of flags
"$cc" -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Werror \
    -I "$root/kvm-runtime/include" "$root/examples/c/main.c" \
    "$target_dir/release/libkvm_runtime.a" $libs -lm -o "$build/kvm-example"

if [ "$valgrind" = 1 ]; then
    exec valgrind --quiet --error-exitcode=1 --leak-check=full "$build/kvm-example" "$model" "$prompt" "$n" "$threads"
fi
exec "$build/kvm-example" "$model" "$prompt" "$n" "$threads"
