//! Measures cheap drafts on a real model (a measurement, not a test): greedy
//! acceptance per draft position and draft step time of self drafts that
//! skip k of the target's layers (spread evenly, a contiguous late-middle
//! block, or the last layers) and of prompt lookup, on MT-Bench questions.
//!
//! ```text
//! cargo run --release -p arbor-drafts --example measure_drafts
//! ```
//!
//! It reads `$ARBOR_HOME/models/qwen2.5-coder-1.5b.gguf` and MT-Bench
//! (`arbor fetch qwen2.5-coder-1.5b`, `arbor fetch --dataset mt-bench`).
//! `ARBOR_MEASURE_MODEL` (a path), `ARBOR_MEASURE_PROMPTS` (question ids, comma
//! separated), `ARBOR_MEASURE_TOKENS` (continuation length),
//! `ARBOR_MEASURE_TURNS` (`2`: measure on the answer to the question's
//! second turn, the first answer in the context) and `ARBOR_MEASURE_ONLY`
//! (`lookup` or `self`) change what is measured.
//!
//! Each draft is replayed along the target's greedy continuation as a
//! chain of depth [`DEPTH`] would be: from the context so far it proposes
//! tokens one at a time until one differs from the target's (or `DEPTH`
//! agree), then the context moves past the agreeing tokens and the
//! target's next one.

use std::time::Instant;

use arbor_backend_candle::CandleBackend;
use arbor_drafts::PromptLookup;
use arbor_gguf::GgufFile;
use arbor_model::LanguageModel;
use arbor_sampling::SamplingParams;
use arbor_speculative::{DecodeOptions, Decoding, Strategy, Verification, decode};
use arbor_tokenizer::{ChatMessage, Tokenizer};

const DEPTH: usize = 4;

