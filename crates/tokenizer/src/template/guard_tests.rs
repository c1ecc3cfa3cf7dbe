//! The namespace guard: what it rewrites, what it leaves, what it refuses.

use minijinja::syntax::SyntaxConfig;

use super::guard_namespace_sets;
use crate::ChatMessage;
use crate::chat::ChatFormat;
use crate::template::TemplateTokens;
use crate::template::fuzz::refused;

fn rewrite(source: &str) -> String {
    guard_namespace_sets(source, &SyntaxConfig::default()).expect("parses")
}

/// `template` rendered for two messages.
fn render(template: &str) -> crate::Result<String> {
    ChatFormat::detect(Some(template), false, TemplateTokens::default()).render(
        &[ChatMessage::user("hi"), ChatMessage::assistant("hello")],
        &[],
    )
}

#[test]
fn only_namespace_assignments_are_rewritten() {
    assert_eq!(
        rewrite("{% set ns.x = dict(a=1) %}{% set y = ns %}{{ '%}' }}"),
        "{% set ns.x = __arbor_stored((dict(a=1))) %}{% set y = ns %}{{ '%}' }}"
    );
    assert_eq!(
        rewrite("{%- set ns.a, b = ns, 1 -%}\n{% raw %}{% set ns.x = ns %}{% endraw %}"),
        "{%- set ns.a, b = __arbor_stored((ns, 1)) -%}\n{% raw %}{% set ns.x = ns %}{% endraw %}"
    );
    assert_eq!(
        rewrite("{% for m in x %}{% macro f() %}{% set ns.x = [m] %}{% endmacro %}{% endfor %}"),
        "{% for m in x %}{% macro f() %}{% set ns.x = __arbor_stored(([m])) %}{% endmacro %}{% endfor %}"
    );
    assert_eq!(
        rewrite("{% set ns.t | trim %} a {% endset %}{% set ns.u %}b{% endset %}"),
        "{% set ns.t | trim | __arbor_stored %} a {% endset %}{% set ns.u %}b{% endset %}"
    );
    let plain = "{% set x = 1 %}{{ x }}";
    assert_eq!(rewrite(plain), plain);
}

/// What chat templates keep in a namespace (counters, flags, strings,
/// lists, tuples, captured blocks) works as before.
#[test]
fn real_assignments_store_what_they_did() {
    let template = "{% set ns = namespace(n=0, s='', roles=[], flag=false) %}\
        {% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.content %}\
        {% set ns.roles = ns.roles + [m.role] %}{% endfor %}\
        {% set ns.a, ns.b = 1, 2 %}{%- set ns.flag = true -%}\
        {% set ns.d | upper %}text{% endset %}{% set ns.m = messages[0] %}\
        {{ ns.n }} {{ ns.s }} {{ ns.roles|join(',') }} {{ ns.a }}{{ ns.b }} {{ ns.flag }} {{ ns.d }} {{ ns.m.content }}";
    assert_eq!(
        render(template).unwrap(),
        "2 hihello user,assistant 12 True TEXT hi"
    );
}

/// Found by the fuzzer: `{% set ns.x = ns %}` put a namespace inside
/// itself and `ns ~ ''` recursed until the stack overflowed. A namespace
/// now stores a plain copy, so no namespace holds one, directly or through
/// a list or another namespace.
#[test]
fn a_namespace_stores_a_copy_not_itself() {
    let out = render("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns ~ '' }}").unwrap();
    assert_eq!(out, "{'x': {'x': 1}}");
    let out =
        render("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ (ns ~ '')|length > 0 }}");
    assert_eq!(out.unwrap(), "True");
    let two = "{% set a = namespace(x=1) %}{% set b = namespace(x=2) %}\
        {% set a.x = b %}{% set b.x = a %}{{ a ~ b }}";
    assert_eq!(
        render(two).unwrap(),
        "{'x': {'x': 2}}{'x': {'x': {'x': 2}}}"
    );
}

#[test]
fn a_loop_that_doubles_a_stored_string_is_refused() {
    refused(
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "bytes of text",
    );
}

#[test]
fn a_stored_value_nested_without_end_is_refused() {
    refused(
        "{% set ns = namespace(l=[]) %}{% for i in range(100) %}{% set ns.l = [ns.l] %}{% endfor %}",
        "nested over 64",
    );
    refused(
        "{% set ns = namespace(l=0) %}{% for i in range(100) %}{% set ns.l = namespace(x=ns.l) %}{% endfor %}",
        "nested over 64",
    );
}
