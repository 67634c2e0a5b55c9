//! `service plugins new`: a plugin crate that builds on its own.
//!
//! The crate carries what it builds against: the guest SDK (with the
//! rules it shares with the host) and the WIT packages of this very server
//! (embedded in the binary), under `vendor/` and `wit/`, and the plugin workspace's lock file, so the dependency
//! versions are the ones the bundled connectors are built and tested with.
//! Its source is the example source's (`plugins/example-http-source`),
//! renamed: a complete connector that is tested with the server.

use std::path::{Path, PathBuf};

/// The guest SDK's files, as `vendor/service-connector-sdk/src/` gets them.
const SDK: &[(&str, &str)] = &[
    ("connector.rs", include_str!("../../../plugins/sdk/src/connector.rs")),
    ("convert.rs", include_str!("../../../plugins/sdk/src/convert.rs")),
    ("http.rs", include_str!("../../../plugins/sdk/src/http.rs")),
    ("lib.rs", include_str!("../../../plugins/sdk/src/lib.rs")),
    ("log.rs", include_str!("../../../plugins/sdk/src/log.rs")),
    ("pages.rs", include_str!("../../../plugins/sdk/src/pages.rs")),
    ("sink.rs", include_str!("../../../plugins/sdk/src/sink.rs")),
    ("time.rs", include_str!("../../../plugins/sdk/src/time.rs")),
    ("types.rs", include_str!("../../../plugins/sdk/src/types.rs")),
];

/// The rules the SDK shares with the host, as
/// `vendor/service-connector-rules/src/` gets them.
const RULES: &[(&str, &str)] = &[
    ("headers.rs", include_str!("../../../plugins/rules/src/headers.rs")),
    ("lib.rs", include_str!("../../../plugins/rules/src/lib.rs")),
    ("origin.rs", include_str!("../../../plugins/rules/src/origin.rs")),
    ("path.rs", include_str!("../../../plugins/rules/src/path.rs")),
    ("retry_after.rs", include_str!("../../../plugins/rules/src/retry_after.rs")),
];

/// The WIT packages, as `wit/` gets them; the links of a version to the
/// ones it includes become copies.
const WIT: &[(&str, &str)] = &[
    ("connector@1.0.0/http.wit", include_str!("../../../wit/connector@1.0.0/http.wit")),
    ("connector@1.0.0/log.wit", include_str!("../../../wit/connector@1.0.0/log.wit")),
    ("connector@1.0.0/plugin.wit", include_str!("../../../wit/connector@1.0.0/plugin.wit")),
    ("connector@1.0.0/sink.wit", include_str!("../../../wit/connector@1.0.0/sink.wit")),
    ("connector@1.0.0/types.wit", include_str!("../../../wit/connector@1.0.0/types.wit")),
    ("connector@1.0.0/world.wit", include_str!("../../../wit/connector@1.0.0/world.wit")),
    ("connector@1.1.0/http-ahead.wit", include_str!("../../../wit/connector@1.1.0/http-ahead.wit")),
    ("connector@1.1.0/world.wit", include_str!("../../../wit/connector@1.1.0/world.wit")),
    ("connector@1.2.0/http-placed.wit", include_str!("../../../wit/connector@1.2.0/http-placed.wit")),
    ("connector@1.2.0/world.wit", include_str!("../../../wit/connector@1.2.0/world.wit")),
    ("connector@1.3.0/http-multi.wit", include_str!("../../../wit/connector@1.3.0/http-multi.wit")),
    ("connector@1.3.0/world.wit", include_str!("../../../wit/connector@1.3.0/world.wit")),
];

/// Where a version finds the packages it includes.
const WIT_DEPENDENCIES: &[(&str, &str)] = &[
    ("connector@1.0.0", "connector@1.1.0/deps/connector@1.0.0"),
    ("connector@1.0.0", "connector@1.2.0/deps/connector@1.0.0"),
    ("connector@1.1.0", "connector@1.2.0/deps/connector@1.1.0"),
    ("connector@1.0.0", "connector@1.3.0/deps/connector@1.0.0"),
    ("connector@1.1.0", "connector@1.3.0/deps/connector@1.1.0"),
    ("connector@1.2.0", "connector@1.3.0/deps/connector@1.2.0"),
];

