//! The memory map (memory.x, with a link-time stack check) and the model's sizes, as every
//! board firmware builds them (`kvm-board-build`; inputs `KVM_BOARD_MODEL`,
//! `KVM_BOARD_N_GEN`).

fn main() {
    kvm_board_build::Firmware {
        name: "kvm-pico",
        default_model: "../../../target/tiny-kjv-int-256k.kvm",
        make_model: "cargo run --release -p kvm-export -- convert models/tiny-kjv --numerics int --cache q8 \
                     --slot-reads recomputed -o target/tiny-kjv-int-256k.kvm (from the repository's root)",
        // The application's high-water mark is under 6 KiB (kvm-pico: stack used ...).
        stack_reserve: 8 * 1024,
        linked: std::env::var_os("CARGO_FEATURE_SLOT").is_none(),
    }
    .build();
}
