//! Links with esp-hal's `linkall.x` (its memory map, sections and the ROM's symbols; it
//! checks the stack minimum, `ESP_HAL_CONFIG_ENSURE_MAIN_STACK_MINIMUM` in
//! .cargo/config.toml) and writes the model's sizes as every board firmware does
//! (`kvm-board-build`; inputs `KVM_BOARD_MODEL`, `KVM_BOARD_N_GEN`).

fn main() {
    println!("cargo:rustc-link-arg-bins=-Tlinkall.x");
    if std::env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
    kvm_board_build::Firmware {
        name: "kvm-esp32c3",
        default_model: "../../../target/tiny-kjv-int-256k.kvm",
        make_model: "cargo run --release -p kvm-export -- convert models/tiny-kjv --numerics int --cache q8 \
                     --slot-reads recomputed -o target/tiny-kjv-int-256k.kvm (from the repository's root)",
        stack_reserve: 0,
        linked: true,
    }
    .build_model();
}
