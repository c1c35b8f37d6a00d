//! The rule of `docs/architecture.md`: no two modules of `kvm-core/src` import each other,
//! directly or through others. This reads every source file, takes the `crate::` paths of
//! its code (not its comments, not its `#[cfg(test)]` items: tests may use anything),
//! builds the graph of the top-level modules (`format`, `quant`, `kernels`, `state`, ...)
//! and fails on a cycle, naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file: comment lines and the items under `#[cfg(test)]` left out, and
/// each line cut at a `//` comment.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            skip_item(&mut lines);
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// Skips the item after a `#[cfg(test)]`: up to its balanced closing brace, or its `;`.
fn skip_item<'a>(lines: &mut impl Iterator<Item = &'a str>) {
    let mut depth = 0i32;
    for line in lines {
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        let t = line.trim_end();
        if depth == 0 && (t.ends_with('}') || t.ends_with(';')) {
            return;
        }
    }
}

/// The top-level modules `code` names after `crate::`, groups (`crate::{a, b::c}`)
/// included.
fn uses(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `kvm_core::`, not `crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0, 0);
            for (i, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(rest));
        }
    }
    found.remove("");
    found
}

/// The identifier `s` starts with, past white space.
fn ident(s: &str) -> String {
    s.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The graph: each top-level module and the other top-level modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let module = |p: &Path| {
        let rel = p.strip_prefix(src).expect("under src");
        let first = rel.components().next().expect("a file").as_os_str().to_string_lossy().into_owned();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|p| module(p)).filter(|m| m != "lib").collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for path in &files {
        let m = module(path);
        if m == "lib" {
            continue;
        }
        let text = fs::read_to_string(path).expect("a source file");
        for d in uses(&code(&text)) {
            if d != m && modules.contains(&d) {
                g.get_mut(&m).expect("a module").insert(d);
            }
        }
    }
    g
}

/// A cycle of `g` (its modules in order, the first repeated at the end), if any.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth-first, white (absent) / grey (on the path) / black (done).
    fn visit(
        m: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut c = path[at..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in &g[m] {
            if let Some(c) = visit(d, g, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|m| visit(m, g, &mut done, &mut Vec::new()))
}

#[test]
fn kvm_core_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 10, "found only {:?} under {}", g.keys(), src.display());
    if let Some(c) = cycle(&g) {
        panic!("a module cycle in kvm-core/src: {}\nthe graph: {g:#?}", c.join(" -> "));
    }
}

#[test]
fn the_check_sees_a_cycle_and_the_paths_it_reads() {
    let found = uses(&code(
        "use crate::{a::X, b};\n// crate::c\nfn f() { crate::d::g(); kvm_crate::e(); }\n#[cfg(test)]\nmod tests {\n    use crate::f;\n}\n",
    ));
    assert_eq!(found.into_iter().collect::<Vec<_>>(), ["a", "b", "d"]);
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .iter()
        .map(|(m, d)| (m.to_string(), [d.to_string()].into()))
        .collect();
    assert_eq!(cycle(&g), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    let acyclic: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b", "c"]), ("b", vec!["c"]), ("c", vec![])]
        .iter()
        .map(|(m, d)| (m.to_string(), d.iter().map(|s| s.to_string()).collect()))
        .collect();
    assert_eq!(cycle(&acyclic), None);
}
