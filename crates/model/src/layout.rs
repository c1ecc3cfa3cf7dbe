//! What a GGUF file holds, parsed once: hyper-parameters ([`Config`]) and
//! where every tensor the decoder uses lies in the file ([`Layout`]). The
//! loader, the memory plan and the layer streamer all read the same
//! [`Layout`].

use arbor_gguf::{GgmlType, Header, TensorInfo};
use arbor_tensor::{Heads, Rope, RopeStyle};

use crate::{ModelError, Result};

/// Hyper-parameters, read from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden: usize,
    pub ffn_hidden: usize,
    pub n_layers: usize,
    pub heads: Heads,
    pub rms_eps: f32,
    pub rope: Rope,
    pub context_length: usize,
}

impl Config {
    /// The output head's share of a token row's multiply-adds (the rest
    /// are the layers' projections and MLP): 0.15 for Qwen2.5-1.5B, 0.28
    /// for the 0.5B, whose 150k vocabulary weighs more against 24 narrow
    /// layers.
    pub fn head_share(&self) -> f64 {
        let (d, kv) = (
            self.hidden as f64,
            (self.heads.n_kv_heads * self.heads.head_dim) as f64,
        );
        let layer = d * (2.0 * d + 2.0 * kv) + 3.0 * d * self.ffn_hidden as f64;
        let head = d * self.vocab_size as f64;
        head / (head + self.n_layers as f64 * layer)
    }

    pub fn from_gguf(h: &Header) -> Result<Self> {
        let arch = h.architecture()?.to_string();
        let style = match arch.as_str() {
            "llama" => RopeStyle::Interleaved,
            "qwen2" => RopeStyle::Halves,
            _ => return Err(ModelError::UnsupportedArchitecture(arch)),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let hidden = h.get_usize(&key("embedding_length"))?;
        let n_heads = h.get_usize(&key("attention.head_count"))?;
        let n_kv_heads = match h.get(&key("attention.head_count_kv")) {
            Some(_) => h.get_usize(&key("attention.head_count_kv"))?,
            None => n_heads,
        };
        if n_heads == 0 || n_kv_heads == 0 || hidden % n_heads != 0 || n_heads % n_kv_heads != 0 {
            return Err(ModelError::Invalid(format!(
                "{n_heads} heads, {n_kv_heads} kv heads, hidden size {hidden}"
            )));
        }
        let head_dim = hidden / n_heads;
        if let Some(v) = h.get(&key("rope.dimension_count"))
            && v.as_u64() != Some(head_dim as u64)
        {
            return Err(ModelError::Invalid(format!(
                "partial rotary embeddings ({v:?} of {head_dim} dims) are not supported"
            )));
        }
        let theta = match h.get(&key("rope.freq_base")) {
            Some(_) => h.get_f64(&key("rope.freq_base"))? as f32,
            None => 10_000.0,
        };
        let embd = h.tensor("token_embd.weight")?;
        let vocab_size = dims2(embd)?.0;
        if dims2(embd)?.1 != hidden {
            return Err(ModelError::Invalid(
                "token_embd width != embedding_length".into(),
            ));
        }
        Ok(Self {
            vocab_size,
            hidden,
            ffn_hidden: h.get_usize(&key("feed_forward_length"))?,
            n_layers: h.get_usize(&key("block_count"))?,
            heads: Heads {
                order: crate::Elastic::head_order(h)?,
                ..Heads::grouped(n_heads, n_kv_heads, head_dim)
            },
            rms_eps: h.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            rope: Rope {
                style,
                theta,
                head_dim,
            },
            context_length: h.get_usize(&key("context_length")).unwrap_or(4096),
            architecture: arch,
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.heads.n_kv_heads * self.heads.head_dim
    }
}

/// `(rows, cols)` of a GGUF matrix (ggml stores `[cols, rows]`).
fn dims2(t: &TensorInfo) -> Result<(usize, usize)> {
    match t.dims[..] {
        [cols] => Ok((1, cols as usize)),
        [cols, rows] => Ok((rows as usize, cols as usize)),
        _ => Err(ModelError::Invalid(format!(
            "`{}` has shape {:?}, expected a matrix",
            t.name, t.dims
        ))),
    }
}

/// One tensor of the model: name, shape, type and where its bytes are in
/// the file (absolute offset).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub ty: GgmlType,
    pub offset: u64,
    pub len: usize,
}

impl TensorEntry {
    /// The entry of tensor `name`, which must be `[rows, cols]`.
    fn find(h: &Header, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let info = h.tensor(name)?;
        if dims2(info)? != (rows, cols) {
            return Err(ModelError::Invalid(format!(
                "`{name}` is {:?}, expected [{rows}, {cols}]",
                dims2(info)?
            )));
        }
        Ok(Self {
            name: name.to_string(),
            rows,
            cols,
            ty: info.ty,
            offset: h.data_offset + info.offset,
            len: info.size as usize,
        })
    }
}

/// A GGUF model's config and the entries of every tensor the decoder uses,
/// shapes checked against the config.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    pub config: Config,
    /// The token embedding, `[vocab, hidden]`.
    pub embedding: TensorEntry,
    /// The output head, `[rows, hidden]` with `rows ≤ vocab` (a slim draft's
    /// head keeps only some tokens; its logits have `rows` columns); `None`
    /// when it is tied to the embedding.
    pub head: Option<TensorEntry>,
    /// The final norm, `[1, hidden]`.
    pub norm: TensorEntry,
    /// Each layer's tensors, in the order the forward pass uses them.
    pub layers: Vec<Vec<TensorEntry>>,
    /// The levels of an elastic file (see [`crate::Elastic`]).
    pub elastic: Option<crate::Elastic>,
    /// Each layer's down projection stored again as column segments between
    /// consecutive elastic levels (`blk.N.ffn_down.weight.segK`): what split
    /// layers hold and stream (see [`crate::split`]); empty where the file
    /// has none. Whole layers hold the whole matrix.
    pub down_segments: Vec<Vec<TensorEntry>>,
}

impl Layout {
    pub fn from_gguf(h: &Header) -> Result<Self> {
        let config = Config::from_gguf(h)?;
        let (vocab, d) = (config.vocab_size, config.hidden);
        let embedding = TensorEntry::find(h, "token_embd.weight", vocab, d)?;
        let layers = (0..config.n_layers)
            .map(|i| layer_tensors(&config, h, i))
            .collect::<Result<_>>()?;
        let norm = TensorEntry::find(h, "output_norm.weight", 1, d)?;
        let head = match h.tensor("output.weight") {
            Ok(info) => {
                let rows = dims2(info)?.0;
                if rows == 0 || rows > vocab {
                    return Err(ModelError::Invalid(format!(
                        "`output.weight` has {rows} rows for a vocabulary of {vocab}"
                    )));
                }
                Some(TensorEntry::find(h, "output.weight", rows, d)?)
            }
            Err(_) => None,
        };
        let elastic = crate::Elastic::from_header(h, &config)?;
        if elastic.as_ref().is_some_and(|e| e.vocab.is_some())
            && head.as_ref().is_none_or(|h| h.rows != vocab)
        {
            return Err(ModelError::Invalid(
                "an elastic file whose head rows are in frequency order needs an untied head \
                 of the whole vocabulary"
                    .into(),
            ));
        }
        let down_segments: Vec<Vec<TensorEntry>> = (0..config.n_layers)
            .map(|i| down_segments(&config, h, i))
            .collect::<Result<_>>()?;
        Ok(Self {
            config,
            embedding,
            head,
            norm,
            layers,
            elastic,
            down_segments,
        })
    }

