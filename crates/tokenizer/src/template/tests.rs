//! Chat templates rendered through a whole [`Tokenizer`] built from a small
//! hand-made header, with real templates from `tests/templates/`.

use arbor_gguf::{Header, Value};

use super::format_time;
use crate::chat::ChatFormat;
use crate::metadata::{KEY_ADD_BOS, KEY_BOS, KEY_EOS, KEY_TEMPLATE, KEY_TOKENS, KEY_TYPES};
use crate::tests::tiny_header;
use crate::{ChatMessage, Tokenizer, TokenizerError};

const QWEN25: &str = include_str!("../../tests/templates/qwen2.5.jinja");
const SMOLLM2: &str = include_str!("../../tests/templates/smollm2.jinja");
const LLAMA3: &str = include_str!("../../tests/templates/llama3.jinja");

/// The tiny vocabulary (which has the ChatML tokens) with `template`.
fn with_template(template: &str) -> Tokenizer {
    let mut h = tiny_header();
    h.metadata
        .insert(KEY_TEMPLATE.into(), Value::String(template.into()));
    Tokenizer::from_gguf(&h).expect("tokenizer")
}

/// Appends control tokens to the tiny vocabulary; returns their ids.
fn add_control_tokens(h: &mut Header, texts: &[&str]) -> Vec<u32> {
    let Some(Value::Array(tokens)) = h.metadata.get_mut(KEY_TOKENS) else {
        unreachable!()
    };
    let first = tokens.len() as u32;
    tokens.extend(texts.iter().map(|t| Value::String((*t).into())));
    let Some(Value::Array(types)) = h.metadata.get_mut(KEY_TYPES) else {
        unreachable!()
    };
    types.extend(texts.iter().map(|_| Value::I32(3)));
    (first..first + texts.len() as u32).collect()
}

