//! Self drafts: a decoder whose layers are partly streamed from disk drafts
//! for itself with the layers it holds in memory. The draft runs the
//! resident layers only (a skipped layer passes the residual stream on
//! unchanged), with the target's embedding, final norm and head, and its
//! own KV cache for the layers it runs. It shares every weight with the
//! target through `Arc`s, so it costs no weight memory: only its cache and
//! activations, and for an untied embedding read by rows, a second handle
//! on the row source.

use std::sync::Arc;

use arbor_tensor::Backend;

use crate::blocks::{Block, Embedding};
use crate::{Decoder, ModelError, Result};

impl<B: Backend + Clone> Decoder<B> {
    /// A draft running this decoder's resident layers and skipping the
    /// streamed ones (see [`Decoder::self_draft_with`]).
    pub fn self_draft(&self) -> Result<Decoder<B>> {
        self.self_draft_with(&self.resident_layers())
    }

    /// A draft running the layers marked in `keep` (one flag per layer,
    /// each kept layer resident here) and skipping the others. Its cache
    /// starts empty and holds the kept layers only; its
    /// [`resident_bytes`](Decoder::resident_bytes) is 0, the weights being
    /// counted by this decoder.
    pub fn self_draft_with(&self, keep: &[bool]) -> Result<Decoder<B>> {
        let n = self.blocks.len();
        if keep.len() != n {
            return Err(ModelError::Input(format!(
                "{} layer flags for {n} layers",
                keep.len()
            )));
        }
        if !keep.contains(&true) {
            return Err(ModelError::Input(
                "a self draft needs at least one layer".into(),
            ));
        }
        let mut blocks = Vec::with_capacity(n);
        for (i, (block, &k)) in self.blocks.iter().zip(keep).enumerate() {
            blocks.push(match (block, k) {
                (Block::Resident(w), true) => Block::Resident(Arc::clone(w)),
                // An elastic draft at (or below) the split level runs the
                // held prefix (checked by `Decoder::elastic_draft`).
                (Block::Split { prefix, .. }, true) => Block::Resident(Arc::clone(prefix)),
                (_, true) => {
                    return Err(ModelError::Input(format!(
                        "layer {i} is not resident: a self draft cannot run it"
                    )));
                }
                (_, false) => Block::Skipped,
            });
        }
        if self.head_source.is_some() {
            return Err(ModelError::Input(
                "the target's head is read from disk on every pass: a self draft needs it held"
                    .into(),
            ));
        }
        let embed = match &self.embed {
            Embedding::Table(w) => Embedding::Table(Arc::clone(w)),
            Embedding::Rows { source, ty, cols } => Embedding::Rows {
                source: source.try_clone()?,
                ty: *ty,
                cols: *cols,
            },
        };
        let kept = keep.iter().filter(|&&k| k).count();
        let cache = (0..kept)
            .map(|_| self.backend.kv_new(&self.config.heads))
            .collect::<Result<_, _>>()?;
        Ok(Decoder {
            backend: self.backend.clone(),
            config: self.config.clone(),
            embed,
            blocks,
            source: None,
            norm: self.norm.clone(),
            output: self.output.clone(),
            head_source: None,
            slots: vec![cache],
            slot: 0,
            head_rows: self.head_rows,
            head_keep: self.head_keep,
            approx: None,
            argmax_only: false,
            resident_bytes: 0,
            keep_last: false,
            kept: None,
            probes: None,
            elastic: self.elastic.clone(),
            level: self.level,
            lora: self.lora.clone(),
        })
    }

    /// Which layers a forward pass runs (resident or streamed); a self
    /// draft's skipped layers are `false`.
    pub fn running_layers(&self) -> Vec<bool> {
        self.blocks
            .iter()
            .map(|b| !matches!(b, Block::Skipped))
            .collect()
    }
}