    /// The output head's tensor: `output.weight`, or the token embedding it
    /// is tied to.
    pub fn head_tensor(&self) -> &TensorEntry {
        self.head.as_ref().unwrap_or(&self.embedding)
    }

    /// Rows of the output head: the columns of the logits the decoder
    /// returns (the vocabulary, unless the head is a slim one).
    pub fn head_rows(&self) -> usize {
        self.head
            .as_ref()
            .map_or(self.config.vocab_size, |h| h.rows)
    }
}

/// The tensors of layer `layer`, in the order the forward pass uses them.
fn layer_tensors(c: &Config, h: &Header, layer: usize) -> Result<Vec<TensorEntry>> {
    let (d, kv, ff) = (c.hidden, c.kv_dim(), c.ffn_hidden);
    let mut shapes = vec![
        ("attn_norm.weight", 1, d),
        ("attn_q.weight", d, d),
        ("attn_k.weight", kv, d),
        ("attn_v.weight", kv, d),
        ("attn_q.bias", 1, d),
        ("attn_k.bias", 1, kv),
        ("attn_v.bias", 1, kv),
        ("attn_output.weight", d, d),
        ("ffn_norm.weight", 1, d),
        ("ffn_gate.weight", ff, d),
        ("ffn_up.weight", ff, d),
        ("ffn_down.weight", d, ff),
    ];
    shapes
        .retain(|(n, _, _)| !n.ends_with(".bias") || h.tensor(&format!("blk.{layer}.{n}")).is_ok());
    shapes
        .into_iter()
        .map(|(n, rows, cols)| TensorEntry::find(h, &format!("blk.{layer}.{n}"), rows, cols))
        .collect()
}

/// Layer `layer`'s stored down segments, in column order; they must cover
/// every column.
fn down_segments(c: &Config, h: &Header, layer: usize) -> Result<Vec<TensorEntry>> {
    let mut segs: Vec<TensorEntry> = Vec::new();
    loop {
        let name = format!("blk.{layer}.ffn_down.weight.seg{}", segs.len());
        let Ok(info) = h.tensor(&name) else { break };
        let (rows, cols) = dims2(info)?;
        if rows != c.hidden {
            return Err(ModelError::Invalid(format!(
                "`{name}` has {rows} rows, expected {}",
                c.hidden
            )));
        }
        segs.push(TensorEntry::find(h, &name, rows, cols)?);
    }
    let cols: usize = segs.iter().map(|s| s.cols).sum();
    if !segs.is_empty() && cols != c.ffn_hidden {
        return Err(ModelError::Invalid(format!(
            "layer {layer}'s down segments cover {cols} of {} columns",
            c.ffn_hidden
        )));
    }
    Ok(segs)
}
