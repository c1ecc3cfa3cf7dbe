//! LoRA recovery of elastic levels (ELMS §3.2): low-rank side branches
//! `y += (x A) B` beside the frozen projections of a level's sub-model,
//! trained to win back what the dropped units took. Quantized weights
//! cannot absorb a merge, so the branches stay unmerged; a decoder holds
//! one set per level, and the set of the level passes run at is the one
//! applied — switching level attaches that level's adapters and detaches
//! the others without moving anything.
//!
//! A pair's shapes follow the level's cut of its layer: `q` maps the
//! normed hidden state to the level's query columns, `k`/`v` to the keys
//! and values (whole at every level), `o` maps the level's attention
//! columns back to the hidden width, `gate`/`up` map to the level's
//! neurons and `down` maps them back.

use std::sync::Arc;

use arbor_tensor::Backend;

use crate::{Config, Cut, Decoder, Elastic, ModelError, Result};

/// The projections a layer's adapters may sit beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q",
            Proj::K => "k",
            Proj::V => "v",
            Proj::O => "o",
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        }
    }

    pub fn parse(s: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.name() == s)
    }

    /// `[in, out]` of this projection in a layer cut to `cut` of a model
    /// shaped `c`.
    pub fn shape(self, c: &crate::Config, cut: Cut) -> (usize, usize) {
        let (d, q) = (c.hidden, cut.heads * c.heads.head_dim);
        let kv = c.heads.n_kv_heads * c.heads.head_dim;
        match self {
            Proj::Q => (d, q),
            Proj::K | Proj::V => (d, kv),
            Proj::O => (q, d),
            Proj::Gate | Proj::Up => (d, cut.neurons),
            Proj::Down => (cut.neurons, d),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One side branch: `a [in, rank]`, `b [rank, out]` (any scale folded
/// into `b`).
#[derive(Debug, Clone)]
pub struct LoraPair<T> {
    pub a: T,
    pub b: T,
}

/// The adapters of one level: per layer, a pair or none per projection
/// (indexed as [`Proj::ALL`]).
#[derive(Debug, Clone)]
pub struct Lora<T> {
    /// The level they recover (a built level of the file).
    pub level: f64,
    pub layers: Vec<[Option<LoraPair<T>>; 7]>,
}

/// A factor on the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl<T> Lora<T> {
    pub fn pair(&self, layer: usize, p: Proj) -> Option<&LoraPair<T>> {
        self.layers.get(layer).and_then(|l| l[p.index()].as_ref())
    }

    /// The same adapters with every factor made by `f` (host to device,
    /// or to tracked tensors for training), in layer then [`Proj::ALL`]
    /// order, `a` before `b`.
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Lora<U>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let mut out: [Option<LoraPair<U>>; 7] = Default::default();
            for (slot, p) in out.iter_mut().zip(l) {
                if let Some(p) = p {
                    let a = f(&p.a)?;
                    *slot = Some(LoraPair { a, b: f(&p.b)? });
                }
            }
            layers.push(out);
        }
        Ok(Lora {
            level: self.level,
            layers,
        })
    }
}

/// Where adapters for `level` go and what they are shaped by: the index of
/// that level, which an elastic file must build exactly, and each layer's
/// cut there; a model that is not elastic takes adapters for level 1 only.
pub fn level_cuts(c: &Config, elastic: Option<&Elastic>, level: f64) -> Result<(usize, Vec<Cut>)> {
    match elastic {
        Some(e) => {
            let i = e.level_index(level)?;
            if e.levels[i] != level {
                return Err(ModelError::Input(format!(
                    "adapters for level {level}, which this file does not build (nearest {})",
                    e.levels[i]
                )));
            }
            Ok((i, e.cuts[i].clone()))
        }
        None if level == 1.0 => Ok((
            0,
            vec![
                Cut {
                    heads: c.heads.n_heads,
                    neurons: c.ffn_hidden,
                };
                c.n_layers
            ],
        )),
        None => Err(ModelError::Input(format!(
            "adapters for level {level} given to a model that is not elastic"
        ))),
    }
}

impl<B: Backend> Decoder<B> {
    /// Holds `lora` for its level: passes at that level add its branches
    /// (replacing any set held for it before). Every pair's shapes must
    /// fit that level's cut of its layer.
    pub fn attach_lora(&mut self, lora: Lora<B::Tensor>) -> Result<()> {
        let c = &self.config;
        let (level, cuts) = level_cuts(c, self.elastic.as_deref(), lora.level)?;
        if lora.layers.len() != c.n_layers {
            return Err(ModelError::Input(format!(
                "adapters for {} layers given to a model of {}",
                lora.layers.len(),
                c.n_layers
            )));
        }
        for (i, (layer, &cut)) in lora.layers.iter().zip(&cuts).enumerate() {
            for (p, pair) in Proj::ALL.iter().zip(layer) {
                let Some(pair) = pair else { continue };
                let (din, dout) = p.shape(c, cut);
                let ((ar, r), (br, bc)) =
                    (self.backend.shape(&pair.a), self.backend.shape(&pair.b));
                if ar != din || br != r || bc != dout || r == 0 {
                    return Err(ModelError::Input(format!(
                        "layer {i}'s {} adapter is [{ar}, {r}]·[{br}, {bc}]; level {} needs \
                         [{din}, r]·[r, {dout}]",
                        p.name(),
                        lora.level
                    )));
                }
            }
        }
        if self.lora.len() <= level {
            self.lora.resize(level + 1, None);
        }
        self.lora[level] = Some(Arc::new(lora));
        Ok(())
    }

    /// Drops the adapters held for `level`'s level (if any).
    pub fn detach_lora(&mut self, level: f64) -> Result<()> {
        let i = match self.elastic.as_deref() {
            Some(e) => e.level_index(level)?,
            None => 0,
        };
        if let Some(slot) = self.lora.get_mut(i) {
            *slot = None;
        }
        Ok(())
    }

    /// The adapters passes apply now: those of the current level.
    pub fn active_lora(&self) -> Option<&Lora<B::Tensor>> {
        self.lora.get(self.level).and_then(|l| l.as_deref())
    }
}

/// `y + (x a) b`, or `y` without a pair; `cols` picks `b`'s output
/// columns (a split layer's held or lent neurons), `rows` `a`'s input rows.
pub(crate) fn side<B: Backend>(
    be: &B,
    y: B::Tensor,
    x: &B::Tensor,
    pair: Option<&LoraPair<B::Tensor>>,
    rows: Option<std::ops::Range<usize>>,
    cols: Option<std::ops::Range<usize>>,
) -> Result<B::Tensor> {
    let Some(p) = pair else { return Ok(y) };
    let a = match rows {
        Some(r) if r.len() < be.shape(&p.a).0 => &be.select_rows(&p.a, &r.collect::<Vec<_>>())?,
        _ => &p.a,
    };
    let b = match cols {
        Some(c) if c.len() < be.shape(&p.b).1 => &be.narrow_cols(&p.b, c)?,
        _ => &p.b,
    };
    let low = be.matmul_tensor(x, a)?;
    Ok(be.add(&y, &be.matmul_tensor(&low, b)?)?)
}
