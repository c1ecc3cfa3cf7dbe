//! A decoder's output head: logits of the rows a pass asks for, from a
//! held head or one lent a slice at a time ([`HeadSource`]), in token order
//! or (an elastic file's frequency-ordered head) put back into it, over the
//! whole head or its first rows.

use std::sync::Mutex;

use arbor_tensor::Backend;

use crate::blocks::Embedding;
use crate::{Decoder, HeadSource, Logits, ModelError, Result, check_logit_rows};

impl<B: Backend> Decoder<B> {
    /// Where the output head comes from when it was not loaded
    /// ([`Decoder::load_parts`]); its rows must be the head's.
    pub fn set_head_source(&mut self, source: Box<dyn HeadSource<B>>) -> Result<()> {
        if source.rows() != self.head_rows || source.slice_rows() == 0 {
            return Err(ModelError::Invalid(format!(
                "a head source of {} rows in slices of {} for a head of {} rows",
                source.rows(),
                source.slice_rows(),
                self.head_rows
            )));
        }
        self.head_source = Some(Mutex::new(source));
        Ok(())
    }

    /// Gives a streamed head a held approximate copy (see
    /// [`crate::certified`]), used by passes whose logits are read only
    /// for their argmax ([`LanguageModel::set_argmax_only`]).
    ///
    /// [`LanguageModel::set_argmax_only`]: crate::LanguageModel::set_argmax_only
    pub fn set_approx_head(&mut self, approx: crate::certified::ApproxHead<B>) -> Result<()> {
        if self.head_source.is_none()
            || approx.rows() != self.head_rows
            || self.head_order().is_some()
        {
            return Err(ModelError::Invalid(format!(
                "an approximate head of {} rows for a head of {} rows{}",
                approx.rows(),
                self.head_rows,
                match self.head_source.is_none() {
                    true => " that is held",
                    false => " in frequency order or",
                }
            )));
        }
        self.resident_bytes += approx.held_bytes();
        self.approx = Some(std::sync::Arc::new(approx));
        Ok(())
    }

    /// Whether the output head is read a slice at a time on every pass
    /// instead of held.
    pub fn head_streamed(&self) -> bool {
        self.head_source.is_some()
    }

    /// Columns of the logits [`crate::LanguageModel::forward`] returns: the
    /// vocabulary, or fewer for a slim head (see [`crate::Layout::head`]).
    pub fn head_rows(&self) -> usize {
        self.head_rows
    }

    /// Logits `[rows.len(), head rows]` of the listed rows of final hidden
    /// states `x`, left on the device. Only these rows go through the
    /// head: with a 150k vocabulary it costs more than a layer.
    pub fn head(&self, x: &B::Tensor, rows: &[usize]) -> Result<B::Tensor> {
        let b = &self.backend;
        check_logit_rows(rows, b.shape(x).0)?;
        let x = b.select_rows(x, rows)?;
        let x = b.rms_norm(&x, &self.norm, self.config.rms_eps)?;
        if let Some(source) = &self.head_source {
            let mut source = source.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(approx) = self.approx.as_deref().filter(|_| self.argmax_only)
                && let Some(logits) = self.head_certified(&x, approx, source.as_mut())?
            {
                return Ok(logits);
            }
            return self.head_slices(&x, source.as_mut());
        }
        let head = match (&self.output, &self.embed) {
            (Some(w), _) | (None, Embedding::Table(w)) => w.as_ref(),
            (None, Embedding::Rows { .. }) => {
                return Err(ModelError::Invalid("no output head".into()));
            }
        };
        crate::weights::part(b, &x, head, self.head_keep, self.config.hidden)
    }

    /// [`Decoder::head`] over a head lent a slice at a time: each slice's
    /// logits are written into their columns of the whole row.
    fn head_slices(&self, x: &B::Tensor, source: &mut dyn HeadSource<B>) -> Result<B::Tensor> {
        let b = &self.backend;
        let (n, d) = (b.shape(x).0, self.config.hidden);
        let (keep, step) = (self.head_keep, source.slice_rows());
        let mut logits = vec![0f32; n * keep];
        for first in (0..keep).step_by(step) {
            let rows = step.min(source.rows() - first);
            let used = rows.min(keep - first);
            let w = source.slice(first, rows)?;
            let part = b.take_vec(crate::weights::part(b, x, &*w, used, d)?)?;
            crate::put_columns(&mut logits, keep, first, &part, used);
        }
        Ok(b.tensor_from_vec(logits, n, keep)?)
    }

