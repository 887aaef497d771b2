//! Text cut to size for the model and for people (head and tail, with what was cut said),
//! and a file's lines numbered as `read_file` shows them.

/// Most characters of one observation; longer ones keep head and tail.
pub const MAX_OBSERVATION: usize = 16 * 1024;

/// Cuts text to `max` characters, keeping head and tail with a note of what was cut.
pub fn head_tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    let keep = max / 2;
    let head: String = text.chars().take(keep).collect();
    let tail: String = text.chars().skip(n - keep).collect();
    let cut_lines = text
        .chars()
        .skip(keep)
        .take(n - 2 * keep)
        .filter(|c| *c == '\n')
        .count();
    format!(
        "{head}\n[… {} characters ({cut_lines} lines) cut …]\n{tail}",
        n - 2 * keep
    )
}

/// Numbered lines `start..=end` (1-based; 0 = open) of a file's text.
pub fn numbered(text: &str, start: u32, end: u32) -> String {
    let start = start.max(1) as usize;
    let total = text.lines().count();
    let end = if end == 0 {
        total
    } else {
        (end as usize).min(total)
    };
    if start > total.max(1) {
        return format!("(the file has {total} lines)");
    }
    let mut out = String::new();
    for (i, l) in text
        .lines()
        .enumerate()
        .skip(start - 1)
        .take(end + 1 - start)
    {
        out.push_str(&format!("{:>6}\t{l}\n", i + 1));
    }
    if out.is_empty() {
        out.push_str("(empty file)\n");
    }
    out
}
