//! Writing a slim draft GGUF from a draft GGUF.

use std::path::Path;
use std::time::Instant;

use arbor_gguf::{GgmlType, GgufFile, GgufWriter, TensorInfo, Value, dequantize_rows};
use arbor_model::{Layout, TensorEntry};

use super::quant::quantize;
use super::{
    KEY_CORPUS, KEY_K, KEY_QUANT, KEY_SOURCE, KEY_SOURCE_BYTES, KEY_TOKEN_IDS, Quant, SlimOptions,
    TokenCounts, kept_ids, special_ids,
};
use crate::DraftError;

/// What [`derive()`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SlimReport {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// The vocabulary (rows of the token table).
    pub vocab: usize,
    /// Rows of the new head (K).
    pub head_rows: usize,
    /// Special tokens among them.
    pub specials: usize,
    pub head_type: GgmlType,
    /// Bytes of the new head, of all layers, and of the token table.
    pub head_bytes: u64,
    pub layer_bytes: u64,
    pub embedding_bytes: u64,
    /// Corpus tokens counted, and how many of them are kept ids.
    pub corpus_tokens: u64,
    pub covered_tokens: u64,
    pub secs: f64,
}

impl SlimReport {
    /// Bytes of weights one draft pass reads: every layer and the head
    /// (the token table is read one row per token).
    pub fn pass_bytes(&self) -> u64 {
        self.layer_bytes + self.head_bytes
    }

    /// Share of the corpus's tokens the head keeps.
    pub fn coverage(&self) -> f64 {
        self.covered_tokens as f64 / self.corpus_tokens.max(1) as f64
    }
}

