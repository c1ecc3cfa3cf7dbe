//! Probes: column scales, all ones, multiplied into a pass at the outputs
//! of each layer's query projection, the attention output (the output
//! projection's input), the gate and up projections, and the down
//! projection's input. Their values change nothing; their gradients give
//! each unit's first-order importance (ELMS eq. 2 before its absolute
//! value): a probe on output column `i` of `y = W x` has
//! `∂L/∂s_i = Σ_t δ_i (W x)_i = Σ_j W_ij ∂L/∂W_ij` (the unit's row of
//! weights), one on input column `j` has `Σ_t x_j ∂L/∂x_j =
//! Σ_i W_ij ∂L/∂W_ij` (its column). Keys and values are not probed: the
//! query heads of a group share them.

use arbor_tensor::Backend;

use crate::{Decoder, ModelError, Result};

/// One layer's probes, each `[1, width]`.
#[derive(Debug, Clone)]
pub struct Probes<T> {
    /// The query projection's output (`heads × head_dim`).
    pub q: T,
    /// The attention output, the output projection's input.
    pub attn: T,
    /// The gate and up projections' outputs and the down projection's
    /// input (`ffn`).
    pub gate: T,
    pub up: T,
    pub down: T,
}

impl<B: Backend> Decoder<B> {
    /// Multiplies every later pass by `probes` (one per layer, see the
    /// module doc), or stops (`None`).
    pub fn set_probes(&mut self, probes: Option<Vec<Probes<B::Tensor>>>) -> Result<()> {
        if let Some(p) = &probes {
            let c = &self.config;
            let heads = c.heads.n_heads * c.heads.head_dim;
            let bad = p.len() != c.n_layers
                || p.iter().any(|l| {
                    [(&l.q, heads), (&l.attn, heads), (&l.gate, c.ffn_hidden)]
                        .into_iter()
                        .chain([(&l.up, c.ffn_hidden), (&l.down, c.ffn_hidden)])
                        .any(|(t, w)| self.backend.shape(t) != (1, w))
                });
            if bad {
                return Err(ModelError::Input(format!(
                    "probes for {} layers do not fit {} layers of {heads} query columns and {} neurons",
                    p.len(),
                    c.n_layers,
                    c.ffn_hidden
                )));
            }
        }
        self.probes = probes;
        Ok(())
    }
}
