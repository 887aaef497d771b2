//! The rules of ARCHITECTURE.md, checked mechanically. Crates: the worker never links sled
//! or the brain, and `shared` stays free of brain-only dependencies (`cargo tree`). Inside
//! `brain/src`: each layer uses only the layers below it, `model` and `engine` never see
//! wire types, `llm` and `fleet` know nothing of the engine, and no two files import each
//! other in a circle. Every source file opens with a `//!` line saying what it is for. Every
//! path ARCHITECTURE.md names (a file, a module, a `crate::module::item`) is in the tree. And
//! the workspace's clippy settings refuse what they promise to (a function too long, an unsafe
//! block that does not say why it is sound), shown on a crate planted with both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn deps_of(package: &str) -> Vec<String> {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .args(["--manifest-path", manifest])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert!(names.len() > 10, "cargo tree printed too little:\n{text}");
    names
}

#[test]
fn worker_does_not_depend_on_sled_or_brain() {
    let names = deps_of("worker");
    assert!(
        names.iter().any(|n| n == "shared"),
        "sanity: worker uses shared"
    );
    for banned in ["sled", "brain"] {
        assert!(
            !names.iter().any(|n| n == banned),
            "worker depends on {banned}; move what it needs into `shared`"
        );
    }
}

#[test]
fn shared_does_not_depend_on_brain_only_crates() {
    let names = deps_of("shared");
    for banned in ["sled", "brain", "worker", "openssh"] {
        assert!(
            !names.iter().any(|n| n == banned),
            "shared depends on {banned}"
        );
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// Every Rust source of the workspace (not generated code, not `target/`).
fn sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in [
        "brain", "worker", "shared", "proto", "testkit", "src", "tests",
    ] {
        rust_files(&root().join(d), &mut out);
    }
    out.sort();
    assert!(out.len() > 50, "found too few sources: {out:?}");
    out
}

#[test]
fn every_file_says_what_it_is_for() {
    let missing: Vec<String> = sources()
        .into_iter()
        .filter(|f| !std::fs::read_to_string(f).unwrap().starts_with("//!"))
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not open with a `//!` line saying what they are for: {missing:#?}"
    );
}

/// The workspace's `[workspace.lints.*]` tables as a member's `[lints.*]`.
fn workspace_lints() -> String {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut out = String::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            inside = line.starts_with("[workspace.lints.");
        }
        if inside {
            out.push_str(&line.replacen("[workspace.lints.", "[lints.", 1));
            out.push('\n');
        }
    }
    assert!(out.contains("too_many_lines"), "no lints found: {out}");
    out
}

/// A function of `lines` statements.
fn function_of(name: &str, lines: usize) -> String {
    let body: String = (0..lines)
        .map(|i| format!("    x = x.wrapping_add({i});\n"))
        .collect();
    format!("pub fn {name}(mut x: u64) -> u64 {{\n{body}    x\n}}\n")
}

