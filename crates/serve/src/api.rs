//! The request bodies of the OpenAI endpoints arbor serves, parsed and
//! checked into what one generation needs (`worker::Job`). Which fields
//! are served at all is [`crate::fields`]' list; fields arbor honours are
//! checked here for type and range, each failure a 400 naming the field.

use arbor_engine::slo::{OnMiss, Slo};
use arbor_engine::{ChatMessage, Role, SamplingParams};
use serde::Deserialize;

use crate::error::ApiError;

/// `stop`: one string or up to four.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `content`: a string, or parts of which the text ones are joined.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's earlier calls, sent back with the conversation.
    #[serde(default)]
    pub tool_calls: Option<Vec<MessageCall>>,
    /// Which call a `tool` message answers (read, not rendered: templates
    /// pair results with calls by order).
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageCall {
    #[serde(default)]
    pub id: Option<String>,
    pub function: CallFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CallFunction {
    pub name: String,
    /// JSON text of an object.
    pub arguments: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// arbor's own per-request settings (`"arbor": {...}` in the body; the
/// official clients send it through `extra_body`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArborOptions {
    /// A strategy name (`tree`, `chain`, `autoregressive`…) for this
    /// request instead of the server's.
    #[serde(default)]
    pub strategy: Option<String>,
    /// Stream the draft's provisional text and its rollbacks in an `arbor`
    /// field of the chunks (never as content).
    #[serde(default)]
    pub provisional: Option<bool>,
    /// A latency objective for this request (an elastic model's server).
    #[serde(default)]
    pub slo: Option<SloOptions>,
}

/// `"arbor": {"slo": {"ttft": 0.5, "tpot": 0.8}}`: fractions of the full
/// model's time to first token and per output token (a part left out is
/// 1); `"refuse": true` turns a request no pair is predicted to meet away
/// instead of serving it with the fastest pair.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloOptions {
    #[serde(default)]
    pub ttft: Option<f64>,
    #[serde(default)]
    pub tpot: Option<f64>,
    #[serde(default)]
    pub refuse: Option<bool>,
}

