//! Sets `--cfg kvm_arm_dsp` when the target is 32-bit Arm and its code generation has the
//! DSP extension (`smlad`, `sxtb16`), and `--cfg kvm_mve` when it has Helium (MVE): they
//! select the `dsp` and `helium` kernel tiers at compile time.
//!
//! rustc exposes neither as a stable `target_feature`, so this asks the compiler itself: it
//! compiles one instruction of each extension for the target with the build's own flags
//! (`thumbv7em` has DSP; `thumbv8m.main` has it with `-C target-cpu=cortex-m33` or
//! `-C target-feature=+dsp`, and MVE as well with `-C target-cpu=cortex-m55`; `thumbv6m`
//! and `thumbv7m` have neither).

use std::env;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One instruction of each extension, as a function `asm!` must assemble (`smull`: the
/// 32 x 32 -> 64-bit multiply that ARMv6-M lacks).
const PROBES: [(&str, &str); 3] = [
    ("kvm_arm_smull", r#"smull {0}, {1}, {2}, {3}", inout(reg) r, out(reg) _, in(reg) a, in(reg) b"#),
    ("kvm_arm_dsp", r#"smlad {0}, {1}, {2}, {0}", inout(reg) r, in(reg) a, in(reg) b"#),
    (
        "kvm_mve",
        r#"vdup.8 q0, {a}", "vdup.8 q1, {b}", "vmlava.s8 r0, q0, q1", a = in(reg) a, b = in(reg) b,
        inout("r0") r, out("q0") _, out("q1") _"#,
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    write_int_tables();
    println!("cargo:rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
    for (cfg, _) in PROBES {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    println!("cargo::rustc-check-cfg=cfg(kvm_armv6m)");
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() != Ok("arm") {
        return;
    }
    let mut smull = false;
    for (cfg, asm) in PROBES {
        if assembles(cfg, asm) {
            println!("cargo:rustc-cfg={cfg}");
            smull |= cfg == "kvm_arm_smull";
        }
    }
    // Thumb-1 only (ARMv6-M, Armv8-M Baseline): no `smull` is the telling absence.
    if !smull {
        println!("cargo:rustc-cfg=kvm_armv6m");
    }
}

/// Whether `asm` (the arguments of one `asm!`, over `r`, `a` and `b`) compiles for the
/// target with the flags cargo passes this build.
fn assembles(name: &str, asm: &str) -> bool {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = out.join(format!("{name}_probe.rs"));
    let probe = format!(
        "#![no_std]\npub fn probe(a: u32, b: u32) -> u32 {{\n    let mut r = 0u32;\n    \
         unsafe {{ core::arch::asm!(\"{asm}) }};\n    r\n}}\n"
    );
    if std::fs::write(&src, probe).is_err() {
        return false;
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").unwrap_or_default();
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    Command::new(rustc)
        .args(["--crate-type=lib", "--emit=obj", "--edition=2021", "--target", &target])
        .args(flags.split('\x1f').filter(|f| !f.is_empty()))
        .arg("-o")
        .arg(out.join(format!("{name}_probe.o")))
        .arg(&src)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `round(f(i) * 2^15)` for `i < n`, as a Rust `[u16; n]` constant named `name`.
fn table(name: &str, doc: &str, n: usize, f: impl Fn(f64) -> f64) -> String {
    let v: Vec<String> = (0..n).map(|i| format!("{}", libm::round(f(i as f64) * 32768.0) as u16)).collect();
    format!("/// {doc}\npub(crate) const {name}: [u16; {n}] = [{}];\n", v.join(", "))
}

/// The exponential's three tables (`exp(-x)` for `x = a/4 + b/512 + c/65536`) and the
/// quarter sine wave (`sin(i * pi / 512)`, 257 points), all Q15.
fn write_int_tables() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let pi = core::f64::consts::PI;
    let src = [
        table("EXP_HI", "`exp(-a / 4)`, Q15.", 64, |a| libm::exp(-a / 4.0)),
        table("EXP_MID", "`exp(-b / 512)`, Q15.", 128, |b| libm::exp(-b / 512.0)),
        table("EXP_LO", "`exp(-c / 65536)`, Q15.", 128, |c| libm::exp(-c / 65536.0)),
        table("SIN_QUARTER", "`sin(i * pi / 512)`, Q15.", 257, |i| libm::sin(i * pi / 512.0)),
    ]
    .concat();
    std::fs::write(out.join("int_tables.rs"), src).expect("OUT_DIR is writable");
}
