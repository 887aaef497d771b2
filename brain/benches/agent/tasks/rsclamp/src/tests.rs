//! The tests of `clamp` (the check relies on them).

use super::clamp;

#[test]
fn inside() {
    assert_eq!(clamp(5, 0, 10), 5);
}

#[test]
fn above() {
    assert_eq!(clamp(15, 0, 10), 10);
}

#[test]
fn below() {
    assert_eq!(clamp(-5, 0, 10), 0);
}
