//! Tools in chat prompts: the functions a model may call, its calls, and
//! their results.
//!
//! A template that reads `tools` (Qwen2.5's does) lays all of it out
//! itself: it gets the tool definitions as `tools` and each assistant
//! message's calls as `tool_calls` (`{"type": "function", "function":
//! {"name", "arguments"}}`, the arguments as a JSON object, as Hugging
//! Face's transformers passes them). For a template that does not, the
//! conversation is first rewritten into plain messages in the same
//! `<tool_call>` JSON layout (`lower`): the definitions join the system
//! message, calls become the assistant's text, and results become user
//! turns in `<tool_response>` tags. Either way the model answers a call as
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, which the server
//! parses back.

use minijinja::context;
use minijinja::value::{Serde, Value};

use crate::{ChatMessage, Result, Role, Tokenizer};

/// One call of a tool, as an assistant message holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

impl Tokenizer {
    /// The prompt for `messages` with `tools` (OpenAI's tool objects,
    /// `{"type": "function", "function": {...}}`) available to the model.
    pub fn chat_prompt_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<String> {
        let uses_tools = !tools.is_empty()
            || (messages.iter()).any(|m| m.role == Role::Tool || !m.tool_calls.is_empty());
        match uses_tools && !self.chat.renders_tools() {
            true => self.chat.render(&lower(messages, tools), &[]),
            false => self.chat.render(messages, tools),
        }
    }
}

/// A message as a template sees it: `role` and `content`, and an
/// assistant's `tool_calls` when it has any.
pub(crate) fn message_value(m: &ChatMessage) -> Value {
    let plain = context! { role => m.role.as_str(), content => m.content.as_str() };
    if m.tool_calls.is_empty() {
        return plain;
    }
    let calls: Vec<serde_json::Value> = (m.tool_calls.iter())
        .map(|c| {
            serde_json::json!({
                "type": "function",
                "function": {"name": c.name, "arguments": arguments(c)},
            })
        })
        .collect();
    context! { tool_calls => Value::from(Serde(calls)), ..plain }
}

/// A call's arguments as JSON (its text when that is not JSON).
fn arguments(c: &ToolCall) -> serde_json::Value {
    serde_json::from_str(&c.arguments).unwrap_or_else(|_| c.arguments.clone().into())
}

/// The `<tool_call>` text of one call.
pub fn call_text(c: &ToolCall) -> String {
    let name = python_json(&c.name.clone().into());
    let args = python_json(&arguments(c));
    format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>")
}

/// What the system message gains when tools are defined.
fn tools_text(tools: &[serde_json::Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call the functions below, each given as a JSON schema between \
         <tools></tools> tags:\n<tools>",
    );
    for t in tools {
        out.push('\n');
        out.push_str(&python_json(t));
    }
    out.push_str(
        "\n</tools>\n\nTo call one, reply with a JSON object holding the function's name and \
         its arguments between <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": \
         <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>",
    );
    out
}

/// A conversation with tools as plain system, user and assistant messages.
pub(crate) fn lower(messages: &[ChatMessage], tools: &[serde_json::Value]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let mut rest = messages;
    if !tools.is_empty() {
        let defined = tools_text(tools);
        match messages.first() {
            Some(m) if m.role == Role::System => {
                out.push(ChatMessage::system(format!("{}\n\n{defined}", m.content)));
                rest = &messages[1..];
            }
            _ => out.push(ChatMessage::system(defined)),
        }
    }
    for m in rest {
        match m.role {
            Role::Tool => {
                let result = format!("<tool_response>\n{}\n</tool_response>", m.content);
                // Results of one round of calls share a user turn.
                match out.last_mut() {
                    Some(last)
                        if last.role == Role::User
                            && last.content.ends_with("</tool_response>") =>
                    {
                        last.content.push('\n');
                        last.content.push_str(&result);
                    }
                    _ => out.push(ChatMessage::user(result)),
                }
            }
            _ if !m.tool_calls.is_empty() => {
                let mut text = m.content.clone();
                for c in &m.tool_calls {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&call_text(c));
                }
                out.push(ChatMessage::new(m.role, text));
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// `value` as Python's `json.dumps` writes it (`", "` and `": "`), as
/// templates print JSON; used for the tool layout of templates without one.
pub(crate) fn python_json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonSeparators);
    // Writing a JSON value to memory cannot fail.
    let _ = serde::Serialize::serialize(value, &mut ser);
    String::from_utf8(out).unwrap_or_default()
}

/// Compact JSON with Python's default separators.
pub(crate) struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}