fn env(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// What one draft did over all prompts.
#[derive(Default)]
struct Tally {
    rounds: usize,
    /// `agree[k]`: rounds whose first `k + 1` proposals all agreed.
    agree: [usize; DEPTH],
    steps: usize,
    step_secs: f64,
    /// Lookup only: proposals and hits by the probability given.
    by_confidence: Vec<(f32, usize, usize)>,
}

impl Tally {
    fn row(&self, name: &str, target_step: f64) {
        let r = self.rounds.max(1) as f64;
        let per: Vec<String> = self
            .agree
            .iter()
            .map(|&a| format!("{:.2}", a as f64 / r))
            .collect();
        let mean: f64 = self.agree.iter().map(|&a| a as f64).sum::<f64>() / r;
        let step = self.step_secs / self.steps.max(1) as f64;
        println!(
            "{name:<28} {:>5} rounds  agree@1..{DEPTH} [{}]  mean accepted {mean:.2}  step {:.3} ms ({:.2}x target)",
            self.rounds,
            per.join(" "),
            step * 1e3,
            step / target_step
        );
        for (c, n, hit) in &self.by_confidence {
            println!(
                "    p={c:.2}: {n} proposals, {:.2} right",
                *hit as f64 / (*n).max(1) as f64
            );
        }
    }
}

/// Replays `draft` along `prompt` + `cont` (see the file's header).
fn replay(draft: &mut dyn LanguageModel, prompt: &[u32], cont: &[u32], t: &mut Tally) {
    draft.truncate_cache(0).unwrap();
    // The cache holds the context but its last token.
    draft.step(&prompt[..prompt.len() - 1]).unwrap();
    let mut last = *prompt.last().unwrap();
    let mut i = 0;
    while i + DEPTH <= cont.len() {
        let base = draft.cache_len();
        let mut feed = last;
        let mut agreed = 0;
        for k in 0..DEPTH {
            let start = Instant::now();
            let row = draft.step(&[feed]).unwrap();
            t.step_secs += start.elapsed().as_secs_f64();
            t.steps += 1;
            let guess = argmax(&row);
            let p = row[guess as usize].exp() / row.iter().map(|v| v.exp()).sum::<f32>();
            if k == 0 && draft.backend_name() == "lookup" && p > 0.01 {
                let key = (p * 100.0).round() / 100.0;
                let hit = (guess == cont[i]) as usize;
                match t.by_confidence.iter_mut().find(|e| e.0 == key) {
                    Some(e) => (e.1, e.2) = (e.1 + 1, e.2 + hit),
                    None => t.by_confidence.push((key, 1, hit)),
                }
            }
            if guess != cont[i + k] {
                break;
            }
            t.agree[k] += 1;
            agreed += 1;
            feed = guess;
        }
        t.rounds += 1;
        // Keep `last` and the agreeing tokens the draft has fed.
        let fed = agreed.min(DEPTH - 1);
        draft.truncate_cache(base + 1 + fed).unwrap();
        if agreed > fed {
            draft.step(&cont[i + fed..i + agreed]).unwrap();
        }
        if i + agreed == cont.len() {
            break;
        }
        last = cont[i + agreed];
        i += agreed + 1;
    }
    t.by_confidence.sort_by(|a, b| a.0.total_cmp(&b.0));
}

/// Indices of `k` of `n` layers: spread evenly (as the budget planner
/// streams them), a block centred at two thirds of the depth, the last.
fn placements(n: usize, k: usize) -> Vec<(&'static str, Vec<usize>)> {
    let spread = (0..k).map(|j| (2 * j + 1) * n / (2 * k)).collect();
    let start = (2 * n / 3).saturating_sub(k / 2).min(n - k);
    vec![
        ("spread", spread),
        ("block", (start..start + k).collect()),
        ("last", (n - k..n).collect()),
    ]
}

fn main() {
    let home = arbor_fetch::arbor_home();
    let default_model = home.join("models").join("qwen2.5-coder-1.5b.gguf");
    let path = env("ARBOR_MEASURE_MODEL", &default_model.to_string_lossy());
    let ids: Vec<u64> = env("ARBOR_MEASURE_PROMPTS", "81,101,121,131")
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let tokens: usize = env("ARBOR_MEASURE_TOKENS", "48").parse().unwrap();
    let only = env("ARBOR_MEASURE_ONLY", "");
    let turns: usize = env("ARBOR_MEASURE_TURNS", "1").parse().unwrap();
    let file = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(file.header()).unwrap();
    let mut target =
        arbor_pipeline::load_resident(CandleBackend::new(), &file, &mut |_, _| {}).unwrap();
    let questions = home.join("datasets").join("mt-bench-question.jsonl");
    let questions = std::fs::read_to_string(&questions).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run `arbor fetch --dataset mt-bench`)",
            questions.display()
        )
    });
    let mut runs = Vec::new();
    let mut target_secs = 0.0;
    let mut target_steps = 0;
    for line in questions.lines() {
        let q: serde_json::Value = serde_json::from_str(line).unwrap();
        if !ids.contains(&q["question_id"].as_u64().unwrap()) {
            continue;
        }
        let opts = DecodeOptions {
            max_tokens: tokens,
            sampling: SamplingParams::default(),
            stop_tokens: tok.stop_ids(),
            strategy: Strategy::new(Decoding::Autoregressive),
            verification: Verification::Exact,
        };
        let mut messages = Vec::new();
        let turn =
            |messages: &mut Vec<ChatMessage>, target: &mut arbor_model::Decoder<_>, i: usize| {
                messages.push(ChatMessage::user(q["turns"][i].as_str().unwrap()));
                let prompt = tok.encode(&tok.chat_prompt(messages).unwrap()).unwrap();
                target.truncate_cache(0).unwrap();
                let out = decode(target, None, &prompt, &opts, &mut |_| {}).unwrap();
                messages.push(ChatMessage::assistant(tok.decode(&out.tokens).unwrap()));
                (prompt, out)
            };
        let (mut prompt, mut out) = turn(&mut messages, &mut target, 0);
        if turns == 2 {
            (prompt, out) = turn(&mut messages, &mut target, 1);
        }
        target_secs += out.stats.decode_secs;
        target_steps += out.tokens.len().saturating_sub(1);
        println!(
            "q{} ({}): {} prompt tokens → {:?}",
            q["question_id"],
            q["category"].as_str().unwrap_or("?"),
            prompt.len(),
            tok.decode(&out.tokens).unwrap()
        );
        runs.push((prompt, out.tokens));
    }
    let target_step = target_secs / target_steps.max(1) as f64;
    println!("target step {:.1} ms", target_step * 1e3);
    let measure = |draft: &mut dyn LanguageModel, name: &str| {
        let mut t = Tally::default();
        for (prompt, cont) in &runs {
            replay(draft, prompt, cont, &mut t);
        }
        t.row(name, target_step);
    };
    if only != "self" {
        for (min, max) in [(1, 3), (2, 3), (1, 5)] {
            let mut lookup = PromptLookup::new(target.config().clone())
                .with_ngrams(min, max)
                .unwrap();
            measure(&mut lookup, &format!("lookup n={min}..={max}"));
        }
    }
    if only != "lookup" {
        let n = target.config().n_layers;
        for k in [4, 8, 12] {
            for (how, skip) in placements(n, k) {
                let keep: Vec<bool> = (0..n).map(|i| !skip.contains(&i)).collect();
                let mut draft = target.self_draft_with(&keep).unwrap();
                measure(&mut draft, &format!("self -{k} {how} {skip:?}"));
            }
        }
    }
}
