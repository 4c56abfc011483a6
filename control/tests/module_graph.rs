//! The control crate's modules import one another one way: shared vocabulary (problems,
//! updates, status, the store's changes, the translation's output) lives in modules of its own
//! that act on nothing, so no module needs to import back from one that imports it.
//!
//! This test reads the module graph from the sources (`crate::`, `super::` and `self::` paths,
//! and a module's `use` of its own children) and fails on any circle, naming the files and the
//! paths that tie them. Test modules (`#[cfg(test)]`) may reach anywhere and are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`["translate", "builder"]`), its file and its text
/// without test modules and comments.
struct Module {
    path: Vec<String>,
    file: PathBuf,
    code: String,
    /// Child modules declared in it (not those under `#[cfg(test)]`).
    children: BTreeSet<String>,
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// The text of a file without comments, string literals' contents and `#[cfg(test)]` items.
fn strip(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            // Skip the item that follows: a `mod x;` line, or a block to its closing brace.
            let mut depth = 0i32;
            let mut opened = false;
            for l in lines.by_ref() {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if (opened && depth <= 0) || (!opened && l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn child_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let t = line.trim();
        let t = t
            .strip_prefix("pub(crate) ")
            .or_else(|| t.strip_prefix("pub "))
            .unwrap_or(t);
        if let Some(rest) = t.strip_prefix("mod ") {
            let name = rest.trim_end_matches(';').trim();
            if rest.trim_end().ends_with(';') && is_ident(name) {
                out.insert(name.to_string());
            }
        }
    }
    out
}

fn load(dir: &Path, root: &Path, out: &mut Vec<Module>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            load(&p, root, out);
            continue;
        }
        if p.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let rel = p.strip_prefix(root).unwrap();
        let mut path: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if matches!(path.last().map(String::as_str), Some("mod") | Some("lib")) {
            path.pop();
        }
        let code = strip(&fs::read_to_string(&p).unwrap());
        out.push(Module {
            path,
            file: rel.to_path_buf(),
            children: child_modules(&code),
            code,
        });
    }
}

/// Every path written in `code` that starts with `crate::`, `super::` or `self::`, and every
/// `use` of a child module, as absolute module paths (`use a::{b, c::d}` gives both).
fn paths(m: &Module) -> Vec<Vec<String>> {
    let code = &m.code;
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let starts = ["crate::", "super::", "self::"];
    let mut i = 0;
    while i < code.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let prev_ok = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        let hit = prev_ok && starts.iter().any(|s| code[i..].starts_with(s));
        let use_child = prev_ok
            && code[..i].trim_end().ends_with("use")
            && m.children
                .iter()
                .any(|c| code[i..].starts_with(&format!("{c}::")));
        if hit || use_child {
            let (tree, len) = path_tree(&code[i..]);
            for p in tree {
                out.push(absolute(&m.path, &p));
            }
            i += len.max(1);
        } else {
            i += 1;
        }
    }
    out
}

/// The paths of one use tree at the start of `s` (`a::b::{c, d::e}`), and its length.
fn path_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = 0;
    let b = s.as_bytes();
    loop {
        let start = i;
        while i < s.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start {
            prefix.push(s[start..i].to_string());
        }
        if s[i..].starts_with("::{") {
            i += 3;
            let mut out = Vec::new();
            loop {
                while i < s.len() && (b[i] == b' ' || b[i] == b'\n' || b[i] == b',') {
                    i += 1;
                }
                if i >= s.len() || b[i] == b'}' {
                    return (out, i + 1);
                }
                let (sub, len) = path_tree(&s[i..]);
                for p in sub {
                    let mut full = prefix.clone();
                    full.extend(p);
                    out.push(full);
                }
                i += len.max(1);
            }
        }
        if s[i..].starts_with("::") {
            i += 2;
            continue;
        }
        return (vec![prefix], i);
    }
}