/// A Llama-3-like tokenizer: `<|begin_of_text|>` is BOS, `<|eot_id|>` EOS.
fn llama3(add_bos: bool) -> Tokenizer {
    let mut h = tiny_header();
    let ids = add_control_tokens(
        &mut h,
        &[
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
    );
    h.metadata.insert(KEY_BOS.into(), Value::U32(ids[0]));
    h.metadata.insert(KEY_EOS.into(), Value::U32(ids[3]));
    h.metadata.insert(KEY_ADD_BOS.into(), Value::Bool(add_bos));
    h.metadata
        .insert(KEY_TEMPLATE.into(), Value::String(LLAMA3.into()));
    Tokenizer::from_gguf(&h).expect("llama3 tokenizer")
}

fn conversations() -> [Vec<ChatMessage>; 2] {
    [
        vec![ChatMessage::system("Be terse."), ChatMessage::user("Hi")],
        vec![ChatMessage::user("Hi")],
    ]
}

/// Qwen2.5's and SmolLM2's real templates give exactly what the hand-written
/// ChatML gave for them (expected strings checked with Python's jinja2).
#[test]
fn real_chatml_templates_match_handwritten_chatml() {
    for (template, default_system) in [
        (
            QWEN25,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        ),
        (
            SMOLLM2,
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        ),
    ] {
        let t = with_template(template);
        assert!(matches!(t.chat, ChatFormat::Template(_)), "{:?}", t.chat);
        let by_hand = ChatFormat::ChatMl {
            default_system: Some(default_system.into()),
        };
        let [with_system, user_only] = conversations();
        let expected_with_system = "<|im_start|>system\nBe terse.<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        let expected_user_only = format!(
            "<|im_start|>system\n{default_system}<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.chat_prompt(&with_system).unwrap(), expected_with_system);
        assert_eq!(
            by_hand.render(&with_system, &[]).unwrap(),
            expected_with_system
        );
        assert_eq!(t.chat_prompt(&user_only).unwrap(), expected_user_only);
        assert_eq!(by_hand.render(&user_only, &[]).unwrap(), expected_user_only);
        // A multi-turn conversation too.
        let long = [
            ChatMessage::user("a"),
            ChatMessage::assistant("b"),
            ChatMessage::user("c"),
        ];
        assert_eq!(
            t.chat_prompt(&long).unwrap(),
            by_hand.render(&long, &[]).unwrap()
        );
    }
}

#[test]
fn llama3_template_writes_bos_and_headers() {
    let t = llama3(false);
    let [with_system, _] = conversations();
    let p = t.chat_prompt(&with_system).unwrap();
    assert_eq!(
        p,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let ids = t.encode(&p).unwrap();
    assert_eq!(ids[0], t.bos_id().unwrap());
    assert_eq!(ids.iter().filter(|&&i| Some(i) == t.bos_id()).count(), 1);
}

/// When `encode` adds BOS itself, the BOS the template writes is dropped so
/// the encoded prompt starts with exactly one.
#[test]
fn bos_written_by_template_is_not_doubled() {
    let t = llama3(true);
    let bos = t.bos_id().unwrap();
    let p = t.chat_prompt(&[ChatMessage::user("Hi")]).unwrap();
    assert!(p.starts_with("<|start_header_id|>user"), "{p:?}");
    let ids = t.encode(&p).unwrap();
    assert_eq!(ids[0], bos);
    assert_ne!(ids[1], bos);
    assert_eq!(ids.iter().filter(|&&i| i == bos).count(), 1);
    // Only a leading BOS is removed; one elsewhere in the text stays.
    let t = with_template("{{ 'x' + bos_token }}");
    assert_eq!(t.chat_prompt(&[]).unwrap(), "x<|endoftext|>");
}

#[test]
fn generation_prompt_ends_with_assistant_header() {
    let [with_system, user_only] = conversations();
    for messages in [&with_system, &user_only] {
        assert!(
            llama3(true)
                .chat_prompt(messages)
                .unwrap()
                .ends_with("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        );
        for template in [QWEN25, SMOLLM2] {
            assert!(
                with_template(template)
                    .chat_prompt(messages)
                    .unwrap()
                    .ends_with("<|im_end|>\n<|im_start|>assistant\n")
            );
        }
    }
}

#[test]
fn raise_exception_gives_typed_error() {
    let t = with_template(
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}\
         {{ raise_exception('Conversation roles must alternate user/assistant') }}\
         {% endif %}{{ m.content }}{% endfor %}",
    );
    assert_eq!(
        t.chat_prompt(&[ChatMessage::user("a"), ChatMessage::assistant("b")])
            .unwrap(),
        "ab"
    );
    match t.chat_prompt(&[ChatMessage::assistant("b")]) {
        Err(TokenizerError::ChatTemplateRejected(msg)) => {
            assert_eq!(msg, "Conversation roles must alternate user/assistant")
        }
        other => panic!("expected ChatTemplateRejected, got {other:?}"),
    }
    // The Llama-3 fixture refuses roles it does not know; arbor's roles pass.
    assert!(llama3(false).chat_prompt(&conversations()[0]).is_ok());
    // Other render failures are a ChatTemplate error.
    let t = with_template("{{ messages[0].content.no_such_method() }}");
    match t.chat_prompt(&[ChatMessage::user("a")]) {
        Err(TokenizerError::ChatTemplate(msg)) => assert!(msg.contains("no_such_method"), "{msg}"),
        other => panic!("expected ChatTemplate, got {other:?}"),
    }
}

/// A template minijinja cannot compile does not stop the model loading:
/// plain text still encodes, and chat either fails with a typed error or,
/// for a ChatML template, falls back to the hand-written ChatML.
#[test]
fn uncompilable_template_still_loads() {
    let t = with_template("{% if messages %}[INST] {{ messages[0].content }}");
    assert!(matches!(t.chat, ChatFormat::Broken(_)));
    assert!(!t.encode("hello world").unwrap().is_empty());
    match t.chat_prompt(&[ChatMessage::user("a")]) {
        Err(TokenizerError::ChatTemplate(msg)) => {
            assert!(msg.starts_with("cannot be compiled: syntax error"), "{msg}")
        }
        other => panic!("expected ChatTemplate, got {other:?}"),
    }

    let t = with_template(&QWEN25.replace("{%- endfor %}", "{%- endfour %}"));
    assert!(matches!(t.chat, ChatFormat::ChatMl { .. }), "{:?}", t.chat);
    assert_eq!(
        t.chat_prompt(&[ChatMessage::user("Hi")]).unwrap(),
        with_template(QWEN25)
            .chat_prompt(&[ChatMessage::user("Hi")])
            .unwrap()
    );
}

/// Features HF templates lean on: Python string methods, `namespace`, loop
/// controls and attributes, slicing, `trim`, `tojson`, `eos_token`.
#[test]
fn python_style_templates() {
    let t = with_template(
        "{%- set ns = namespace(n=0) %}\n\
         {%- for m in messages[1:] %}\n\
             {%- if m.content.startswith('stop') %}{% break %}{% endif %}\n\
             {%- set ns.n = ns.n + 1 %}\n\
             {{- m.content.strip().split(',') | join('|') }}{{ '/' if not loop.last }}\n\
         {%- endfor %}\n\
         {{- ' ' ~ ns.n ~ ' ' ~ (messages[0].content | trim | upper) ~ eos_token }}",
    );
    let p = t
        .chat_prompt(&[
            ChatMessage::system("  sys "),
            ChatMessage::user(" a,b "),
            ChatMessage::assistant("c"),
            ChatMessage::user("stop here"),
        ])
        .unwrap();
    assert_eq!(p, "a|b/c/ 2 SYS<|endoftext|>");
}

#[test]
fn tojson_writes_like_python() {
    let t = with_template(
        "{{ {'a': \"x'<é\", 'b': [1, 2.5, none, true], 'c': {}} | tojson }}\n\
         {{ 'é😀' | tojson(ensure_ascii=true) }}\n{{ {'a': [1, {'b': 2}]} | tojson(indent=2) }}",
    );
    assert_eq!(
        t.chat_prompt(&[]).unwrap(),
        "{\"a\": \"x'<é\", \"b\": [1, 2.5, null, true], \"c\": {}}\n\
         \"\\u00e9\\ud83d\\ude00\"\n\
         {\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}"
    );
}

#[test]
fn strftime_formats_utc_dates() {
    let all = "%Y-%m-%d %H:%M:%S %a %A %b %B %j %y %e %I %p %F %% %Q";
    // Expected values from Python's datetime.strftime.
    for (secs, expected) in [
        (
            0,
            "1970-01-01 00:00:00 Thu Thursday Jan January 001 70  1 12 AM 1970-01-01 % %Q",
        ),
        (
            1_721_998_862,
            "2024-07-26 13:01:02 Fri Friday Jul July 208 24 26 01 PM 2024-07-26 % %Q",
        ),
        (
            951_782_400,
            "2000-02-29 00:00:00 Tue Tuesday Feb February 060 00 29 12 AM 2000-02-29 % %Q",
        ),
        (
            -86_400,
            "1969-12-31 00:00:00 Wed Wednesday Dec December 365 69 31 12 AM 1969-12-31 % %Q",
        ),
        (
            4_102_444_799,
            "2099-12-31 23:59:59 Thu Thursday Dec December 365 99 31 11 PM 2099-12-31 % %Q",
        ),
    ] {
        assert_eq!(format_time(all, secs), expected);
    }
    // Through a template: today's date, in the same format as `format_time`.
    let p = with_template("{{ strftime_now('%d %b %Y') }}")
        .chat_prompt(&[])
        .unwrap();
    assert_eq!(p.len(), "26 Jul 2024".len(), "{p}");
}
