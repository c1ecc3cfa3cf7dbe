//! Elastic models (ELMS §3.2): a GGUF file whose query heads and MLP
//! neurons are stored most important first, so that the first part of every
//! weight matrix is itself a smaller model — a *level*. A level keeps, in
//! each layer, its first `heads` query heads (rows of the query projection,
//! columns of the output projection) and its first `neurons` neurons (rows
//! of the gate and up projections, columns of the down projection); keys
//! and values stay whole. Switching level changes which prefix each matmul
//! reads (`Backend::matmul_part`): no weight moves.
//!
//! Query heads are stored interleaved across the KV heads (runs of
//! `head_run` heads take the KV heads in turn, [`HeadOrder::Interleaved`]),
//! so that a prefix of whole rounds keeps as many heads for every KV head.
//! `head_run` is 2 where a head is half of the output projection's
//! quantization block (the 1.5B's Q4_K with 128-wide heads), so that heads
//! move as whole blocks.
//!
//! The file says all this in its metadata (`arbor.elastic.*`, written by
//! [`Elastic::metadata`], read back and checked by
//! [`Elastic::from_header`]).

use arbor_gguf::{Header, Value};
use arbor_tensor::{Backend, HeadOrder, Heads};

use crate::{Config, Decoder, Layout, ModelError, Result};

const LEVELS: &str = "arbor.elastic.levels";
const HEAD_RUN: &str = "arbor.elastic.head_run";
const ANCHORS: &str = "arbor.elastic.anchors";
const HEADS: &str = "arbor.elastic.heads";
const NEURONS: &str = "arbor.elastic.neurons";
const ORDER: &str = "arbor.elastic.order";
const VOCAB: &str = "arbor.elastic.vocab";

/// What one layer keeps at one level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub heads: usize,
    pub neurons: usize,
}

/// The levels of an elastic file.
#[derive(Debug, Clone, PartialEq)]
pub struct Elastic {
    /// Ascending, in `(0, 1]`, the last 1 (the whole model): the share of
    /// each non-anchor layer's units kept.
    pub levels: Vec<f64>,
    /// Query heads that move together (1, or 2 where a head is half a
    /// quantization block of the output projection).
    pub head_run: usize,
    /// Layers kept whole at every level.
    pub anchors: Vec<usize>,
    /// `cuts[level][layer]`.
    pub cuts: Vec<Vec<Cut>>,
    /// How the units were ranked: `importance`, `file` (unreordered) or
    /// `magnitude` (the baselines are elastic files too).
    pub order: String,
    /// The output head's rows in frequency order where the file was built
    /// with one: `vocab[r]` is the token whose logit head row `r` gives,
    /// the most frequent tokens (special ones first) at the top, so the
    /// first rows are a smaller head ([`Decoder::set_head_share`]).
    /// `None`: the head's rows are the tokens in id order.
    pub vocab: Option<Vec<u32>>,
}

fn invalid(m: String) -> ModelError {
    ModelError::Invalid(format!("elastic metadata: {m}"))
}

impl Elastic {
    /// Whether a header describes an elastic model.
    pub fn is_elastic(h: &Header) -> bool {
        h.get(LEVELS).is_some()
    }

    /// The query head order of the file's layers: interleaved for an
    /// elastic file (its `head_run`), grouped otherwise.
    pub fn head_order(h: &Header) -> Result<HeadOrder> {
        match h.get(HEAD_RUN) {
            None => Ok(HeadOrder::Grouped),
            Some(_) => Ok(HeadOrder::Interleaved {
                run: h.get_usize(HEAD_RUN)?,
            }),
        }
    }

    /// The levels of an elastic file, checked against its config; `None`
    /// for an ordinary file.
    pub fn from_header(h: &Header, c: &Config) -> Result<Option<Self>> {
        if !Self::is_elastic(h) {
            return Ok(None);
        }
        let levels = h.get_f64_array(LEVELS)?;
        let ints = |k: &str| -> Result<Vec<usize>> {
            (h.get_i64_array(k)?.into_iter())
                .map(|v| usize::try_from(v).map_err(|_| invalid(format!("`{k}` holds {v}"))))
                .collect()
        };
        let (heads, neurons) = (ints(HEADS)?, ints(NEURONS)?);
        let layers = c.n_layers;
        if heads.len() != levels.len() * layers || neurons.len() != heads.len() {
            return Err(invalid(format!(
                "{} head and {} neuron counts for {} levels of {layers} layers",
                heads.len(),
                neurons.len(),
                levels.len()
            )));
        }
        let cuts = (0..levels.len())
            .map(|l| {
                (0..layers)
                    .map(|i| Cut {
                        heads: heads[l * layers + i],
                        neurons: neurons[l * layers + i],
                    })
                    .collect()
            })
            .collect();
        let e = Self {
            levels,
            head_run: h.get_usize(HEAD_RUN)?,
            anchors: ints(ANCHORS)?,
            cuts,
            order: h.get_str(ORDER).unwrap_or("importance").to_string(),
            vocab: match h.get(VOCAB) {
                None => None,
                Some(_) => Some(
                    (ints(VOCAB)?.into_iter())
                        .map(|v| u32::try_from(v).map_err(|_| invalid(format!("token {v}"))))
                        .collect::<Result<_>>()?,
                ),
            },
        };
        e.validate(c)?;
        Ok(Some(e))
    }

