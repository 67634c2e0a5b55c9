//! The crate's layout keeps its promises: every top-level module sits in
//! a layer and imports only layers below its own, and no two modules
//! (top-level, or files of one folder) import each other. Read from the
//! source, so a change that breaks the layering fails here, not in review.

use std::collections::{BTreeMap, BTreeSet};

/// Each top-level module's layer: a module may import only modules of a
/// lower layer. The composition files sit on top.
const LAYERS: &[(&str, u8)] = &[
    ("config", 0),
    ("retry", 0),
    ("store", 1),
    ("telemetry", 2),
    ("egress", 2),
    ("plugin", 3),
    ("error", 4),
    ("access", 5),
    ("warehouse", 5),
    ("audit", 6),
    ("credentials", 6),
    ("state", 7),
    ("authoring", 7),
    ("connectors", 8),
    ("reverse_etl", 8),
    ("webhooks", 8),
    ("jobs", 9),
    ("ops", 9),
    ("http", 10),
    ("web", 10),
    ("mcp", 10),
    ("server", 11),
    ("cli", 12),
];

/// `(folder-level module path, file text)` of every source file:
/// `["ops", "gate"]`, `["http"]` for `http/mod.rs`, `["lib"]`.
fn sources() -> Vec<(Vec<String>, String)> {
    crate::support::host_sources()
        .into_iter()
        .map(|(path, text)| {
            let mut parts: Vec<String> =
                path.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.len() > 1 && parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            (parts, text)
        })
        .collect()
}

/// The modules a file names as `crate::a::b` or `super::b` (comments
/// left out), as `(a, Some(b))` or `(a, None)`.
fn references(module: &[String], text: &str) -> BTreeSet<(String, Option<String>)> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            for item in list.split('}').next().unwrap_or("").split(',') {
                let first = ident(item.trim());
                if !first.is_empty() {
                    out.insert((first, None));
                }
            }
            continue;
        }
        let first = ident(rest);
        let second = rest[first.len()..].strip_prefix("::").map(ident).filter(|s| !s.is_empty());
        if !first.is_empty() {
            out.insert((first, second));
        }
    }
    // `super::x` from a file inside a folder names a sibling of that file.
    if module.len() == 2 {
        for (i, _) in code.match_indices("super::") {
            let sibling = ident(&code[i + "super::".len()..]);
            if !sibling.is_empty() {
                out.insert((module[0].clone(), Some(sibling)));
            }
        }
    }
    out
}

#[test]
fn every_module_imports_only_layers_below_its_own() {
    let layers: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut violations = Vec::new();
    let mut seen_modules = BTreeSet::new();
    for (module, text) in sources() {
        let top = module[0].as_str();
        if top == "lib" || top == "main" {
            continue;
        }
        seen_modules.insert(top.to_owned());
        let Some(&own) = layers.get(top) else {
            violations.push(format!("{top} has no layer: add it to LAYERS"));
            continue;
        };
        for (other, _) in references(&module, &text) {
            if other == top || other == "self" {
                continue;
            }
            match layers.get(other.as_str()) {
                Some(&theirs) if theirs < own => {}
                Some(_) => violations.push(format!("{} imports {other}, which is not below it", module.join("::"))),
                None => violations.push(format!("{} imports {other}, which has no layer", module.join("::"))),
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
    let declared: BTreeSet<String> = layers.keys().map(|k| k.to_string()).collect();
    assert_eq!(seen_modules, declared, "LAYERS names exactly the crate's top-level modules");
}

/// The sibling files a file names, as module paths: `crate::a::b::c`
/// resolves to the longest module path it starts with, `super::x` to the
/// file `x` beside this one.
fn sibling_imports(module: &[String], text: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect()
    };
    let parent = &module[..module.len() - 1];
    let mut found = BTreeSet::new();
    let mut path_after = |rest: &str, base: Vec<String>| {
        let mut path = base;
        let mut rest = rest;
        loop {
            let name = ident(rest);
            if name.is_empty() {
                break;
            }
            path.push(name.clone());
            rest = &rest[name.len()..];
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => break,
            }
        }
        // The longest known module the path starts with.
        while !path.is_empty() && !known.contains(&path) {
            path.pop();
        }
        if path.len() == module.len() && path[..path.len() - 1] == *parent && path != module {
            found.insert(path);
        }
    };
    for (i, _) in code.match_indices("crate::") {
        path_after(&code[i + "crate::".len()..], Vec::new());
    }
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("::") {
            continue;
        }
        path_after(&code[i + "super::".len()..], parent.to_vec());
    }
    found
}

/// The strongly connected components of more than one file among the
/// files of each folder: every import circle, however long, not only two
/// files naming each other.
#[test]
fn no_files_of_a_folder_import_each_other_in_a_circle() {
    let files: Vec<(Vec<String>, String)> = sources().into_iter().filter(|(m, _)| m.len() >= 2).collect();
    let known: BTreeSet<Vec<String>> = sources().into_iter().map(|(m, _)| m).collect();
    let index: BTreeMap<Vec<String>, usize> = files.iter().enumerate().map(|(i, (m, _))| (m.clone(), i)).collect();
    let edges: Vec<Vec<usize>> = files
        .iter()
        .map(|(m, text)| sibling_imports(m, text, &known).iter().filter_map(|t| index.get(t).copied()).collect())
        .collect();
    let circles: Vec<String> = strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|&i| files[i].0.join("::")).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert!(circles.is_empty(), "files that import each other, directly or round a circle: {circles:#?}");
}

/// Tarjan's algorithm: the strongly connected components of a graph given
/// as adjacency lists.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct Walk<'a> {
        edges: &'a [Vec<usize>],
        next: usize,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        components: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.edges[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                self.components.push(component);
            }
        }
    }
    let n = edges.len();
    let mut walk = Walk {
        edges,
        next: 0,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        components: Vec::new(),
    };
    for v in 0..n {
        if walk.index[v].is_none() {
            walk.visit(v);
        }
    }
    walk.components
}

#[test]
fn the_circle_finder_finds_circles() {
    // 0 -> 1 -> 2 -> 0 is a circle of three; 3 -> 4 is none; 5 -> 5 is a file alone.
    let edges = vec![vec![1], vec![2], vec![0], vec![4], vec![], vec![5]];
    let mut circles: Vec<Vec<usize>> = strongly_connected(&edges).into_iter().filter(|c| c.len() > 1).collect();
    circles.iter_mut().for_each(|c| c.sort());
    assert_eq!(circles, vec![vec![0, 1, 2]]);
}

#[test]
fn every_folder_says_what_lives_in_it() {
    let mut missing = Vec::new();
    for (module, text) in sources() {
        let is_folder_root = module == ["lib"]
            || text.lines().any(|l| l.trim_start().starts_with("pub mod ") || l.trim_start().starts_with("mod "));
        if !is_folder_root {
            continue;
        }
        let docs: String = text.lines().filter_map(|l| l.strip_prefix("//!")).collect::<Vec<_>>().join("\n");
        if docs.trim().is_empty() {
            missing.push(format!("{}: no //! docs", module.join("::")));
        }
        for line in text.lines() {
            let line = line.trim_start();
            let declared = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))
                .or_else(|| line.strip_prefix("pub(crate) mod "));
            let Some(name) = declared.and_then(|d| d.strip_suffix(';')) else { continue };
            let named = docs.match_indices(name).any(|(i, _)| {
                let before = docs[..i].chars().last().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                let after = docs[i + name.len()..].chars().next().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                before && after
            });
            if !named {
                missing.push(format!("{}: the //! layout does not name `{name}`", module.join("::")));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}
