//! The layering rule, checked from the source: no import cycles between
//! modules, and the core names no concrete kind.
//!
//! Each crate's files are read with `syn` (the parser rustc's own macros
//! use, so a `use` tree with groups, renames and globs is read as the
//! compiler reads it). Every path into the crate (`crate::…`, `super::…`,
//! `self::…`) found in a non-test item is an edge from the file's module to
//! the deepest module the path names. Edges to a module's own ancestors
//! (a child using its parent's items) and from a module to its own
//! descendants (a parent using its children) are how Rust modules nest and
//! are not counted. Every other edge is lifted to the two siblings under the
//! nearest common ancestor — `backend::docker::moving` naming
//! `sandbox::client` is the edge `backend → sandbox` — and the siblings under
//! each module must form no cycle.
//!
//! Kinds (a backend, a snapshot kind) may be named only from inside
//! themselves and from the one registration file each crate lists.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use syn::visit::Visit;

/// A module path inside one crate: `["backend", "docker"]`.
type ModulePath = Vec<String>;

/// What one crate must honour.
pub(crate) struct CrateRule {
    /// The crate's `src` directory, relative to the workspace root.
    pub src: &'static str,
    /// Modules that are concrete kinds: nothing outside them names them…
    pub kinds: &'static [&'static str],
    /// …except these files (the registrations), relative to `src`.
    pub registrations: &'static [&'static str],
}

/// The workspace's crates and their kinds.
pub(crate) const RULES: &[CrateRule] = &[
    CrateRule {
        src: "host/src",
        kinds: &[
            "backend::local",
            "snapshot::local",
            "snapshot::noop",
            "plugin::snapshot_kinds",
        ],
        registrations: &["backend/registration.rs", "sandbox/snapshot_binding.rs"],
    },
    CrateRule {
        src: "host/docker/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/registry/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/base/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/server/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/cli/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/egress/src",
        kinds: &[],
        registrations: &[],
    },
    CrateRule {
        src: "host/agent/src",
        kinds: &[],
        registrations: &[],
    },
];

/// One reference from a file into its crate.
struct Reference {
    file: PathBuf,
    from: ModulePath,
    to: ModulePath,
    line: usize,
}

/// Checks every crate in [`RULES`]; the error lists every cycle and every
/// kind named from outside, each with the lines that make it.
/// Crates that are concrete kinds: the core (`host/Cargo.toml`) may not
/// depend on them (a dev-dependency, for an example, is not the core).
pub(crate) const KIND_CRATES: &[&str] = &["berth-docker"];

/// The core's `[dependencies]` that are kind crates.
fn core_kind_dependencies(root: &Path) -> Result<Vec<String>> {
    let path = root.join("host/Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let deps = manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    Ok(deps
        .into_iter()
        .filter(|d| KIND_CRATES.contains(&d.as_str()))
        .collect())
}

pub(crate) fn check(root: &Path) -> Result<()> {
    let mut problems = String::new();
    for kind in core_kind_dependencies(root)? {
        let _ = writeln!(
            problems,
            "host/Cargo.toml: the core depends on the kind crate {kind} (register it from a front end instead)"
        );
    }
    for rule in RULES {
        problems.push_str(&check_crate(root, rule)?);
    }
    if problems.is_empty() {
        eprintln!("xtask: layering: no import cycle, no kind named outside its registration");
        Ok(())
    } else {
        anyhow::bail!("the layering rule is broken (docs/ARCHITECTURE.md, \"Layers\"):\n{problems}")
    }
}

