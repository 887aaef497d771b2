//! Text cut to size for the model and for people: head and tail, with what was cut said.

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
