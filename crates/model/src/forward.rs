//! A decoder's pass through its layers: attention (per slot) and the MLP
//! of every block, resident, streamed, split or skipped.

use arbor_tensor::Backend;

use crate::blocks::Block;
use crate::lora::{Proj, side};
use crate::weights::{down_sum, part, part_add};
use crate::{Decoder, ModelError, Result};

impl<B: Backend> Decoder<B> {
    /// The pass through every layer of input rows `x`, made of `segments`
    /// (consecutive row ranges, each attending over its own slot's cache).
    pub(crate) fn layers(
        &mut self,
        mut x: B::Tensor,
        positions: &[u32],
        segments: &[crate::slots::Segment<'_>],
    ) -> Result<B::Tensor> {
        let (b, c) = (&self.backend, &self.config);
        let mut layer = 0;
        let probes = self.probes.as_deref();
        // `t` times the probe that `pick` chooses, when probing.
        let probe = |t: B::Tensor, i: usize, pick: fn(&crate::Probes<B::Tensor>) -> &B::Tensor| {
            match probes {
                Some(p) => b.scale_cols(&t, pick(&p[i])),
                None => Ok(t),
            }
        };
        let elastic = self.elastic.as_deref();
        let lora = self.lora.get(self.level).and_then(|l| l.as_deref());
        let pair = |i: usize, p: Proj| lora.and_then(|l| l.pair(i, p));
        let whole = crate::Cut {
            heads: c.heads.n_heads,
            neurons: c.ffn_hidden,
        };
        for (i, block) in self.blocks.iter().enumerate() {
            // What this layer keeps at the level passes run at.
            let cut = elastic.map_or(whole, |e| e.cuts[self.level][i]);
            let heads = match elastic {
                Some(e) => e.heads(&c.heads, cut.heads),
                None => c.heads,
            };
            let (d, q_cols) = (c.hidden, cut.heads * c.heads.head_dim);
            let lease;
            let mut suffix = None;
            let no_source =
                || ModelError::Input(format!("layer {i} is not resident and has no source"));
            let block = match block {
                Block::Skipped => continue,
                Block::Resident(block) => block.as_ref(),
                Block::Streamed => {
                    lease = self.source.as_mut().ok_or_else(no_source)?.layer(i)?;
                    &lease.weights
                }
                Block::Split { prefix, neurons } => {
                    if probes.is_some() {
                        return Err(ModelError::Input(format!(
                            "layer {i} is split: probes need whole layers"
                        )));
                    }
                    if cut.neurons > *neurons {
                        let lent = self.source.as_mut().ok_or_else(no_source)?.mlp_suffix(i)?;
                        suffix = Some((lent, *neurons));
                    }
                    prefix.as_ref()
                }
            };
            let cache = layer;
            layer += 1;
            // Attention
            let h = b.rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            let a = &block.attn;
            // A bias with nothing between it and the matmul is added by
            // the matmul (`matmul_add`: the same values, one op fewer).
            let q = match &a.q_bias {
                Some(bias)
                    if probes.is_none()
                        && pair(i, Proj::Q).is_none()
                        && q_cols == b.shape(bias).1 =>
                {
                    part_add(b, &h, &a.q, q_cols, d, bias)?
                }
                q_bias => {
                    let q = side(
                        b,
                        part(b, &h, &a.q, q_cols, d)?,
                        &h,
                        pair(i, Proj::Q),
                        None,
                        None,
                    )?;
                    let q = probe(q, i, |p| &p.q)?;
                    match q_bias {
                        Some(bias) if q_cols < b.shape(bias).1 => {
                            b.add(&q, &b.narrow_cols(bias, 0..q_cols)?)?
                        }
                        bias => biased(b, q, bias)?,
                    }
                }
            };
            let kv = |w, bias: &Option<B::Tensor>, p| match bias {
                Some(bias) if pair(i, p).is_none() => Ok(b.matmul_add(&h, w, bias)?),
                _ => biased(
                    b,
                    side(b, b.matmul(&h, w)?, &h, pair(i, p), None, None)?,
                    bias,
                ),
            };
            let (k, v) = (kv(&a.k, &a.k_bias, Proj::K)?, kv(&a.v, &a.v_bias, Proj::V)?);
            let q = b.rope(&q, positions, &c.rope)?;
            let k = b.rope(&k, positions, &c.rope)?;
            let att =
                crate::slots::attend(b, &mut self.slots, cache, segments, [&q, &k, &v], &heads)?;
            let att = probe(att, i, |p| &p.attn)?;
            // The residual is added by the o and down matmuls where nothing
            // comes between (x + y and y + x are the same floats).
            x = match pair(i, Proj::O) {
                None => part_add(b, &att, &a.o, d, q_cols, &x)?,
                o_pair => {
                    let o = part(b, &att, &a.o, d, q_cols)?;
                    b.add(&x, &side(b, o, &att, o_pair, None, None)?)?
                }
            };
            // MLP
            let h = b.rms_norm(&x, &block.ffn_norm, c.rms_eps)?;
            let m = &block.mlp;
            // A split layer's held neurons first, then the lent rest.
            let own = suffix.as_ref().map_or(cut.neurons, |(_, held)| *held);
            // Adapters over the held neurons, then over the lent ones.
            let mlp = |w, p, n: std::ops::Range<usize>| {
                side(
                    b,
                    part(b, &h, w, n.len(), d)?,
                    &h,
                    pair(i, p),
                    None,
                    Some(n),
                )
            };
            let gate = probe(mlp(&m.gate, Proj::Gate, 0..own)?, i, |p| &p.gate)?;
            let up = probe(mlp(&m.up, Proj::Up, 0..own)?, i, |p| &p.up)?;
            let act = probe(b.swiglu(&gate, &up)?, i, |p| &p.down)?;
            if let (None, None, None, [whole]) =
                (&suffix, elastic, pair(i, Proj::Down), m.down.as_slice())
            {
                x = part_add(b, &act, whole, d, own, &x)?;
                continue;
            }
            let mut down = match (&suffix, m.down.as_slice(), elastic) {
                // A whole elastic layer: its segments summed in one pass.
                (None, [whole], Some(e)) => b.matmul_sum(&act, whole, d, &e.down_ends(i, own))?,
                _ => down_sum(b, None, &act, &m.down, d, 0..own)?,
            };
            let mut act = act;
            if let Some((lent, held)) = &suffix {
                let (s, rest) = (&lent.mlp, *held..cut.neurons);
                let lent_act = b.swiglu(
                    &mlp(&s.gate, Proj::Gate, rest.clone())?,
                    &mlp(&s.up, Proj::Up, rest.clone())?,
                )?;
                down = down_sum(b, Some(down), &lent_act, &s.down, d, rest)?;
                if pair(i, Proj::Down).is_some() {
                    act = b.concat_cols(&act, &lent_act)?;
                }
            }
            let neurons = Some(0..cut.neurons);
            x = b.add(
                &x,
                &side(b, down, &act, pair(i, Proj::Down), neurons, None)?,
            )?;
        }
        Ok(x)
    }
}

/// `x · wᵀ` over the first `rows` rows and `cols` columns of `w`: the
/// whole matmul when that is all of it, else an elastic level's prefix.
fn biased<B: Backend>(b: &B, x: B::Tensor, bias: &Option<B::Tensor>) -> Result<B::Tensor> {
    Ok(match bias {
        Some(bias) => b.add(&x, bias)?,
        None => x,
    })
}
