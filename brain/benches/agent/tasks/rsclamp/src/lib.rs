//! Limiting a number to a range.

/// `x` limited to `lo..=hi`.
pub fn clamp(x: i64, lo: i64, hi: i64) -> i64 {
    if x < lo {
        hi
    } else if x > hi {
        hi
    } else {
        x
    }
}

#[cfg(test)]
mod tests;
