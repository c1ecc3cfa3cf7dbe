//! What the test files share.

/// The cache and config methods of a test wrapper around `self.inner`.
macro_rules! delegate_to_inner {
    () => {
        fn cache_len(&self) -> usize {
            self.inner.cache_len()
        }
        fn truncate_cache(&mut self, len: usize) -> Result<()> {
            self.inner.truncate_cache(len)
        }
        fn keep_cache(&mut self, positions: &[usize]) -> Result<()> {
            self.inner.keep_cache(positions)
        }
        fn config(&self) -> &Config {
            self.inner.config()
        }
    };
}

pub mod models;

/// `logits` times `by` (a sharper, flatter or, negative, adversarial model).
pub fn scaled(mut logits: arbor_model::Logits, by: f32) -> arbor_model::Logits {
    logits.data.iter_mut().for_each(|v| *v *= by);
    logits
}

/// A property's number of cases: `default`, or `PROPTEST_CASES` where set
/// (`cargo xtask test --device arm64` runs fewer under emulation).
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