    /// [`Decoder::head`]'s logits from the approximate head, exact
    /// wherever a row's maximum may be (see [`crate::certified`]); `None`
    /// where the whole head must run: values that are not finite, more
    /// candidates than [`max_gathered`](crate::certified::max_gathered),
    /// or a source that cannot gather rows.
    fn head_certified(
        &self,
        x: &B::Tensor,
        approx: &crate::certified::ApproxHead<B>,
        source: &mut dyn HeadSource<B>,
    ) -> Result<Option<B::Tensor>> {
        let b = &self.backend;
        let (n, d, vocab) = (b.shape(x).0, self.config.hidden, self.head_rows);
        let host = b.to_vec(x)?;
        let mut logits = approx.logits(b, x)?;
        let mut rows = Vec::new();
        for (xr, lr) in host.chunks_exact(d).zip(logits.chunks_exact(vocab)) {
            let Some(c) = approx.candidates(xr, lr) else {
                return Ok(None);
            };
            rows.extend(c);
        }
        rows.sort_unstable();
        rows.dedup();
        if rows.len() > crate::certified::max_gathered(vocab) {
            return Ok(None);
        }
        let Some(w) = source.gather(&rows)? else {
            return Ok(None);
        };
        let exact = b.take_vec(crate::weights::part(b, x, &w, rows.len(), d)?)?;
        for (out, ex) in logits
            .chunks_exact_mut(vocab)
            .zip(exact.chunks_exact(rows.len()))
        {
            for (&j, &v) in rows.iter().zip(ex) {
                out[j] = v;
            }
        }
        Ok(Some(b.tensor_from_vec(logits, n, vocab)?))
    }

    /// The token of each head row where the file stores its head in
    /// frequency order ([`crate::Elastic::vocab`]).
    pub(crate) fn head_order(&self) -> Option<&[u32]> {
        self.elastic.as_ref()?.vocab.as_deref()
    }

    /// Logits of [`Decoder::head`] on the host, one row per token of the
    /// vocabulary: a head in frequency order is put back in token order,
    /// the tokens past its kept rows `-inf`.
    pub(crate) fn host_logits(&self, logits: B::Tensor, rows: usize) -> Result<Logits> {
        let data = self.backend.take_vec(logits)?;
        let Some(order) = self.head_order() else {
            return Ok(Logits {
                rows,
                vocab: self.head_rows,
                data,
            });
        };
        let (vocab, keep) = (order.len(), self.head_keep);
        let mut out = vec![f32::NEG_INFINITY; rows * vocab];
        for (src, dst) in data.chunks_exact(keep).zip(out.chunks_exact_mut(vocab)) {
            for (&v, &t) in src.iter().zip(order) {
                dst[t as usize] = v;
            }
        }
        Ok(Logits {
            rows,
            vocab,
            data: out,
        })
    }

    /// Multiplies the first `share` of a frequency-ordered head's rows
    /// from now on (rounded up to whole groups of eight rows), returning
    /// how many; the tokens past them get `-inf` logits. 1 is the whole
    /// head. Models whose head is in token order refuse.
    pub fn set_head_share(&mut self, share: f64) -> Result<usize> {
        if !(share > 0.0 && share <= 1.0) {
            return Err(ModelError::Input(format!(
                "head share {share} is outside (0, 1]"
            )));
        }
        if self.head_order().is_none() {
            return Err(ModelError::Input(
                "only an elastic file built with its head in frequency order runs part of \
                 its head"
                    .into(),
            ));
        }
        let rows = self.head_rows;
        let keep = ((share * rows as f64).ceil() as usize).div_ceil(8) * 8;
        self.head_keep = keep.clamp(8.min(rows), rows);
        Ok(self.head_keep)
    }

    /// The column of each token's logit in [`Decoder::head`]'s output (its
    /// head row): the token itself unless the head is in frequency order.
    pub fn head_columns(&self, tokens: &[u32]) -> Vec<usize> {
        match self.head_order() {
            None => tokens.iter().map(|&t| t as usize).collect(),
            Some(order) => {
                let mut row = vec![0usize; order.len()];
                for (r, &t) in order.iter().enumerate() {
                    row[t as usize] = r;
                }
                tokens.iter().map(|&t| row[t as usize]).collect()
            }
        }
    }
}
