//! Writing an elastic GGUF: every layer's units in their ranked order, the
//! levels in the metadata.

use std::path::{Path, PathBuf};
use std::time::Instant;

use arbor_gguf::{GgmlType, GgufFile, GgufWriter, Value, dequantize, quantize_q5_0, quantize_q8_0};
use arbor_model::{Config, Elastic, Layout, TensorEntry};

use crate::order::{head_order, neuron_order};
use crate::{ElasticError, Order, Result, Scores, cuts};

/// What the down projection is stored as once its columns are permuted
/// (its neurons sit inside quantization blocks, so it is quantized again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownType {
    /// 8.5 bits a weight: requantizing 4- to 6-bit values costs almost
    /// nothing.
    Q8_0,
    /// 5.5 bits a weight: smaller, a second rounding on top of the file's.
    Q5_0,
}

impl DownType {
    pub fn ty(self) -> GgmlType {
        match self {
            DownType::Q8_0 => GgmlType::Q8_0,
            DownType::Q5_0 => GgmlType::Q5_0,
        }
    }

    fn quantize(self, x: &[f32]) -> Vec<u8> {
        match self {
            DownType::Q8_0 => quantize_q8_0(x),
            DownType::Q5_0 => quantize_q5_0(x),
        }
    }
}

impl std::str::FromStr for DownType {
    type Err = ElasticError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "q8_0" => Ok(DownType::Q8_0),
            "q5_0" => Ok(DownType::Q5_0),
            _ => Err(ElasticError::Input(format!(
                "unknown down type `{s}` (q8_0 or q5_0)"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Fractions of each non-anchor layer's units kept (1 is added).
    pub levels: Vec<f64>,
    /// Layers kept whole.
    pub anchors: Vec<usize>,
    pub order: Order,
    pub down: DownType,
    /// The output head's rows in this order (token ids, most frequent
    /// first: every token once), so that its first rows are a smaller
    /// head; `None` keeps token order. Needs an untied head.
    pub vocab: Option<Vec<u32>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BuildReport {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// Query heads that move together.
    pub head_run: usize,
    /// Output projections quantized again (their heads were not whole
    /// blocks), of all layers.
    pub requantized_o: usize,
    pub levels: Vec<f64>,
    /// Bytes of layer weights each level multiplies per token.
    pub level_bytes: Vec<u64>,
    pub secs: f64,
}

/// Writes the elastic version of the model at `input` to `output`: units
/// ranked by `scores` (importance or magnitude; none for file order), the
/// levels of `opts` in the metadata. `progress(done, total)` counts layers.
pub fn build(
    input: &Path,
    output: &Path,
    scores: Option<&Scores>,
    opts: &BuildOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<BuildReport> {
    let start = Instant::now();
    let file = GgufFile::open(input)?;
    let h = file.header();
    if Elastic::is_elastic(h) {
        return Err(ElasticError::Input(format!(
            "{} is already elastic",
            input.display()
        )));
    }
    let layout = Layout::from_gguf(h)?;
    let c = &layout.config;
    let scores = match (opts.order, scores) {
        (Order::File, _) => None,
        (_, Some(s)) => {
            s.check(c)?;
            Some(s)
        }
        (order, None) => {
            return Err(ElasticError::Input(format!(
                "{} order needs scores",
                order.name()
            )));
        }
    };
    if let Some(&a) = opts.anchors.iter().find(|&&a| a >= c.n_layers) {
        return Err(ElasticError::Input(format!(
            "anchor layer {a} of {} layers",
            c.n_layers
        )));
    }
    let head_run = head_run(c, &layout)?;
    let step = neuron_step(opts.down.ty());
    let (levels, level_cuts) = cuts(c, head_run, &opts.anchors, &opts.levels, step)?;
    let elastic = Elastic {
        levels,
        head_run,
        anchors: opts.anchors.clone(),
        cuts: level_cuts,
        order: opts.order.name().to_string(),
        vocab: opts.vocab.clone(),
    };
    elastic.validate(c)?;
    let mut head = match (&opts.vocab, &layout.head) {
        (Some(_), None) => {
            return Err(ElasticError::Input(
                "the head is tied to the token embedding: its rows cannot be put in frequency \
                 order (build without a vocabulary order)"
                    .into(),
            ));
        }
        (Some(order), Some(h)) => {
            let rows: Vec<usize> = order.iter().map(|&t| t as usize).collect();
            Some((h.name.clone(), move_rows(h, file.tensor(&h.name)?.1, &rows)))
        }
        (None, _) => None,
    };
    let mut w = GgufWriter::new();
    for (key, value) in &h.metadata {
        w.add_meta(key.clone(), value.clone());
    }
    for (key, value) in elastic.metadata() {
        w.add_meta(key, value);
    }
    let name = input.file_name().map(|n| n.to_string_lossy().into_owned());
    w.add_meta(
        "arbor.elastic.source",
        Value::String(name.unwrap_or_default()),
    );
    w.add_meta(
        "arbor.elastic.down_type",
        Value::String(opts.down.ty().name().into()),
    );
    let mut head_scores = Vec::new();
    let mut neuron_scores = Vec::new();
    let mut requantized_o = 0;
    let in_layers: std::collections::HashSet<&str> = (layout.layers.iter().flatten())
        .map(|e| e.name.as_str())
        .collect();
    // Tensors outside the layers (embedding, norm, head) as they are, the
    // head's rows in frequency order where asked.
    for info in &h.tensors {
        if !in_layers.contains(info.name.as_str()) {
            let bytes = match head.take_if(|(name, _)| *name == info.name) {
                Some((_, moved)) => moved,
                None => file.tensor_bytes(info).to_vec(),
            };
            w.add_tensor(&info.name, &info.dims, info.ty, bytes);
            file.release(info);
        }
    }
    for (i, entries) in layout.layers.iter().enumerate() {
        let anchor = opts.anchors.contains(&i);
        let heads = head_order(c, head_run, scores.map(|s| s.heads[i].as_slice()));
        // Anchor layers are never cut: their neurons stay where they are,
        // and their down projection keeps its bytes.
        let neurons = match anchor {
            true => (0..c.ffn_hidden).collect(),
            false => neuron_order(c, scores.map(|s| s.neurons[i].as_slice())),
        };
        if let Some(s) = scores {
            head_scores.extend(heads.iter().map(|&h| Value::F32(s.heads[i][h] as f32)));
            neuron_scores.extend(neurons.iter().map(|&n| Value::F32(s.neurons[i][n] as f32)));
        }
        for e in entries {
            let (_, bytes) = file.tensor(&e.name)?;
            let role = e
                .name
                .rsplit_once(&format!("blk.{i}."))
                .map_or("", |(_, r)| r);
            let (ty, data) = match role {
                "attn_q.weight" => (e.ty, move_rows(e, bytes, &spread(&heads, c.heads.head_dim))),
                "attn_q.bias" => (
                    e.ty,
                    move_values(e, bytes, &spread(&heads, c.heads.head_dim))?,
                ),
                "attn_output.weight" => {
                    let cols = spread(&heads, c.heads.head_dim);
                    match move_cols(e, bytes, &cols) {
                        Some(data) => (e.ty, data),
                        None => {
                            requantized_o += 1;
                            (
                                GgmlType::Q8_0,
                                requantize_cols(e, bytes, &cols, DownType::Q8_0)?,
                            )
                        }
                    }
                }
                "ffn_gate.weight" | "ffn_up.weight" => (e.ty, move_rows(e, bytes, &neurons)),
                "ffn_down.weight" if !anchor => (
                    opts.down.ty(),
                    requantize_cols(e, bytes, &neurons, opts.down)?,
                ),
                _ => (e.ty, bytes.to_vec()),
            };
            let info = h.tensor(&e.name)?;
            if role == "ffn_down.weight" && !anchor {
                // Again as column segments between the levels' cuts, so a
                // split layer reads its held and its streamed part whole.
                let ends: Vec<usize> = elastic.cuts.iter().map(|c| c[i].neurons).collect();
                for (k, (cols, seg)) in column_segments(&data, e.rows, ty, &ends)
                    .into_iter()
                    .enumerate()
                {
                    let name = format!("{}.seg{k}", e.name);
                    w.add_tensor(&name, &[cols as u64, e.rows as u64], ty, seg);
                }
            }
            w.add_tensor(&e.name, &info.dims, ty, data);
            file.release(info);
        }
        progress(i + 1, c.n_layers);
    }
    if scores.is_some() {
        w.add_meta("arbor.elastic.head_scores", Value::Array(head_scores));
        w.add_meta("arbor.elastic.neuron_scores", Value::Array(neuron_scores));
    }
    w.write(output).map_err(|source| ElasticError::Write {
        path: PathBuf::from(output),
        source,
    })?;
    let written = Layout::from_gguf(GgufFile::open(output)?.header())?;
    let level_bytes = (0..elastic.levels.len())
        .map(|l| elastic.level_bytes(&written, l))
        .collect();
    Ok(BuildReport {
        input_bytes: file.bytes().len() as u64,
        output_bytes: std::fs::metadata(output).map_or(0, |m| m.len()),
        head_run,
        requantized_o,
        levels: elastic.levels.clone(),
        level_bytes,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// Query heads that move together: 1 where every output projection's
/// blocks hold whole heads, else the smallest run whose columns are whole
/// blocks and that divides a KV head's group (2 for 128-wide heads in
/// 256-wide K-quant blocks); where none does, those projections are
/// quantized again to Q8_0 and heads move alone.
fn head_run(c: &Config, layout: &Layout) -> Result<usize> {
    let (d, group) = (c.heads.head_dim, c.heads.n_heads / c.heads.n_kv_heads);
    let widest = (layout.layers.iter().flatten())
        .filter(|e| e.name.ends_with("attn_output.weight"))
        .map(|e| e.ty.block_len())
        .max()
        .unwrap_or(1);
    Ok((1..=group)
        .find(|&r| group.is_multiple_of(r) && (r * d).is_multiple_of(widest))
        .unwrap_or(1))
}

/// Neurons a level keeps are multiples of this: whole blocks of the down
/// projection's columns, and whole groups of eight gate and up rows.
fn neuron_step(down: GgmlType) -> usize {
    let b = down.block_len();
    if b.is_multiple_of(8) { b } else { b * 8 }
}

/// Each of `units` (heads) widened to its `width` consecutive indices.
fn spread(units: &[usize], width: usize) -> Vec<usize> {
    units
        .iter()
        .flat_map(|&u| u * width..(u + 1) * width)
        .collect()
}

/// The rows of `e` in the order `rows` (`rows[p]` is the row stored at
/// `p`): whole rows of blocks move, nothing is rounded.
fn move_rows(e: &TensorEntry, bytes: &[u8], rows: &[usize]) -> Vec<u8> {
    let row = bytes.len() / e.rows;
    rows.iter()
        .flat_map(|&r| &bytes[r * row..(r + 1) * row])
        .copied()
        .collect()
}

/// A vector (a bias) in the order `idx`.
fn move_values(e: &TensorEntry, bytes: &[u8], idx: &[usize]) -> Result<Vec<u8>> {
    if e.ty != GgmlType::F32 {
        return Err(ElasticError::Input(format!(
            "`{}` is {}, not F32",
            e.name, e.ty
        )));
    }
    Ok(idx
        .iter()
        .flat_map(|&i| &bytes[4 * i..4 * i + 4])
        .copied()
        .collect())
}

/// Every row's columns in the order `cols`, moving whole blocks when the
/// order keeps each block's columns together and in order (`None` when
/// it does not).
fn move_cols(e: &TensorEntry, bytes: &[u8], cols: &[usize]) -> Option<Vec<u8>> {
    let (len, size) = (e.ty.block_len(), e.ty.block_bytes());
    let blocks: Vec<usize> = cols.chunks(len).map(|c| c[0] / len).collect();
    let whole = cols
        .chunks(len)
        .all(|c| c.len() == len && c[0] % len == 0 && c.windows(2).all(|w| w[1] == w[0] + 1));
    if !whole {
        return None;
    }
    let row = bytes.len() / e.rows;
    let mut out = Vec::with_capacity(bytes.len());
    for r in bytes.chunks_exact(row) {
        for &b in &blocks {
            out.extend_from_slice(&r[b * size..(b + 1) * size]);
        }
    }
    Some(out)
}

/// Every row's columns in the order `cols`, dequantized and quantized
/// again as `to`.
fn requantize_cols(e: &TensorEntry, bytes: &[u8], cols: &[usize], to: DownType) -> Result<Vec<u8>> {
    if !e.cols.is_multiple_of(to.ty().block_len()) {
        return Err(ElasticError::Input(format!(
            "`{}` has rows of {} values, not whole {} blocks",
            e.name,
            e.cols,
            to.ty()
        )));
    }
    let values = dequantize(e.ty, bytes, e.rows * e.cols)?;
    let mut permuted = Vec::with_capacity(values.len());
    for r in values.chunks_exact(e.cols) {
        permuted.extend(cols.iter().map(|&c| r[c]));
    }
    Ok(to.quantize(&permuted))
}

/// The columns of a row-major `[rows, ·]` matrix of type `ty` cut at the
/// distinct `ends` (increasing; the last is every column), each piece a
/// row-major matrix of its own: `(columns, bytes)`.
fn column_segments(
    data: &[u8],
    rows: usize,
    ty: GgmlType,
    ends: &[usize],
) -> Vec<(usize, Vec<u8>)> {
    let (bl, bb) = (ty.block_len(), ty.block_bytes());
    let row_bytes = data.len() / rows;
    let mut cuts: Vec<usize> = ends.to_vec();
    cuts.dedup();
    let mut out = Vec::with_capacity(cuts.len());
    let mut start = 0;
    for &end in &cuts {
        let (a, b) = (start / bl * bb, end / bl * bb);
        let mut seg = Vec::with_capacity(rows * (b - a));
        for r in 0..rows {
            seg.extend_from_slice(&data[r * row_bytes + a..r * row_bytes + b]);
        }
        out.push((end - start, seg));
        start = end;
    }
    out
}
