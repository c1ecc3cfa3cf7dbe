//! Transformer models, written once against [`arbor_tensor::Backend`].
//!
//! [`layout`] reads a GGUF file's config and tensor layout once;
//! [`decoder`] holds the llama/qwen2 family, built from a [`Layout`];
//! [`weights`] holds a layer's weights and the traits through which a
//! decoder borrows the weights it does not hold ([`LayerSource`],
//! [`RowSource`]). This crate reads no files beyond the mapped GGUF it is
//! loaded from; weights fetched from disk later come through those traits.
//! [`LanguageModel`] is the object-safe face the engine drives: feed tokens
//! at explicit positions under an explicit mask, read logits for chosen
//! rows, and edit the KV cache (truncate, keep only some positions). A
//! row may also be an embedding vector instead of a token ([`Row`]).

mod blocks;
pub mod certified;
mod check;
pub mod decoder;
pub mod elastic;
mod forward;
mod head;
pub mod layout;
pub mod lora;
mod probes;
mod self_draft;
mod slots;
pub mod split;
pub mod testing;
pub mod weights;

pub use arbor_tensor::Mask;
pub use check::{check_logit_rows, check_pass, check_tokens};
pub use decoder::Decoder;
pub use elastic::{Cut, Elastic};
pub use layout::{Config, Layout, TensorEntry};
pub use lora::{HostMatrix, Lora, LoraPair, Proj};
pub use probes::Probes;
pub use split::{SuffixLease, is_suffix};
pub use weights::{
    HeadSlice, HeadSource, LayerSource, LayerWeights, Lease, Mlp, RowSource, copied_bytes,
    held_bytes,
};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Tensor(#[from] arbor_tensor::Error),
    #[error(transparent)]
    Gguf(#[from] arbor_gguf::GgufError),
    /// An error of a weight source ([`LayerSource`], [`RowSource`]), kept
    /// whole: [`ModelError::source_as`] gets it back.
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync>),
    #[error("unsupported architecture `{0}` (arbor runs llama and qwen2)")]
    UnsupportedArchitecture(String),
    #[error("bad model: {0}")]
    Invalid(String),
    #[error("bad input: {0}")]
    Input(String),
}

impl ModelError {
    /// Wraps an error of a weight source.
    pub fn from_source(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Source(Box::new(e))
    }

    /// The weight source's error, when this is one of type `E`.
    pub fn source_as<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Self::Source(e) => e.downcast_ref(),
            _ => None,
        }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Writes `part`'s rows (`used` values each) into columns `first..` of
/// the rows of `logits` (`width` values each): one slice's logits.
pub(crate) fn put_columns(
    logits: &mut [f32],
    width: usize,
    first: usize,
    part: &[f32],
    used: usize,
) {
    for (out, row) in logits.chunks_exact_mut(width).zip(part.chunks_exact(used)) {
        out[first..first + used].copy_from_slice(row);
    }
}

/// Logits for some rows of a forward pass, row-major `[rows, vocab]`.
/// `vocab` is the number of head rows: the vocabulary, except for a decoder
/// loaded from a slim draft, whose head keeps fewer tokens (the
/// `arbor-drafts` wrapper widens those back to the vocabulary).
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }

    /// The listed rows, in that order.
    pub fn select(&self, rows: &[usize]) -> Logits {
        Logits {
            rows: rows.len(),
            vocab: self.vocab,
            data: rows.iter().flat_map(|&r| self.row(r)).copied().collect(),
        }
    }
}

/// Sent while a forward pass runs on a model whose weights are partly read
/// from disk: the pass stopped to wait for a layer, or got it and goes on.
/// Another model may use the CPU in between (provisional generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightWait {
    Waiting,
    Resumed,
}

/// One input row of a forward pass: a token, or an embedding vector fed
/// in its place (`hidden` values; parallel prompt decoding's trained
/// prompt tokens).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row<'a> {
    Token(u32),
    Vector(&'a [f32]),
}

impl Row<'_> {
    /// The token, if this row is one.
    pub fn token(&self) -> Option<u32> {
        match self {
            Row::Token(t) => Some(*t),
            Row::Vector(_) => None,
        }
    }

    /// The rows' tokens, if every row is one.
    pub fn all_tokens(rows: &[Row<'_>]) -> Option<Vec<u32>> {
        rows.iter().map(Row::token).collect()
    }
}

