//! `cargo xtask imports`: the edges between the files of each crate — file
//! A names something of file B through `crate::…`, `super::…`, or a child
//! module's name — and a failure where two files name each other. A crate's
//! root (`lib.rs`, `main.rs`) declares modules and re-exports; edges to and
//! from it are not counted, nor are edges between a module and the modules
//! declared inside it (a parent file and its children read as one unit).
//! Test modules (from a file's first `#[cfg(test)]` on) are skipped. A
//! text scan, not a compiler pass: it reads paths as written, which is
//! what a reader follows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`["bench", "peer"]`) of each source file of a crate.
type Modules = BTreeMap<Vec<String>, PathBuf>;
/// `(from, to)`: the file `from` names something of the file `to`.
type Edges = BTreeSet<(Vec<String>, Vec<String>)>;

/// Prints every crate's edges (when `verbose`) and returns an error naming
/// the pairs that go both ways.
pub fn check(root: &Path, verbose: bool) -> Result<(), String> {
    let mut circles = Vec::new();
    for src in crate_sources(root)? {
        let modules = modules_of(&src)?;
        let edges = edges_of(&modules)?;
        let name = src
            .parent()
            .unwrap_or(&src)
            .strip_prefix(root)
            .unwrap_or(&src);
        if verbose {
            println!(
                "{} ({} files, {} edges)",
                name.display(),
                modules.len(),
                edges.len()
            );
            for (from, to) in &edges {
                println!("  {} -> {}", from.join("::"), to.join("::"));
            }
        }
        for (from, to) in &edges {
            if from < to && edges.contains(&(to.clone(), from.clone())) {
                circles.push(format!(
                    "{}: {} <-> {}",
                    name.display(),
                    from.join("::"),
                    to.join("::")
                ));
            }
        }
    }
    match circles.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "files that name each other (an import circle):\n  {}",
            circles.join("\n  ")
        )),
    }
}

/// `src/` of every crate: `crates/*`, `backends/*`, `xtask`.
fn crate_sources(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for group in ["crates", "backends"] {
        let dir = root.join(group);
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries.flatten() {
            if e.path().join("src").is_dir() {
                out.push(e.path().join("src"));
            }
        }
    }
    out.push(root.join("xtask/src"));
    out.sort();
    Ok(out)
}

fn modules_of(src: &Path) -> Result<Modules, String> {
    let mut out = Modules::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap_or(&path);
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            // `src/bin/x.rs` and the like are roots of their own; only the
            // library or binary tree under `src/` is one crate.
            if parts == ["lib"] || parts == ["main"] {
                parts.clear();
            }
            if parts.first().is_some_and(|p| p == "bin") {
                continue;
            }
            out.insert(parts, path);
        }
    }
    Ok(out)
}

/// Directed edges between non-root modules.
fn edges_of(modules: &Modules) -> Result<Edges, String> {
    let mut edges = BTreeSet::new();
    for (module, path) in modules {
        if module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let code = code_of(&text);
        for target in references(module, &code, modules) {
            // A module and the modules declared inside it read as one
            // unit (a child sees its parent's items; the parent declares
            // and re-exports the child): only edges across units count.
            let nested = target.starts_with(module) || module.starts_with(&target);
            if !target.is_empty() && !nested {
                edges.insert((module.clone(), target));
            }
        }
    }
    Ok(edges)
}

/// The text before the first test module, without line comments.
fn code_of(text: &str) -> String {
    let end = text.find("#[cfg(test)]").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules (files) that `module`'s code names.
fn references(module: &[String], code: &str, modules: &Modules) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let children: Vec<&Vec<String>> = modules
        .keys()
        .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
        .collect();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let at_word = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        if !at_word || !is_ident(bytes[i]) {
            i += 1;
            continue;
        }
        let path = path_at(&code[i..]);
        // Up to the end of the path's last segment.
        let advance = path.iter().map(|p| p.len()).sum::<usize>() + 2 * (path.len().max(1) - 1);
        if let Some(first) = path.first() {
            let absolute: Option<Vec<String>> = match first.as_str() {
                "crate" | "super" => anchored(module, &path),
                name if path.len() > 1 => children
                    .iter()
                    .find(|c| c.last().is_some_and(|l| l == name))
                    .map(|_| module.iter().chain(&path).cloned().collect()),
                _ => None,
            };
            out.extend(absolute.and_then(|abs| file_of(&abs, modules)));
            // `use super::{a, b}` and `use crate::{x::Y, z}` name several.
            if (first == "crate" || first == "super") && code[i + advance..].starts_with("::{") {
                let base = anchored(module, &path).unwrap_or_default();
                let open = i + advance + 3;
                let close = code[open..].find('}').map_or(code.len(), |c| open + c);
                for item in code[open..close].split(',') {
                    let inner = path_at(
                        item.trim_start_matches(|c: char| !c.is_alphanumeric() && c != '_'),
                    );
                    if inner.is_empty() {
                        continue;
                    }
                    let abs: Vec<String> = base.iter().chain(&inner).cloned().collect();
                    out.extend(file_of(&abs, modules));
                }
            }
        }
        i += advance.max(1);
    }
    out
}

/// The module path a `crate::…` or `super::…` path written in `module`
/// names (`None`: more `super`s than parents).
fn anchored(module: &[String], path: &[String]) -> Option<Vec<String>> {
    if path.first().is_some_and(|p| p == "crate") {
        return Some(path[1..].to_vec());
    }
    let supers = path.iter().take_while(|p| *p == "super").count();
    let base = module.len().checked_sub(supers)?;
    Some(
        module[..base]
            .iter()
            .chain(&path[supers..])
            .cloned()
            .collect(),
    )
}

/// The file holding `path`: its longest prefix that is a module file.
fn file_of(path: &[String], modules: &Modules) -> Option<Vec<String>> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains_key(p))
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The `a::b::c` path starting at `s` (its identifier segments).
fn path_at(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        let n = rest.bytes().take_while(|b| is_ident(*b)).count();
        if n == 0 {
            break;
        }
        out.push(rest[..n].to_string());
        rest = &rest[n..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}