    /// Checks the levels against a model's config: ascending levels ending
    /// at 1, counts that fit the layers, grow with the level, keep whole
    /// rounds of heads, end with the whole model and keep anchors whole.
    pub fn validate(&self, c: &Config) -> Result<()> {
        let (n, kv, ffn) = (c.heads.n_heads, c.heads.n_kv_heads, c.ffn_hidden);
        let round = self.head_run * kv;
        if self.levels.is_empty()
            || self.levels.last() != Some(&1.0)
            || self.levels.iter().any(|&l| !(l > 0.0 && l <= 1.0))
            || self.levels.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(invalid(format!(
                "levels {:?} are not ascending in (0, 1] ending at 1",
                self.levels
            )));
        }
        if self.head_run == 0 || !n.is_multiple_of(round) {
            return Err(invalid(format!(
                "runs of {} heads do not divide {n} heads over {kv} KV heads",
                self.head_run
            )));
        }
        if let Some(&a) = self.anchors.iter().find(|&&a| a >= c.n_layers) {
            return Err(invalid(format!("anchor layer {a} of {}", c.n_layers)));
        }
        if let Some(v) = &self.vocab {
            let mut seen = vec![false; c.vocab_size];
            let fresh =
                |t: &u32| (seen.get_mut(*t as usize)).is_some_and(|s| !std::mem::replace(s, true));
            if v.len() != c.vocab_size || !v.iter().all(fresh) {
                return Err(invalid(format!(
                    "the head's token order is not an order of the {} tokens",
                    c.vocab_size
                )));
            }
        }
        if self.cuts.len() != self.levels.len() || self.cuts.iter().any(|l| l.len() != c.n_layers) {
            return Err(invalid("a cut per level and layer is missing".into()));
        }
        for (l, cuts) in self.cuts.iter().enumerate() {
            for (i, cut) in cuts.iter().enumerate() {
                let bad =
                    |what: String| invalid(format!("level {} layer {i}: {what}", self.levels[l]));
                if cut.heads == 0 || cut.heads > n || !cut.heads.is_multiple_of(round) {
                    return Err(bad(format!(
                        "{} heads (whole rounds of {round} up to {n})",
                        cut.heads
                    )));
                }
                if cut.neurons == 0 || cut.neurons > ffn {
                    return Err(bad(format!("{} neurons of {ffn}", cut.neurons)));
                }
                let whole = Cut {
                    heads: n,
                    neurons: ffn,
                };
                if (l + 1 == self.levels.len() || self.anchors.contains(&i)) && *cut != whole {
                    return Err(bad(
                        "the whole model and anchor layers keep every unit".into()
                    ));
                }
                if let Some(prev) = l.checked_sub(1).map(|p| self.cuts[p][i])
                    && (prev.heads > cut.heads || prev.neurons > cut.neurons)
                {
                    return Err(bad("keeps fewer units than the level below".into()));
                }
            }
        }
        Ok(())
    }

    /// The metadata that describes these levels.
    pub fn metadata(&self) -> Vec<(String, Value)> {
        let flat = |f: fn(&Cut) -> usize| {
            Value::Array(
                (self.cuts.iter().flatten())
                    .map(|c| Value::U32(f(c) as u32))
                    .collect(),
            )
        };
        let mut out = vec![
            (
                LEVELS.into(),
                Value::Array(self.levels.iter().map(|&l| Value::F64(l)).collect()),
            ),
            (HEAD_RUN.into(), Value::U32(self.head_run as u32)),
            (
                ANCHORS.into(),
                Value::Array(self.anchors.iter().map(|&a| Value::U32(a as u32)).collect()),
            ),
            (HEADS.into(), flat(|c| c.heads)),
            (NEURONS.into(), flat(|c| c.neurons)),
            (ORDER.into(), Value::String(self.order.clone())),
        ];
        if let Some(v) = &self.vocab {
            out.push((
                VOCAB.into(),
                Value::Array(v.iter().map(|&t| Value::U32(t)).collect()),
            ));
        }
        out
    }

    /// The index of the built level for a requested `level`: the nearest
    /// built level at or below it (a request within 1e-9 above a level
    /// is that level).
    pub fn level_index(&self, level: f64) -> Result<usize> {
        if !(level > 0.0 && level <= 1.0) {
            return Err(ModelError::Input(format!(
                "level {level} is outside (0, 1]"
            )));
        }
        (self.levels.iter())
            .rposition(|&l| l <= level + 1e-9)
            .ok_or_else(|| {
                ModelError::Input(format!(
                    "level {level} is below the lowest level this file holds ({})",
                    self.levels[0]
                ))
            })
    }

    /// Where layer `layer`'s down projection segments end, up to neuron
    /// `upto` (a level's cut, so the last end): the levels' cuts, in order,
    /// without repeats — where `arbor elastic build` cuts the stored
    /// segments (see [`crate::split`]).
    pub fn down_ends(&self, layer: usize, upto: usize) -> Vec<usize> {
        let mut ends: Vec<usize> = (self.cuts.iter())
            .map(|c| c[layer].neurons)
            .filter(|&n| n > 0 && n < upto)
            .collect();
        ends.dedup();
        ends.push(upto);
        ends
    }

    /// Bytes of the layer weights level `level` (an index) multiplies per
    /// token in a file of layout `layout` (norms and biases aside).
    pub fn level_bytes(&self, layout: &Layout, level: usize) -> u64 {
        let c = &layout.config;
        let mut total = 0;
        for (i, entries) in layout.layers.iter().enumerate() {
            let cut = self.cuts[level][i];
            let heads = cut.heads as f64 / c.heads.n_heads as f64;
            let neurons = cut.neurons as f64 / c.ffn_hidden as f64;
            for t in entries.iter().filter(|t| t.rows > 1) {
                let share = match t.name.rsplit('.').nth(1) {
                    Some("attn_q" | "attn_output") => heads,
                    Some("ffn_gate" | "ffn_up" | "ffn_down") => neurons,
                    _ => 1.0,
                };
                total += (t.len as f64 * share).round() as u64;
            }
        }
        total
    }

    /// The attention layout of `heads` query heads of a model with these
    /// heads.
    pub fn heads(&self, of: &Heads, heads: usize) -> Heads {
        Heads {
            n_heads: heads,
            order: HeadOrder::Interleaved { run: self.head_run },
            ..*of
        }
    }
}

