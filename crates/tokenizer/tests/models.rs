//! Checks against the real model files (ids taken from llama.cpp on the same
//! files). Each test prints a note and passes when its file is absent.

use std::path::PathBuf;
use std::time::Instant;

use arbor_tokenizer::{ChatMessage, Tokenizer};

/// `$ARBOR_HOME`, else `$XDG_CACHE_HOME/arbor`, else `~/.cache/arbor`.
fn arbor_home() -> Option<PathBuf> {
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(h) = nonempty("ARBOR_HOME") {
        return Some(h.into());
    }
    if let Some(x) = nonempty("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("arbor"));
    }
    nonempty("HOME").map(|h| PathBuf::from(h).join(".cache").join("arbor"))
}

fn load(name: &str) -> Option<Tokenizer> {
    let path = arbor_home()?.join("models").join(format!("{name}.gguf"));
    if !path.exists() {
        eprintln!("skipping: {} not found", path.display());
        return None;
    }
    let file = arbor_gguf::GgufFile::open(&path).expect("open gguf");
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(file.header()).expect("tokenizer from gguf");
    eprintln!(
        "{name}: built tokenizer ({} tokens) in {:.1} ms",
        tok.vocab_size(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Some(tok)
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

#[test]
fn qwen_ids_match_llama_cpp() {
    let Some(t) = load("qwen2.5-coder-0.5b") else {
        return;
    };
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

#[test]
fn smollm_ids_match_llama_cpp() {
    let Some(t) = load("smollm2-135m") else {
        return;
    };
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

#[test]
fn qwen_stream_holds_back_split_emoji() {
    let Some(t) = load("qwen2.5-coder-0.5b") else {
        return;
    };
    // " 🚀" is three tokens here: 11162 (space + 2 bytes), 248, 222.
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

#[test]
fn draft_and_target_vocabularies() {
    let (Some(small), Some(big)) = (load("qwen2.5-coder-0.5b"), load("qwen2.5-coder-1.5b")) else {
        return;
    };
    assert!(small.same_vocabulary(&big));
    if let Some(smol) = load("smollm2-135m") {
        assert!(!small.same_vocabulary(&smol));
    }
    let s = "fn main() { println!(\"hi\"); }";
    assert_eq!(small.encode(s).unwrap(), big.encode(s).unwrap());
}
