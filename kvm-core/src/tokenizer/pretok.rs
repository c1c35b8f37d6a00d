//! The GPT-2 pre-tokenizer without a regex engine: splits text into the matches of
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! taken leftmost-first, as Oniguruma (inside Hugging Face `tokenizers`) does. The
//! pattern matches every character, so the pieces cover the text with no gaps.

use super::unicode_tables::RUNS;

/// The character classes the pattern distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Other,
    /// `\p{L}`: general categories Lu, Ll, Lt, Lm, Lo.
    Letter,
    /// `\p{N}`: general categories Nd, Nl, No.
    Number,
    /// `\s`: the `White_Space` property.
    Space,
}

/// The class of `c`: an ASCII fast path, else a binary search of the generated runs.
pub(crate) fn class(c: char) -> Class {
    match c {
        'a'..='z' | 'A'..='Z' => Class::Letter,
        '0'..='9' => Class::Number,
        '\t'..='\r' | ' ' => Class::Space,
        '\0'..='\x7f' => Class::Other,
        _ => table_class(c),
    }
}

/// The class of `c` according to the generated table alone.
pub(crate) fn table_class(c: char) -> Class {
    let cp = c as u32;
    let i = RUNS.partition_point(|&w| w >> 11 <= cp);
    let Some(&w) = i.checked_sub(1).and_then(|i| RUNS.get(i)) else {
        return Class::Other;
    };
    let (start, len) = (w >> 11, ((w >> 2) & 0x1ff) + 1);
    if cp - start >= len {
        return Class::Other;
    }
    match w & 3 {
        1 => Class::Letter,
        2 => Class::Number,
        3 => Class::Space,
        _ => Class::Other,
    }
}

/// The pieces of a text, in order.
#[derive(Debug, Clone)]
pub(crate) struct Pieces<'t> {
    rest: &'t str,
}

impl<'t> Pieces<'t> {
    pub(crate) fn new(text: &'t str) -> Self {
        Pieces { rest: text }
    }
}

impl<'t> Iterator for Pieces<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        if self.rest.is_empty() {
            return None;
        }
        let n = piece_len(self.rest);
        let (piece, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        Some(piece)
    }
}

/// Byte length of the match at the start of `s` (non-empty), always a char boundary > 0.
fn piece_len(s: &str) -> usize {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return 0;
    };
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive, as in GPT-2).
    if first == '\'' {
        let b = s.as_bytes();
        match (b.get(1), b.get(2)) {
            (Some(b's' | b't' | b'm' | b'd'), _) => return 2,
            (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => return 3,
            _ => {}
        }
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    let (skip, head) = match (first, chars.next()) {
        (' ', Some(next)) => (1, next),
        _ => (0, first),
    };
    let cls = class(head);
    if cls != Class::Space {
        return skip + run_len(s.get(skip..).unwrap_or(""), cls);
    }
    // `\s+(?!\S)|\s+`: a run of white space reaching the end of the text is taken whole;
    // before a non-space, a run of two or more gives up its last character (which may
    // then lead the next piece as its optional space); a single character is taken alone.
    let mut end = 0;
    let mut last = 0;
    for (i, c) in s.char_indices() {
        if class(c) != Class::Space {
            break;
        }
        last = i;
        end = i + c.len_utf8();
    }
    if end == s.len() || last == 0 {
        end
    } else {
        last
    }
}

/// Byte length of the run of characters of class `cls` at the start of `s`.
fn run_len(s: &str, cls: Class) -> usize {
    s.char_indices().find(|&(_, c)| class(c) != cls).map_or(s.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn split(s: &str) -> Vec<&str> {
        Pieces::new(s).collect()
    }

    #[test]
    fn gpt2_pattern_cases() {
        let cases: &[(&str, &[&str])] = &[
            ("Hello world!", &["Hello", " world", "!"]),
            ("it's we'll they're I'd don't", &["it", "'s", " we", "'ll", " they", "'re", " I", "'d", " don", "'t"]),
            ("IT'S 'S' 's", &["IT", "'", "S", " '", "S", "'", " '", "s"]),
            ("'''s", &["'''", "s"]),
            ("'", &["'"]),
            ("'s", &["'s"]),
            ("'ve'", &["'ve", "'"]),
            ("a   b", &["a", "  ", " b"]),
            ("a   ", &["a", "   "]),
            ("a \n\tb", &["a", " \n", "\t", "b"]),
            ("a\nb", &["a", "\n", "b"]),
            (" \nb", &[" ", "\n", "b"]),
            ("\n\n\n", &["\n\n\n"]),
            ("  !", &[" ", " !"]),
            ("x1y2 34", &["x", "1", "y", "2", " 34"]),
            ("3.14", &["3", ".", "14"]),
            ("naïve café", &["naïve", " café"]),
            ("e\u{301}", &["e", "\u{301}"]),
            ("日本語の テキスト", &["日本語の", " テキスト"]),
            ("🚀🔥 x", &["🚀🔥", " x"]),
            ("\u{a0}a\u{3000}", &["\u{a0}", "a", "\u{3000}"]),
            ("\r\n", &["\r\n"]),
            ("a\r\nb", &["a", "\r", "\n", "b"]),
            ("Ⅻ٣½", &["Ⅻ٣½"]),
        ];
        for (text, want) in cases {
            assert_eq!(split(text), *want, "{text:?}");
        }
    }

    #[test]
    fn ascii_fast_path_agrees_with_table() {
        for b in 0..128u8 {
            assert_eq!(class(b as char), table_class(b as char), "{b:#x}");
        }
    }

    #[test]
    fn classes_beyond_ascii() {
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('ª'), Class::Letter);
        assert_eq!(class('\u{301}'), Class::Other); // Mn, though Rust calls it alphabetic
        assert_eq!(class('\u{345}'), Class::Other); // Other_Alphabetic Mn
        assert_eq!(class('²'), Class::Number);
        assert_eq!(class('\u{85}'), Class::Space);
        assert_eq!(class('\u{200b}'), Class::Other); // zero width space is not White_Space
        assert_eq!(class('\u{10ffff}'), Class::Other);
        assert_eq!(class('\u{2a6df}'), Class::Letter); // last of CJK Extension B
        assert_eq!(class('\u{2a6e0}'), Class::Other);
    }
}
