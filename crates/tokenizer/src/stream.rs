//! Incremental decoding of generated tokens.

use crate::{Result, Tokenizer};

/// Turns ids into text one at a time, as they are generated.
///
/// A token can end in the middle of a UTF-8 character (emoji and CJK text are
/// often split over several byte tokens), so bytes that may still become a
/// character are held back until the following tokens complete them. Bytes
/// that can never become valid UTF-8 are emitted as U+FFFD at once, exactly
/// where [`Tokenizer::decode`] would put them: the concatenation of every
/// [`push`](Self::push) and the final [`finish`](Self::finish) equals
/// `decode` of all the ids.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an unfinished character (at most 3).
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let bytes = self.tokenizer.token_bytes(id)?;
        if self.pending.is_empty() {
            // Common case: no copy of the bytes needed unless a character is
            // left unfinished.
            let (text, rest) = complete_prefix(bytes);
            self.pending.extend_from_slice(rest);
            return Ok(text);
        }
        self.pending.extend_from_slice(bytes);
        let buf = std::mem::take(&mut self.pending);
        let (text, rest) = complete_prefix(&buf);
        self.pending.extend_from_slice(rest);
        Ok(text)
    }

    /// Ends the stream: whatever is still held back (an unfinished character)
    /// comes out as U+FFFD. The decoder is empty and reusable afterwards.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Whether bytes are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// Splits `bytes` into the text that is already determined and a trailing
/// incomplete (but so far valid) UTF-8 sequence. Invalid bytes become U+FFFD
/// following the same rules as `String::from_utf8_lossy`.
fn complete_prefix(bytes: &[u8]) -> (String, &[u8]) {
    let mut out = String::new();
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return (out, &[]);
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).expect("validated prefix"));
                match e.error_len() {
                    // The input ends inside a character that may still be
                    // completed by later bytes.
                    None => return (out, bad),
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &bad[n..];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::complete_prefix;

    #[test]
    fn holds_back_only_incomplete_tails() {
        let rocket = "🚀".as_bytes();
        assert_eq!(complete_prefix(b"ab"), ("ab".into(), &b""[..]));
        assert_eq!(complete_prefix(&rocket[..2]), (String::new(), &rocket[..2]));
        let mut v = b"x".to_vec();
        v.extend_from_slice(&rocket[..3]);
        assert_eq!(complete_prefix(&v), ("x".into(), &rocket[..3]));
        // A lone continuation byte can never be completed.
        assert_eq!(
            complete_prefix(&[0x80, b'a']),
            ("\u{FFFD}a".into(), &b""[..])
        );
        // A truncated character followed by something else is invalid too.
        let mut w = rocket[..2].to_vec();
        w.push(b'z');
        assert_eq!(complete_prefix(&w), ("\u{FFFD}z".into(), &b""[..]));
    }
}
