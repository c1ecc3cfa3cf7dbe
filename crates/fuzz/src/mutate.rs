//! Byte-level mutations, the kind AFL and libFuzzer stack: bit flips,
//! interesting integers at any offset and width, inserted, deleted and
//! duplicated ranges, dictionary words, numbers rewritten in text, and
//! splices of two inputs.

use crate::Rng;

/// Applies one to `max_stack` mutations to `input`, keeping it at most
/// `max_len` bytes. `other` is a second corpus input to splice with;
/// `dictionary` holds words of the input's language (keywords, keys,
/// syntax) to insert or write over.
pub fn mutate(
    rng: &mut Rng,
    input: &mut Vec<u8>,
    other: &[u8],
    dictionary: &[Vec<u8>],
    max_len: usize,
    max_stack: usize,
) {
    for _ in 0..rng.range(1, max_stack.max(1)) {
        mutate_once(rng, input, other, dictionary);
    }
    input.truncate(max_len);
}

fn mutate_once(rng: &mut Rng, b: &mut Vec<u8>, other: &[u8], dictionary: &[Vec<u8>]) {
    let len = b.len();
    match rng.below(13) {
        // Flip one bit.
        0 if len > 0 => {
            let i = rng.below(len);
            b[i] ^= 1 << rng.below(8);
        }
        // Set one byte to a boundary value.
        1 if len > 0 => {
            let i = rng.below(len);
            b[i] = *rng.pick(&[0u8, 1, 0x7f, 0x80, 0xff, b'0', b'"', b'{', b'%']);
        }
        // Add or subtract a little from one byte.
        2 if len > 0 => {
            let i = rng.below(len);
            let d = rng.range(1, 35) as u8;
            b[i] = if rng.one_in(2) {
                b[i].wrapping_add(d)
            } else {
                b[i].wrapping_sub(d)
            };
        }
        // An interesting little-endian integer of 1, 2, 4 or 8 bytes.
        3 if len > 0 => {
            let width = *rng.pick(&[1usize, 2, 4, 8]);
            let v = rng.interesting_u64().to_le_bytes();
            let at = rng.below(len);
            let n = width.min(len - at);
            b[at..at + n].copy_from_slice(&v[..n]);
        }
        // Delete a range.
        4 if len > 0 => {
            let at = rng.below(len);
            let n = rng.range(1, (len - at).min(64));
            b.drain(at..at + n);
        }
        // Duplicate a range somewhere else.
        5 if len > 0 => {
            let at = rng.below(len);
            let n = rng.range(1, (len - at).min(128));
            let chunk = b[at..at + n].to_vec();
            let to = rng.below(len + 1);
            b.splice(to..to, chunk);
        }
        // Insert random bytes.
        6 => {
            let to = rng.below(len + 1);
            let n = rng.range(1, 16);
            let noise = rng.bytes(n);
            b.splice(to..to, noise);
        }
        // Insert a dictionary word.
        7 | 8 if !dictionary.is_empty() => {
            let word = rng.pick(dictionary).clone();
            let to = rng.below(len + 1);
            b.splice(to..to, word);
        }
        // Write a dictionary word over what is there.
        9 if !dictionary.is_empty() && len > 0 => {
            let word = rng.pick(dictionary);
            let at = rng.below(len);
            let n = word.len().min(len - at);
            b[at..at + n].copy_from_slice(&word[..n]);
        }
        // Rewrite a decimal number in text (JSON, templates).
        10 => rewrite_number(rng, b),
        // Splice: this input's head with the other's tail.
        11 if !other.is_empty() => {
            let keep = rng.below(len + 1);
            let from = rng.below(other.len());
            b.truncate(keep);
            b.extend_from_slice(&other[from..]);
        }
        // Cut the end off.
        12 if len > 0 => b.truncate(rng.below(len)),
        // The chosen mutation did not apply (empty input, no dictionary):
        // fall back to inserting bytes, which always does.
        _ => {
            let to = rng.below(len + 1);
            let byte = rng.next_u64() as u8;
            b.insert(to, byte);
        }
    }
}

/// Numbers that break number handling when written as text.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "255",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "1e309",
    "-1e309",
    "1e-400",
    "0.5",
    "1.0000000000000002",
    "3.4028236e38",
    "100000000000000000000000000000",
];

/// Replaces a run of ASCII digits (or, when there is none, a random spot)
/// with one of [`NUMBERS`].
fn rewrite_number(rng: &mut Rng, b: &mut Vec<u8>) {
    let digits: Vec<usize> = (0..b.len()).filter(|&i| b[i].is_ascii_digit()).collect();
    let number = rng.pick(NUMBERS).as_bytes().to_vec();
    if digits.is_empty() {
        let to = rng.below(b.len() + 1);
        b.splice(to..to, number);
        return;
    }
    let start = *rng.pick(&digits);
    let mut end = start;
    while end < b.len() && (b[end].is_ascii_digit() || b".eE-+".contains(&b[end])) {
        end += 1;
    }
    b.splice(start..end, number);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_change_inputs_and_respect_the_length_cap() {
        let mut rng = Rng::new(3);
        let seed = b"{\"max_tokens\": 16, \"model\": \"m\"}".to_vec();
        let dict = vec![b"null".to_vec(), b"[".to_vec()];
        let mut changed = 0;
        for _ in 0..2000 {
            let mut x = seed.clone();
            mutate(&mut rng, &mut x, b"other", &dict, 40, 4);
            assert!(x.len() <= 40);
            changed += usize::from(x != seed);
        }
        // A few mutations can undo themselves (a flip and a flip back).
        assert!(changed > 1900, "{changed}");
    }

    #[test]
    fn empty_inputs_grow() {
        let mut rng = Rng::new(5);
        for _ in 0..100 {
            let mut x = Vec::new();
            mutate(&mut rng, &mut x, &[], &[], 64, 1);
            // Every mutation of an empty input inserts something.
            assert!(!x.is_empty());
        }
    }

    #[test]
    fn numbers_in_text_are_rewritten() {
        let mut rng = Rng::new(9);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut x = b"{\"n\": 12}".to_vec();
            rewrite_number(&mut rng, &mut x);
            let s = String::from_utf8(x).unwrap();
            assert!(s.starts_with("{\"n\": ") && s.ends_with('}'), "{s}");
            seen.insert(s);
        }
        assert!(seen.len() > 10, "{seen:?}");
    }
}
