//! The chat-template renderer fuzzed: a template (from a model file, so
//! untrusted) compiled the way a tokenizer loads it — ChatML fallback
//! included — and rendered with a conversation. Inputs are the committed
//! seeds (`fuzz/seeds/chat_template`: real templates with conversations),
//! every input that ever failed (`fuzz/regressions/chat_template`),
//! templates generated from a small Jinja grammar, and byte-level
//! mutations of all of these. No input may panic, and every failure is a
//! typed chat-template error.
//!
//! An input is NUL-separated: the template, the BOS text, the EOS text,
//! flags (`b`: encode adds BOS; `c`: the vocabulary has ChatML tokens),
//! then role and content of each message.

use arbor_fuzz::{Fuzzer, Rng, outcome, repo_path};

use super::TemplateTokens;
use crate::chat::ChatFormat;
use crate::{ChatMessage, Role, TokenizerError};

/// An input, split into what the renderer takes.
struct Case {
    template: String,
    tokens: TemplateTokens,
    chatml: bool,
    messages: Vec<ChatMessage>,
}

fn split(input: &[u8]) -> Case {
    let text = String::from_utf8_lossy(input);
    let mut parts = text.split('\0');
    let template = parts.next().unwrap_or_default().to_string();
    let bos = parts.next().unwrap_or_default().to_string();
    let eos = parts.next().unwrap_or_default().to_string();
    let flags = parts.next().unwrap_or_default();
    let add_bos = flags.contains('b');
    let chatml = flags.contains('c');
    let mut messages = Vec::new();
    while let (Some(role), content) = (parts.next(), parts.next()) {
        let role = match role {
            "system" => Role::System,
            "assistant" => Role::Assistant,
            "user" => Role::User,
            other => [Role::System, Role::User, Role::Assistant][other.len() % 3],
        };
        messages.push(ChatMessage::new(role, content.unwrap_or_default()));
    }
    Case {
        template,
        tokens: TemplateTokens { bos, eos, add_bos },
        chatml,
        messages,
    }
}

/// What a case rendered to, as an outcome.
fn check(input: &[u8]) -> u64 {
    let case = split(input);
    let bos = case.tokens.bos.clone();
    let drops_bos = case.tokens.add_bos && !bos.is_empty();
    let keeps_bos = TemplateTokens {
        add_bos: false,
        ..case.tokens.clone()
    };
    let format = ChatFormat::detect(Some(&case.template), case.chatml, case.tokens);
    let kind = match &format {
        ChatFormat::Template(_) => "template",
        ChatFormat::ChatMl { .. } => "chatml",
        ChatFormat::Missing => "missing",
        ChatFormat::Broken(_) => "broken",
    };
    match format.render(&case.messages, &[]) {
        Ok(prompt) => {
            if let ChatFormat::ChatMl { .. } = format {
                assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
            }
            // When encode adds BOS, a template's prompt is its output less
            // one leading BOS (compared only where the output cannot depend
            // on the time of day).
            if kind == "template" && drops_bos && !case.template.contains("strftime") {
                let whole = ChatFormat::detect(Some(&case.template), case.chatml, keeps_bos)
                    .render(&case.messages, &[])
                    .expect("rendered once already");
                assert_eq!(prompt, whole.strip_prefix(bos.as_str()).unwrap_or(&whole));
            }
            // The prompt's length is left out where it depends on the date.
            let len = match case.template.contains("strftime") {
                true => 0,
                false => prompt.len().min(64) / 8 + 1,
            };
            outcome((kind, len, case.messages.len().min(4)))
        }
        Err(e) => {
            let class = match e {
                TokenizerError::ChatTemplate(msg) => {
                    msg.split([':', '(']).next().unwrap_or_default().to_string()
                }
                TokenizerError::ChatTemplateRejected(_) => "rejected".into(),
                other => panic!("a render failed with a non-template error: {other:?}"),
            };
            outcome((kind, class))
        }
    }
}

#[test]
fn fuzz_chat_template() {
    let report = Fuzzer::new("chat_template")
        .seeds_from(repo_path("fuzz/seeds/chat_template"))
        .regressions_from(repo_path("fuzz/regressions/chat_template"))
        .dictionary(DICTIONARY)
        .max_len(16 << 10)
        .execs(1000)
        .generator(generate)
        .run(check);
    assert!(report.outcomes > 20, "{report}");
}