fn check_crate(root: &Path, rule: &CrateRule) -> Result<String> {
    let src = root.join(rule.src);
    let files = module_files(&src)?;
    let modules: BTreeSet<ModulePath> = files.iter().map(|(_, m)| m.clone()).collect();
    let mut parsed_files = Vec::new();
    for (file, module) in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed =
            syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        parsed_files.push((file, module, parsed));
    }
    // Re-exports first, so that a name reached through its parent
    // (`crate::snapshot::LocalOptions`) counts as the module that defines
    // it (`snapshot::local`).
    let mut aliases = Aliases::new();
    for (_, module, parsed) in &parsed_files {
        let mut collector = Collector {
            module,
            modules: &modules,
            aliases: &Aliases::new(),
            found: Vec::new(),
        };
        for item in &parsed.items {
            if let syn::Item::Use(u) = item {
                if matches!(u.vis, syn::Visibility::Inherited) || is_test_only(item) {
                    continue;
                }
                let mut names = Vec::new();
                exported_names(&mut Vec::new(), &u.tree, &mut names);
                for (path, name) in names {
                    if let Some(to) = collector.resolve(&path) {
                        if &to != *module && !module.starts_with(&to) {
                            aliases.insert(((*module).clone(), name), to);
                        }
                    }
                }
            }
        }
        collector.found.clear();
    }
    let mut references = Vec::new();
    for (file, module, parsed) in &parsed_files {
        let mut collector = Collector {
            module,
            modules: &modules,
            aliases: &aliases,
            found: Vec::new(),
        };
        for item in &parsed.items {
            if !is_test_only(item) {
                collector.visit_item(item);
            }
        }
        for (to, line) in collector.found {
            references.push(Reference {
                file: file.strip_prefix(root).unwrap_or(file).to_path_buf(),
                from: (*module).clone(),
                to,
                line,
            });
        }
    }
    let mut out = String::new();
    for cycle in cycles(&references) {
        let _ = writeln!(
            out,
            "{}: an import cycle between {}",
            rule.src,
            cycle.join(" → ")
        );
    }
    for r in &references {
        for kind in rule.kinds {
            let kind: ModulePath = kind.split("::").map(String::from).collect();
            // The kind's parent declares it and may re-export its names.
            let inside = r.from.starts_with(&kind) || r.from == kind[..kind.len() - 1];
            let registration = rule
                .registrations
                .iter()
                .any(|f| r.file.ends_with(Path::new(f)));
            if r.to.starts_with(&kind) && !inside && !registration {
                let _ = writeln!(
                    out,
                    "{}:{}: names the kind {} from outside it (only its registration may)",
                    r.file.display(),
                    r.line,
                    kind.join("::")
                );
            }
        }
    }
    Ok(out)
}

