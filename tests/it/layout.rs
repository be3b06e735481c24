//! The module map of `src/` is layered: no import cycle.
//!
//! The check reads every file under `src/` (the library; `main.rs` is the
//! binary, which names the library as `autoapproval::`) and collects the
//! paths it names through `crate::`, `super::` and `self::`, including
//! `use` groups, outside `#[cfg(test)]` items. Each path is taken to the
//! module it lands in (a file, or an inline `mod x { … }`; an item's path to
//! the module that holds or re-exports it).
//!
//! The unit is a module among its siblings, at every level: the crate's
//! top-level modules (`controller`, `coordination`, `db`, …) must not
//! import each other in a circle, counting every file beneath each; nor
//! must the files of one directory module (`controller::config`,
//! `controller::discovery`, …). A module and its own children are one room:
//! a `mod.rs` that re-exports its children and children that use their
//! parent's shared items are not a cycle.
//!
//! When it fails it names the circle and, for each step, a file and line
//! that makes it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

#[test]
fn the_modules_of_src_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = cycles_in(&src);
    assert!(
        cycles.is_empty(),
        "import cycles in src/ (move the shared piece below both, or pass it in):\n{}",
        cycles.join("\n")
    );
}

/// A module's path below the crate root: `[]` is the root.
type ModulePath = Vec<String>;

/// One path a module names, and where.
struct Reference {
    from: ModulePath,
    to: ModulePath,
    at: String,
}

/// Every cycle among siblings, one line per cycle and one per step.
fn cycles_in(src: &Path) -> Vec<String> {
    let mut known = BTreeSet::new();
    let mut references = Vec::new();
    for (module, file) in files(src, src) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let shown = file
            .strip_prefix(src.parent().expect("src has a parent"))
            .unwrap_or(&file);
        known.insert(module.clone());
        scan(
            &module,
            &code_only(&text),
            &shown.display().to_string(),
            &mut known,
            &mut references,
        );
    }
    // Edges among the children of each level: (level, from, to) -> where.
    let mut levels: BTreeMap<ModulePath, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for reference in &references {
        let to = landing(&known, &reference.to);
        let from = &reference.from;
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue; // a module and its own descendants or ancestors
        }
        levels
            .entry(from[..common].to_vec())
            .or_default()
            .entry(from[common].clone())
            .or_default()
            .entry(to[common].clone())
            .or_insert_with(|| reference.at.clone());
    }
    let mut found = Vec::new();
    for (level, graph) in &levels {
        let name = if level.is_empty() {
            "crate".to_owned()
        } else {
            format!("crate::{}", level.join("::"))
        };
        for (group, cycle) in circles(graph) {
            found.push(format!(
                "{name}: {} reach each other, e.g. {}",
                group.join(", "),
                cycle.join(" -> ")
            ));
            for step in cycle.windows(2) {
                found.push(format!(
                    "    {} -> {}: {}",
                    step[0], step[1], graph[&step[0]][&step[1]]
                ));
            }
        }
    }
    found
}

/// The `.rs` files under `dir` and the module each one is.
fn files(src: &Path, dir: &Path) -> Vec<(ModulePath, std::path::PathBuf)> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(files(src, &path));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || path == src.join("main.rs") {
            continue;
        }
        let relative = path
            .strip_prefix(src)
            .expect("under src")
            .with_extension("");
        let mut module: ModulePath = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module
            .last()
            .is_some_and(|last| last == "mod" || last == "lib")
        {
            module.pop();
        }
        found.push((module, path));
    }
    found
}

/// The deepest known module on `path`: where the item it names lives or
/// is re-exported.
fn landing(known: &BTreeSet<ModulePath>, path: &[String]) -> ModulePath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| known.contains(prefix))
        .unwrap_or_default()
}