// ---- regressions ------------------------------------------------------------

/// The committed regression input `name`, replayed through [`check`].
fn replay(name: &str) -> Vec<u8> {
    let input = std::fs::read(repo_path(&format!("fuzz/regressions/chat_template/{name}")))
        .expect("the regression input");
    check(&input);
    input
}

/// `template` rendered (no BOS, no ChatML tokens) for one user message.
fn render(template: &str) -> crate::Result<String> {
    ChatFormat::detect(Some(template), false, TemplateTokens::default())
        .render(&[ChatMessage::user("hi")], &[])
}

/// Asserts that `template` fails with a chat-template error saying `why`
/// (also used by the namespace guard's tests).
pub(super) fn refused(template: &str, why: &str) {
    match render(template) {
        Err(TokenizerError::ChatTemplate(msg)) => assert!(msg.contains(why), "{template}: {msg}"),
        other => panic!("{template}: {other:?}"),
    }
}

/// Found by the fuzzer: `tojson(indent=9223372036854775808)` panicked
/// ("capacity overflow": `indent` spaces were allocated per level). A huge
/// indent is now a template error, and the largest allowed one works.
#[test]
fn tojson_refuses_a_huge_indent() {
    replay("tojson_huge_indent");
    let with_indent = |indent: &str| format!("{{{{ messages[0]|tojson(indent={indent}) }}}}");
    for huge in ["9223372036854775808", "1025"] {
        refused(&with_indent(huge), "indent");
    }
    let wide = render(&with_indent("1024")).unwrap();
    assert!(
        wide.contains(&format!("\n{}\"role\"", " ".repeat(1024))),
        "{wide:?}"
    );
}

