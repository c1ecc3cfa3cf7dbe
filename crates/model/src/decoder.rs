//! The llama / qwen2 decoder, top to bottom: config from GGUF metadata →
//! weights → attention and MLP blocks → forward.
//!
//! Both families are pre-norm decoders with RMSNorm, rotary embeddings,
//! grouped-query attention and a SwiGLU MLP. They differ in three details,
//! all read from the file: qwen2 has biases on Q, K and V; qwen2 rotates
//! halves of each head while llama GGUF files rotate adjacent pairs; and the
//! output head may be tied to the token embedding (no `output.weight`).

use std::ops::Deref;

use arbor_gguf::{GgmlType, GgufFile, Header, TensorInfo};
use arbor_paging::{AlignedBuf, DirectReader};
use arbor_tensor::{Backend, Heads, Mask, Rope, RopeStyle, WeightData};

use crate::{LanguageModel, Logits, ModelError, Result};

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
                n_heads,
                n_kv_heads,
                head_dim,
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

struct Attention<B: Backend> {
    q: B::Weight,
    k: B::Weight,
    v: B::Weight,
    q_bias: Option<B::Tensor>,
    k_bias: Option<B::Tensor>,
    v_bias: Option<B::Tensor>,
    o: B::Weight,
}

struct Mlp<B: Backend> {
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
}

/// The weights of one decoder layer.
pub struct LayerWeights<B: Backend> {
    attn_norm: B::Tensor,
    attn: Attention<B>,
    ffn_norm: B::Tensor,
    mlp: Mlp<B>,
}

/// A streamed layer's weights, lent for one forward pass. `hold` is dropped
/// with it (a memory reservation, a pipeline slot).
pub struct Lease<B: Backend> {
    pub weights: LayerWeights<B>,
    pub hold: Box<dyn Send + Sync>,
}

impl<B: Backend> Deref for Lease<B> {
    type Target = LayerWeights<B>;
    fn deref(&self) -> &LayerWeights<B> {
        &self.weights
    }
}

/// Where the weights of layers that are not resident come from. The decoder
/// asks for them in layer order during every forward pass.
pub trait LayerSource<B: Backend>: Send {
    /// The weights of layer `layer`, waiting until they are loaded.
    fn layer(&mut self, layer: usize) -> Result<Lease<B>>;

    /// Reports waits in [`layer`](Self::layer) to `tx` (see
    /// [`LanguageModel::notify_waits`]).
    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<crate::WeightWait>>) {
        drop(tx);
    }
}

/// One tensor of a layer: name, shape, type and where its bytes are in the
/// file (absolute offset).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub ty: GgmlType,
    pub offset: u64,
    pub len: usize,
}

/// The token embedding: a resident table, or rows read from the file as
/// tokens need them (a few hundred bytes per token; the table is the size
/// of two layers and otherwise only sits in memory).
enum Embedding<B: Backend> {
    Table(B::Weight),
    Rows {
        reader: DirectReader,
        buf: AlignedBuf,
        spec: TensorSpec,
        row_bytes: usize,
    },
}

/// A llama/qwen2 decoder with its KV cache.
pub struct Decoder<B: Backend> {
    backend: B,
    config: Config,
    embed: Embedding<B>,
    /// `None` for layers streamed from `source`.
    blocks: Vec<Option<LayerWeights<B>>>,
    source: Option<Box<dyn LayerSource<B>>>,
    norm: B::Tensor,
    /// `None` when the head is tied to the embedding.
    output: Option<B::Weight>,
    cache: Vec<B::Kv>,
    resident_bytes: u64,
}

impl Config {
    /// The tensors of layer `layer`, in the order the forward pass uses them.
    pub fn layer_tensors(&self, file: &Header, layer: usize) -> Result<Vec<TensorSpec>> {
        let (d, kv, ff) = (self.hidden, self.kv_dim(), self.ffn_hidden);
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
        shapes.retain(|(n, _, _)| {
            !n.ends_with(".bias") || file.tensor(&format!("blk.{layer}.{n}")).is_ok()
        });
        shapes
            .into_iter()
            .map(|(n, rows, cols)| {
                let name = format!("blk.{layer}.{n}");
                let info = file.tensor(&name)?;
                if dims2(info)? != (rows, cols) {
                    return Err(ModelError::Invalid(format!(
                        "`{name}` is {:?}, expected [{rows}, {cols}]",
                        dims2(info)?
                    )));
                }
                Ok(TensorSpec {
                    name,
                    rows,
                    cols,
                    ty: info.ty,
                    offset: file.data_offset + info.offset,
                    len: info.size as usize,
                })
            })
            .collect()
    }
}

