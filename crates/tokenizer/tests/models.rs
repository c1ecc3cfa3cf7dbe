//! Checks against the real model files (ids taken from llama.cpp on the same
//! files), found through the one lookup every real-model test uses
//! (`arbor_fetch::testing::cached_model`): a model that is not fetched is
//! reported as `skipped: …`, or fails the test when `ARBOR_REQUIRE_MODELS`
//! lists it (CI lists SmolLM2).

use arbor_tokenizer::{ChatMessage, Tokenizer};

fn load(name: &str) -> Option<Tokenizer> {
    let path = arbor_fetch::testing::cached_model(name)?;
    let file = arbor_gguf::GgufFile::open(&path).expect("open gguf");
    Some(Tokenizer::from_gguf(file.header()).expect("tokenizer from gguf"))
}

const ROUND_TRIP: &[&str] = &[
    "Hello, world!",
    "def fibonacci(n):\n    return n",
    "  Ünïcödé 你好 🚀 1234567",
    "line one\r\nline two\n\n\n\tindented  \n",
    "emoji: 👩‍👩‍👧‍👦 🇯🇵 ✨ — and CJK: 日本語のテキスト、中文文本。한국어",
    "   leading and trailing spaces   ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "don't I'LL we've 3.14159 x=1e-9 && y!=z",
];

/// Every fetched model's ids equal llama.cpp's on the same file (SmolLM2
/// wherever CI runs; the Qwen cases where that model is fetched).
#[test]
fn ids_match_llama_cpp() {
    if let Some(t) = load("smollm2-135m") {
        smollm_ids_match_llama_cpp(&t);
    }
    if let Some(t) = load("qwen2.5-coder-0.5b") {
        qwen_ids_match_llama_cpp(&t);
    }
}

fn qwen_ids_match_llama_cpp(t: &Tokenizer) {
    assert_eq!(t.encode("Hello, world!").unwrap(), [9707, 11, 1879, 0]);
    assert_eq!(
        t.encode("def fibonacci(n):\n    return n").unwrap(),
        [750, 75698, 1445, 982, 262, 470, 308]
    );
    assert_eq!(
        t.encode("  Ünïcödé 你好 🚀 1234567").unwrap(),
        [
            220, 30512, 77, 37572, 66, 2956, 128505, 220, 108386, 11162, 248, 222, 220, 16, 17, 18,
            19, 20, 21, 22
        ]
    );
    assert_eq!(t.encode("<|im_start|>").unwrap(), [151644]);
    assert_eq!(
        t.encode("<|im_start|>user\nHi<|im_end|>").unwrap()[..2],
        [151644, 872]
    );
    assert_eq!(t.bos_id(), Some(151643));
    assert!(!t.adds_bos());
    assert_eq!(t.stop_ids(), [151643, 151645]);
    assert_eq!(t.vocab_size(), 151936);
    assert_eq!(t.token_text(9707), Some("Hello"));
    for s in ROUND_TRIP {
        assert_eq!(&t.decode(&t.encode(s).unwrap()).unwrap(), s);
    }
}

fn smollm_ids_match_llama_cpp(t: &Tokenizer) {
    assert_eq!(
        t.encode("Hello, world! The quick brown fox.").unwrap(),
        [19556, 28, 905, 17, 378, 2365, 6354, 16438, 30]
    );
    assert_eq!(t.encode("<|im_start|>").unwrap(), [1]);
    assert_eq!(t.stop_ids(), [0, 2]);
    for s in ROUND_TRIP {
        assert_eq!(&t.decode(&t.encode(s).unwrap()).unwrap(), s);
    }
}

/// Streaming text holds back the bytes of a character split over tokens
/// and prints it whole once complete.
fn check_stream_holds_back_split_characters(t: &Tokenizer) {
    let ids = t.encode("go 🚀 now 你好").unwrap();
    let mut s = t.stream();
    let mut out = String::new();
    let mut pieces = Vec::new();
    for &id in &ids {
        let piece = s.push(id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "split character leaked: {piece:?}"
        );
        pieces.push(piece.clone());
        out.push_str(&piece);
    }
    out.push_str(&s.finish());
    assert_eq!(out, t.decode(&ids).unwrap());
    assert_eq!(out, "go 🚀 now 你好");
    assert!(pieces.iter().any(String::is_empty), "{pieces:?}");
}

#[test]
fn streams_hold_back_split_emoji() {
    if let Some(t) = load("smollm2-135m") {
        check_stream_holds_back_split_characters(&t);
    }
    let Some(t) = load("qwen2.5-coder-0.5b") else {
        return;
    };
    check_stream_holds_back_split_characters(&t);
    // " 🚀" is three tokens here: 11162 (space + 2 bytes), 248, 222.
    let mut s = t.stream();
    assert_eq!(s.push(11162).unwrap(), " ");
    assert_eq!(s.push(248).unwrap(), "");
    assert_eq!(s.push(222).unwrap(), "🚀");
    assert_eq!(s.finish(), "");
}

