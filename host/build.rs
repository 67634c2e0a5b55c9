//! Builds the bundled connector plugins (the `plugins/` workspace) for
//! `wasm32-wasip2` and embeds them in the server, so `cargo run -- serve`
//! on a fresh clone needs no extra step.
//!
//! The plugins are built by a nested cargo with a target directory of its
//! own (`target/wasm`): sharing the outer build's directory would deadlock
//! on its lock. The `wasm32-wasip2` standard library is installed through
//! rustup when missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Plugin packages embedded in the server: (package, component file stem).
const BUNDLED: &[(&str, &str)] = &[
    ("conn-emailcampaign", "conn_emailcampaign"),
    ("conn-socialmedia", "conn_socialmedia"),
    ("conn-restmanifest", "conn_restmanifest"),
    ("conn-airbyte-manifest", "conn_airbyte_manifest"),
];

/// Plugin packages built beside them and not embedded: the example source
/// an author starts from, so its checked-in cassette replays with the
/// `service` binary alone (the cassette names the component it builds).
const BUILT_BESIDE: &[&str] = &["example-http-source"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let plugins = root.join("plugins");
    let target_dir = root.join("target").join("wasm");
    println!("cargo:rerun-if-changed={}", plugins.display());
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    // The migrations are embedded by `sqlx::migrate!`: a new one rebuilds
    // the server.
    println!("cargo:rerun-if-changed={}", root.join("migrations").display());
    println!("cargo:rustc-env=SERVICE_WASM_TARGET_DIR={}", target_dir.display());

    if !BUNDLED.is_empty() {
        ensure_wasm_target();
        let packages: Vec<&str> = BUNDLED.iter().map(|(p, _)| *p).chain(BUILT_BESIDE.iter().copied()).collect();
        build_workspace(&plugins, &target_dir, &packages);
    }

    let out_dir = target_dir.join("wasm32-wasip2").join("release");
    let mut generated =
        String::from("/// Bundled plugins: (file stem, component bytes).\npub static BUNDLED: &[(&str, &[u8])] = &[\n");
    for (_, name) in BUNDLED {
        let file = out_dir.join(format!("{name}.wasm"));
        if !file.exists() {
            panic!("bundled plugin {name} was not built: {} is missing", file.display());
        }
        generated.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", file.display().to_string()));
    }
    generated.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("bundled.rs");
    std::fs::write(dest, generated).unwrap();
}

/// Installs the wasm32-wasip2 standard library if this toolchain lacks it.
fn ensure_wasm_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc).args(["--print", "sysroot"]).output().ok().filter(|o| o.status.success());
    let installed = sysroot
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib/rustlib/wasm32-wasip2").exists())
        .unwrap_or(false);
    if installed {
        return;
    }
    println!("cargo:warning=installing the wasm32-wasip2 target with rustup");
    let status = Command::new("rustup").args(["target", "add", "wasm32-wasip2"]).status();
    if !status.is_ok_and(|s| s.success()) {
        panic!(
            "the wasm32-wasip2 target is missing and `rustup target add wasm32-wasip2` failed; install it and build again"
        );
    }
}

/// Runs `cargo build --release` of `packages` in a plugin workspace.
fn build_workspace(dir: &Path, target_dir: &Path, packages: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir).args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"]).arg(target_dir);
    for p in packages {
        cmd.args(["-p", p]);
    }
    // The outer build's settings are not meant for the guest build.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO_PRIMARY_PACKAGE",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().expect("run cargo for the plugins");
    if !output.status.success() {
        panic!("building the plugins in {} failed:\n{}", dir.display(), String::from_utf8_lossy(&output.stderr));
    }
}
