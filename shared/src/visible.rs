//! Text from a task (a command's output, the model's words, a file name) shown to a person
//! in a terminal. A terminal obeys control characters: a carriage return, an erase-line and a
//! cursor-up can paint `run ls -la` over `curl …/x | sh`; OSC 52 writes the viewer's
//! clipboard; bidirectional overrides reorder what is read. So every human view writes such
//! text through [`visible`], which keeps newlines and tabs and spells out everything else
//! that steers a terminal, so it is seen, not obeyed:
//!
//! - C0 controls and DEL: `\r`, `\x1b`, `\x07`, `\x7f`, …
//! - C1 controls (U+0080 to U+009F, which some terminals take as CSI, OSC, …): `\u009b`, …
//! - Unicode's bidirectional controls (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to
//!   U+2069): `\u202e`, …
//!
//! The last two are written as JSON writes them, and JSON writes no C0 control as it is, so
//! a `--json` answer passed through here means exactly what it did: the CLI writes all its
//! answers through it.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` steers a terminal (or the order text is read in) rather than being shown.
fn hidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every control character but newline and tab written out visibly.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !hidden(c) {
            out.push(c);
            continue;
        }
        let _ = match c {
            '\r' => write!(out, "\\r"),
            '\0'..='\u{7f}' => write!(out, "\\x{:02x}", c as u32),
            // JSON's own escape: a JSON answer passed through here still means the same.
            _ => write!(out, "\\u{:04x}", c as u32),
        };
    }
    Cow::Owned(out)
}

/// [`visible`] over a stream of bytes cut anywhere (a diff as it arrives): a character cut
/// between two pieces is held until the rest of it comes; bytes that are not UTF-8 are shown
/// as U+FFFD, so no lone byte reaches a terminal that would take it as a C1 control.
#[derive(Debug, Default)]
pub struct VisibleStream {
    held: Vec<u8>,
}

impl VisibleStream {
    /// The text to show for `bytes`, following what came before.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        // Keep back a character that may still be incomplete: the last lead byte, when
        // fewer bytes follow it than it announces.
        let mut cut = self.held.len();
        let tail = self.held.len().saturating_sub(3);
        if let Some(i) = (tail..self.held.len())
            .rev()
            .find(|&i| self.held[i] & 0xc0 != 0x80)
        {
            let need = match self.held[i] {
                0xc2..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf4 => 4,
                _ => 1,
            };
            if self.held.len() - i < need {
                cut = i;
            }
        }
        let rest = self.held.split_off(cut);
        let text = visible(&String::from_utf8_lossy(&self.held)).into_owned();
        self.held = rest;
        text
    }

    /// What is left at the end of the stream.
    pub fn finish(&mut self) -> String {
        let text = visible(&String::from_utf8_lossy(&self.held)).into_owned();
        self.held.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_newlines_and_tabs_are_left_as_they_are() {
        let t = "line one\n\tindented — ünïcode ✓\n";
        assert!(matches!(visible(t), Cow::Borrowed(s) if s == t));
    }

    #[test]
    fn every_control_is_written_out() {
        let t = "curl x | sh\r\x1b[2K\x1b[1Arun ls\x07\u{9b}2J\u{202e}txt.exe\x7f\0";
        let v = visible(t);
        assert_eq!(
            v,
            "curl x | sh\\r\\x1b[2K\\x1b[1Arun ls\\x07\\u009b2J\\u202etxt.exe\\x7f\\x00"
        );
        assert!(!v.chars().any(hidden));
    }

    #[test]
    fn json_passed_through_means_the_same() {
        let v = serde_json::json!({"reason": "a\r\x1b[2Kb\u{9b}c\u{202e}d\te\nf"});
        for text in [v.to_string(), serde_json::to_string_pretty(&v).unwrap()] {
            let shown = visible(&text);
            assert!(!shown.chars().any(hidden), "{shown}");
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&shown).unwrap(),
                v
            );
        }
    }

    #[test]
    fn a_stream_cut_inside_a_character_shows_it_whole() {
        let bytes = "a\u{9b}b✓\x1b".as_bytes();
        for cut in 0..=bytes.len() {
            let mut s = VisibleStream::default();
            let mut shown = s.push(&bytes[..cut]);
            shown.push_str(&s.push(&bytes[cut..]));
            shown.push_str(&s.finish());
            assert_eq!(shown, "a\\u009bb✓\\x1b", "cut at {cut}");
        }
        // A byte that is no UTF-8 (a lone 0x9b, CSI to an 8-bit terminal) is not passed on.
        let mut s = VisibleStream::default();
        let shown = s.push(b"x\x9by") + &s.finish();
        assert_eq!(shown, "x\u{fffd}y");
        // A bad byte before a character still coming does not flush that character early.
        let mut s = VisibleStream::default();
        let shown = s.push(b"x\xffy\xe2\x9c") + &s.push(b"\x93") + &s.finish();
        assert_eq!(shown, "x\u{fffd}y✓");
    }
}