/// Found by the fuzzer: two nested `range(100000)` loops (10^10 steps)
/// never returned. A render now runs on fuel and stops with an error.
#[test]
fn a_template_that_loops_for_ever_runs_out_of_fuel() {
    let input = replay("nested_ranges");
    let case = split(&input);
    let format = ChatFormat::detect(Some(&case.template), case.chatml, case.tokens);
    match format.render(&case.messages, &[]) {
        Err(TokenizerError::ChatTemplate(msg)) => assert!(msg.contains("fuel"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

/// Found by the fuzzer: `9223372036854775807 * ('<|im_start|>'|list)`
/// overflowed a length inside minijinja 2.24: a panic where overflow is
/// checked (after which a fuzz thread twice overflowed its stack), a wrap
/// where it is not. minijinja 3 refuses such a repeat, and an engine panic
/// would be the template's error, not the caller's.
#[test]
fn an_engine_overflow_is_not_a_panic() {
    replay("repeat_overflow");
    // minijinja 3 refuses the repeat outright.
    refused(
        "{{ (9223372036854775807 * ('ab'|list))|length }}",
        "too large",
    );
}

/// Found by the fuzzer: `{{ messages * 9223372036854775807 }}` printed a
/// lazily repeated list in one instruction, so fuel never ran out while the
/// output grew until the machine's memory was gone (24 GiB, then the OOM
/// killer). minijinja 3 refuses to repeat a sequence past 10^8 items, a
/// value of over 2^20 items is not printed, and a render writes into a
/// bounded buffer, so a template that prints without end (a big repeat, or
/// a long loop of big strings) fails with a typed error.
#[test]
fn a_template_that_prints_without_end_is_cut_off() {
    replay("repeated_list_printed");
    refused("{{ messages * 9223372036854775807 }}", "too large");
    refused("{{ messages * 50000000 }}", "items");
    refused(
        "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
        "wrote more than",
    );
}

/// Found by the fuzzer (CI's step at 842bee9): `{% set ns.n = ns %}` put a
/// namespace inside itself, and printing it recursed until the test
/// thread's stack overflowed (an abort, not a panic). A namespace now
/// stores a plain copy of what it is given (`guard.rs`), so it never holds
/// itself and every way of printing it ends.
#[test]
fn a_namespace_never_holds_itself() {
    replay("namespace_holds_itself");
    for (print, printed) in [
        ("{{ ns }}", "{'x': {'x': 1}}"),
        ("{{ ns.x }}", "{'x': 1}"),
        ("{{ ns|tojson }}", r#"{"x": {"x": 1}}"#),
        ("{{ [[ns]] }}", "[[{'x': {'x': 1}}]]"),
        ("{{ ns|string }}", "{'x': {'x': 1}}"),
        (
            "{{ ns|pprint }}",
            "{\n    'x': {\n        'x': 1,\n    },\n}",
        ),
        ("{{ [ns]|join }}", "{'x': {'x': 1}}"),
        ("{{ ns ~ '' }}", "{'x': {'x': 1}}"),
    ] {
        let template = format!("{{% set ns = namespace(x=1) %}}{{% set ns.x = ns %}}{print}");
        assert_eq!(render(&template).unwrap(), printed, "{print}");
    }
    // What real templates print still prints.
    let ok = render("{% set ns = namespace(x=[1, {'a': [2]}]) %}{{ ns.x }}{{ messages|tojson }}");
    assert!(ok.is_ok(), "{ok:?}");
    // A value nested past the bound is still refused where it is printed.
    let deep = format!("{{{{ {}1{} }}}}", "[".repeat(70), "]".repeat(70));
    refused(&deep, "nested over 64");
}

/// The fuel is far more than real templates need: Qwen2.5's (the most
/// elaborate of the three) renders 10,000 messages.
#[test]
fn real_templates_render_long_conversations_on_their_fuel() {
    let qwen = include_str!("../../tests/templates/qwen2.5.jinja");
    let messages: Vec<ChatMessage> = (0..10_000)
        .map(|i| match i % 2 {
            0 => ChatMessage::user(format!("question {i}")),
            _ => ChatMessage::assistant(format!("answer {i}")),
        })
        .collect();
    let format = ChatFormat::detect(Some(qwen), true, TemplateTokens::default());
    let prompt = format.render(&messages, &[]).expect("renders");
    assert!(prompt.contains("answer 9999") && prompt.ends_with("<|im_start|>assistant\n"));
}

/// Jinja syntax and the names templates use.
const DICTIONARY: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "\0",
    "messages",
    "message",
    "['role']",
    "['content']",
    ".content",
    "loop.index0",
    "loop.last",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "if ",
    "endif",
    "for ",
    " in ",
    "endfor",
    "set ",
    "macro",
    "endmacro",
    "else",
    "elif ",
    "not ",
    " and ",
    "|tojson",
    "|trim",
    "|length",
    "|upper",
    "|safe",
    "|list",
    ".strip()",
    ".split(",
    ".startswith(",
    "raise_exception(",
    "strftime_now(",
    "namespace(",
    "range(",
    "[::-1]",
    "[1:]",
    "[-1]",
    " ~ ",
    " + ",
    " * ",
    " // ",
    " % ",
    "==",
    "!=",
    "'",
    "\"",
    "(",
    ")",
    "[",
    "]",
    "<|im_start|>",
    "<|im_end|>",
    "\\n",
    "none",
    "true",
    "0",
];

// ---- generation -------------------------------------------------------------

/// A template from a small grammar of what chat templates do, with a
/// conversation.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let mut t = String::new();
    for _ in 0..rng.range(1, 5) {
        statement(rng, &mut t, 0);
    }
    let mut out = t;
    out.push('\0');
    out.push_str(one(rng, &["", "<s>", "<|endoftext|>"]));
    out.push('\0');
    out.push_str(one(rng, &["", "</s>", "<|im_end|>"]));
    out.push('\0');
    out.push_str(one(rng, &["", "b", "c", "bc"]));
    for _ in 0..rng.small(5) {
        out.push('\0');
        out.push_str(one(rng, &["system", "user", "assistant"]));
        out.push('\0');
        out.push_str(&content(rng));
    }
    out.into_bytes()
}

fn content(rng: &mut Rng) -> String {
    let pieces = [
        "hi",
        " ",
        "\n",
        "é",
        "{{ x }}",
        "{% if %}",
        "<|im_start|>",
        "</s>",
        "'",
        "\"",
        "\\",
        "\u{202e}",
        "\u{10ffff}",
    ];
    (0..rng.small(6)).map(|_| one(rng, &pieces)).collect()
}

fn statement(rng: &mut Rng, t: &mut String, depth: usize) {
    let nest = depth < 3;
    match rng.below(if nest { 9 } else { 4 }) {
        0 => t.push_str(one(rng, &["text ", "\n", "<|im_start|>", " {# c #} "])),
        1 | 2 => {
            t.push_str("{{ ");
            expr(rng, t, 0);
            t.push_str(" }}");
        }
        3 => {
            let var = rng.pick(&["x", "ns.x", "messages", "m"]);
            t.push_str(&format!("{{% set {var} = "));
            expr(rng, t, 0);
            t.push_str(" %}");
        }
        4 | 5 => {
            t.push_str("{% for m in ");
            // Long loops are rare: each one that nests runs out of fuel,
            // which takes a while.
            t.push_str(match rng.one_in(32) {
                true => "range(100000)",
                false => one(
                    rng,
                    &[
                        "messages",
                        "messages[1:]",
                        "messages|reverse",
                        "range(3)",
                        "range(30)",
                        "m['content']",
                        "x",
                    ],
                ),
            });
            t.push_str(" %}");
            for _ in 0..rng.range(1, 3) {
                statement(rng, t, depth + 1);
            }
            t.push_str(one(
                rng,
                &["{% endfor %}", "{% break %}{% endfor %}", "{% endfor %}"],
            ));
        }
        6 | 7 => {
            t.push_str("{% if ");
            expr(rng, t, 0);
            t.push_str(" %}");
            statement(rng, t, depth + 1);
            if rng.one_in(2) {
                t.push_str("{% else %}");
                statement(rng, t, depth + 1);
            }
            t.push_str("{% endif %}");
        }
        _ => {
            t.push_str("{% macro f(a) %}");
            statement(rng, t, depth + 1);
            t.push_str("{% endmacro %}{{ f(");
            expr(rng, t, 0);
            t.push_str(") }}");
        }
    }
}

fn expr(rng: &mut Rng, t: &mut String, depth: usize) {
    if depth > 2 || rng.one_in(3) {
        t.push_str(one(
            rng,
            &[
                "messages",
                "messages[0]['role']",
                "messages[-1].content",
                "m['content']",
                "m.role",
                "loop.index0",
                "loop.last",
                "add_generation_prompt",
                "bos_token",
                "eos_token",
                "x",
                "ns",
                "namespace(x=1)",
                "'<|im_start|>'",
                "'\\n'",
                "none",
                "true",
                "0",
                "-1",
                "100000",
                "9223372036854775807",
                "1.5",
                "tools",
            ],
        ));
        return;
    }
    match rng.below(6) {
        0 => {
            expr(rng, t, depth + 1);
            t.push_str(one(
                rng,
                &[" + ", " ~ ", " * ", " - ", " // ", " % ", " == ", " and "],
            ));
            expr(rng, t, depth + 1);
        }
        1 => {
            expr(rng, t, depth + 1);
            t.push_str(one(
                rng,
                &[
                    "|tojson",
                    "|tojson(indent=2)",
                    "|trim",
                    "|length",
                    "|upper",
                    "|list",
                    "|first",
                    "|join(', ')",
                    "|default('d')",
                ],
            ));
        }
        2 => {
            t.push('(');
            expr(rng, t, depth + 1);
            t.push(')');
            t.push_str(one(
                rng,
                &[
                    ".strip()",
                    ".split('\\n')",
                    ".startswith('<')",
                    ".replace('a', 'bb')",
                    ".items()",
                    "[0]",
                    "[1:-1]",
                    "['content']",
                ],
            ));
        }
        3 => {
            t.push_str(one(rng, &["raise_exception(", "strftime_now(", "range("]));
            expr(rng, t, depth + 1);
            t.push(')');
        }
        4 => {
            t.push_str("not ");
            expr(rng, t, depth + 1);
        }
        _ => {
            expr(rng, t, depth + 1);
            t.push_str(" if ");
            expr(rng, t, depth + 1);
            t.push_str(" else ");
            expr(rng, t, depth + 1);
        }
    }
}

/// One of `items`.
fn one(rng: &mut Rng, items: &[&'static str]) -> &'static str {
    items[rng.below(items.len())]
}