/// The workspace's lint settings and clippy.toml, on a crate of their own with one function
/// just past the limit, one just inside it, and an unsafe block without its `SAFETY:` line:
/// clippy refuses the first and the last, and only those.
#[test]
fn clippy_refuses_a_long_function_and_an_unexplained_unsafe_block() {
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(root().join("clippy.toml")).unwrap();
    let limit: usize = config
        .lines()
        .find_map(|l| l.strip_prefix("too-many-lines-threshold = "))
        .expect("clippy.toml sets too-many-lines-threshold")
        .trim()
        .parse()
        .unwrap();
    std::fs::write(dir.path().join("clippy.toml"), &config).unwrap();
    std::fs::write(
        dir.path().join("Cargo.toml"),
        format!(
            "[package]\nname = \"planted\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\n[workspace]\n\n{}",
            workspace_lints()
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    // clippy counts a body's lines: the statements and the tail `x`.
    let lib = format!(
        "//! Planted.\n{}{}pub fn first(v: &[u8]) -> u8 {{\n    unsafe {{ *v.as_ptr() }}\n}}\n",
        function_of("too_long", limit),
        function_of("just_inside", limit - 1),
    );
    std::fs::write(dir.path().join("src/lib.rs"), lib).unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["clippy", "--offline", "--quiet", "--lib"])
        .current_dir(dir.path())
        .env("CARGO_TARGET_DIR", dir.path().join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("run cargo clippy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "clippy passed the planted crate:\n{stderr}"
    );
    let long: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("this function has too many lines"))
        .collect();
    assert_eq!(
        long,
        [format!(
            "error: this function has too many lines ({}/{limit})",
            limit + 1
        )],
        "{stderr}"
    );
    assert!(stderr.contains("fn too_long"), "{stderr}");
    assert!(!stderr.contains("fn just_inside"), "{stderr}");
    assert!(
        stderr.contains("unsafe block missing a safety comment"),
        "{stderr}"
    );
}

/// The brain's layers, lowest first, and what each may use besides itself
/// ([`EVERY_LAYER_BELOW`]: every layer listed before it).
const LAYERS: &[(&str, &[&str])] = &[
    ("storage", &[]),
    ("llm", &[]),
    ("model", &["llm"]),
    ("trust", &["storage", "model"]),
    ("mirror", &["storage", "model"]),
    ("git", &["model", "mirror"]),
    ("egress", &["model", "trust"]),
    ("fleet", &["model", "trust"]),
    ("provision", &["storage", "model", "trust", "fleet"]),
    ("engine", &["storage", "llm", "model"]),
    ("config", &["llm", "model", "git", "provision"]),
    ("api", EVERY_LAYER_BELOW),
    ("web", EVERY_LAYER_BELOW),
    ("app", EVERY_LAYER_BELOW),
    ("admin", EVERY_LAYER_BELOW),
];

/// A layer at the top uses any layer below it.
const EVERY_LAYER_BELOW: &[&str] = &["*"];

/// What each layer may use, with [`EVERY_LAYER_BELOW`] spelled out.
fn allowed_layers() -> BTreeMap<&'static str, Vec<&'static str>> {
    LAYERS
        .iter()
        .enumerate()
        .map(|(i, (layer, uses))| {
            let uses = if *uses == EVERY_LAYER_BELOW {
                LAYERS[..i].iter().map(|(l, _)| *l).collect()
            } else {
                uses.to_vec()
            };
            (*layer, uses)
        })
        .collect()
}

/// One file of `brain/src` as a module: its path (`engine::agent`), its text without inline
/// test modules, and the child modules it declares.
struct Module {
    path: Vec<String>,
    file: String,
    text: String,
    children: BTreeSet<String>,
}

fn brain_modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .filter(|f| !f.ends_with("main.rs"))
        .map(|f| {
            let rel = f.strip_prefix(src).unwrap();
            let mut path: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                path.pop();
            }
            // Comments name paths without using them.
            let full: String = std::fs::read_to_string(&f)
                .unwrap()
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| format!("{l}\n"))
                .collect();
            // Inline test modules (always last) see their file through `super`.
            let text = match full.find("#[cfg(test)]\nmod tests {") {
                Some(i) => full[..i].to_string(),
                None => full,
            };
            let children = text
                .lines()
                .filter_map(|l| {
                    let l = l.trim();
                    let l = l
                        .strip_prefix("pub(crate) ")
                        .or(l.strip_prefix("pub "))
                        .unwrap_or(l);
                    l.strip_prefix("mod ")?
                        .strip_suffix(';')
                        .map(str::to_string)
                })
                .collect();
            Module {
                path,
                file: rel.display().to_string(),
                text,
                children,
            }
        })
        .collect()
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Module paths a file refers to: `crate::a::b` (and `crate::a::{b, c}`), `super::x`, and
/// `use child::...` of its own children. Only lower-case segments: they name modules.
fn references(m: &Module) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let text = &m.text;
    let parent: Vec<String> = m.path[..m.path.len().saturating_sub(1)].to_vec();
    let mut push = |base: Vec<String>, rest: &str| {
        let mut path = base;
        // `super::{a, b}`: a group right after the base.
        let mut rest = match rest.strip_prefix('{') {
            Some(r) => {
                let end = r.find('}').unwrap_or(r.len());
                for item in r[..end].split(',') {
                    let seg: String = item
                        .trim()
                        .chars()
                        .take_while(|c| is_ident_char(*c))
                        .collect();
                    if seg.chars().next().is_some_and(|c| c.is_ascii_lowercase()) && seg != "self" {
                        let mut p = path.clone();
                        p.push(seg);
                        out.insert(p);
                    }
                }
                return;
            }
            None => rest,
        };
        loop {
            let seg: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
            if seg.is_empty() || !seg.chars().next().unwrap().is_ascii_lowercase() {
                break;
            }
            path.push(seg.clone());
            rest = &rest[seg.len()..];
            match rest.strip_prefix("::") {
                Some(r) if r.starts_with('{') => {
                    // A group: each item's first segment.
                    let end = r.find('}').unwrap_or(r.len());
                    for item in r[1..end].split(',') {
                        let item = item.trim();
                        let seg: String = item.chars().take_while(|c| is_ident_char(*c)).collect();
                        if seg.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                            && seg != "self"
                        {
                            let mut p = path.clone();
                            p.push(seg);
                            out.insert(p);
                        }
                    }
                    break;
                }
                Some(r) => rest = r,
                None => break,
            }
        }
        out.insert(path);
    };
    for (i, _) in text.match_indices("crate::") {
        if i > 0 && is_ident_char(text[..i].chars().last().unwrap()) {
            continue;
        }
        push(vec![], &text[i + "crate::".len()..]);
        continue;
    }
    for (i, _) in text.match_indices("super::") {
        if i > 0 && is_ident_char(text[..i].chars().last().unwrap()) {
            continue;
        }
        push(parent.clone(), &text[i + "super::".len()..]);
    }
    for line in text.lines() {
        let l = line.trim();
        let l = l.strip_prefix("pub ").unwrap_or(l);
        if let Some(rest) = l.strip_prefix("use ") {
            let seg: String = rest.chars().take_while(|c| is_ident_char(*c)).collect();
            if m.children.contains(&seg) {
                push(m.path.clone(), rest);
            }
        }
    }
    out
}

