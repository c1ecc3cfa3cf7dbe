//! Tool calling in OpenAI's shape over the model's own `<tool_call>` JSON.
//!
//! A request's `tools` go to the chat template (or to the tokenizer's own
//! layout for templates without tools: `arbor_tokenizer::tools`);
//! `tool_choice` decides what the model may do: `none` renders no tools,
//! `auto` lets it choose, `required` starts its answer with `<tool_call>`
//! and a named function starts it with that call's name, so the model
//! continues with the arguments. The answer is then read back
//! ([`Calls`]): text before the first `<tool_call>` is content, each
//! `<tool_call>{"name", "arguments"}</tool_call>` block is a call, and an
//! answer whose blocks do not parse is returned as plain content.

use serde_json::{Value, json};

use crate::error::ApiError;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// What a request asked of tools, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolRequest {
    /// The definitions the template renders (empty: none).
    pub tools: Vec<Value>,
    /// Text the model's answer is made to start with (its own tokens are
    /// the continuation); `None`: the answer is not read for calls.
    pub prefix: Option<String>,
    /// A call the answer must be: what its rest must match.
    pub force: Option<Force>,
}

/// The call `tool_choice` forces, for the grammar of the answer's rest.
#[derive(Debug, Clone, PartialEq)]
pub enum Force {
    /// `required`: `{"name": one of the tools, "arguments": its schema}`.
    Any(Value),
    /// A named function: its arguments' schema, then `}`.
    Named(Option<Value>),
}

impl ToolRequest {
    /// The JSON schema of a call of any of `tools`.
    fn any_call(tools: &[Value]) -> Value {
        let calls: Vec<Value> = (tools.iter())
            .map(|t| {
                let params = match &t["function"]["parameters"] {
                    Value::Null => json!({"type": "object"}),
                    p => p.clone(),
                };
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t["function"]["name"]}, "arguments": params},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        json!({"anyOf": calls})
    }
}

/// Checks `tools` and `tool_choice`.
pub fn request(tools: Option<&[Value]>, choice: Option<&Value>) -> Result<ToolRequest, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let name = (t["type"] == "function")
            .then(|| t["function"]["name"].as_str())
            .flatten()
            .filter(|n| valid_name(n));
        let Some(name) = name else {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}]"),
                "a tool is `{\"type\": \"function\", \"function\": {\"name\": …}}` with a name \
                 of 1 to 64 letters, digits, `_` or `-`",
            ));
        };
        let parameters = &t["function"]["parameters"];
        if !(parameters.is_null() || parameters.is_object()) {
            return Err(ApiError::invalid_param(
                &format!("tools[{i}].function.parameters"),
                "`parameters` is a JSON schema object",
            ));
        }
        names.push(name.to_string());
    }
    let choice = match choice {
        None | Some(Value::Null) => "auto",
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => s,
        Some(v) if v["type"] == "function" && v["function"]["name"].is_string() => {
            let name = v["function"]["name"].as_str().unwrap_or_default();
            if !names.iter().any(|n| n == name) {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!("`tool_choice` names `{name}`, which is not one of `tools`"),
                ));
            }
            // The call's start in the layout the model was shown (names
            // need no escaping: `valid_name`).
            let tool = tools.iter().find(|t| t["function"]["name"] == name);
            let params = tool
                .map(|t| &t["function"]["parameters"])
                .filter(|p| p.is_object());
            return Ok(ToolRequest {
                tools: tools.to_vec(),
                prefix: Some(format!("{OPEN}\n{{\"name\": \"{name}\", \"arguments\": ")),
                force: Some(Force::Named(params.cloned())),
            });
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "`tool_choice` is \"none\", \"auto\", \"required\" or {\"type\": \"function\", \
                 \"function\": {\"name\": …}}",
            ));
        }
    };
    if tools.is_empty() {
        return match choice {
            "required" => Err(ApiError::invalid_param(
                "tool_choice",
                "`tool_choice` is \"required\" but the request has no `tools`",
            )),
            _ => Ok(ToolRequest::default()),
        };
    }
    Ok(match choice {
        "none" => ToolRequest::default(),
        "required" => ToolRequest {
            tools: tools.to_vec(),
            prefix: Some(format!("{OPEN}\n")),
            force: Some(Force::Any(ToolRequest::any_call(tools))),
        },
        _ => ToolRequest {
            tools: tools.to_vec(),
            prefix: Some(String::new()),
            force: None,
        },
    })
}

