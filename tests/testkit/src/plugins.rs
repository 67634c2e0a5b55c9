//! Builds the test plugins (`tests/plugins`, a wasm32-wasip2 workspace)
//! and the example source once per process; shared by the integration
//! tests and the benchmarks.

use std::path::{Path, PathBuf};

/// The repository.
pub fn repository() -> &'static Path {
    // `tests/testkit` -> the repository.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().and_then(Path::parent).unwrap()
}

/// Where the guest builds go: the server's own guest target directory.
pub fn wasm_target_dir() -> PathBuf {
    repository().join("target").join("wasm")
}

/// Builds `packages` of the wasm workspace in `workspace` (release).
fn build(workspace: &Path, packages: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .current_dir(workspace)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--target-dir"])
        .arg(wasm_target_dir())
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    for p in packages {
        command.args(["-p", p]);
    }
    let out = command.output().expect("run cargo for the guest plugins");
    assert!(out.status.success(), "building {} failed:\n{}", workspace.display(), String::from_utf8_lossy(&out.stderr));
}

/// The example source's component (`plugins/example-http-source`),
/// built once per process.
pub fn example_plugin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            build(&repository().join("plugins"), &["example-http-source"]);
            wasm_target_dir().join("wasm32-wasip2/release/example_http_source.wasm")
        })
        .clone()
}

/// A bundled connector's component, as the server's build made it.
pub fn bundled_plugin(stem: &str) -> PathBuf {
    let path = wasm_target_dir().join("wasm32-wasip2/release").join(format!("{stem}.wasm"));
    assert!(path.exists(), "the server's build did not leave {}", path.display());
    path
}

/// The path of test plugin `name`'s component, building them all first.
pub fn test_plugin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        build(&repository().join("tests/plugins"), &[]);
        wasm_target_dir().join("wasm32-wasip2/release")
    });
    let path = dir.join(format!("{name}.wasm"));
    assert!(path.exists(), "no test plugin {}", path.display());
    path
}
