//! Constrained decoding: a JSON schema (or a Lark grammar) as an
//! [`arbor_sampling::Constraint`], computed by llguidance.
//!
//! Why llguidance: it is maintained (Microsoft's guidance project, used by
//! llama.cpp, vLLM, SGLang and TensorRT-LLM), it compiles JSON schemas
//! itself (nested objects, enums, arrays, bounded numbers, `$ref`), it
//! takes any tokenizer given as the bytes of each token, and it computes a
//! token mask in tens of microseconds with rollback, which speculative
//! verification needs: every row of a draft tree is masked for the state
//! after its own path, then the matcher goes back. outlines-core builds an
//! index per schema ahead of time (seconds for a 150k vocabulary) and has
//! no rollback.
//!
//! [`Grammars`] holds a model's vocabulary as llguidance sees it (built
//! once per model: a trie of every token's bytes; special tokens are kept
//! out of text); [`Grammar`] is one request's matcher.

use std::sync::{Arc, Mutex};

use arbor_sampling::Constraint;
use arbor_tokenizer::{TokenKind, Tokenizer};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The vocabulary cannot be given to the grammar engine.
    #[error("the vocabulary: {0}")]
    Vocabulary(String),
    /// The schema or grammar is not one the engine accepts.
    #[error("{0}")]
    Invalid(String),
}

/// A tokenizer's vocabulary as the grammar engine sees it.
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Bytes the grammar forces, as tokens: the longest token at each step
    /// (any split is valid; the mask decides what the model may choose).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }
}

/// A model's vocabulary ready for grammars: build once, then make a
/// [`Grammar`] per request.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    /// Tokens that end generation: allowed wherever the grammar may end.
    stops: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("stops", &self.stops)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// The vocabulary of `tokenizer` for a model with `vocab` logits per row
    /// (at least the tokenizer's size; rows past it are never allowed).
    pub fn new(tokenizer: &Tokenizer, vocab: usize) -> Result<Self, GrammarError> {
        let stops = tokenizer.stop_ids();
        let eos = (tokenizer.eos_id())
            .or_else(|| stops.first().copied())
            .ok_or_else(|| GrammarError::Vocabulary("the model has no end token".into()))?;
        let vocab = vocab.max(tokenizer.vocab_size());
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| match tokenizer.token_kind(id) {
                Some(TokenKind::Normal | TokenKind::Byte) => tokenizer
                    .token_bytes(id)
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default(),
                // Special tokens (and unused entries) are never text: the
                // engine's marker byte keeps them out of every match.
                kind => {
                    let name = match kind {
                        Some(_) => tokenizer.token_text(id).unwrap_or("").to_string(),
                        None => String::new(),
                    };
                    let name = match name.starts_with('<') && name.ends_with('>') {
                        true => name,
                        false => format!("<[{id}]>"),
                    };
                    [&[TokTrie::SPECIAL_TOKEN_MARKER][..], name.as_bytes()].concat()
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            ..TokRxInfo::new(vocab as u32, eos)
        };
        let env: TokEnv = Arc::new(Env {
            trie: TokTrie::from(&info, &words),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            stops,
        })
    }

    /// Output that is one JSON value matching `schema`, written as
    /// Python's `json.dumps` writes it (`", "` and `": "`, no other
    /// whitespace: a small model cannot wander off into blank lines).
    pub fn json_schema(&self, schema: &Value) -> Result<Grammar, GrammarError> {
        self.grammar(TopLevelGrammar::from_json_schema(compact(schema)?))
    }

    /// Output that is one JSON object (`response_format: json_object`).
    pub fn json_object(&self) -> Result<Grammar, GrammarError> {
        self.json_schema(&json!({"type": "object"}))
    }

    /// The rest of a tool call whose text so far is `{"name": "f",
    /// "arguments": `: an arguments object matching `parameters` (any
    /// object when `None`), then `}`.
    pub fn tool_arguments(&self, parameters: Option<&Value>) -> Result<Grammar, GrammarError> {
        let schema = compact(parameters.unwrap_or(&json!({"type": "object"})))?;
        let lark = format!("start: args \"}}\"\nargs: %json {schema}\n");
        self.grammar(TopLevelGrammar::from_grammar(GrammarWithLexer::from_lark(
            lark,
        )))
    }

    /// Output in a Lark grammar (llguidance's dialect).
    pub fn lark(&self, source: &str) -> Result<Grammar, GrammarError> {
        self.grammar(TopLevelGrammar::from_lark(source.to_string()))
    }

    fn grammar(&self, grammar: TopLevelGrammar) -> Result<Grammar, GrammarError> {
        let parser = self.factory.create_parser(grammar);
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(Grammar {
            matcher: Mutex::new(matcher),
            eos: self.factory.tok_env().tok_trie().eos_token(),
            stops: self.stops.clone(),
            spent: Mutex::new((0, 0.0)),
        })
    }
}

