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