/// One sequence's part of a pass over several ([`LanguageModel::forward_slots`]):
/// its rows, their positions and mask over that slot's cache, and which of
/// its rows to return logits for (indices into `rows`).
#[derive(Debug, Clone, Copy)]
pub struct SlotPass<'a> {
    pub slot: usize,
    pub rows: &'a [Row<'a>],
    pub positions: &'a [u32],
    pub mask: &'a Mask,
    pub logit_rows: &'a [usize],
}

/// What the engine needs from a model, whatever its backend.
pub trait LanguageModel: Send {
    /// Runs `tokens` (at `positions`, attending as `mask` allows over the
    /// cached positions followed by these tokens) and appends their keys
    /// and values to the cache. Returns logits for the rows in
    /// `logit_rows` (indices into `tokens`).
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits>;

    /// [`LanguageModel::forward`] over rows that are tokens or embedding
    /// vectors. Models that only take tokens refuse vectors. (The default
    /// calls `forward`: a model whose `forward` calls `forward_rows` must
    /// implement both.)
    fn forward_rows(
        &mut self,
        rows: &[Row<'_>],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits> {
        match Row::all_tokens(rows) {
            Some(tokens) => self.forward(&tokens, positions, mask, logit_rows),
            None => Err(ModelError::Input(
                "this model takes tokens only, not embedding vectors".into(),
            )),
        }
    }

    /// Makes later forward passes keep their final hidden states (until
    /// the next pass, or until turned off, which drops them), so that
    /// [`LanguageModel::later_logits`] can put more of their rows through
    /// the output head once the caller knows which it needs: a pass then
    /// asks only for the rows it surely reads (with a 150k vocabulary a
    /// row of logits costs 0.6 MB and a sixth of a 1.5B model's per-row
    /// compute). Returns whether this model can; the default cannot.
    fn keep_last_pass(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// Logits of rows of the last forward pass (indices into its rows,
    /// any of them, returned before or not) from the hidden states it kept;
    /// `None` when it kept none (see [`LanguageModel::keep_last_pass`]).
    fn later_logits(&mut self, rows: &[usize]) -> Result<Option<Logits>> {
        let _ = rows;
        Ok(None)
    }

    /// Tells the model whether later passes' logits are read only for
    /// their argmax (greedy decoding without a constraint or
    /// log-probabilities): a model with a held approximate head then
    /// gives exact values only where the maximum may be (see
    /// [`certified`]). Returns whether the model does anything with it;
    /// the default does not.
    fn set_argmax_only(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// Number of cached positions.
    fn cache_len(&self) -> usize;
    /// Drops cached positions from `len` on.
    fn truncate_cache(&mut self, len: usize) -> Result<()>;
    /// Keeps only these cached positions (strictly increasing), compacted.
    fn keep_cache(&mut self, positions: &[usize]) -> Result<()>;

    fn config(&self) -> &Config;
    /// Backend name (`candle`, `flex`, ...).
    fn backend_name(&self) -> &'static str;

    /// Bytes the backend holds for this model's resident weights, by its
    /// own accounting (`None` where the model does not say).
    fn weight_bytes(&self) -> Option<u64> {
        None
    }

    /// Bytes the model's device has reserved from its driver now (a GPU
    /// backend's memory pools: weights, caches, scratch); `None` where the
    /// backend does not say.
    fn device_reserved_bytes(&self) -> Option<u64> {
        None
    }

    /// The levels an elastic model runs at (`None`: only the whole model;
    /// see [`Elastic`]).
    fn levels(&self) -> Option<&[f64]> {
        None
    }

    /// Runs later passes at the built level nearest at or below `level`
    /// and returns it (see [`Decoder::set_level`]); models that are not
    /// elastic refuse.
    fn set_level(&mut self, level: f64) -> Result<f64> {
        Err(ModelError::Input(format!(
            "level {level} asked of a model that is not elastic"
        )))
    }

    /// Multiplies only the first `share` (in (0, 1]) of a frequency-ordered
    /// output head from now on (see [`Decoder::set_head_share`]): the
    /// rows kept, or `None` where the head is not ordered (the whole head
    /// always runs).
    fn set_head_share(&mut self, share: f64) -> Result<Option<usize>> {
        let _ = share;
        Ok(None)
    }

    /// Keeps caches for `n` sequences (slots) from now on: slot 0 is the
    /// cache the model had, new slots start empty, slots past `n` are
    /// dropped. Models that keep one sequence refuse more.
    fn set_slots(&mut self, n: usize) -> Result<()> {
        match n {
            1 => Ok(()),
            _ => Err(ModelError::Input(format!(
                "{n} sequences asked of a model that keeps one cache"
            ))),
        }
    }

    /// Makes the one-sequence methods (`forward`, the cache methods) work
    /// on slot `slot`'s cache.
    fn select_slot(&mut self, slot: usize) -> Result<()> {
        match slot {
            0 => Ok(()),
            _ => Err(ModelError::Input(format!(
                "slot {slot} of a model that keeps one cache"
            ))),
        }
    }

    /// One pass over several sequences' rows, each attending over its own
    /// slot's cache; a row's logits do not depend on the other sequences.
    /// A model that batches them reads each weight once for all (the
    /// default runs one pass per sequence). The selected slot is left as
    /// it was.
    fn forward_slots(&mut self, passes: &[SlotPass<'_>]) -> Result<Vec<Logits>> {
        let mut out = Vec::with_capacity(passes.len());
        for p in passes {
            self.select_slot(p.slot)?;
            out.push(self.forward_rows(p.rows, p.positions, p.mask, p.logit_rows)?);
        }
        self.select_slot(0)?;
        Ok(out)
    }

    /// A model sharing this one's weights with an empty cache of its own
    /// (a draft for one more sequence); models that cannot refuse.
    fn fork(&self) -> Result<Box<dyn LanguageModel>> {
        Err(ModelError::Input("this model cannot be shared".into()))
    }

    /// This model without the layers `keep` marks `false` (the residual
    /// passes through them), sharing its weights, with a cache of its own
    /// (see [`Decoder::self_draft_with`]); models that cannot refuse.
    fn without_layers(&self, keep: &[bool]) -> Result<Box<dyn LanguageModel>> {
        let _ = keep;
        Err(ModelError::Input("this model cannot drop layers".into()))
    }

    /// A draft that runs this elastic model at `level`, sharing its
    /// weights (see [`Decoder::elastic_draft`]); models that are not
    /// elastic refuse.
    fn elastic_draft(&self, level: f64) -> Result<Box<dyn LanguageModel>> {
        Err(ModelError::Input(format!(
            "an elastic draft at level {level} asked of a model that is not elastic (build one \
             with `arbor elastic build`)"
        )))
    }

    /// Holds LoRA adapters for their level (see [`Decoder::attach_lora`]);
    /// models without adapters refuse.
    fn attach_lora(&mut self, lora: &Lora<HostMatrix>) -> Result<()> {
        Err(ModelError::Input(format!(
            "adapters for level {} given to a model that takes none",
            lora.level
        )))
    }

    /// Reports [`WeightWait`]s of later forward passes to `tx` (`None`
    /// stops and drops the sender). Models whose weights are all in memory
    /// never wait and drop it at once.
    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<WeightWait>>) {
        drop(tx);
    }

    /// Told, when this model drafts for a target whose pass waits for
    /// weights (provisional generation), that it has nothing more it may
    /// extend until the target resumes. The default does nothing; a test's
    /// draft releases its waiting target on it, so the steps a draft takes
    /// in each wait do not depend on how threads are scheduled.
    fn idle_while_target_waits(&mut self) {}

    /// Causal forward of `tokens` after the cache, positions continuing
    /// from the cache length; logits of the last token only.
    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(ModelError::Input("no tokens to run".into()));
        }
        let past = self.cache_len();
        let positions: Vec<u32> = (past..past + tokens.len()).map(|p| p as u32).collect();
        let mask = Mask::causal(past, tokens.len());
        let logits = self.forward(tokens, &positions, &mask, &[tokens.len() - 1])?;
        Ok(logits.data)
    }
}
