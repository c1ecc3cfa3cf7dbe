//! The byte-level alphabet of GPT-2 style vocabularies.
//!
//! Each of the 256 byte values is written as one printable character so that
//! tokens can be stored as strings: bytes that are already printable (ASCII
//! `!`..=`~` and Latin-1 `¡`..=`¬`, `®`..=`ÿ`) stand for themselves, and the
//! remaining 68 (control characters, space, DEL, NBSP, soft hyphen) are given
//! the code points 256, 257, ... in byte order. So a space is `Ġ` (U+0120) and
//! a newline `Ċ` (U+010A).

/// Whether byte `b` is written as the character with the same number.
const fn is_self_mapped(b: u32) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `CHAR_TO_BYTE[c]` is the byte written as code point `c`, for the 324
/// code points the alphabet uses; -1 elsewhere.
const CHAR_TO_BYTE: [i16; 324] = {
    let mut table = [-1i16; 324];
    let mut next = 256;
    let mut b = 0;
    while b < 256 {
        if is_self_mapped(b) {
            table[b as usize] = b as i16;
        } else {
            table[next] = b as i16;
            next += 1;
        }
        b += 1;
    }
    table
};

/// Appends the bytes that byte-level token text `s` stands for. Characters
/// outside the alphabet (which a well-formed vocabulary does not contain) are
/// kept as their own UTF-8.
pub(crate) fn decode_into(s: &str, out: &mut Vec<u8>) {
    for c in s.chars() {
        match CHAR_TO_BYTE.get(c as usize) {
            Some(&b) if b >= 0 => out.push(b as u8),
            _ => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// The byte-level text for `bytes` (the inverse of [`decode_into`]).
#[cfg(test)]
pub(crate) fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| {
            let cp = CHAR_TO_BYTE
                .iter()
                .position(|&x| x == b as i16)
                .expect("every byte has a character");
            char::from_u32(cp as u32).expect("alphabet is valid")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        assert_eq!(CHAR_TO_BYTE.iter().filter(|&&b| b >= 0).count(), 256);
        let mut seen = [false; 256];
        for &b in &CHAR_TO_BYTE {
            if b >= 0 {
                assert!(!seen[b as usize]);
                seen[b as usize] = true;
            }
        }
        assert_eq!(encode(b" "), "Ġ");
        assert_eq!(encode(b"\n"), "Ċ");
        assert_eq!(encode(b"\t"), "ĉ");
        assert_eq!(encode(&[0xAD]), "Ń");
        let all: Vec<u8> = (0..=255).collect();
        let mut back = Vec::new();
        decode_into(&encode(&all), &mut back);
        assert_eq!(back, all);
    }
}
