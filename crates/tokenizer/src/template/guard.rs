//! What a template may store in a namespace.
//!
//! A namespace is the only value a template can change after it is made,
//! and so the only way a template can build a value that grows from one
//! loop step to the next or that holds itself: `{% set ns.x = ns %}` made a
//! cycle, and turning it into text with `ns ~ ''` recursed until the stack
//! overflowed (an abort, which no `catch_unwind` sees); `{% set ns.s = ns.s ~
//! ns.s %}` in a loop doubled a string until memory ran out. minijinja has no
//! hook on an assignment or an operator, so before a template is compiled the
//! right-hand side of every assignment to a namespace attribute is wrapped in
//! a call to [`stored`], which copies the value into plain lists and maps and
//! bounds its depth, items and bytes. A namespace then never holds another
//! namespace (a copy of one is a plain map with its values of that moment),
//! so no cycle can form, and what a loop accumulates in one is bounded.
//! Real chat templates store flags, counters, indices and strings there,
//! which [`stored`] passes through unchanged.

use minijinja::machinery::{self, Token, ast};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

// The bounds on nesting and items are the ones a printed value has.
use super::{MAX_DEPTH, MAX_ITEMS};

/// The name [`stored`] is registered under in the template's environment
/// (as a function and as a filter).
pub(super) const STORED: &str = "__arbor_stored";

/// Bytes of text a stored value may hold, all strings together: far past a
/// conversation that fits any context window, far below the memory of the
/// machines arbor runs on.
pub(super) const MAX_BYTES: usize = 32 << 20;

/// `source` with every assignment to a namespace attribute guarded:
/// `{% set a.b = E %}` becomes `{% set a.b = __arbor_stored((E)) %}` (the
/// double parentheses keep `E1, E2` a tuple), and a block assignment with a
/// filter, `{% set a.b | f %}…{% endset %}`, gets `| __arbor_stored` after
/// its filter (without one it stores the captured text, which is a string).
/// Insertions stay on their line, so errors name the template's own lines.
pub(super) fn guard_namespace_sets(source: &str, syntax: &SyntaxConfig) -> Result<String, Error> {
    let template = machinery::parse(source, super::NAME, syntax.clone())?;
    let mut sites = Vec::new();
    collect(&template, &mut sites);
    if sites.is_empty() {
        return Ok(source.to_owned());
    }
    let tokens: Vec<(Token<'_>, machinery::Span)> =
        machinery::tokenize(source, false, syntax.clone()).collect::<Result<_, _>>()?;
    let mut inserts: Vec<(usize, &str)> = Vec::with_capacity(sites.len() * 2);
    for (start, site) in sites {
        let first = tokens.partition_point(|(_, span)| (span.start_offset as usize) < start);
        let end = (first..tokens.len())
            .find(|&i| matches!(tokens[i].0, Token::BlockEnd))
            .ok_or_else(|| unguardable(start))?;
        // The end of the statement's last token before its `%}`.
        let last = end.checked_sub(1).ok_or_else(|| unguardable(start))?;
        let close = tokens[last].1.end_offset as usize;
        match site {
            Site::Value => {
                let assign = (first..end)
                    .find(|&i| matches!(tokens[i].0, Token::Assign))
                    .filter(|&i| i + 1 < end)
                    .ok_or_else(|| unguardable(start))?;
                let open = tokens[assign + 1].1.start_offset as usize;
                inserts.push((open, "__arbor_stored(("));
                inserts.push((close, "))"));
            }
            Site::Filter => inserts.push((close, " | __arbor_stored")),
        }
    }
    // Offsets are byte positions of token boundaries, so char boundaries.
    inserts.sort_by_key(|&(at, _)| at);
    let extra: usize = inserts.iter().map(|(_, s)| s.len()).sum();
    let mut out = String::with_capacity(source.len() + extra);
    let mut from = 0;
    for (at, text) in inserts {
        out.push_str(source.get(from..at).ok_or_else(|| unguardable(at))?);
        out.push_str(text);
        from = at;
    }
    out.push_str(&source[from..]);
    Ok(out)
}

fn unguardable(offset: usize) -> Error {
    Error::new(
        ErrorKind::SyntaxError,
        format!("cannot read the namespace assignment at byte {offset}"),
    )
}

/// Where a guard goes in an assignment statement.
#[derive(Debug, Clone, Copy)]
enum Site {
    /// `{% set a.b = E %}`: around `E`.
    Value,
    /// `{% set a.b | f %}…{% endset %}`: after the filter chain.
    Filter,
}

/// The start offsets of the statements that assign to a namespace
/// attribute, in every body (loops, conditions, macros, blocks, ...).
fn collect(stmt: &ast::Stmt<'_>, out: &mut Vec<(usize, Site)>) {
    let all = |body: &[ast::Stmt<'_>], out: &mut Vec<(usize, Site)>| {
        body.iter().for_each(|s| collect(s, out));
    };
    match stmt {
        ast::Stmt::Template(t) => all(&t.children, out),
        ast::Stmt::ForLoop(f) => {
            all(&f.body, out);
            all(&f.else_body, out);
        }
        ast::Stmt::IfCond(i) => {
            all(&i.true_body, out);
            all(&i.false_body, out);
        }
        ast::Stmt::WithBlock(w) => all(&w.body, out),
        ast::Stmt::Set(s) => {
            if dotted(&s.target) {
                out.push((s.span().start_offset as usize, Site::Value));
            }
        }
        ast::Stmt::SetBlock(s) => {
            if dotted(&s.target) && s.filter.is_some() {
                out.push((s.span().start_offset as usize, Site::Filter));
            }
            all(&s.body, out);
        }
        ast::Stmt::AutoEscape(a) => all(&a.body, out),
        ast::Stmt::FilterBlock(f) => all(&f.body, out),
        ast::Stmt::Block(b) => all(&b.body, out),
        ast::Stmt::Macro(m) => all(&m.body, out),
        ast::Stmt::CallBlock(c) => all(&c.macro_decl.body, out),
        ast::Stmt::EmitExpr(_)
        | ast::Stmt::EmitRaw(_)
        | ast::Stmt::Import(_)
        | ast::Stmt::FromImport(_)
        | ast::Stmt::Extends(_)
        | ast::Stmt::Include(_)
        | ast::Stmt::Continue(_)
        | ast::Stmt::Break(_)
        | ast::Stmt::Do(_) => {}
    }
}

/// Whether an assignment target names a namespace attribute (`a.b`, or one
/// inside a tuple: `a.b, c`).
fn dotted(target: &ast::Expr<'_>) -> bool {
    match target {
        ast::Expr::GetAttr(_) => true,
        ast::Expr::List(l) => l.items.iter().any(dotted),
        _ => false,
    }
}

/// `__arbor_stored(value)`: `value` as a template may store it in a
/// namespace: lists, maps (a namespace among them) and iterables copied into
/// plain lists and maps, anything else as it is; refused when nested over
/// [`MAX_DEPTH`] deep or holding over [`MAX_ITEMS`] items or [`MAX_BYTES`]
/// bytes of text.
pub(super) fn stored(value: &Value) -> Result<Value, Error> {
    let mut spent = Spent::default();
    copy(value, 0, &mut spent)
}

#[derive(Default)]
struct Spent {
    items: usize,
    bytes: usize,
}

fn refuse(what: String) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("a namespace may not store {what}"),
    )
}