const EXAMPLE: &str = include_str!("../../../plugins/example-http-source/src/lib.rs");
const EXAMPLE_ID: &str = "conn_example_jsonplaceholder";
const EXAMPLE_NAME: &str = "\"JSONPlaceholder (example)\"";
const LOCK: &str = include_str!("../../../plugins/Cargo.lock");
/// The rules crate's manifest, as it is: it has no dependencies.
const RULES_MANIFEST: &str = include_str!("../../../plugins/rules/Cargo.toml");
const SDK_VERSION: &str = "0.1.0";

/// Why no crate was made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScaffoldError {
    #[error(
        "'{0}' is not a plugin name: use 1-48 lower-case letters, digits and hyphens, starting with a letter (e.g. my-source)"
    )]
    Name(String),
    #[error("{0} already exists and is not empty; choose another --dir")]
    Occupied(PathBuf),
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// What was made.
pub(crate) struct Scaffolded {
    pub dir: PathBuf,
    pub connector_id: String,
    /// The component `cargo build` leaves, relative to `dir`.
    pub component: PathBuf,
}

/// Writes a new plugin crate named `name` into `dir`.
pub(crate) fn new_plugin(name: &str, dir: &Path) -> Result<Scaffolded, ScaffoldError> {
    let valid = (1..=48).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        return Err(ScaffoldError::Name(name.to_owned()));
    }
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(ScaffoldError::Occupied(dir.to_owned()));
    }
    let lib = name.replace('-', "_");
    let connector_id = format!("conn_{lib}");
    let title = title(name);
    let fill = |template: &str| {
        template
            .replace("{crate}", name)
            .replace("{lib}", &lib)
            .replace("{title}", &title)
            .replace("{sdk_version}", SDK_VERSION)
    };
    let source = EXAMPLE.replace(EXAMPLE_ID, &connector_id).replace(EXAMPLE_NAME, &format!("{title:?}"));

    let mut files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), fill(include_str!("template/Cargo.toml.in"))),
        ("Cargo.lock".into(), LOCK.to_owned()),
        (".cargo/config.toml".into(), fill(include_str!("template/config.toml.in"))),
        (".gitignore".into(), fill(include_str!("template/gitignore.in"))),
        ("README.md".into(), fill(include_str!("template/README.md.in"))),
        ("config.example.json".into(), fill(include_str!("template/config.example.json.in"))),
        ("cassettes/README.md".into(), fill(include_str!("template/cassettes-README.md.in"))),
        ("src/lib.rs".into(), source),
        ("vendor/service-connector-sdk/Cargo.toml".into(), fill(include_str!("template/sdk-Cargo.toml.in"))),
    ];
    for (file, text) in SDK {
        files.push((Path::new("vendor/service-connector-sdk/src").join(file), (*text).to_owned()));
    }
    files.push(("vendor/service-connector-rules/Cargo.toml".into(), RULES_MANIFEST.to_owned()));
    for (file, text) in RULES {
        files.push((Path::new("vendor/service-connector-rules/src").join(file), (*text).to_owned()));
    }
    for (file, text) in WIT {
        files.push((Path::new("wit").join(file), (*text).to_owned()));
        for (package, copy) in WIT_DEPENDENCIES {
            if let Some(rest) = file.strip_prefix(package) {
                files.push((Path::new("wit").join(format!("{copy}{rest}")), (*text).to_owned()));
            }
        }
    }
    for (relative, text) in &files {
        let path = dir.join(relative);
        let io = |e: std::io::Error| ScaffoldError::Io { path: path.clone(), message: e.to_string() };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&path, text).map_err(io)?;
    }
    Ok(Scaffolded {
        dir: dir.to_owned(),
        connector_id,
        component: Path::new("target/wasm32-wasip2/debug").join(format!("{lib}.wasm")),
    })
}

