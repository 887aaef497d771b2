//! The error of reading one of the model's words (a permission, a delivery mode, a pick, a
//! role) from text: which word it was, and the words that would do.

/// A word that names none of a kind's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {word:?}: use {choices}")]
pub struct UnknownWord {
    /// What the word should name (`permission`, `delivery`).
    pub what: &'static str,
    pub word: String,
    /// The words that would do, for a person (`branch, pr or none`).
    pub choices: &'static str,
}

impl UnknownWord {
    pub fn new(what: &'static str, word: &str, choices: &'static str) -> Self {
        Self {
            what,
            word: word.to_string(),
            choices,
        }
    }
}