/// The file-level import graph of `brain/src`: file → files it uses.
fn brain_graph() -> (Vec<Module>, BTreeMap<usize, BTreeSet<usize>>) {
    graph_of(&root().join("brain/src"))
}

fn graph_of(src: &Path) -> (Vec<Module>, BTreeMap<usize, BTreeSet<usize>>) {
    let modules = brain_modules(src);
    let by_path: BTreeMap<Vec<String>, usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.clone(), i))
        .collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, m) in modules.iter().enumerate() {
        for r in references(m) {
            // The longest prefix that is a file.
            let target = (0..=r.len())
                .rev()
                .find_map(|n| by_path.get(&r[..n]).copied());
            if let Some(t) = target
                && t != i
                && !modules[t].path.is_empty()
            {
                edges.entry(i).or_default().insert(t);
            }
        }
    }
    (modules, edges)
}

#[test]
fn each_brain_layer_uses_only_the_layers_below_it() {
    let (modules, edges) = brain_graph();
    let allowed = allowed_layers();
    let mut bad = Vec::new();
    for (from, tos) in &edges {
        let a = &modules[*from].path[0];
        let may = allowed.get(a.as_str()).unwrap_or_else(|| {
            panic!(
                "layer {a} ({}) is not in LAYERS: add it",
                modules[*from].file
            )
        });
        for to in tos {
            let b = &modules[*to].path[0];
            if a != b && !may.contains(&b.as_str()) {
                bad.push(format!(
                    "{} uses {}",
                    modules[*from].file, modules[*to].file
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "layering broken (see LAYERS and ARCHITECTURE.md): {bad:#?}"
    );
    // Wire types stay at the edges.
    for m in &modules {
        let layer = m.path.first().map(String::as_str).unwrap_or("");
        if matches!(layer, "model" | "engine") {
            assert!(
                !m.text.contains("proto::") && !m.text.contains("tonic::"),
                "{} uses wire types (proto/tonic): convert in api::convert instead",
                m.file
            );
        }
        if matches!(layer, "llm" | "fleet") {
            assert!(
                !m.text.contains("crate::engine"),
                "{} uses the engine: it must not know about tasks",
                m.file
            );
        }
    }
}

#[test]
fn no_two_brain_files_import_each_other_in_a_circle() {
    let (modules, edges) = brain_graph();
    let circles = circles(&modules, &edges);
    assert!(
        circles.is_empty(),
        "files that import each other in a circle (move what both need below both): {circles:#?}"
    );
    assert!(
        edges.len() > 40,
        "the import graph looks empty: {}",
        edges.len()
    );
}

#[test]
fn no_files_import_each_other_in_a_circle_in_the_other_crates() {
    let mut all = Vec::new();
    for krate in ["worker/src", "shared/src", "testkit/src"] {
        let (modules, edges) = graph_of(&root().join(krate));
        let found: Vec<String> = circles(&modules, &edges)
            .into_iter()
            .map(|c| format!("{krate}: {}", c.join(" → ")))
            .collect();
        all.extend(found);
    }
    assert!(
        all.is_empty(),
        "files that import each other in a circle: {all:#?}"
    );
}

#[test]
fn the_circle_check_sees_circles_through_groups_super_and_children() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "//! x\npub mod a;\npub mod b;\npub mod c;\n",
    )
    .unwrap();
    // a/mod.rs -> a/inner.rs (a child, by `use`) -> b.rs (a group) -> a/mod.rs (super)
    std::fs::write(
        src.join("a/mod.rs"),
        "//! x\nmod inner;\npub use inner::Thing;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/inner.rs"), "//! x\nuse crate::{b, c};\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "//! x\n// a comment naming crate::c is not a use\nuse crate::a::Other;\n",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "//! x\npub struct C;\n").unwrap();
    let (modules, edges) = graph_of(src);
    let found = circles(&modules, &edges);
    assert_eq!(found.len(), 1, "{found:?}");
    let mut names: Vec<String> = found[0].iter().map(|s| s.to_string()).collect();
    names.sort();
    assert_eq!(names, ["a/inner.rs", "a/mod.rs", "b.rs"]);
}

/// Strongly connected components of more than one file: the circles.
fn circles<'a>(
    modules: &'a [Module],
    edges: &BTreeMap<usize, BTreeSet<usize>>,
) -> Vec<Vec<&'a str>> {
    // Tarjan's strongly connected components.
    struct T<'a> {
        edges: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        sccs: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for &w in t.edges.get(&v).into_iter().flatten() {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(i) if t.on[w] => t.low[v] = t.low[v].min(i),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                t.sccs.push(scc);
            }
        }
    }
    let n = modules.len();
    let mut t = T {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: vec![],
        next: 0,
        sccs: vec![],
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.sccs
        .iter()
        .map(|s| s.iter().map(|i| modules[*i].file.as_str()).collect())
        .collect()
}

