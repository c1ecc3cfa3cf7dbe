//! The sampling surface beyond the filters: `logprobs` (chat: a bool with
//! `top_logprobs` alternatives; completions: the number of alternatives),
//! presence and frequency penalties and `logit_bias`. Penalties and biases
//! become an [`arbor_engine::Shaping`] rule that the decoding loop applies
//! to every target row a token is chosen from, so a speculative answer
//! under them equals the one-token answer under them. Scores are read
//! from those same rows (after every rule, at temperature 1, before
//! top-k/top-p/min-p) and rendered in OpenAI's two shapes.

use std::collections::HashMap;
use std::sync::Arc;

use arbor_engine::{Scored, Shaping, Tokenizer};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::fields::Endpoint;

/// The most alternatives a token lists (OpenAI's chat limit).
pub const MAX_TOP: usize = 20;

/// The scoring and shaping fields of a request body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ScoringFields {
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub logit_bias: Option<HashMap<String, f64>>,
}

/// Penalties and biases, checked for range (the vocabulary is checked
/// when the rule is made, [`Shape::rule`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    pub presence: f32,
    pub frequency: f32,
    pub bias: Vec<(u32, f32)>,
}

impl Shape {
    /// The rule for one request over a vocabulary of `vocab` tokens;
    /// `None` when it would change nothing.
    pub fn rule(&self, vocab: usize) -> Result<Option<Arc<Shaping>>, ApiError> {
        let s = Shaping::new(self.presence, self.frequency, &self.bias, vocab).map_err(|e| {
            let param = match e {
                arbor_engine::ShapeError::Penalty(name, _) => name,
                _ => "logit_bias",
            };
            ApiError::invalid_param(param, e.to_string())
        })?;
        Ok((!s.is_neutral()).then(|| Arc::new(s)))
    }
}

impl ScoringFields {
    /// How many alternatives to list per token (`None`: no scores), and
    /// the penalties and biases.
    pub fn check(&self, endpoint: Endpoint) -> Result<(Option<usize>, Shape), ApiError> {
        let top = match (&self.logprobs, endpoint) {
            (None | Some(Value::Null), _) => None,
            (Some(Value::Bool(on)), Endpoint::Chat) => on.then_some(0),
            (Some(v), Endpoint::Completion) if v.is_u64() => v.as_u64().map(|n| n as usize),
            (Some(_), Endpoint::Chat) => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "`logprobs` is true or false on chat completions",
                ));
            }
            (Some(_), Endpoint::Completion) => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "`logprobs` is a count of alternatives (0 to 20) on completions",
                ));
            }
        };
        let top = match (top, self.top_logprobs, endpoint) {
            (_, Some(_), Endpoint::Completion) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "completions give the count in `logprobs`",
                ));
            }
            (_, Some(n), _) if !(0..=MAX_TOP as i64).contains(&n) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    format!("`top_logprobs` must be in [0, {MAX_TOP}], got {n}"),
                ));
            }
            (None, Some(n), _) if n > 0 => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ));
            }
            (Some(_), Some(n), Endpoint::Chat) => Some(n as usize),
            (top, _, _) => top,
        };
        if let Some(n) = top
            && n > MAX_TOP
        {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("at most {MAX_TOP} alternatives per token, got {n}"),
            ));
        }
        let mut bias = Vec::new();
        for (k, &v) in self.logit_bias.iter().flatten() {
            let token = k.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid_param(
                    "logit_bias",
                    format!("`logit_bias` keys are token ids, got `{k}`"),
                )
            })?;
            bias.push((token, v as f32));
        }
        bias.sort_by_key(|b| b.0);
        let shape = Shape {
            presence: self.presence_penalty.unwrap_or(0.0) as f32,
            frequency: self.frequency_penalty.unwrap_or(0.0) as f32,
            bias,
        };
        Ok((top, shape))
    }
}

/// JSON cannot hold −∞ (a token a grammar ruled out): OpenAI's floor.
fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        f64::from(lp)
    } else {
        -9999.0
    }
}

fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    tokenizer
        .token_bytes(id)
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&token_bytes(tokenizer, id)).into_owned()
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
pub fn chat(tokenizer: &Tokenizer, scored: &[Scored]) -> Value {
    let entry = |id: u32, lp: f32| {
        json!({
            "token": token_text(tokenizer, id),
            "logprob": finite(lp),
            "bytes": token_bytes(tokenizer, id),
        })
    };
    let content: Vec<Value> = (scored.iter())
        .map(|s| {
            let mut e = entry(s.token, s.logprob);
            e["top_logprobs"] = s.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// Completions' `logprobs`: parallel lists of tokens, their scores, their
/// alternatives (token text → score) and their offsets in the text.
pub fn completion(tokenizer: &Tokenizer, scored: &[Scored], offset: usize) -> Value {
    let mut at = offset;
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for s in scored {
        let text = token_text(tokenizer, s.token);
        offsets.push(at);
        at += text.len();
        tokens.push(text);
        lps.push(finite(s.logprob));
        let top: serde_json::Map<String, Value> = (s.top.iter())
            .map(|&(t, lp)| (token_text(tokenizer, t), json!(finite(lp))))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// The scores of the tokens whose text reached the client: when a stop
/// sequence cut the answer at byte `sent`, the tokens after the cut go.
pub fn delivered(tokenizer: &Tokenizer, scored: &mut Vec<Scored>, sent: usize) {
    let mut at = 0;
    let keep = scored
        .iter()
        .take_while(|s| {
            let before = at;
            at += token_bytes(tokenizer, s.token).len();
            before < sent
        })
        .count();
    scored.truncate(keep);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> ScoringFields {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn logprobs_take_each_endpoints_shape() {
        let chat = |j: &str| fields(j).check(Endpoint::Chat).map(|c| c.0);
        let text = |j: &str| fields(j).check(Endpoint::Completion).map(|c| c.0);
        assert_eq!(chat(r#"{}"#).unwrap(), None);
        assert_eq!(chat(r#"{"logprobs":false}"#).unwrap(), None);
        assert_eq!(chat(r#"{"logprobs":true}"#).unwrap(), Some(0));
        assert_eq!(
            chat(r#"{"logprobs":true,"top_logprobs":5}"#).unwrap(),
            Some(5)
        );
        assert_eq!(text(r#"{"logprobs":3}"#).unwrap(), Some(3));
        assert_eq!(text(r#"{"logprobs":0}"#).unwrap(), Some(0));
        for (j, param) in [
            (r#"{"logprobs":2}"#, "logprobs"),
            (r#"{"top_logprobs":2}"#, "top_logprobs"),
            (r#"{"logprobs":true,"top_logprobs":21}"#, "top_logprobs"),
        ] {
            assert_eq!(chat(j).unwrap_err().param.as_deref(), Some(param), "{j}");
        }
        for (j, param) in [
            (r#"{"logprobs":true}"#, "logprobs"),
            (r#"{"logprobs":30}"#, "logprobs"),
            (r#"{"logprobs":1,"top_logprobs":1}"#, "top_logprobs"),
        ] {
            assert_eq!(text(j).unwrap_err().param.as_deref(), Some(param), "{j}");
        }
    }

    #[test]
    fn shapes_are_checked() {
        let (_, s) = fields(r#"{"presence_penalty":0.5,"logit_bias":{"7":-100," 3":2}}"#)
            .check(Endpoint::Chat)
            .unwrap();
        assert_eq!(s.bias, vec![(3, 2.0), (7, -100.0)]);
        assert!(s.rule(10).unwrap().is_some());
        assert!(Shape::default().rule(10).unwrap().is_none());
        let e = s.rule(5).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        let (_, s) = fields(r#"{"frequency_penalty":3}"#)
            .check(Endpoint::Chat)
            .unwrap();
        assert_eq!(
            s.rule(10).unwrap_err().param.as_deref(),
            Some("frequency_penalty")
        );
        let e = fields(r#"{"logit_bias":{"x":1}}"#)
            .check(Endpoint::Chat)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
    }
}