fn absolute(here: &[String], p: &[String]) -> Vec<String> {
    let mut base: Vec<String> = here.to_vec();
    let mut rest = p;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
    }
    base.extend(rest.iter().cloned());
    base
}

#[test]
fn control_modules_have_no_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = Vec::new();
    load(&root, &root, &mut modules);
    // Modules mounted only for tests are left out.
    let test_only: BTreeSet<Vec<String>> = modules
        .iter()
        .flat_map(|m| {
            let raw = fs::read_to_string(root.join(&m.file)).unwrap();
            let lines: Vec<&str> = raw.lines().map(str::trim).collect();
            lines
                .windows(2)
                .filter(|w| {
                    w[0] == "#[cfg(test)]" && w[1].starts_with("mod ") && w[1].ends_with(';')
                })
                .map(|w| {
                    let mut p = m.path.clone();
                    p.push(w[1]["mod ".len()..w[1].len() - 1].trim().to_string());
                    p
                })
                .collect::<Vec<_>>()
        })
        .collect();
    modules.retain(|m| !test_only.contains(&m.path));
    let index: BTreeMap<Vec<String>, usize> = modules
        .iter()
        .enumerate()
        .map(|(i, m)| (m.path.clone(), i))
        .collect();

    // Edges allowed to close a loop, each with its reason (none today); an entry that no longer
    // ties anything fails the test, so the list only shrinks.
    const ALLOWED: &[(&str, &str, &str)] = &[];
    let allowed = |a: &Module, b: &Module| {
        ALLOWED
            .iter()
            .any(|(from, to, _)| a.file == Path::new(from) && b.file == Path::new(to))
    };
    let mut allowed_seen = BTreeSet::new();

    // edges[a][b]: the paths by which module a uses module b.
    let mut edges: Vec<BTreeMap<usize, BTreeSet<String>>> = vec![BTreeMap::new(); modules.len()];
    for (a, m) in modules.iter().enumerate() {
        for p in paths(m) {
            // The longest prefix that is a module of the crate.
            let Some(b) = (0..=p.len())
                .rev()
                .find_map(|n| index.get(&p[..n]).copied())
            else {
                continue;
            };
            // A module's own items, and its ancestors' `mod` lines, are no dependency; a
            // path into an ancestor is (it reaches up).
            if allowed(&modules[a], &modules[b]) {
                allowed_seen.insert((modules[a].file.clone(), modules[b].file.clone()));
                continue;
            }
            if b != a && !modules[b].path.is_empty() {
                edges[a].entry(b).or_default().insert(p.join("::"));
            }
        }
    }

    // Tarjan's strongly connected components.
    struct Tarjan<'a> {
        edges: &'a [BTreeMap<usize, BTreeSet<String>>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        sccs: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            let next: Vec<usize> = self.edges[v].keys().copied().collect();
            for w in next {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.sccs.push(scc);
                }
            }
        }
    }
    let n = modules.len();
    let mut t = Tarjan {
        edges: &edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }

    let mut report = String::new();
    for scc in &t.sccs {
        let set: BTreeSet<usize> = scc.iter().copied().collect();
        report.push_str("circle:\n");
        for &a in &set {
            for (b, via) in &edges[a] {
                if set.contains(b) {
                    report.push_str(&format!(
                        "  {} -> {}: {}\n",
                        modules[a].file.display(),
                        modules[*b].file.display(),
                        via.iter().cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(
        report.is_empty(),
        "control/src has import circles; move the shared names into a module of their own that \
         imports neither side:\n{report}"
    );
    for (from, to, why) in ALLOWED {
        assert!(
            allowed_seen.contains(&(PathBuf::from(from), PathBuf::from(to))),
            "{from} no longer uses {to} ({why}): remove the allowance"
        );
    }
    // The reader itself sees the graph (a parser that found nothing would pass any tree).
    assert!(n > 20, "only {n} modules read under {}", root.display());
    assert!(
        edges.iter().map(BTreeMap::len).sum::<usize>() > 40,
        "too few imports read"
    );
}