impl<B: Backend> Decoder<B> {
    /// The levels of an elastic file (`None` for an ordinary one).
    pub fn elastic(&self) -> Option<&Elastic> {
        self.elastic.as_deref()
    }

    /// The level passes run at (1 for an ordinary file).
    pub fn level(&self) -> f64 {
        self.elastic.as_ref().map_or(1.0, |e| e.levels[self.level])
    }

    /// Runs later passes at the built level nearest at or below `level`,
    /// returned: a number changes, nothing is copied or allocated. The
    /// cache holds keys and values of the level it was filled at: empty
    /// it (or keep only what that level may reuse) before switching in
    /// the middle of a text.
    pub fn set_level(&mut self, level: f64) -> Result<f64> {
        let e = self.elastic.as_deref().ok_or_else(|| {
            ModelError::Input(format!(
                "level {level} asked of a model that is not elastic (build one with `arbor \
                 elastic build`)"
            ))
        })?;
        self.level = e.level_index(level)?;
        Ok(e.levels[self.level])
    }

    /// A draft that runs this elastic decoder's layers at `level`: every
    /// weight shared, only its KV cache its own (see
    /// [`Decoder::self_draft_with`]; here every layer must be resident).
    pub fn elastic_draft(&self, level: f64) -> Result<Decoder<B>> {
        if self.elastic.is_none() {
            return Err(ModelError::Input(format!(
                "an elastic draft at level {level} asked of a model that is not elastic"
            )));
        }
        let mut d = self.self_draft_with(&vec![true; self.blocks.len()])?;
        d.set_level(level)?;
        let cuts = &self.elastic.as_ref().expect("checked above").cuts[d.level];
        for (i, block) in self.blocks.iter().enumerate() {
            if let crate::blocks::Block::Split { neurons, .. } = block
                && cuts[i].neurons > *neurons
            {
                return Err(ModelError::Input(format!(
                    "an elastic draft at level {level} needs {} neurons of layer {i}, \
                     which holds {neurons}",
                    cuts[i].neurons
                )));
            }
        }
        Ok(d)
    }
}
