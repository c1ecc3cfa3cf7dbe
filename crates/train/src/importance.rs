//! Units' importance for elastic sub-models (ELMS §3.2).
//!
//! A layer's units are its query heads (their rows of the query projection
//! and columns of the output projection) and its MLP neurons (a row of the
//! gate and of the up projection and a column of the down projection). A
//! unit's importance is `|Σ_w ∂L/∂w · w|` over its weights, the loss `L`
//! being the next-token loss of a calibration text: the first-order change
//! of the loss were the unit removed. It needs no weight gradients: the
//! decoder's probes (`arbor_model::Probes`, column scales of one) give
//! exactly those sums as their gradients, summed here over the unit's
//! columns and over the text's chunks before the absolute value is taken.
//!
//! A layer's own importance (for the anchor layers kept whole) is the
//! loss increase when it is skipped.

use arbor_backend_burn::{BurnBackend, BurnTensor};
use arbor_model::{Config, Decoder, LanguageModel, Mask, Probes};
use arbor_ppd::TensorFile;
use arbor_tensor::Backend;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use crate::{Result, TrainError};

/// Signed sums of `∂L/∂w · w` per unit, over the calibration tokens so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Importance {
    /// Per layer, one value per query head.
    pub heads: Vec<Vec<f64>>,
    /// Per layer, one value per MLP neuron.
    pub neurons: Vec<Vec<f64>>,
    /// Tokens predicted so far, and the sum of their losses (nats).
    pub tokens: usize,
    pub loss_sum: f64,
}

impl Importance {
    pub fn new(c: &Config) -> Self {
        Self {
            heads: vec![vec![0.0; c.heads.n_heads]; c.n_layers],
            neurons: vec![vec![0.0; c.ffn_hidden]; c.n_layers],
            tokens: 0,
            loss_sum: 0.0,
        }
    }

    /// Mean next-token loss so far.
    pub fn mean_loss(&self) -> f64 {
        self.loss_sum / self.tokens.max(1) as f64
    }