/// `schema` with the engine's layout options: fixed separators, no free
/// whitespace. A schema that is not an object (or `true`) is refused.
fn compact(schema: &Value) -> Result<Value, GrammarError> {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        Value::Bool(true) => json!({}),
        _ => return Err(GrammarError::Invalid("a JSON schema is an object".into())),
    };
    schema["x-guidance"] = json!({
        "item_separator": ", ",
        "key_separator": ": ",
        "whitespace_flexible": false,
    });
    Ok(schema)
}

/// One request's rule: what may come next after what was committed.
pub struct Grammar {
    matcher: Mutex<Matcher>,
    eos: u32,
    stops: Vec<u32>,
    /// Rows masked and the seconds it took.
    spent: Mutex<(usize, f64)>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// Whether the committed output is complete (the grammar may end here).
    pub fn is_accepting(&self) -> bool {
        let mut m = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
        m.is_accepting().unwrap_or(false)
    }

    /// Rows masked so far and the seconds masking took (what the rule
    /// costs a generation).
    pub fn spent(&self) -> (usize, f64) {
        *self.spent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Constraint for Grammar {
    fn mask(&self, path: &[u32], logits: &mut [f32]) -> Result<(), String> {
        let start = std::time::Instant::now();
        let r = self.mask_row(path, logits);
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        spent.0 += 1;
        spent.1 += start.elapsed().as_secs_f64();
        r
    }

    fn commit(&self, tokens: &[u32]) -> Result<(), String> {
        let mut m = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
        m.consume_tokens(tokens).map_err(|e| e.to_string())
    }
}

impl Grammar {
    fn mask_row(&self, path: &[u32], logits: &mut [f32]) -> Result<(), String> {
        let mut m = self.matcher.lock().unwrap_or_else(|e| e.into_inner());
        if !path.is_empty() {
            let valid = m.validate_tokens(path).map_err(|e| e.to_string())?;
            if valid < path.len() {
                return Ok(()); // a path the grammar rules out: never reached
            }
            m.consume_tokens(path).map_err(|e| e.to_string())?;
        }
        let mask = m.compute_mask_or_eos();
        if !path.is_empty() {
            m.rollback(path.len()).map_err(|e| e.to_string())?;
        }
        let mask = mask.map_err(|e| e.to_string())?;
        // Every stop token is allowed exactly where the grammar's end
        // token is: their logits are set aside and put back after the mask.
        let may_end = mask.is_allowed(self.eos);
        let ends: Vec<(usize, f32)> = (self.stops.iter().chain([&self.eos]))
            .filter_map(|&t| logits.get(t as usize).map(|&l| (t as usize, l)))
            .collect();
        for (t, l) in logits.iter_mut().enumerate() {
            if !(t < mask.len() && mask.is_allowed(t as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
        for (t, l) in ends {
            logits[t] = if may_end { l } else { f32::NEG_INFINITY };
        }
        Ok(())
    }
}