#[test]
fn chat_prompts() {
    if let Some(t) = load("qwen2.5-coder-0.5b") {
        assert_eq!(
            t.chat_prompt(&[ChatMessage::user("Write hello world in Rust.")])
                .unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nWrite hello world in Rust.<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(
            t.chat_prompt(&[
                ChatMessage::system("Be terse."),
                ChatMessage::user("Hi"),
                ChatMessage::assistant("Hello."),
                ChatMessage::user("Bye"),
            ])
            .unwrap(),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let ids = t
            .encode(&t.chat_prompt(&[ChatMessage::user("Hi")]).unwrap())
            .unwrap();
        assert_eq!(ids[0], 151644);
        assert_eq!(ids[ids.len() - 3..], [151644, 77091, 198]);
    }
    if let Some(t) = load("smollm2-135m") {
        assert_eq!(
            t.chat_prompt(&[ChatMessage::user("What is 2+2?")]).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }
}

/// A conversation with a tool: Qwen2.5's template lays it out itself
/// (the definitions in its system turn, the call as `<tool_call>` JSON, the
/// result as a `<tool_response>` in a user turn); SmolLM2's has no tools,
/// so the conversation is rewritten into the same layout in plain turns.
#[test]
fn tools_in_chat_prompts() {
    use arbor_tokenizer::{Role, ToolCall};
    let tool = serde_json::json!({"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let call = ToolCall {
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris"}"#.into(),
    };
    let messages = [
        ChatMessage::user("Weather in Paris?"),
        ChatMessage {
            tool_calls: vec![call],
            ..ChatMessage::assistant("")
        },
        ChatMessage::new(Role::Tool, r#"{"celsius": 21}"#),
    ];
    let expect_call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for name in ["qwen2.5-coder-0.5b", "smollm2-135m"] {
        let Some(t) = load(name) else { continue };
        let p = t
            .chat_prompt_with_tools(&messages, std::slice::from_ref(&tool))
            .unwrap();
        assert!(p.contains("<tools>\n{"), "{name}: {p}");
        assert!(p.contains("\"get_weather\""), "{name}: {p}");
        assert!(p.contains(expect_call), "{name}: {p}");
        assert!(
            p.contains(
                "<|im_start|>user\n<tool_response>\n{\"celsius\": 21}\n</tool_response><|im_end|>"
            ),
            "{name}: {p}"
        );
        assert!(p.ends_with("<|im_start|>assistant\n"), "{name}: {p}");
        // Without tools the prompt is the plain one.
        let plain = [ChatMessage::user("Hi")];
        assert_eq!(
            t.chat_prompt_with_tools(&plain, &[]).unwrap(),
            t.chat_prompt(&plain).unwrap()
        );
    }
}

/// A model shares its vocabulary with itself and its family, not with
/// another family.
#[test]
fn draft_and_target_vocabularies() {
    let smol = load("smollm2-135m");
    if let Some(smol) = &smol {
        assert!(smol.same_vocabulary(smol));
    }
    let Some(small) = load("qwen2.5-coder-0.5b") else {
        return;
    };
    if let Some(smol) = &smol {
        assert!(!small.same_vocabulary(smol));
    }
    let Some(big) = load("qwen2.5-coder-1.5b") else {
        return;
    };
    assert!(small.same_vocabulary(&big));
    let s = "fn main() { println!(\"hi\"); }";
    assert_eq!(small.encode(s).unwrap(), big.encode(s).unwrap());
}

/// Qwen2.5-Coder's FIM tokens are found (SmolLM2 has none: a typed
/// error); an infill prompt is the prefix, suffix and middle tokens around
/// the code encoded as text (special-token text in the code stays text),
/// other files behind file separators.
#[test]
fn infill_prompts() {
    use arbor_tokenizer::{Infill, TokenizerError};
    if let Some(t) = load("smollm2-135m") {
        assert_eq!(t.fim_tokens(), None);
        let e = t.encode_infill(&Infill::default()).unwrap_err();
        assert!(matches!(e, TokenizerError::NoInfillTokens), "{e}");
    }
    for (name, names) in [
        (
            "qwen2.5-coder-0.5b",
            [
                "<|fim_prefix|>",
                "<|fim_suffix|>",
                "<|fim_middle|>",
                "<|file_sep|>",
            ],
        ),
        (
            "qwen2.5-coder-1.5b",
            [
                "<|fim_prefix|>",
                "<|fim_suffix|>",
                "<|fim_middle|>",
                "<|file_sep|>",
            ],
        ),
    ] {
        let Some(t) = load(name) else { continue };
        let fim = t.fim_tokens().expect("a code vocabulary has FIM tokens");
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(
            [fim.prefix, fim.suffix, fim.middle, fim.file_sep.unwrap()],
            names.map(id)
        );
        let (pre, suf) = ("fn add(a: i32, b: i32) -> i32 {\n", "\n}\n");
        let ids = t
            .encode_infill(&Infill {
                prefix: pre,
                suffix: suf,
                ..Infill::default()
            })
            .unwrap();
        let text = |s: &str| t.encode_text(s).unwrap();
        let want = [
            vec![fim.prefix],
            text(pre),
            vec![fim.suffix],
            text(suf),
            vec![fim.middle],
        ]
        .concat();
        assert_eq!(ids, want, "{name}");
        // A prefix that writes the middle token is text, not a middle.
        let sneaky = format!("// {}\n", names[2]);
        let ids = t
            .encode_infill(&Infill {
                prefix: &sneaky,
                ..Infill::default()
            })
            .unwrap();
        assert_eq!(ids.iter().filter(|&&i| i == fim.middle).count(), 1);
        let extra = [(
            "util.rs".to_string(),
            "pub fn one() -> i32 { 1 }".to_string(),
        )];
        let ids = t
            .encode_infill(&Infill {
                prefix: pre,
                suffix: suf,
                filename: Some("main.rs"),
                extra: &extra,
                ..Infill::default()
            })
            .unwrap();
        assert_eq!(
            ids.iter().filter(|&&i| i == fim.file_sep.unwrap()).count(),
            2
        );
        assert!(t.decode(&ids).unwrap().contains("util.rs\npub fn one()"));
        let stops = t.infill_stop_ids();
        assert!(stops.contains(&fim.file_sep.unwrap()) && stops.contains(&fim.prefix));
    }
}
