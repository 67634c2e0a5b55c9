//! Builds the test plugins (`tests/plugins`, a wasm32-wasip2 workspace)
//! once per process; shared by the integration tests and the benchmarks.

use std::path::{Path, PathBuf};

/// The path of test plugin `name`'s component, building them all first.
pub fn test_plugin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        // `tests/testkit` -> the repository; the guest builds share the
        // server's own guest target directory (`target/wasm`).
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).unwrap();
        let target = root.join("target").join("wasm");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .current_dir(root.join("tests/plugins"))
            .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
            .arg(&target)
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .expect("run cargo for the test plugins");
        assert!(out.status.success(), "building test plugins failed:\n{}", String::from_utf8_lossy(&out.stderr));
        target.join("wasm32-wasip2/release")
    });
    let path = dir.join(format!("{name}.wasm"));
    assert!(path.exists(), "no test plugin {}", path.display());
    path
}
