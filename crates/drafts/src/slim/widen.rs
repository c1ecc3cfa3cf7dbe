//! A slim draft's logits widened back to the whole vocabulary.

use arbor_model::{Config, LanguageModel, Logits, Mask, ModelError, Result, WeightWait};

use crate::DraftError;

/// A model whose head keeps only the tokens `ids` (ascending; its logits
/// have `ids.len()` columns), seen as a model over the whole vocabulary:
/// column `ids[i]` gets logit `i`, every other token `-inf`. Softmax over
/// the widened row is the model's distribution renormalised over the kept
/// tokens, so a verifier that works with the draft's probabilities stays
/// exact.
pub struct SlimDraft<M: ?Sized = dyn LanguageModel> {
    ids: Vec<u32>,
    inner: Box<M>,
}

impl<M: LanguageModel + ?Sized> SlimDraft<M> {
    /// Wraps `inner`, whose head rows are the tokens `ids`: strictly
    /// increasing, at least one, all inside `inner`'s vocabulary.
    pub fn new(inner: Box<M>, ids: Vec<u32>) -> Result<Self, DraftError> {
        let vocab = inner.config().vocab_size;
        if ids.is_empty() {
            return Err(DraftError::BadSlim("no kept token ids".into()));
        }
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DraftError::BadSlim(
                "kept token ids are not strictly increasing".into(),
            ));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(DraftError::TokenOutOfRange { id, vocab });
        }
        Ok(Self { ids, inner })
    }

    /// The kept token ids, ascending.
    pub fn token_ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl<M: LanguageModel + ?Sized> LanguageModel for SlimDraft<M> {
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits> {
        let slim = self.inner.forward(tokens, positions, mask, logit_rows)?;
        if slim.vocab != self.ids.len() {
            return Err(ModelError::Invalid(format!(
                "the slim head has {} rows, its metadata keeps {} token ids",
                slim.vocab,
                self.ids.len()
            )));
        }
        let vocab = self.inner.config().vocab_size;
        let mut data = vec![f32::NEG_INFINITY; slim.rows * vocab];
        for (r, row) in data.chunks_exact_mut(vocab).enumerate() {
            for (&id, &v) in self.ids.iter().zip(slim.row(r)) {
                row[id as usize] = v;
            }
        }
        Ok(Logits {
            rows: slim.rows,
            vocab,
            data,
        })
    }

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

    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }

    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<WeightWait>>) {
        self.inner.notify_waits(tx);
    }

    fn fork(&self) -> Result<Box<dyn LanguageModel>> {
        Ok(Box::new(SlimDraft {
            ids: self.ids.clone(),
            inner: self.inner.fork()?,
        }))
    }
}