    /// Adds one chunk of calibration text (at least two tokens; the
    /// model's cache is emptied before and after).
    pub fn add_chunk(&mut self, model: &mut Decoder<BurnBackend>, tokens: &[u32]) -> Result<()> {
        let c = model.config().clone();
        if self.heads.len() != c.n_layers
            || self.neurons.first().map(Vec::len) != Some(c.ffn_hidden)
        {
            return Err(TrainError::Input(
                "importance of another model's shape".into(),
            ));
        }
        let b = model.backend().clone();
        let q_cols = c.heads.n_heads * c.heads.head_dim;
        let leaves = (0..c.n_layers)
            .map(|_| -> Result<Probes<BurnTensor>> {
                let ones = |w: usize| b.leaf(&vec![1.0; w], 1, w);
                Ok(Probes {
                    q: ones(q_cols)?,
                    attn: ones(q_cols)?,
                    gate: ones(c.ffn_hidden)?,
                    up: ones(c.ffn_hidden)?,
                    down: ones(c.ffn_hidden)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        model.set_probes(Some(leaves.clone()))?;
        let loss = next_token_loss(model, tokens);
        model.set_probes(None)?;
        model.truncate_cache(0)?;
        let loss = loss?;
        let all: Vec<&BurnTensor> = (leaves.iter())
            .flat_map(|p| [&p.q, &p.attn, &p.gate, &p.up, &p.down])
            .collect();
        let value = b.to_vec(&loss)?[0] as f64;
        let grads = b.gradients(&loss, &all)?;
        let grad = |k: usize| grads[k].clone().unwrap_or_default();
        let hd = c.heads.head_dim;
        for l in 0..c.n_layers {
            let [q, attn, gate, up, down] = [0, 1, 2, 3, 4].map(|j| grad(5 * l + j));
            for (h, v) in self.heads[l].iter_mut().enumerate() {
                let cols = h * hd..(h + 1) * hd;
                *v +=
                    (q.get(cols.clone()).map_or(0.0, sum) + attn.get(cols).map_or(0.0, sum)) as f64;
            }
            for (n, v) in self.neurons[l].iter_mut().enumerate() {
                let at = |g: &[f32]| g.get(n).copied().unwrap_or(0.0);
                *v += (at(&gate) + at(&up) + at(&down)) as f64;
            }
        }
        self.tokens += tokens.len() - 1;
        self.loss_sum += value;
        Ok(())
    }
}

fn sum(v: &[f32]) -> f32 {
    v.iter().sum()
}

/// The summed next-token loss (nats) of `tokens` from an empty cache,
/// `[1, 1]` (tracked where the model's probes are).
pub(crate) fn next_token_loss(
    model: &mut Decoder<BurnBackend>,
    tokens: &[u32],
) -> Result<BurnTensor> {
    let n = tokens.len();
    if n < 2 {
        return Err(TrainError::Input(
            "a calibration chunk needs two tokens".into(),
        ));
    }
    model.truncate_cache(0)?;
    let x = model.embed_rows(
        &tokens[..n - 1]
            .iter()
            .map(|&t| arbor_model::Row::Token(t))
            .collect::<Vec<_>>(),
    )?;
    let positions: Vec<u32> = (0..(n - 1) as u32).collect();
    let h = model.forward_hidden(x, &positions, &Mask::causal(0, n - 1))?;
    let rows: Vec<usize> = (0..n - 1).collect();
    let logits = model.head(&h, &rows)?;
    let device = model.backend().device().clone();
    // A head in frequency order has each token's logit at its head row.
    let targets: Vec<i64> = (model.head_columns(&tokens[1..]).into_iter())
        .map(|c| c as i64)
        .collect();
    let targets = Tensor::<2, Int>::from_data(TensorData::new(targets, [n - 1, 1]), &device);
    let picked = log_softmax(logits.inner().clone(), 1).gather(1, targets);
    Ok(BurnTensor::from_inner(picked.sum().neg().reshape([1, 1])))
}

/// The mean next-token loss (nats) of `chunks`, each from an empty cache
/// (left empty).
pub fn mean_loss(model: &mut Decoder<BurnBackend>, chunks: &[Vec<u32>]) -> Result<f64> {
    let (mut total, mut n) = (0.0, 0usize);
    for c in chunks {
        let l = next_token_loss(model, c)?;
        total += model.backend().to_vec(&l)?[0] as f64;
        n += c.len() - 1;
        model.truncate_cache(0)?;
    }
    Ok(total / n.max(1) as f64)
}

/// The mean next-token loss of `chunks` with each layer skipped in turn,
/// less the loss with every layer: the loss each layer's removal costs.
/// Also returns the full model's mean loss.
pub fn layer_costs(
    model: &Decoder<BurnBackend>,
    chunks: &[Vec<u32>],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(f64, Vec<f64>)> {
    let layers = model.config().n_layers;
    let mean =
        |keep: &[bool]| -> Result<f64> { mean_loss(&mut model.self_draft_with(keep)?, chunks) };
    let base = mean(&vec![true; layers])?;
    let mut costs = Vec::with_capacity(layers);
    for l in 0..layers {
        progress(l, layers);
        let keep: Vec<bool> = (0..layers).map(|i| i != l).collect();
        costs.push(mean(&keep)? - base);
    }
    progress(layers, layers);
    Ok((base, costs))
}

/// Importance as written to disk: the sums, each layer's removal cost
/// (empty until measured) and free-form provenance, in a safetensors file
/// (`heads` `[layers, heads]`, `neurons` `[layers, ffn]`, `layer_costs`
/// `[layers]`, all f64; `tokens` and `loss_sum` in the metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct ImportanceFile {
    pub importance: Importance,
    pub layer_costs: Vec<f64>,
    pub meta: std::collections::BTreeMap<String, String>,
}

impl ImportanceFile {
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.to_tensors()?.to_bytes().map_err(file_error)
    }

    fn to_tensors(&self) -> Result<TensorFile> {
        let imp = &self.importance;
        let width = |v: &[Vec<f64>]| v.first().map_or(0, Vec::len);
        if imp.heads.iter().any(|h| h.len() != width(&imp.heads))
            || imp.neurons.iter().any(|n| n.len() != width(&imp.neurons))
            || imp.heads.len() != imp.neurons.len()
        {
            return Err(file_error("ragged per-layer values"));
        }
        let mut file = TensorFile::with_meta(self.meta.clone());
        file.meta.insert("tokens".into(), imp.tokens.to_string());
        file.meta
            .insert("loss_sum".into(), imp.loss_sum.to_string());
        let flat = |v: &[Vec<f64>]| v.iter().flatten().copied().collect();
        file.put_f64(
            "heads",
            vec![imp.heads.len(), width(&imp.heads)],
            flat(&imp.heads),
        );
        file.put_f64(
            "neurons",
            vec![imp.neurons.len(), width(&imp.neurons)],
            flat(&imp.neurons),
        );
        if !self.layer_costs.is_empty() {
            let costs = self.layer_costs.clone();
            file.put_f64("layer_costs", vec![costs.len()], costs);
        }
        Ok(file)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut file = TensorFile::from_bytes(bytes).map_err(file_error)?;
        let mut rows = |name: &str| -> Result<Vec<Vec<f64>>> {
            let (shape, v) = file.take_f64(name).map_err(file_error)?;
            match shape[..] {
                [_, w] if w > 0 => Ok(v.chunks(w).map(<[f64]>::to_vec).collect()),
                _ => Err(file_error(format!("{name} has shape {shape:?}"))),
            }
        };
        let (heads, neurons) = (rows("heads")?, rows("neurons")?);
        if heads.len() != neurons.len() {
            return Err(file_error("heads and neurons cover different layers"));
        }
        let layer_costs = match file.contains("layer_costs") {
            true => file.take_f64("layer_costs").map_err(file_error)?.1,
            false => Vec::new(),
        };
        let mut meta = file.meta;
        let mut num = |k: &str| -> Result<f64> {
            let v = meta
                .remove(k)
                .ok_or_else(|| file_error(format!("no `{k}`")))?;
            v.parse().map_err(|_| file_error(format!("`{k}` is `{v}`")))
        };
        let (tokens, loss_sum) = (num("tokens")? as usize, num("loss_sum")?);
        Ok(Self {
            importance: Importance {
                heads,
                neurons,
                tokens,
                loss_sum,
            },
            layer_costs,
            meta,
        })
    }

    /// Writes the file whole (through a temporary file beside it, so that
    /// an interrupted save leaves the old one).
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        self.to_tensors()?.save(path).map_err(file_error)
    }
}

fn file_error(m: impl std::fmt::Display) -> TrainError {
    TrainError::Input(format!("importance file: {m}"))
}
