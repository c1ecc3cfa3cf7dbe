//! Chat prompts.
//!
//! GGUF files carry their chat template as Jinja source
//! (`tokenizer.chat_template`). arbor runs that template (see `template`), so
//! any model whose template minijinja compiles gets exactly the prompt format
//! it was trained with. ChatML (`<|im_start|>role\n...<|im_end|>\n`, used by
//! Qwen2/2.5, SmolLM2 and many others) is also rendered by hand, but only as a
//! fallback, when the vocabulary has the ChatML tokens and either
//! - the file has no template, or
//! - its template does not compile but is visibly ChatML; then the default
//!   system message the template inserts when the conversation has none is
//!   read from the template text (e.g. Qwen2.5's "You are Qwen, created by
//!   Alibaba Cloud. You are a helpful assistant.").
//!
//! Any other model without a usable template still loads and generates from
//! plain prompts; only [`crate::Tokenizer::chat_prompt`] fails, with a typed
//! error.

use crate::template::{ChatTemplate, TemplateTokens};
use crate::{Result, TokenizerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result, answering an assistant's tool call.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// An assistant's calls of tools (empty for every other message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<crate::ToolCall>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";

/// How a model's chat prompts are made.
#[derive(Debug)]
pub(crate) enum ChatFormat {
    /// The file's own Jinja template.
    Template(Box<ChatTemplate>),
    /// Hand-written ChatML (the fallback described in the module docs).
    ChatMl {
        /// System message used when the conversation does not start with one.
        default_system: Option<String>,
    },
    /// The file has no template and the vocabulary is not ChatML.
    Missing,
    /// The file's template does not compile; the compiler's message.
    Broken(String),
}

impl ChatFormat {
    /// Compiles the file's template, falling back to ChatML as described in
    /// the module docs. Never fails: a template that cannot be used only
    /// makes chat prompts fail.
    pub(crate) fn detect(
        template: Option<&str>,
        has_chatml_tokens: bool,
        tokens: TemplateTokens,
    ) -> Self {
        match template {
            Some(src) => match ChatTemplate::compile(src, tokens) {
                Ok(t) => Self::Template(Box::new(t)),
                Err(_) if has_chatml_tokens && src.contains(IM_START) && src.contains(IM_END) => {
                    Self::ChatMl {
                        default_system: default_system_message(src),
                    }
                }
                Err(e) => Self::Broken(e.to_string()),
            },
            None if has_chatml_tokens => Self::ChatMl {
                default_system: None,
            },
            None => Self::Missing,
        }
    }

    /// Whether the format lays out tools itself (a template that reads
    /// `tools`); else [`crate::tools`] writes them into plain messages.
    pub(crate) fn renders_tools(&self) -> bool {
        matches!(self, Self::Template(t) if t.renders_tools())
    }

    pub(crate) fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<String> {
        match self {
            Self::Template(t) => t.render(messages, tools),
            Self::ChatMl { default_system } => {
                Ok(render_chatml(default_system.as_deref(), messages))
            }
            Self::Missing => Err(TokenizerError::UnsupportedChatTemplate(
                "the model file has no chat template and its vocabulary is not ChatML".into(),
            )),
            Self::Broken(why) => Err(TokenizerError::ChatTemplate(format!(
                "cannot be compiled: {why}"
            ))),
        }
    }
}

/// ChatML turns for `messages`, preceded by `default_system` when the
/// conversation does not start with a system message, and followed by the
/// assistant's header.
fn render_chatml(default_system: Option<&str>, messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    let turn = |out: &mut String, role: &str, content: &str| {
        out.push_str(IM_START);
        out.push_str(role);
        out.push('\n');
        out.push_str(content);
        out.push_str(IM_END);
        out.push('\n');
    };
    if let Some(sys) = default_system
        && messages.first().map(|m| m.role) != Some(Role::System)
    {
        turn(&mut out, "system", sys);
    }
    for m in messages {
        turn(&mut out, m.role.as_str(), &m.content);
    }
    out.push_str(IM_START);
    out.push_str("assistant\n");
    out
}

/// Finds a fixed system turn written out in a ChatML template: a string
/// literal containing `<|im_start|>system`, a newline, then literal text up to
/// `<|im_end|>`. Places where the system text comes from the conversation
/// (`'<|im_start|>system\n' + messages[0]['content']`) end the literal with a
/// quote before `<|im_end|>` and are skipped.
fn default_system_message(template: &str) -> Option<String> {
    let marker = "<|im_start|>system";
    let mut from = 0;
    while let Some(found) = template[from..].find(marker) {
        let start = from + found + marker.len();
        from = start;
        let after = &template[start..];
        // The newline is either real or a `\n` escape inside the literal.
        let body = if let Some(rest) = after.strip_prefix("\\n") {
            rest
        } else if let Some(rest) = after.strip_prefix('\n') {
            rest
        } else {
            continue;
        };
        let Some(end) = body.find(IM_END) else {
            continue;
        };
        if let Some(text) = unescape_literal(&body[..end]) {
            return Some(text);
        }
    }
    None
}

/// The text of a piece of a Jinja string literal, or `None` if the piece is
/// not entirely inside one literal (it has an unescaped quote or a Jinja
/// delimiter).
fn unescape_literal(s: &str) -> Option<String> {
    if ["{{", "}}", "{%", "%}"].iter().any(|d| s.contains(d)) {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other @ ('\\' | '\'' | '"') => out.push(other),
                _ => return None,
            },
            '\'' | '"' => return None,
            _ => out.push(c),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_escaped_and_raw_defaults() {
        let qwen = r#"{%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a bot; it\'s fine.<|im_end|>\n' }}
    {%- endif %}"#;
        assert_eq!(
            default_system_message(qwen).as_deref(),
            Some("You are a bot; it's fine.")
        );
        let smol = "{{ '<|im_start|>system\nBe nice<|im_end|>\n' }}";
        assert_eq!(default_system_message(smol).as_deref(), Some("Be nice"));
        let none =
            "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' }}";
        assert_eq!(default_system_message(none), None);
    }

    #[test]
    fn chatml_fallback() {
        let none = TemplateTokens::default();
        let f = ChatFormat::detect(None, true, none.clone());
        assert!(matches!(
            f,
            ChatFormat::ChatMl {
                default_system: None
            }
        ));
        let p = f
            .render(
                &[ChatMessage::user("hi"), ChatMessage::assistant("yo")],
                &[],
            )
            .unwrap();
        assert_eq!(
            p,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
        );
        // A ChatML template minijinja cannot compile keeps today's rendering,
        // default system message included.
        let broken = "{% frobnicate %}{{ '<|im_start|>system\\nBe nice<|im_end|>\\n' }}";
        let f = ChatFormat::detect(Some(broken), true, none.clone());
        assert_eq!(
            f.render(&[ChatMessage::user("hi")], &[]).unwrap(),
            "<|im_start|>system\nBe nice<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        // ...but not when the vocabulary lacks the ChatML tokens.
        let f = ChatFormat::detect(Some(broken), false, none.clone());
        assert!(matches!(f, ChatFormat::Broken(_)));
        assert!(matches!(
            ChatFormat::detect(None, false, none).render(&[], &[]),
            Err(TokenizerError::UnsupportedChatTemplate(_))
        ));
    }
}
