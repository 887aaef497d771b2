//! The one seeded generator for tests and benches (rand's `StdRng`): a run that fails can be
//! replayed from the seed it printed.

use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// A generator seeded from `TETHER_TEST_SEED`, or else the clock; the seed is printed, so a
/// failing run can be replayed with it.
pub fn seeded() -> StdRng {
    let seed = std::env::var("TETHER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("seed {seed} (set TETHER_TEST_SEED={seed} to replay)");
    StdRng::seed_from_u64(seed)
}

/// `len` bytes that do not compress, the same every run.
pub fn noise(len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    StdRng::seed_from_u64(len as u64).fill_bytes(&mut v);
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn noise_is_the_same_every_run_and_does_not_repeat() {
        let a = super::noise(4096);
        assert_eq!(a, super::noise(4096));
        assert_ne!(a[..2048], a[2048..]);
        let distinct: std::collections::HashSet<u8> = a.iter().copied().collect();
        assert!(distinct.len() > 200, "{}", distinct.len());
    }
}