/// Every `.rs` file under `src` with the module it is (`bin/` left out:
/// binaries are crates of their own).
fn module_files(src: &Path) -> Result<Vec<(PathBuf, ModulePath)>> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            let relative = path.strip_prefix(src).unwrap_or(&path).to_path_buf();
            if path.is_dir() {
                if relative != Path::new("bin") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_some_and(|e| e == "rs") {
                out.push((path.clone(), module_of(&relative)));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// `lib.rs` → root, `a/mod.rs` and `a.rs` → `a`, `a/b.rs` → `a::b`.
fn module_of(relative: &Path) -> ModulePath {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// `#[cfg(test)]` items: test code may reach anywhere.
fn is_test_only(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Mod(m) => &m.attrs,
        syn::Item::Fn(f) => &f.attrs,
        syn::Item::Use(u) => &u.attrs,
        syn::Item::Impl(i) => &i.attrs,
        _ => return false,
    };
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

/// Names a module re-exports (`pub use`), to the module that defines them.
type Aliases = BTreeMap<(ModulePath, String), ModulePath>;

/// The paths and exported names of a `use` tree: `a::{b, c as d}` gives
/// (`a::b`, `b`) and (`a::c`, `d`); globs export nothing by name.
fn exported_names(
    prefix: &mut Vec<String>,
    tree: &syn::UseTree,
    out: &mut Vec<(Vec<String>, String)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            exported_names(prefix, &p.tree, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((path, n.ident.to_string()));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((path, r.rename.to_string()));
        }
        syn::UseTree::Glob(_) => {}
        syn::UseTree::Group(g) => {
            for t in &g.items {
                exported_names(prefix, t, out);
            }
        }
    }
}

struct Collector<'a> {
    module: &'a ModulePath,
    modules: &'a BTreeSet<ModulePath>,
    aliases: &'a Aliases,
    found: Vec<(ModulePath, usize)>,
}

impl Collector<'_> {
    /// The deepest known module a path (its segments, `crate`/`super`/`self`
    /// first) names, if it is a path into this crate.
    fn resolve(&self, segments: &[String]) -> Option<ModulePath> {
        let child = |name: &str| {
            let mut m = self.module.clone();
            m.push(name.to_string());
            self.modules.contains(&m)
        };
        let (mut absolute, mut rest): (ModulePath, &[String]) =
            match segments.first().map(String::as_str) {
                Some("crate") => (Vec::new(), &segments[1..]),
                Some("self") => (self.module.clone(), &segments[1..]),
                Some("super") => {
                    let mut m = self.module.clone();
                    m.pop();
                    (m, &segments[1..])
                }
                // A child module named without `self::` (`use local::X;`).
                Some(name) if segments.len() > 1 && child(name) => (self.module.clone(), segments),
                _ => return None,
            };
        while rest.first().map(String::as_str) == Some("super") {
            absolute.pop();
            rest = &rest[1..];
        }
        absolute.extend(rest.iter().cloned());
        // Follow re-exports (a bounded number of hops: they cannot loop in
        // a crate that compiles, but a bound costs nothing).
        for _ in 0..8 {
            let Some(n) = (0..=absolute.len())
                .rev()
                .find(|&n| self.modules.contains(&absolute[..n].to_vec()))
            else {
                break;
            };
            let Some(name) = absolute.get(n) else { break };
            let Some(to) = self.aliases.get(&(absolute[..n].to_vec(), name.clone())) else {
                break;
            };
            let mut followed = to.clone();
            followed.extend(absolute[n + 1..].iter().cloned());
            absolute = followed;
        }
        (0..=absolute.len())
            .rev()
            .map(|n| absolute[..n].to_vec())
            .find(|m| self.modules.contains(m))
    }

    fn record(&mut self, segments: &[String], line: usize) {
        if let Some(to) = self.resolve(segments) {
            self.found.push((to, line));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.record(&prefix.clone(), line);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(&prefix.clone(), line);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(&prefix.clone(), line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, line);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, node: &'ast syn::ItemUse) {
        let line = node.use_token.span.start().line;
        self.use_tree(&mut Vec::new(), &node.tree, line);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map(|s| s.ident.span().start().line)
            .unwrap_or(0);
        self.record(&segments, line);
        syn::visit::visit_path(self, path);
    }
}

/// The cycles among siblings, each as the sibling modules' paths, with the
/// edges that close it named after them.
fn cycles(references: &[Reference]) -> Vec<Vec<String>> {
    // Sibling edges, grouped by their common parent.
    let mut edges: BTreeMap<(ModulePath, ModulePath), Vec<String>> = BTreeMap::new();
    for r in references {
        if r.from.starts_with(&r.to) || r.to.starts_with(&r.from) {
            continue;
        }
        let common = r.from.iter().zip(&r.to).take_while(|(a, b)| a == b).count();
        let a = r.from[..=common].to_vec();
        let b = r.to[..=common].to_vec();
        edges
            .entry((a, b))
            .or_default()
            .push(format!("{}:{}", r.file.display(), r.line));
    }
    let mut graph: BTreeMap<ModulePath, BTreeSet<ModulePath>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a.clone()).or_default().insert(b.clone());
        graph.entry(b.clone()).or_default();
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|component| {
            let mut named: Vec<String> = component.iter().map(|m| m.join("::")).collect();
            for (a, b) in edges.keys() {
                if component.contains(a) && component.contains(b) {
                    let mut at = edges[&(a.clone(), b.clone())].clone();
                    at.dedup();
                    let more = at.len().saturating_sub(3);
                    at.truncate(3);
                    let more = if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    };
                    named.push(format!(
                        "({} → {} at {}{more})",
                        a.join("::"),
                        b.join("::"),
                        at.join(", ")
                    ));
                }
            }
            named
        })
        .collect()
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    graph: &BTreeMap<ModulePath, BTreeSet<ModulePath>>,
) -> Vec<BTreeSet<ModulePath>> {
    struct State<'g> {
        graph: &'g BTreeMap<ModulePath, BTreeSet<ModulePath>>,
        index: BTreeMap<&'g ModulePath, usize>,
        low: BTreeMap<&'g ModulePath, usize>,
        stack: Vec<&'g ModulePath>,
        on_stack: BTreeSet<&'g ModulePath>,
        out: Vec<BTreeSet<ModulePath>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g ModulePath) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(from: &str, to: &str) -> Reference {
        let path = |s: &str| {
            s.split("::")
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect()
        };
        Reference {
            file: PathBuf::from(format!("{from}.rs")),
            from: path(from),
            to: path(to),
            line: 1,
        }
    }

    #[test]
    fn siblings_that_name_each_other_are_a_cycle_and_nesting_is_not() {
        let refs = [
            reference("sandbox::client", "backend"),
            reference("backend::docker::moving", "sandbox::client"),
            reference("backend::docker", "backend"),
            reference("backend", "backend::docker"),
            reference("workspace::tree", "units"),
        ];
        let found = cycles(&refs);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            found[0][..2],
            ["backend".to_string(), "sandbox".to_string()]
        );
        assert!(found[0][2].contains("backend::docker::moving"), "{found:?}");
        assert!(cycles(&refs[2..]).is_empty());
    }

    #[test]
    fn a_name_reached_through_a_reexport_counts_as_the_module_defining_it() {
        let path = |p: &str| -> ModulePath {
            p.split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        };
        let modules: BTreeSet<ModulePath> = ["", "sandbox", "snapshot", "snapshot::local"]
            .into_iter()
            .map(path)
            .collect();
        // `snapshot/mod.rs`: `pub use local::{LocalOptions, LocalSnapshot as Local};`
        let tree: syn::UseTree =
            syn::parse_str("local::{LocalOptions, LocalSnapshot as Local}").expect("a use tree");
        let mut names = Vec::new();
        exported_names(&mut Vec::new(), &tree, &mut names);
        let snapshot = path("snapshot");
        let reexporting = Collector {
            module: &snapshot,
            modules: &modules,
            aliases: &Aliases::new(),
            found: Vec::new(),
        };
        let mut aliases = Aliases::new();
        for (p, name) in names {
            let to = reexporting.resolve(&p).expect("a child module");
            aliases.insert((snapshot.clone(), name), to);
        }
        let sandbox = path("sandbox");
        let user = Collector {
            module: &sandbox,
            modules: &modules,
            aliases: &aliases,
            found: Vec::new(),
        };
        let segments = |p: &str| -> Vec<String> { p.split("::").map(String::from).collect() };
        for reached in ["crate::snapshot::LocalOptions", "super::snapshot::Local"] {
            assert_eq!(
                user.resolve(&segments(reached)),
                Some(path("snapshot::local")),
                "{reached}"
            );
        }
        assert_eq!(
            user.resolve(&segments("crate::snapshot::SandboxSnapshot")),
            Some(snapshot)
        );
    }

    #[test]
    fn the_core_depending_on_a_kind_crate_is_found() {
        let root = std::env::temp_dir().join(format!("berth-layering-{}", std::process::id()));
        std::fs::create_dir_all(root.join("host")).expect("a scratch directory");
        let manifest = |deps: &str| {
            std::fs::write(
                root.join("host/Cargo.toml"),
                format!("[package]\nname = \"berth\"\n[dependencies]\n{deps}\n[dev-dependencies]\nberth-docker = {{ path = \"docker\" }}\n"),
            )
            .expect("writing the manifest");
            core_kind_dependencies(&root).expect("a readable manifest")
        };
        assert!(manifest("tokio = \"1\"").is_empty());
        assert_eq!(
            manifest("berth-docker = { path = \"docker\" }"),
            ["berth-docker"]
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_workspace_honours_the_layering_rule() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."));
        if let Err(e) = check(root) {
            panic!("{e}");
        }
    }
}