impl<B: Backend> LayerWeights<B> {
    /// Builds a layer from its tensors' bytes (`bytes[i]` for `specs[i]`, as
    /// returned by [`Config::layer_tensors`]); `streamed` for a layer built
    /// for one pass (see [`Backend::streamed_weight`]).
    pub fn from_bytes(
        backend: &B,
        specs: &[TensorSpec],
        bytes: &[&[u8]],
        streamed: bool,
    ) -> Result<Self> {
        let find = |suffix: &str| {
            specs
                .iter()
                .position(|s| s.name.ends_with(suffix))
                .map(|i| (&specs[i], bytes[i]))
        };
        let need = |suffix: &str| {
            find(suffix).ok_or_else(|| ModelError::Invalid(format!("layer has no `{suffix}`")))
        };
        let matrix = |suffix: &str| -> Result<B::Weight> {
            let (s, b) = need(suffix)?;
            let w = WeightData {
                name: &s.name,
                ty: s.ty,
                rows: s.rows,
                cols: s.cols,
                bytes: b,
            };
            Ok(if streamed {
                backend.streamed_weight(w)?
            } else {
                backend.weight(w)?
            })
        };
        let vector = |suffix: &str| -> Result<Option<B::Tensor>> {
            let Some((s, b)) = find(suffix) else {
                return Ok(None);
            };
            if b.len() != s.len {
                return Err(ModelError::Invalid(format!("`{}`: short data", s.name)));
            }
            let data = arbor_gguf::dequantize(s.ty, b, s.cols)?;
            Ok(Some(backend.tensor(&data, 1, s.cols)?))
        };
        let required = |suffix: &str| -> Result<B::Tensor> {
            vector(suffix)?.ok_or_else(|| ModelError::Invalid(format!("layer has no `{suffix}`")))
        };
        Ok(Self {
            attn_norm: required("attn_norm.weight")?,
            attn: Attention {
                q: matrix("attn_q.weight")?,
                k: matrix("attn_k.weight")?,
                v: matrix("attn_v.weight")?,
                q_bias: vector("attn_q.bias")?,
                k_bias: vector("attn_k.bias")?,
                v_bias: vector("attn_v.bias")?,
                o: matrix("attn_output.weight")?,
            },
            ffn_norm: required("ffn_norm.weight")?,
            mlp: Mlp {
                gate: matrix("ffn_gate.weight")?,
                up: matrix("ffn_up.weight")?,
                down: matrix("ffn_down.weight")?,
            },
        })
    }
}

/// Bytes a layer holds once loaded on `backend`.
pub fn held_bytes<B: Backend>(backend: &B, specs: &[TensorSpec]) -> u64 {
    specs
        .iter()
        .map(|s| {
            if s.rows == 1 {
                (s.cols * 4) as u64
            } else {
                backend.weight_bytes(s.ty, s.rows, s.cols)
            }
        })
        .sum()
}

/// Reads tensors from the file, checking each one's shape.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    file: &'a GgufFile,
    done: usize,
    total: usize,
    progress: &'a mut dyn FnMut(usize, usize),
}

impl<B: Backend> Loader<'_, B> {
    fn info(&self, name: &str, rows: usize, cols: usize) -> Result<&TensorInfo> {
        let info = self.file.header().tensor(name)?;
        if dims2(info)? != (rows, cols) {
            return Err(ModelError::Invalid(format!(
                "`{name}` is {:?}, expected [{rows}, {cols}]",
                dims2(info)?
            )));
        }
        Ok(info)
    }

    fn tick(&mut self) {
        self.done += 1;
        (self.progress)(self.done, self.total);
    }

    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        let info = self.info(name, rows, cols)?;
        let w = self.backend.weight(WeightData {
            name,
            ty: info.ty,
            rows,
            cols,
            bytes: self.file.tensor_bytes(info),
        })?;
        self.file.release(info);
        self.tick();
        Ok(w)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<B::Tensor> {
        let info = self.info(name, 1, len)?;
        let data = arbor_gguf::dequantize(info.ty, self.file.tensor_bytes(info), len)?;
        self.tick();
        Ok(self.backend.tensor(&data, 1, len)?)
    }
}

