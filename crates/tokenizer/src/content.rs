//! Chat prompts whose message text stays text.
//!
//! [`Tokenizer::encode`] turns special-token text into the special token,
//! as llama.cpp does, which is right for a prompt its author wrote whole.
//! In a chat, only the template should write control tokens: a user who
//! types `<|im_end|>\n<|im_start|>system\n…` into a message must not open
//! a system turn. [`Tokenizer::encode_chat`] therefore encodes the
//! template's text with special tokens and each message's text without
//! them. To know which characters of the prompt came from which message,
//! the template is rendered a second time with a marker in place of every
//! message's text; the prompt must then be that rendering with the markers
//! replaced by the texts, which holds for templates that copy message text
//! as it is (Qwen2.5's, SmolLM2's, ChatML). A template that rewrites text
//! (trims it, tests it) fails the check and the conversation is refused
//! with [`TokenizerError::SpecialTextInContent`] rather than encoded with
//! the user's control tokens.

use crate::{ChatMessage, Result, Tokenizer, TokenizerError};

/// Private-use characters around a message's index: a template cannot
/// produce them by itself.
const OPEN: char = '\u{F8F0}';
const CLOSE: char = '\u{F8F1}';

/// A part of a rendered prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part<'a> {
    /// Written by the template.
    Template(&'a str),
    /// The text of message `i`.
    Message(usize),
}

impl Tokenizer {
    /// Token ids of the chat prompt for `messages`, each message's text
    /// encoded as the characters it is: special-token text in a message
    /// becomes ordinary tokens, so only the template writes control tokens.
    /// A conversation with no such text encodes exactly as
    /// `encode(&chat_prompt(messages)?)`.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with_tools(messages, &[])
    }

    /// [`encode_chat`](Self::encode_chat) with `tools` available to the
    /// model ([`Tokenizer::chat_prompt_with_tools`]).
    pub fn encode_chat_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
    ) -> Result<Vec<u32>> {
        let text = self.chat_prompt_with_tools(messages, tools)?;
        let Some((first, token)) = (messages.iter().enumerate())
            .find_map(|(i, m)| self.special_text_in(&m.content).map(|t| (i, t)))
        else {
            return self.encode(&text);
        };
        let refuse = || TokenizerError::SpecialTextInContent {
            message: first,
            token: token.to_string(),
        };
        let marked: Vec<ChatMessage> = (messages.iter().enumerate())
            .map(|(i, m)| ChatMessage {
                content: marker(i),
                ..m.clone()
            })
            .collect();
        let skeleton = self.chat_prompt_with_tools(&marked, tools)?;
        let parts = split(&skeleton, messages.len()).ok_or_else(refuse)?;
        let rebuilt: String = (parts.iter())
            .map(|p| match *p {
                Part::Template(t) => t,
                Part::Message(i) => messages[i].content.as_str(),
            })
            .collect();
        if rebuilt != text {
            return Err(refuse());
        }
        let plain = self.plain();
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        for part in parts {
            let (encoder, piece) = match part {
                Part::Template(t) => (&self.inner, t),
                Part::Message(i) => (plain, messages[i].content.as_str()),
            };
            if piece.is_empty() {
                continue;
            }
            let enc = (encoder.encode_fast(piece, false)).map_err(TokenizerError::Backend)?;
            ids.extend_from_slice(enc.get_ids());
        }
        Ok(ids)
    }

    /// Token ids for `text` read as the characters it is: special-token
    /// text becomes ordinary tokens, and no BOS is added (a piece of a
    /// prompt the caller assembles).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let enc = (self.plain().encode_fast(text, false)).map_err(TokenizerError::Backend)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The backend tokenizer with special-token matching off (made on
    /// first use).
    fn plain(&self) -> &tokenizers::Tokenizer {
        self.plain.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// The first special token whose text `content` holds.
    fn special_text_in(&self, content: &str) -> Option<&str> {
        if content.is_empty() {
            return None;
        }
        (self.matched.iter())
            .filter_map(|&id| self.names.get(id))
            .find(|t| !t.is_empty() && content.contains(t))
    }
}

fn marker(i: usize) -> String {
    format!("{OPEN}{i}{CLOSE}")
}

/// `skeleton` cut at the markers of messages `0..n`: each may appear at
/// most once (a template may leave a message out), in order. `None` when a
/// marker repeats or comes out of order (it is then left in a template
/// part).
fn split(skeleton: &str, n: usize) -> Option<Vec<Part<'_>>> {
    let mut parts = Vec::new();
    let mut rest = skeleton;
    for i in 0..n {
        let m = marker(i);
        if let Some(at) = rest.find(&m) {
            parts.push(Part::Template(&rest[..at]));
            parts.push(Part::Message(i));
            rest = &rest[at + m.len()..];
        }
    }
    parts.push(Part::Template(rest));
    let stray = |p: &Part<'_>| matches!(p, Part::Template(t) if t.contains(OPEN));
    match parts.iter().any(stray) {
        true => None,
        false => Some(parts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_split_in_order_and_repeats_are_refused() {
        let s = format!("<a>{}<b>{}<c>", marker(0), marker(1));
        assert_eq!(
            split(&s, 2).unwrap(),
            vec![
                Part::Template("<a>"),
                Part::Message(0),
                Part::Template("<b>"),
                Part::Message(1),
                Part::Template("<c>"),
            ]
        );
        // Message 0 left out by the template.
        let s = format!("<a>{}<c>", marker(1));
        assert_eq!(split(&s, 2).unwrap().len(), 3);
        let s = format!("{}{}", marker(0), marker(0));
        assert!(split(&s, 1).is_none());
        let s = format!("{}{}", marker(1), marker(0));
        assert!(split(&s, 2).is_none());
    }
}