/// The fields `/v1/chat/completions` and `/v1/completions` share.
#[derive(Debug, Clone, Deserialize)]
pub struct Common {
    pub model: String,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<i64>,
    #[serde(default)]
    pub arbor: Option<ArborOptions>,
    #[serde(flatten)]
    pub scoring: crate::scoring::ScoringFields,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    pub response_format: Option<serde_json::Value>,
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt`: one string (or a list holding one: `n` and batches are 1).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Text after the answer: the answer fills the middle.
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// Raw text, tokenized as a completion prompt is.
    #[serde(default)]
    pub content: Option<String>,
    /// Or chat messages, rendered with the model's template first.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
}

/// Parses a JSON body, a 400 with serde's reason when it does not fit.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ApiError::invalid(format!("the body is not valid JSON: {e}"))
        }
        _ => ApiError::invalid(format!("the request does not fit the API: {e}")),
    })
}

/// Parses a generation request: its fields checked against what arbor
/// serves ([`crate::fields`]), then its types.
pub fn parse_generation<T: serde::de::DeserializeOwned>(
    body: &[u8],
    endpoint: crate::fields::Endpoint,
) -> Result<T, ApiError> {
    let value: serde_json::Value = parse(body)?;
    crate::fields::check(&value, endpoint)?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("the request does not fit the API: {e}")))
}

/// A seed for a request that gives none: different for every request, and
/// within `int64` (the API's type), so sending it back reproduces the text.
fn fresh_seed() -> u64 {
    random_u64() & i64::MAX as u64
}

/// 64 random bits, different on every call (std's per-process hash keys,
/// which each new `RandomState` steps, mixed with the time).
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// What one generation runs with, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `None`: the server's default.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub strategy: Option<String>,
    pub provisional: bool,
    pub slo: Option<(Slo, OnMiss)>,
    /// Alternatives listed with each token's score (`None`: no scores).
    pub logprobs: Option<usize>,
    /// Penalties and biases.
    pub shape: crate::scoring::Shape,
}

impl Common {
    /// Checks every field arbor honours (`logprobs` differs by endpoint).
    pub fn settings(&self, endpoint: crate::fields::Endpoint) -> Result<Settings, ApiError> {
        let (logprobs, shape) = self.scoring.check(endpoint)?;
        let max = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => Some(("max_completion_tokens", n)),
            (None, Some(n)) => Some(("max_tokens", n)),
            (None, None) => None,
        };
        let max_tokens = match max {
            Some((field, n)) if n < 1 => {
                return Err(ApiError::invalid_param(
                    field,
                    format!("`{field}` must be at least 1, got {n}"),
                ));
            }
            Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            None => None,
        };
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("`temperature` must be in [0, 2], got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("`top_p` must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
            Some(k) => {
                return Err(ApiError::invalid_param(
                    "top_k",
                    format!("`top_k` must be 0 (off) or more, got {k}"),
                ));
            }
        };
        let min_p = self.min_p.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&min_p) {
            return Err(ApiError::invalid_param(
                "min_p",
                format!("`min_p` must be in [0, 1], got {min_p}"),
            ));
        }
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::invalid_param(
                "n",
                format!("`n` must be 1 (one choice per request), got {n}"),
            ));
        }
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid_param(
                "stop",
                "`stop` holds at most 4 non-empty strings",
            ));
        }
        let arbor = self.arbor.clone().unwrap_or_default();
        let slo = match &arbor.slo {
            None => None,
            Some(o) => {
                let slo = Slo::new(o.ttft.unwrap_or(1.0), o.tpot.unwrap_or(1.0))
                    .map_err(|e| ApiError::invalid_param("arbor.slo", e.to_string()))?;
                let on_miss = match o.refuse {
                    Some(true) => OnMiss::Refuse,
                    _ => OnMiss::Fastest,
                };
                Some((slo, on_miss))
            }
        };
        Ok(Settings {
            max_tokens,
            sampling: SamplingParams {
                temperature: temperature as f32,
                top_p: top_p as f32,
                top_k,
                min_p: min_p as f32,
                seed: self.seed.map_or_else(fresh_seed, |s| s as u64),
            },
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: (self.stream_options.as_ref())
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            strategy: arbor.strategy,
            provisional: arbor.provisional.unwrap_or(false),
            slo,
            logprobs,
            shape,
        })
    }
}

/// Chat messages for the template: roles checked, text parts joined.
pub fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}].role"),
                        format!(
                            "role `{other}` is not one arbor serves (system, developer, user, \
                             assistant, tool)"
                        ),
                    ));
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    if let Some(p) = parts.iter().find(|p| p.kind != "text") {
                        return Err(ApiError::invalid_param(
                            &format!("messages[{i}].content"),
                            format!("content parts of type `{}` are not supported", p.kind),
                        ));
                    }
                    parts.iter().filter_map(|p| p.text.as_deref()).collect()
                }
            };
            let mut tool_calls = Vec::new();
            for (j, c) in m.tool_calls.iter().flatten().enumerate() {
                let args = serde_json::from_str::<serde_json::Value>(&c.function.arguments);
                if !args.is_ok_and(|a| a.is_object()) {
                    return Err(ApiError::invalid_param(
                        &format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        "a call's `arguments` is the JSON text of an object",
                    ));
                }
                tool_calls.push(arbor_engine::ToolCall {
                    name: c.function.name.clone(),
                    arguments: c.function.arguments.clone(),
                });
            }
            if !tool_calls.is_empty() && role != Role::Assistant {
                return Err(ApiError::invalid_param(
                    &format!("messages[{i}].tool_calls"),
                    "only assistant messages hold tool calls",
                ));
            }
            Ok(ChatMessage {
                role,
                content,
                tool_calls,
            })
        })
        .collect()
}

/// The one prompt of a completion request.
pub fn one_prompt(p: &Prompt) -> Result<String, ApiError> {
    match p {
        Prompt::One(s) => Ok(s.clone()),
        Prompt::Many(v) if v.len() == 1 => Ok(v[0].clone()),
        Prompt::Many(v) => Err(ApiError::invalid_param(
            "prompt",
            format!("`prompt` must be one string (got {} of them)", v.len()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(json: &str) -> Result<Settings, ApiError> {
        parse::<Common>(json.as_bytes())?.settings(crate::fields::Endpoint::Chat)
    }

    #[test]
    fn settings_are_checked_field_by_field() {
        let s = common(r#"{"model":"m","max_tokens":5,"temperature":0,"stop":"x"}"#).unwrap();
        assert_eq!(s.max_tokens, Some(5));
        assert_eq!(s.sampling.temperature, 0.0);
        assert_eq!(s.stop, vec!["x".to_string()]);
        let s = common(r#"{"model":"m","max_completion_tokens":7,"max_tokens":3}"#).unwrap();
        assert_eq!(s.max_tokens, Some(7));
        let s = common(r#"{"model":"m","top_k":40,"min_p":0.05,"seed":9}"#).unwrap();
        assert_eq!((s.sampling.top_k, s.sampling.min_p), (40, 0.05));
        assert_eq!(s.sampling.seed, 9);
        // No seed: each request draws its own.
        let seeds: std::collections::HashSet<u64> = (0..8)
            .map(|_| common(r#"{"model":"m"}"#).unwrap().sampling.seed)
            .collect();
        assert_eq!(seeds.len(), 8);
        for (body, param) in [
            (r#"{"model":"m","max_tokens":0}"#, "max_tokens"),
            (
                r#"{"model":"m","max_completion_tokens":-2}"#,
                "max_completion_tokens",
            ),
            (r#"{"model":"m","temperature":2.5}"#, "temperature"),
            (r#"{"model":"m","top_p":0}"#, "top_p"),
            (r#"{"model":"m","n":2}"#, "n"),
            (r#"{"model":"m","top_k":-1}"#, "top_k"),
            (r#"{"model":"m","min_p":1.5}"#, "min_p"),
            (r#"{"model":"m","stop":["a","b","c","d","e"]}"#, "stop"),
        ] {
            let e = common(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status, 400);
        }
    }

    #[test]
    fn malformed_bodies_are_400s_with_reasons() {
        let e = parse::<ChatRequest>(b"{not json").unwrap_err();
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"model":"m"}"#).unwrap_err();
        assert!(e.message.contains("messages"), "{}", e.message);
        let e = parse::<ChatRequest>(br#"{"model":"m","messages":[],"temperature":"hot"}"#)
            .unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse::<Common>(br#"{"model":"m","arbor":{"strategy":"tree","x":1}}"#).unwrap_err();
        assert!(e.message.contains("unknown field"), "{}", e.message);
    }

    #[test]
    fn messages_need_known_roles_and_text() {
        let m: Vec<Message> = serde_json::from_str(
            r#"[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}]"#,
        )
        .unwrap();
        let c = chat_messages(&m).unwrap();
        assert_eq!(c[1].content, "hi there");
        assert_eq!(c[0].role, Role::System);
        assert!(chat_messages(&[]).is_err());
        let bad: Vec<Message> =
            serde_json::from_str(r#"[{"role":"wizard","content":"x"}]"#).unwrap();
        assert_eq!(
            chat_messages(&bad).unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
    }
}