/// OpenAI's rule for function names: 1 to 64 of `a-z A-Z 0-9 _ -`.
fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// One call read from the answer, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// JSON text of the arguments (an object).
    pub arguments: String,
}

impl Call {
    pub fn json(&self, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = i.into();
        }
        v
    }
}

/// Reads an answer for calls as it arrives: text before the first
/// `<tool_call>` passes on as content (less a tail that could be the
/// start of the tag); everything from the tag on is held until the end.
/// An answer that starts as a bare JSON object or a ```json block is held
/// too: some models (Qwen2.5-Coder among them) answer a call that way.
#[derive(Debug, Default)]
pub struct Calls {
    pending: String,
    held: Option<String>,
    /// Content has gone out (a bare call can no longer start).
    spoke: bool,
}

/// How a bare call may start.
const FENCE: &str = "```json";

impl Calls {
    /// `prefix`: what the answer was made to start with.
    pub fn new(prefix: &str) -> Self {
        let mut c = Self::default();
        c.push(prefix);
        c
    }

    /// The content `text` lets out.
    pub fn push(&mut self, text: &str) -> String {
        if let Some(h) = &mut self.held {
            h.push_str(text);
            return String::new();
        }
        self.pending.push_str(text);
        if !self.spoke {
            let start = self.pending.trim_start();
            if start.starts_with('{') || start.starts_with(FENCE) {
                self.held = Some(std::mem::take(&mut self.pending));
                return String::new();
            }
            if FENCE.starts_with(start) || OPEN.starts_with(start) {
                return String::new(); // undecided
            }
        }
        if let Some(at) = self.pending.find(OPEN) {
            self.held = Some(self.pending[at..].to_string());
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        // Keep back the longest tail that could still become the tag.
        let keep = crate::stops::longest_tail_prefix(&self.pending, OPEN);
        let out = self.pending[..self.pending.len() - keep].to_string();
        self.pending.drain(..self.pending.len() - keep);
        self.spoke |= !out.is_empty();
        out
    }

    /// At the end: the calls, and content still to send (the held text
    /// itself when its blocks do not parse).
    pub fn finish(self) -> (Vec<Call>, String) {
        let Some(held) = self.held else {
            return (vec![], self.pending);
        };
        match parse(&held).or_else(|| parse_bare(&held)) {
            Some(calls) => (calls, String::new()),
            None => (vec![], held),
        }
    }
}

/// A whole answer that is one call object (or a list of them), bare or in
/// a ```json block.
fn parse_bare(text: &str) -> Option<Vec<Call>> {
    let t = text.trim();
    let t = match t.strip_prefix(FENCE) {
        Some(inner) => inner.trim().strip_suffix("```")?.trim(),
        None => t,
    };
    let v: Value = serde_json::from_str(t).ok()?;
    let items = match v {
        Value::Array(items) => items,
        one => vec![one],
    };
    let calls: Option<Vec<Call>> = items.iter().map(call).collect();
    calls.filter(|c| !c.is_empty())
}

/// `<tool_call>{…}</tool_call>` blocks, possibly separated by whitespace;
/// the last may lack its closing tag (the answer ended there).
fn parse(text: &str) -> Option<Vec<Call>> {
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let body = rest.strip_prefix(OPEN)?;
        let (inner, after) = match body.find(CLOSE) {
            Some(at) => (&body[..at], &body[at + CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        calls.push(call(&v)?);
        rest = after.trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// `{"name": …, "arguments": {…}}` (arguments also as JSON text).
fn call(v: &Value) -> Option<Call> {
    let name = v["name"].as_str().filter(|n| valid_name(n))?;
    let arguments = match &v["arguments"] {
        Value::Object(_) => v["arguments"].to_string(),
        Value::String(s) if serde_json::from_str::<Value>(s).is_ok_and(|a| a.is_object()) => {
            s.clone()
        }
        Value::Null => "{}".into(),
        _ => return None,
    };
    Some(Call {
        id: call_id(),
        name: name.to_string(),
        arguments,
    })
}

/// `call_` and 24 hex digits, different for every call.
fn call_id() -> String {
    let (a, b) = (crate::api::random_u64(), crate::api::random_u64());
    format!("call_{a:016x}{:08x}", b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object"}}}),
        ]
    }

    #[test]
    fn choices_set_the_prefix() {
        let t = weather();
        assert_eq!(request(Some(&t), None).unwrap().prefix.as_deref(), Some(""));
        assert_eq!(
            request(Some(&t), Some(&json!("none"))).unwrap(),
            ToolRequest::default()
        );
        assert_eq!(
            request(Some(&t), Some(&json!("required")))
                .unwrap()
                .prefix
                .as_deref(),
            Some("<tool_call>\n")
        );
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            request(Some(&t), Some(&named)).unwrap().prefix.as_deref(),
            Some("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ")
        );
        let other = json!({"type": "function", "function": {"name": "launch"}});
        for (tools, choice, param) in [
            (Some(&t[..]), Some(&other), "tool_choice"),
            (None, Some(&json!("required")), "tool_choice"),
            (Some(&t[..]), Some(&json!("always")), "tool_choice"),
            (Some(&[json!({"type": "function"})][..]), None, "tools[0]"),
        ] {
            let e = request(tools, choice).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param));
        }
    }

    #[test]
    fn answers_are_read_for_calls_in_any_pieces() {
        let answer = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                      {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \
                      \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        for step in [1, 2, 5, 300] {
            let mut c = Calls::new("");
            let mut content = String::new();
            let chars: Vec<char> = answer.chars().collect();
            for piece in chars.chunks(step) {
                content.push_str(&c.push(&piece.iter().collect::<String>()));
            }
            let (calls, rest) = c.finish();
            assert_eq!(content + &rest, "Let me look.");
            assert_eq!(calls.len(), 2);
            assert_eq!(calls[1].arguments, r#"{"city":"Oslo"}"#);
            assert_ne!(calls[0].id, calls[1].id);
        }
        // A forced prefix, and an answer cut before its closing tag.
        let mut c = Calls::new("<tool_call>\n{\"name\": \"f\", \"arguments\": ");
        assert_eq!(c.push("{\"x\": 1}}"), "");
        let (calls, rest) = c.finish();
        assert_eq!((calls[0].name.as_str(), rest.as_str()), ("f", ""));
        // Broken JSON comes back as content, and plain text stays text.
        let mut c = Calls::new("");
        assert_eq!(c.push("<tool_call>{\"name\": "), "");
        assert_eq!(c.finish(), (vec![], "<tool_call>{\"name\": ".into()));
        let mut c = Calls::new("");
        assert_eq!(c.push("a <tool"), "a ");
        assert_eq!(c.push("s> b"), "<tools> b");
        assert_eq!(c.finish(), (vec![], String::new()));
        // A bare call in a ```json block; a ```rust block is content.
        let mut c = Calls::new("");
        for piece in ["``", "`json\n{\"name\": \"f\",", " \"arguments\": {}}\n```"] {
            assert_eq!(c.push(piece), "");
        }
        let (calls, rest) = c.finish();
        assert_eq!((calls.len(), rest.as_str()), (1, ""));
        let mut c = Calls::new("");
        assert_eq!(c.push("``"), "");
        assert_eq!(c.push("`rust\nfn main() {}"), "```rust\nfn main() {}");
        // JSON that is not a call is content.
        let mut c = Calls::new("");
        assert_eq!(c.push("{\"a\": 1}"), "");
        assert_eq!(c.finish(), (vec![], "{\"a\": 1}".into()));
    }
}