/// `my-source` → `My source`.
fn title(name: &str) -> String {
    let words = name.replace('-', " ");
    let mut chars = words.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => words,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file added to the SDK or the WIT must reach new plugins too.
    #[test]
    fn every_sdk_and_wit_file_is_vendored() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let listed = |dir: &Path, prefix: &str| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_type().unwrap().is_file())
                .map(|e| format!("{prefix}{}", e.file_name().to_string_lossy()))
                .collect();
            names.sort();
            names
        };
        let sdk: Vec<String> = SDK.iter().map(|(f, _)| (*f).to_owned()).collect();
        assert_eq!(sdk, listed(&root.join("plugins/sdk/src"), ""));
        let rules: Vec<String> = RULES.iter().map(|(f, _)| (*f).to_owned()).collect();
        assert_eq!(rules, listed(&root.join("plugins/rules/src"), ""));
        assert!(!RULES_MANIFEST.contains("workspace = true") && !RULES_MANIFEST.contains("[dependencies]"));
        let mut wit = listed(&root.join("wit/connector@1.0.0"), "connector@1.0.0/");
        wit.extend(listed(&root.join("wit/connector@1.1.0"), "connector@1.1.0/"));
        wit.extend(listed(&root.join("wit/connector@1.2.0"), "connector@1.2.0/"));
        wit.extend(listed(&root.join("wit/connector@1.3.0"), "connector@1.3.0/"));
        assert_eq!(WIT.iter().map(|(f, _)| (*f).to_owned()).collect::<Vec<_>>(), wit);
    }

    /// The vendored SDK's manifest asks for what the plugin workspace
    /// builds the SDK with.
    #[test]
    fn the_vendored_sdk_asks_for_the_workspace_dependencies() {
        let workspace = include_str!("../../../plugins/Cargo.toml");
        for line in include_str!("template/sdk-Cargo.toml.in")
            .lines()
            .filter(|l| l.contains("version = \"") && !l.starts_with("version"))
        {
            let (name, spec) = line.split_once(" = ").unwrap();
            let in_workspace = workspace
                .lines()
                .find(|l| l.starts_with(&format!("{name} = ")))
                .unwrap_or_else(|| panic!("{name} is not a workspace dependency"));
            let version = |s: &str| {
                s.split("version = \"")
                    .nth(1)
                    .or_else(|| s.split('"').nth(1))
                    .map(|v| v.split('"').next().unwrap().to_owned())
            };
            assert_eq!(version(spec), version(in_workspace), "{line} against {in_workspace}");
        }
        let sdk = include_str!("../../../plugins/sdk/Cargo.toml");
        assert!(
            sdk.contains("version.workspace = true") && workspace.contains(&format!("version = \"{SDK_VERSION}\""))
        );
    }

    #[test]
    fn the_example_is_renamed_and_names_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let made = new_plugin("my-source", &dir.path().join("p")).unwrap();
        assert_eq!(made.connector_id, "conn_my_source");
        let source = std::fs::read_to_string(dir.path().join("p/src/lib.rs")).unwrap();
        assert!(source.contains("\"conn_my_source\"") && source.contains("\"My source\""), "{source}");
        assert!(!source.contains(EXAMPLE_ID));
        assert!(dir.path().join("p/wit/connector@1.1.0/deps/connector@1.0.0/types.wit").is_file());
        assert!(dir.path().join("p/wit/connector@1.2.0/deps/connector@1.1.0/world.wit").is_file());
        assert!(dir.path().join("p/wit/connector@1.2.0/deps/connector@1.0.0/http.wit").is_file());
        assert!(dir.path().join("p/wit/connector@1.3.0/deps/connector@1.2.0/http-placed.wit").is_file());
        assert!(dir.path().join("p/cassettes/README.md").is_file());
        assert!(matches!(new_plugin("my-source", &dir.path().join("p")), Err(ScaffoldError::Occupied(_))));
        for bad in ["", "My", "9lives", "a_b", "a-", "a--b", "../x"] {
            assert!(matches!(new_plugin(bad, &dir.path().join("q")), Err(ScaffoldError::Name(_))), "{bad}");
        }
    }
}