fn copy(v: &Value, depth: usize, spent: &mut Spent) -> Result<Value, Error> {
    let kind = v.kind();
    if matches!(kind, ValueKind::String | ValueKind::Bytes) {
        let len = v
            .as_str()
            .map_or_else(|| v.as_bytes().map_or(0, <[u8]>::len), str::len);
        spent.bytes = spent.bytes.saturating_add(len);
        if spent.bytes > MAX_BYTES {
            return Err(refuse(format!("over {MAX_BYTES} bytes of text")));
        }
        return Ok(v.clone());
    }
    if !matches!(kind, ValueKind::Seq | ValueKind::Map | ValueKind::Iterable) {
        return Ok(v.clone());
    }
    if depth >= MAX_DEPTH {
        return Err(refuse(format!("a value nested over {MAX_DEPTH} deep")));
    }
    let mut count = || {
        spent.items += 1;
        if spent.items > MAX_ITEMS {
            Err(refuse(format!("a value of over {MAX_ITEMS} items")))
        } else {
            Ok(())
        }
    };
    let items = v.try_iter()?;
    if kind == ValueKind::Map {
        let mut pairs = Vec::new();
        for key in items {
            count()?;
            let inner = v.get_item(&key)?;
            pairs.push((key, inner));
        }
        let mut out = Vec::with_capacity(pairs.len());
        for (key, inner) in pairs {
            out.push((
                copy(&key, depth + 1, spent)?,
                copy(&inner, depth + 1, spent)?,
            ));
        }
        return Ok(Value::from_pairs(out));
    }
    let mut list = Vec::new();
    for item in items {
        count()?;
        list.push(item);
    }
    let copied = list
        .iter()
        .map(|item| copy(item, depth + 1, spent))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::from(copied))
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
