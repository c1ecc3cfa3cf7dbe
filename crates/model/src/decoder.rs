//! The llama / qwen2 decoder, top to bottom: config from GGUF metadata →
//! weights → attention and MLP blocks → forward.
//!
//! Both families are pre-norm decoders with RMSNorm, rotary embeddings,
//! grouped-query attention and a SwiGLU MLP. They differ in three details,
//! all read from the file: qwen2 has biases on Q, K and V; qwen2 rotates
//! halves of each head while llama GGUF files rotate adjacent pairs; and the
//! output head may be tied to the token embedding (no `output.weight`).

use arbor_gguf::{GgufFile, Header, TensorInfo};
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

struct Block<B: Backend> {
    attn_norm: B::Tensor,
    attn: Attention<B>,
    ffn_norm: B::Tensor,
    mlp: Mlp<B>,
}

/// A llama/qwen2 decoder with its KV cache.
pub struct Decoder<B: Backend> {
    backend: B,
    config: Config,
    embed: B::Weight,
    blocks: Vec<Block<B>>,
    norm: B::Tensor,
    /// `None` when the head is tied to the embedding.
    output: Option<B::Weight>,
    cache: Vec<B::Kv>,
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

    fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<B::Tensor>> {
        match self.file.header().tensor(name) {
            Ok(_) => self.vector(name, len).map(Some),
            Err(_) => Ok(None),
        }
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
        let config = Config::from_gguf(file.header())?;
        let c = &config;
        let (d, kv, ff) = (c.hidden, c.kv_dim(), c.ffn_hidden);
        let has_output = file.header().tensor("output.weight").is_ok();
        let mut l = Loader {
            backend: &backend,
            file,
            done: 0,
            total: file.header().tensors.len(),
            progress,
        };
        let embed = l.matrix("token_embd.weight", c.vocab_size, d)?;
        let mut blocks = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            blocks.push(Block {
                attn_norm: l.vector(&p("attn_norm.weight"), d)?,
                attn: Attention {
                    q: l.matrix(&p("attn_q.weight"), d, d)?,
                    k: l.matrix(&p("attn_k.weight"), kv, d)?,
                    v: l.matrix(&p("attn_v.weight"), kv, d)?,
                    q_bias: l.optional_vector(&p("attn_q.bias"), d)?,
                    k_bias: l.optional_vector(&p("attn_k.bias"), kv)?,
                    v_bias: l.optional_vector(&p("attn_v.bias"), kv)?,
                    o: l.matrix(&p("attn_output.weight"), d, d)?,
                },
                ffn_norm: l.vector(&p("ffn_norm.weight"), d)?,
                mlp: Mlp {
                    gate: l.matrix(&p("ffn_gate.weight"), ff, d)?,
                    up: l.matrix(&p("ffn_up.weight"), ff, d)?,
                    down: l.matrix(&p("ffn_down.weight"), d, ff)?,
                },
            });
        }
        let norm = l.vector("output_norm.weight", d)?;
        let output = if has_output {
            Some(l.matrix("output.weight", c.vocab_size, d)?)
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
            norm,
            output,
            cache,
        })
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
        let (b, c) = (&self.backend, &self.config);
        let mut x = b.embed(&self.embed, tokens)?;
        for (block, kv) in self.blocks.iter().zip(self.cache.iter_mut()) {
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
        let logits = b.matmul(&x, self.output.as_ref().unwrap_or(&self.embed))?;
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
}

fn biased<B: Backend>(b: &B, x: B::Tensor, bias: &Option<B::Tensor>) -> Result<B::Tensor> {
    Ok(match bias {
        Some(bias) => b.add(&x, bias)?,
        None => x,
    })
}