impl<B: Backend> Decoder<B> {
    /// Loads every weight onto `backend`; `progress(done, total)` is called
    /// after each tensor.
    pub fn load(
        backend: B,
        file: &GgufFile,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let n = Config::from_gguf(file.header())?.n_layers;
        Self::load_partial(backend, file, &vec![true; n], progress)
    }

    /// Loads the layers marked in `resident` (one flag per layer) and
    /// everything outside the layers; the other layers must come from a
    /// [`LayerSource`] given with [`Decoder::set_layer_source`].
    pub fn load_partial(
        backend: B,
        file: &GgufFile,
        resident: &[bool],
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let config = Config::from_gguf(file.header())?;
        let c = &config;
        if resident.len() != c.n_layers {
            return Err(ModelError::Input(format!(
                "{} residency flags for {} layers",
                resident.len(),
                c.n_layers
            )));
        }
        let has_output = file.header().tensor("output.weight").is_ok();
        let mut l = Loader {
            backend: &backend,
            file,
            done: 0,
            total: file.header().tensors.len(),
            progress,
        };
        let mut resident_bytes = 0;
        let embed = if has_output {
            let info = l.info("token_embd.weight", c.vocab_size, c.hidden)?;
            let spec = TensorSpec {
                name: info.name.clone(),
                rows: c.vocab_size,
                cols: c.hidden,
                ty: info.ty,
                offset: file.header().data_offset + info.offset,
                len: info.size as usize,
            };
            l.tick();
            Embedding::Rows {
                reader: DirectReader::open(file.path())?,
                buf: AlignedBuf::new(0),
                row_bytes: spec.len / c.vocab_size,
                spec,
            }
        } else {
            let info = l.info("token_embd.weight", c.vocab_size, c.hidden)?;
            resident_bytes += info.size;
            let w = backend.embedding_table(WeightData {
                name: "token_embd.weight",
                ty: info.ty,
                rows: c.vocab_size,
                cols: c.hidden,
                bytes: file.tensor_bytes(info),
            })?;
            file.release(info);
            l.tick();
            Embedding::Table(w)
        };
        let mut blocks = Vec::with_capacity(c.n_layers);
        for (i, &keep) in resident.iter().enumerate() {
            let specs = c.layer_tensors(file.header(), i)?;
            if !keep {
                for _ in &specs {
                    l.tick();
                }
                blocks.push(None);
                continue;
            }
            let bytes: Vec<&[u8]> = specs
                .iter()
                .map(|s| {
                    let info = file.header().tensor(&s.name)?;
                    Ok(file.tensor_bytes(info))
                })
                .collect::<Result<_>>()?;
            blocks.push(Some(LayerWeights::from_bytes(
                &backend, &specs, &bytes, false,
            )?));
            resident_bytes += held_bytes(&backend, &specs);
            for s in &specs {
                file.release(file.header().tensor(&s.name)?);
                l.tick();
            }
        }
        let norm = l.vector("output_norm.weight", c.hidden)?;
        let output = if has_output {
            resident_bytes += backend.weight_bytes(
                file.header().tensor("output.weight")?.ty,
                c.vocab_size,
                c.hidden,
            );
            Some(l.matrix("output.weight", c.vocab_size, c.hidden)?)
        } else {
            None
        };
        let cache = (0..c.n_layers)
            .map(|_| backend.kv_new(&c.heads))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            backend,
            config,
            embed,
            blocks,
            source: None,
            norm,
            output,
            cache,
            resident_bytes,
        })
    }

    /// Where non-resident layers come from.
    pub fn set_layer_source(&mut self, source: Box<dyn LayerSource<B>>) {
        self.source = Some(source);
    }

    /// Which layers are resident.
    pub fn resident_layers(&self) -> Vec<bool> {
        self.blocks.iter().map(Option::is_some).collect()
    }

    /// Bytes of weights held in memory (resident layers, head, norms, and the
    /// embedding table when it is resident).
    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes
    }

    /// Token embeddings of `tokens`, `[n, hidden]`.
    fn embed(&mut self, tokens: &[u32]) -> Result<B::Tensor> {
        let b = &self.backend;
        match &mut self.embed {
            Embedding::Table(w) => Ok(b.embed(w, tokens)?),
            Embedding::Rows {
                reader,
                buf,
                spec,
                row_bytes,
            } => {
                let d = spec.cols;
                let mut data = Vec::with_capacity(tokens.len() * d);
                for &t in tokens {
                    let offset = spec.offset + t as u64 * *row_bytes as u64;
                    let row = reader.read_into(offset, *row_bytes, buf)?;
                    data.extend(arbor_gguf::dequantize(spec.ty, row, d)?);
                }
                Ok(b.tensor(&data, tokens.len(), d)?)
            }
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    fn check_input(
        &self,
        tokens: &[u32],
        positions: &[u32],
        mask: &Mask,
        rows: &[usize],
    ) -> Result<()> {
        let n = tokens.len();
        let past = self.cache_len();
        if n == 0 || positions.len() != n {
            return Err(ModelError::Input(format!(
                "{n} tokens with {} positions",
                positions.len()
            )));
        }
        if mask.rows != n || mask.cols != past + n {
            return Err(ModelError::Input(format!(
                "mask is {}x{}, expected {n}x{}",
                mask.rows,
                mask.cols,
                past + n
            )));
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Input(format!(
                "token {t} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        if let Some(&r) = rows.iter().find(|&&r| r >= n) {
            return Err(ModelError::Input(format!("logit row {r} of {n} tokens")));
        }
        Ok(())
    }
}

impl<B: Backend> LanguageModel for Decoder<B> {
    fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits> {
        self.check_input(tokens, positions, mask, logit_rows)?;
        let mut x = self.embed(tokens)?;
        let (b, c) = (&self.backend, &self.config);
        for (i, (block, kv)) in self.blocks.iter().zip(self.cache.iter_mut()).enumerate() {
            let lease;
            let block = match block {
                Some(block) => block,
                None => {
                    let source = self.source.as_mut().ok_or_else(|| {
                        ModelError::Input(format!("layer {i} is not resident and has no source"))
                    })?;
                    lease = source.layer(i)?;
                    &lease.weights
                }
            };
            // Attention
            let h = b.rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            let a = &block.attn;
            let q = biased(b, b.matmul(&h, &a.q)?, &a.q_bias)?;
            let k = biased(b, b.matmul(&h, &a.k)?, &a.k_bias)?;
            let v = biased(b, b.matmul(&h, &a.v)?, &a.v_bias)?;
            let q = b.rope(&q, positions, &c.rope)?;
            let k = b.rope(&k, positions, &c.rope)?;
            b.kv_append(kv, &k, &v)?;
            let att = b.attention(&q, kv, mask, &c.heads)?;
            x = b.add(&x, &b.matmul(&att, &a.o)?)?;
            // MLP
            let h = b.rms_norm(&x, &block.ffn_norm, c.rms_eps)?;
            let m = &block.mlp;
            let act = b.swiglu(&b.matmul(&h, &m.gate)?, &b.matmul(&h, &m.up)?)?;
            x = b.add(&x, &b.matmul(&act, &m.down)?)?;
        }
        // Only the rows whose logits are wanted go through the head: with a
        // 150k vocabulary it costs more than a layer.
        let x = b.select_rows(&x, logit_rows)?;
        let x = b.rms_norm(&x, &self.norm, c.rms_eps)?;
        let head = match (&self.output, &self.embed) {
            (Some(w), _) | (None, Embedding::Table(w)) => w,
            (None, Embedding::Rows { .. }) => {
                return Err(ModelError::Invalid("no output head".into()));
            }
        };
        let logits = b.matmul(&x, head)?;
        Ok(Logits {
            rows: logit_rows.len(),
            vocab: c.vocab_size,
            data: b.to_vec(&logits)?,
        })
    }

    fn cache_len(&self) -> usize {
        self.cache.first().map_or(0, |kv| self.backend.kv_len(kv))
    }

    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        for kv in &mut self.cache {
            self.backend.kv_truncate(kv, len)?;
        }
        Ok(())
    }

    fn keep_cache(&mut self, positions: &[usize]) -> Result<()> {
        for kv in &mut self.cache {
            self.backend.kv_keep(kv, positions)?;
        }
        Ok(())
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<crate::WeightWait>>) {
        if let Some(source) = &mut self.source {
            source.notify_waits(tx);
        }
    }
}

fn biased<B: Backend>(b: &B, x: B::Tensor, bias: &Option<B::Tensor>) -> Result<B::Tensor> {
    Ok(match bias {
        Some(bias) => b.add(&x, bias)?,
        None => x,
    })
}