/// Every file under the repository's root that git tracks, as `a/b/c.rs`.
fn tracked() -> Vec<String> {
    let out = Command::new("git")
        .args(["ls-files"])
        .current_dir(root())
        .output()
        .expect("git ls-files");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Whether `name` (a file or directory path, a module path like `aws/credentials`, or a
/// Rust path like `engine::attempts::decide`) names something in `files`.
fn names_something(name: &str, files: &[String]) -> bool {
    if name.contains("::") {
        // The longest prefix that is a module file; what follows it must appear in that file.
        let mut parts: Vec<&str> = name.split("::").collect();
        // A crate's name stands for its `src/`.
        let krate = ["brain", "worker", "shared", "testkit", "proto"]
            .contains(&parts[0])
            .then(|| format!("{}/src", parts[0]));
        if krate.is_some() && parts.len() > 1 {
            parts.remove(0);
        }
        for n in (1..=parts.len()).rev() {
            let module = match &krate {
                Some(k) => format!("{k}/{}", parts[..n].join("/")),
                None => parts[..n].join("/"),
            };
            let hits: Vec<&String> = files
                .iter()
                .filter(|f| {
                    let f = format!("/{f}");
                    f.ends_with(&format!("/{module}.rs"))
                        || f.ends_with(&format!("/{module}/mod.rs"))
                        || (n == 1 && f.ends_with(&format!("/{module}/src/lib.rs")))
                })
                .collect();
            if hits.is_empty() {
                continue;
            }
            let rest = &parts[n..];
            return rest.is_empty()
                || hits.iter().any(|f| {
                    let text = std::fs::read_to_string(root().join(f)).unwrap_or_default();
                    rest.iter().all(|r| text.contains(r))
                });
        }
        // An item at a crate's root.
        return krate.is_some_and(|k| {
            let text = std::fs::read_to_string(root().join(k).join("lib.rs")).unwrap_or_default();
            parts.iter().all(|p| text.contains(p))
        });
    }
    let t = name.trim_end_matches('/');
    files.iter().any(|f| {
        let f = format!("/{f}");
        f.ends_with(&format!("/{t}"))
            || f.ends_with(&format!("/{t}.rs"))
            || f.contains(&format!("/{t}/"))
    })
}

/// The names in backticks in `text` that look like paths in the tree: `a/b`, `a/b.rs`,
/// `crate::module::item`. Paths on a running machine (`/proc/...`, `target/`, the data dir's
/// `repos/`) are not the tree's.
fn named_paths(text: &str) -> BTreeSet<String> {
    const NOT_THE_TREE: &[&str] = &[".git/", ".tether/", "target/", "repos/", "../"];
    let mut out = BTreeSet::new();
    for (i, chunk) in text.split('`').enumerate() {
        if i % 2 == 0 || chunk.is_empty() || chunk.contains(char::is_whitespace) {
            continue;
        }
        let path_like = chunk.contains('/')
            && !chunk.starts_with('/')
            && chunk
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
        let rust_like = chunk.contains("::")
            && chunk.split("::").all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
            });
        if (path_like && !NOT_THE_TREE.iter().any(|p| chunk.starts_with(p))) || rust_like {
            out.insert(chunk.to_string());
        }
    }
    out
}

