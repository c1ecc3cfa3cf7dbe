//! A seeded pseudo-random generator (SplitMix64): the same seed gives the
//! same inputs on every machine.

/// The sampler's SplitMix64 ([`arbor_sampling::Rng`]), with the draws a
/// fuzzer needs on top.
#[derive(Debug, Clone)]
pub struct Rng(arbor_sampling::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(arbor_sampling::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "Rng::below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Puts `items` in a random order (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A small count, usually tiny: 0 to 3 most of the time, up to `max`.
    pub fn small(&mut self, max: usize) -> usize {
        match self.below(8) {
            0..=5 => self.below(4.min(max + 1)),
            _ => self.below(max + 1),
        }
    }

    /// An integer from the places parsers break: 0, ±1, powers of two and
    /// their neighbours, type limits, or small values.
    pub fn interesting_u64(&mut self) -> u64 {
        match self.below(6) {
            0 => *self.pick(&[0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 64, 255, 256]),
            1 => {
                let bit = self.below(64);
                (1u64 << bit).wrapping_add(*self.pick(&[0u64, 1, u64::MAX]))
            }
            2 => *self.pick(&[
                u64::MAX,
                u64::MAX - 1,
                i64::MAX as u64,
                i64::MIN as u64,
                u32::MAX as u64,
                i32::MAX as u64,
                i32::MIN as i64 as u64,
                u16::MAX as u64,
            ]),
            3 => self.below(1 << 12) as u64,
            _ => self.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut c = Rng::new(8);
        assert_ne!(xs, (0..100).map(|_| c.next_u64()).collect::<Vec<_>>());
    }

    #[test]
    fn below_stays_in_range_and_reaches_every_value() {
        let mut r = Rng::new(1);
        let mut seen = [0usize; 5];
        for _ in 0..1000 {
            seen[r.below(5)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
        for _ in 0..1000 {
            let v = r.range(3, 9);
            assert!((3..=9).contains(&v));
            assert!(r.small(2) <= 2);
        }
    }
}
