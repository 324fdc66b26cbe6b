//! The workspace's shape, as docs/README.md states it: every crate depends (normal and dev
//! dependencies alike) only on crates below it in the layering, and within a crate the top-level
//! modules depend on each other one way (no cycle of `crate::` references).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layering, bottom first: a crate may depend only on crates listed before it.
const LAYERS: &[&str] = &[
    "autopar-files",
    "autopar-layout",
    "autopar-checkpoint",
    "autopar-comm",
    "autopar-tensor",
    "autopar-graph",
    "autopar-data",
    "autopar-models",
    "autopar-parallel",
    "autopar-runtime",
    "autopar",
    "autopar-fuzz",
    "autopar-py",
];

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace crates a manifest names in its dependency tables.
fn workspace_deps(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.ends_with("dependencies]");
            continue;
        }
        if in_deps {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            if LAYERS.contains(&name) {
                deps.insert(name.to_string());
            }
        }
    }
    deps
}

#[test]
fn every_crate_depends_only_on_crates_below_it() {
    let mut seen = 0;
    for (i, name) in LAYERS.iter().enumerate() {
        let manifest = std::fs::read_to_string(crates_dir().join(name).join("Cargo.toml")).unwrap();
        for dep in workspace_deps(&manifest) {
            let j = LAYERS.iter().position(|l| *l == dep).unwrap();
            assert!(j < i, "{name} depends on {dep}, which is not below it in the layering {LAYERS:?}");
            seen += 1;
        }
    }
    assert!(seen > 20, "the manifests were read ({seen} dependencies)");
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules of a crate's `src` and, for each, the other top-level modules its
/// files name through `crate::`. Left out: the crate root, which re-exports, and the crate's
/// `error` module, whose error values every module returns and which carries every module's
/// values (the house style's one error enum per crate).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let module_of = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
        let m = first.trim_end_matches(".rs").to_string();
        (m != "lib" && m != "main" && m != "error").then_some(m)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| module_of(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for p in &files {
        let Some(m) = module_of(p) else { continue };
        let text = std::fs::read_to_string(p).unwrap();
        // Unit tests may reach anywhere; the module's own code may not.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for (k, _) in code.match_indices("crate::") {
            let before = code[..k].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `autopar_crate::`, not `crate::`
            }
            let rest = &code[k + "crate::".len()..];
            let target: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let names: Vec<String> = if target.is_empty() && rest.starts_with('{') {
                rest[1..rest.find('}').unwrap_or(1)].split(',').map(|s| s.trim().split("::").next().unwrap_or("").to_string()).collect()
            } else {
                vec![target]
            };
            for t in names {
                if t != m && modules.contains(&t) {
                    graph.get_mut(&m).unwrap().insert(t);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for t in &graph[m] {
            match state.get(t).copied().unwrap_or(0) {
                1 => {
                    let at = path.iter().position(|p| p == t).unwrap();
                    let mut cycle = path[at..].to_vec();
                    cycle.push(t.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(t, graph, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_cycle_of_modules() {
    let mut edges = 0;
    let mut cycles = Vec::new();
    for name in LAYERS {
        let src = crates_dir().join(name).join("src");
        let graph = module_graph(&src);
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        if let Some(cycle) = find_cycle(&graph) {
            cycles.push(format!("{name}: {}", cycle.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "modules that depend on each other in a cycle:\n  {}", cycles.join("\n  "));
    assert!(edges > 50, "the sources were read ({edges} module dependencies)");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec![])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(find_cycle(&g), Some(vec!["a".to_string(), "b".into(), "c".into(), "a".into()]));
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&acyclic), None);
}