#[test]
fn every_path_the_architecture_names_exists() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let files = tracked();
    let named = named_paths(&text);
    assert!(named.len() > 20, "{named:?}");
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !names_something(n, &files))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what is not in the tree (fix the map): {missing:?}"
    );
    // The check can fail: a planted name that is nowhere.
    assert!(!names_something("engine/no_such_module.rs", &files));
    assert!(!names_something("engine::no_such_module", &files));
    assert!(!names_something("engine::attempts::no_such_item", &files));
}

/// The README is a landing page: short, and every document it leads to is there. Each
/// relative link of the README and of `docs/` names a file in the tree, and each document in
/// `docs/` is linked from the README (none lost when sections moved there).
#[test]
fn the_readme_is_short_and_its_links_lead_somewhere() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let words = readme.split_whitespace().count();
    assert!(
        words <= 1500,
        "the README has {words} words: at most about 1,500 (move detail to docs/)"
    );
    let mut pages = vec![(root.join("README.md"), readme.clone())];
    let mut docs: Vec<String> = Vec::new();
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(format!("docs/{}", e.file_name().to_string_lossy()));
            pages.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
        }
    }
    let mut broken = Vec::new();
    for (page, text) in &pages {
        // `](target)` of markdown links and images.
        for piece in text.split("](").skip(1) {
            let Some(target) = piece.split(')').next() else {
                continue;
            };
            let target = target.split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let base = page.parent().unwrap();
            if !base.join(target).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
    let unlinked: Vec<&String> = docs
        .iter()
        .filter(|d| !readme.contains(&format!("]({d})")))
        .collect();
    assert!(
        unlinked.is_empty(),
        "documents the README does not lead to: {unlinked:?}"
    );
}
