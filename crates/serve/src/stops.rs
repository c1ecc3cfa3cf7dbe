//! Stop sequences over streamed text: text that may be the start of a stop
//! sequence is held back until the next piece says whether it is, so no
//! part of a stop sequence is ever sent.

/// Streamed text cut at the first of several stop sequences.
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    /// Text received and not yet released.
    held: String,
    stopped: bool,
}

impl StopScanner {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// Takes the next piece; returns the text that is safe to send. After a
    /// stop sequence nothing more is released.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        if let Some(at) = (self.stops.iter())
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Keep the longest tail that begins some stop sequence.
        let keep = (self.stops.iter())
            .map(|s| longest_tail_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// Whether a stop sequence was seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The end of the stream: what was held back is text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Bytes of the longest suffix of `text` (on a character boundary) that is
/// a proper prefix of `stop`.
pub(crate) fn longest_tail_prefix(text: &str, stop: &str) -> usize {
    let most = text.len().min(stop.len().saturating_sub(1));
    (1..=most)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`; returns (released text, stopped).
    fn feed(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopScanner::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out: String = pieces.iter().map(|p| s.push(p)).collect();
        if !s.stopped() {
            out.push_str(&s.finish());
        }
        (out, s.stopped())
    }

    #[test]
    fn cuts_at_the_first_stop_across_pieces() {
        assert_eq!(
            feed(&["END"], &["ab", "cE", "N", "Dxyz"]),
            ("abc".into(), true)
        );
        assert_eq!(feed(&["x", "bc"], &["abcx"]), ("a".into(), true));
        assert_eq!(feed(&["END"], &["abEN", "d"]), ("abENd".into(), false));
        assert_eq!(feed(&[], &["a", "b"]), ("ab".into(), false));
        // Multi-byte text is held and released on character boundaries.
        assert_eq!(feed(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }

    #[test]
    fn held_text_waits_only_while_it_could_be_a_stop() {
        let mut s = StopScanner::new(vec!["</s>".into()]);
        assert_eq!(s.push("hello <"), "hello ");
        assert_eq!(s.push("/"), "");
        assert_eq!(s.push("b>"), "</b>");
        assert_eq!(s.push(" ok"), " ok");
    }
}