/// The source with comments, strings and character literals blanked out
/// (newlines kept, so lines still count).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && matches!(next, Some('"' | '#')) && (i == 0 || !is_ident(chars[i - 1]))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(chars[i..j.min(chars.len())].iter().map(|&c| blank(c)));
            i = j;
        } else if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime.
            let close = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else {
                (chars.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match close {
                Some(end) => {
                    out.extend(std::iter::repeat_n(' ', end + 1 - i));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens: identifiers, `::`, and single punctuation characters, each with
/// its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            found.push((chars[start..i].iter().collect(), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            found.push(("::".to_owned(), line));
            i += 2;
        } else {
            found.push((c.to_string(), line));
            i += 1;
        }
    }
    found
}

/// Records the inline modules of `module`'s file in `known` and the paths
/// it names in `references`.
fn scan(
    module: &ModulePath,
    code: &str,
    file: &str,
    known: &mut BTreeSet<ModulePath>,
    references: &mut Vec<Reference>,
) {
    let tokens = tokens(code);
    let text = |i: usize| tokens.get(i).map_or("", |(t, _)| t.as_str());
    // Inline modules open at a brace depth: (module, depth inside it).
    let mut inline: Vec<(ModulePath, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        let here = inline.last().map_or(module, |(m, _)| m).clone();
        match text(i) {
            "#" if text(i + 1) == "["
                && text(i + 2) == "cfg"
                && text(i + 3) == "("
                && text(i + 4) == "test"
                && text(i + 5) == ")" =>
            {
                i = item_end(&tokens, i + 7);
                continue;
            }
            "mod" if text(i + 2) == "{" => {
                let mut inner = here.clone();
                inner.push(text(i + 1).to_owned());
                known.insert(inner.clone());
                depth += 1;
                inline.push((inner, depth));
                i += 3;
                continue;
            }
            "{" => depth += 1,
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            start @ ("crate" | "super" | "self")
                if text(i + 1) == "::" && !matches!(text(i.wrapping_sub(1)), "$" | "::") =>
            {
                let mut base = match start {
                    "crate" => Vec::new(),
                    "super" => here[..here.len().saturating_sub(1)].to_vec(),
                    _ => here.clone(),
                };
                let mut j = i + 2;
                while text(j) == "super" && text(j + 1) == "::" {
                    base.pop();
                    j += 2;
                }
                let line = tokens[i].1;
                let mut paths = Vec::new();
                let end = path_tree(&tokens, j, base, &mut paths);
                for to in paths {
                    references.push(Reference {
                        from: here.clone(),
                        at: format!("{file}:{line} crate::{}", to.join("::")),
                        to,
                    });
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// The index after the item that starts at `i`: its `;`, or its `{ … }`.
fn item_end(tokens: &[(String, usize)], mut i: usize) -> usize {
    let mut depth = 0;
    while i < tokens.len() {
        match tokens[i].0.as_str() {
            ";" if depth == 0 => return i + 1,
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads the path (tree) at `i` that continues `base`, pushing every
/// full path it names; returns the index after it.
fn path_tree(
    tokens: &[(String, usize)],
    mut i: usize,
    mut base: ModulePath,
    paths: &mut Vec<ModulePath>,
) -> usize {
    let text = |i: usize| tokens.get(i).map_or("", |(t, _)| t.as_str());
    loop {
        match text(i) {
            "{" => {
                i += 1;
                while text(i) != "}" && i < tokens.len() {
                    i = path_tree(tokens, i, base.clone(), paths);
                    if text(i) == "," {
                        i += 1;
                    }
                }
                return i + 1;
            }
            "self" => {
                paths.push(base);
                return i + 1;
            }
            word if word.chars().next().is_some_and(is_ident) => {
                base.push(word.to_owned());
                i += 1;
                if text(i) == "::" {
                    i += 1;
                    continue;
                }
                paths.push(base);
                return i;
            }
            _ => {
                // `*`, or a path that ends on `::<`: what it names so far.
                paths.push(base);
                return i;
            }
        }
    }
}

/// Each group of modules that reach each other, with one shortest circle
/// through its first.
fn circles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<(Vec<String>, Vec<String>)> {
    let reach = |from: &String, to: &String| -> Option<Vec<String>> {
        // Breadth first from `from`'s successors back to `to`.
        let mut previous: BTreeMap<&String, &String> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        while let Some(node) = queue.pop_front() {
            for next in graph.get(node).into_iter().flat_map(|n| n.keys()) {
                if previous.contains_key(next) {
                    continue;
                }
                previous.insert(next, node);
                if next == to {
                    let mut path = vec![to.clone()];
                    let mut at = to;
                    loop {
                        at = previous[at];
                        path.push(at.clone());
                        if at == from {
                            break;
                        }
                    }
                    path.reverse();
                    return Some(path);
                }
                queue.push_back(next);
            }
        }
        None
    };
    let mut covered = BTreeSet::new();
    let mut found = Vec::new();
    for node in graph.keys() {
        if covered.contains(node) {
            continue;
        }
        if let Some(cycle) = reach(node, node) {
            let group: Vec<String> = graph
                .keys()
                .filter(|other| {
                    *other == node || (reach(node, other).is_some() && reach(other, node).is_some())
                })
                .cloned()
                .collect();
            covered.extend(group.iter().cloned());
            found.push((group, cycle));
        }
    }
    found
}
