//! Chat prompts.
//!
//! GGUF files carry their chat template as Jinja source. Rather than run
//! Jinja, arbor recognises the template's family and renders that format
//! directly. Supported: ChatML (`<|im_start|>role\n...<|im_end|>\n`), used by
//! Qwen2/2.5, SmolLM2 and many others, including the default system message a
//! template inserts when the conversation has none (read from the template
//! itself, e.g. Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a
//! helpful assistant.").

use crate::{Result, TokenizerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
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
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
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

/// The chat format recognised for a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChatFormat {
    ChatMl {
        /// System message used when the conversation does not start with one.
        default_system: Option<String>,
    },
    /// No format arbor can render; the reason is reported on use.
    Unsupported(String),
}

impl ChatFormat {
    /// Picks the format from the file's template, or, when the file has none,
    /// from whether the vocabulary has the ChatML tokens.
    pub(crate) fn detect(template: Option<&str>, has_chatml_tokens: bool) -> Self {
        match template {
            Some(t) if t.contains(IM_START) && t.contains(IM_END) => Self::ChatMl {
                default_system: default_system_message(t),
            },
            Some(_) => Self::Unsupported(
                "the model's chat template is not ChatML, the only format arbor renders".into(),
            ),
            None if has_chatml_tokens => Self::ChatMl {
                default_system: None,
            },
            None => Self::Unsupported("the model file has no chat template".into()),
        }
    }

    pub(crate) fn render(&self, messages: &[crate::ChatMessage]) -> Result<String> {
        match self {
            Self::Unsupported(why) => Err(TokenizerError::UnsupportedChatTemplate(why.clone())),
            Self::ChatMl { default_system } => {
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
                Ok(out)
            }
        }
    }
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
    fn chatml_rendering() {
        let f = ChatFormat::detect(Some("<|im_start|><|im_end|>"), true);
        assert_eq!(
            f,
            ChatFormat::ChatMl {
                default_system: None
            }
        );
        let p = f
            .render(&[ChatMessage::user("hi"), ChatMessage::assistant("yo")])
            .unwrap();
        assert_eq!(
            p,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(matches!(
            ChatFormat::detect(Some("{{ bos_token }}[INST]"), false).render(&[]),
            Err(TokenizerError::UnsupportedChatTemplate(_))
        ));
        assert!(ChatFormat::detect(None, false).render(&[]).is_err());
    }
}