/// Writes to `output` a slim copy of the draft GGUF `input`: its head
/// restricted to `opts.k` tokens (special tokens, then the most frequent of
/// `counts`), layers and head stored as `opts` asks, every metadata key
/// kept and the slim keys added. `progress(done, total)` counts tensors.
pub fn derive(
    input: &Path,
    output: &Path,
    opts: &SlimOptions,
    counts: &TokenCounts,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SlimReport, DraftError> {
    let start = Instant::now();
    let file = GgufFile::open(input)?;
    let h = file.header();
    if h.get(KEY_TOKEN_IDS).is_some() {
        return Err(DraftError::AlreadySlim(input.to_path_buf()));
    }
    let layout = Layout::from_gguf(h).map_err(|source| DraftError::NotAModel {
        path: input.to_path_buf(),
        source,
    })?;
    let vocab = layout.config.vocab_size;
    counts.check_matches(h)?;
    if counts.vocab_size() != vocab {
        return Err(DraftError::TokenizerMetadata(format!(
            "{} tokens in the tokenizer, {vocab} rows in the token table",
            counts.vocab_size()
        )));
    }
    let specials = special_ids(h, vocab)?;
    let ids = kept_ids(counts.counts(), opts.k, &specials)?;
    let source_head = layout.head_tensor();
    check_width(source_head, opts.head)?;
    check_width(&layout.embedding, opts.embedding)?;
    for e in layout.layers.iter().flatten().filter(|e| e.rows > 1) {
        check_width(e, opts.layers)?;
    }

    let mut w = GgufWriter::new();
    for (key, value) in &h.metadata {
        w.add_meta(key.clone(), value.clone());
    }
    let source_name = input.file_name().map(|n| n.to_string_lossy().into_owned());
    w.add_meta(
        KEY_TOKEN_IDS,
        Value::Array(ids.iter().map(|&i| Value::U32(i)).collect()),
    )
    .add_meta(KEY_K, Value::U32(ids.len() as u32))
    .add_meta(KEY_CORPUS, Value::String(counts.corpus().to_string()))
    .add_meta(KEY_SOURCE, Value::String(source_name.unwrap_or_default()))
    .add_meta(KEY_SOURCE_BYTES, Value::U64(file.bytes().len() as u64))
    .add_meta(KEY_QUANT, Value::String(opts.layers.name().into()));

    let mut report = SlimReport {
        input_bytes: file.bytes().len() as u64,
        output_bytes: 0,
        vocab,
        head_rows: ids.len(),
        specials: specials.len(),
        head_type: opts.head.target(source_head.ty),
        head_bytes: 0,
        layer_bytes: 0,
        embedding_bytes: 0,
        corpus_tokens: counts.total(),
        covered_tokens: ids.iter().map(|&i| counts.counts()[i as usize]).sum(),
        secs: 0.0,
    };
    let tied = layout.head.is_none();
    let total = h.tensors.len() + usize::from(tied);
    // Every tensor is declared with its new type and shape, then written a
    // tensor at a time: only one converted tensor is held at once.
    let head_dims = |cols: u64| [cols, ids.len() as u64];
    for info in &h.tensors {
        let cols = info.dims[0];
        if info.name == "output.weight" {
            w.add_tensor_later(&info.name, &head_dims(cols), report.head_type);
        } else if info.name == "token_embd.weight" {
            w.add_tensor_later(&info.name, &info.dims, opts.embedding.target(info.ty));
            if tied {
                // The head was the token table: it gets a table of its own.
                w.add_tensor_later("output.weight", &head_dims(cols), report.head_type);
            }
        } else {
            w.add_tensor_later(&info.name, &info.dims, layer_type(info, opts.layers));
        }
    }
    let mut done = 0;
    let mut fill = |name: &str| -> Result<Vec<u8>, DraftError> {
        done += 1;
        progress(done, total);
        // The head's rows come from the source's head (its token table
        // when tied); every other tensor from its namesake.
        let info = match name {
            "output.weight" => h.tensor(&source_head.name)?,
            _ => h.tensor(name)?,
        };
        let bytes = file.tensor_bytes(info);
        let data = match name {
            "output.weight" => {
                let (_, data) = head(source_head, bytes, &ids, opts.head)?;
                report.head_bytes = data.len() as u64;
                data
            }
            "token_embd.weight" => {
                let cols = info.dims[0] as usize;
                let (_, data) = opts.embedding.convert(name, info.ty, cols, bytes)?;
                report.embedding_bytes = data.len() as u64;
                data
            }
            _ => {
                let (_, data) = layer_tensor(info, bytes, opts.layers)?;
                if name.starts_with("blk.") {
                    report.layer_bytes += data.len() as u64;
                }
                data
            }
        };
        file.release(info);
        Ok(data)
    };
    // A failed write leaves no file behind.
    w.write_with(output, &mut fill)?;
    report.output_bytes = std::fs::metadata(output).map_or(0, |m| m.len());
    report.secs = start.elapsed().as_secs_f64();
    Ok(report)
}

/// Fails when `quant` changes the type of `e` and its rows are not whole
/// blocks of the new type.
fn check_width(e: &TensorEntry, quant: Quant) -> Result<(), DraftError> {
    if quant.target(e.ty) != e.ty && !e.cols.is_multiple_of(quant.block_len(e.ty)) {
        return Err(DraftError::RowWidth {
            tensor: e.name.clone(),
            cols: e.cols,
            quant: quant.name(),
        });
    }
    Ok(())
}

/// The type [`layer_tensor`] gives `info`.
fn layer_type(info: &TensorInfo, quant: Quant) -> GgmlType {
    match info.dims.len() == 2 && info.name.starts_with("blk.") {
        true => quant.target(info.ty),
        false => info.ty,
    }
}

/// A tensor outside the head and the token table: matrices of the layers
/// in `quant`, everything else (norms, biases) as it is.
fn layer_tensor(
    info: &TensorInfo,
    bytes: &[u8],
    quant: Quant,
) -> Result<(GgmlType, Vec<u8>), DraftError> {
    if info.dims.len() == 2 && info.name.starts_with("blk.") {
        quant.convert(&info.name, info.ty, info.dims[0] as usize, bytes)
    } else {
        Ok((info.ty, bytes.to_vec()))
    }
}

/// The rows `ids` of the head `source` (whose bytes are `bytes`), in
/// `quant`: copied when the type stays (rows are whole blocks), else
/// dequantized row by row and quantized again.
fn head(
    source: &TensorEntry,
    bytes: &[u8],
    ids: &[u32],
    quant: Quant,
) -> Result<(GgmlType, Vec<u8>), DraftError> {
    let ty = quant.target(source.ty);
    let row_bytes = bytes.len() / source.rows;
    if ty == source.ty {
        let mut out = Vec::with_capacity(ids.len() * row_bytes);
        for &i in ids {
            let at = i as usize * row_bytes;
            out.extend_from_slice(&bytes[at..at + row_bytes]);
        }
        return Ok((ty, out));
    }
    let rows: Vec<u8> = head(source, bytes, ids, Quant::Keep)?.1;
    if source.ty == GgmlType::Q5_0 && ty == GgmlType::Q8_0 {
        return Ok((ty, arbor_gguf::repack_q5_0_to_q8_0(&rows)?));
    }
    let all: Vec<usize> = (0..ids.len()).collect();
    let values = dequantize_rows(source.ty, &rows, source.cols, &all)?;
    Ok((ty, quantize(ty, &values)))
}
