//! The llama / qwen2 decoder: loading a [`Layout`]'s weights and the
//! forward pass through attention and MLP blocks.
//!
//! Both families are pre-norm decoders with RMSNorm, rotary embeddings,
//! grouped-query attention and a SwiGLU MLP. They differ in three details,
//! all read from the file: qwen2 has biases on Q, K and V; qwen2 rotates
//! halves of each head while llama GGUF files rotate adjacent pairs; and the
//! output head may be tied to the token embedding (no `output.weight`).

use std::sync::{Arc, Mutex};

use arbor_gguf::{GgufFile, TensorInfo};
use arbor_tensor::{Backend, Mask, SharedBytes, WeightData};

use crate::blocks::{Block, Embedding};
use crate::weights::held_bytes;
use crate::{
    Config, HeadSource, LanguageModel, LayerSource, LayerWeights, Layout, Logits, ModelError,
    Result, Row, RowSource, TensorEntry,
};
use crate::{check_pass, check_tokens};

/// A llama/qwen2 decoder with its KV cache.
pub struct Decoder<B: Backend> {
    pub(crate) backend: B,
    pub(crate) config: Config,
    pub(crate) embed: Embedding<B>,
    pub(crate) blocks: Vec<Block<B>>,
    pub(crate) source: Option<Box<dyn LayerSource<B>>>,
    pub(crate) norm: B::Tensor,
    /// `None` when the head is tied to the embedding or not resident.
    pub(crate) output: Option<Arc<B::Weight>>,
    /// The head's slices when it is not resident (see
    /// [`Decoder::set_head_source`]).
    pub(crate) head_source: Option<Mutex<Box<dyn HeadSource<B>>>>,
    /// Rows of the head: the logits' columns.
    pub(crate) head_rows: usize,
    /// Head rows passes multiply: all of them, or (a head in frequency
    /// order, see [`crate::Elastic::vocab`]) its first ones.
    pub(crate) head_keep: usize,
    /// A held low-bit copy of a streamed float head (see
    /// [`crate::certified`]), and whether passes may use it: only the
    /// argmax of their logits is read.
    pub(crate) approx: Option<Arc<crate::certified::ApproxHead<B>>>,
    pub(crate) argmax_only: bool,
    /// Per sequence (slot), one cache per layer that runs (every block
    /// but the skipped ones), in layer order; one slot unless
    /// [`LanguageModel::set_slots`] asked for more.
    pub(crate) slots: Vec<Vec<B::Kv>>,
    /// The slot the one-sequence methods work on.
    pub(crate) slot: usize,
    pub(crate) resident_bytes: u64,
    /// Whether passes keep their final hidden states in `kept`.
    pub(crate) keep_last: bool,
    /// The last pass's final hidden states (before the output norm), for
    /// [`LanguageModel::later_logits`].
    pub(crate) kept: Option<B::Tensor>,
    /// Column scales multiplied into each layer (see [`crate::Probes`]).
    pub(crate) probes: Option<Vec<crate::Probes<B::Tensor>>>,
    /// The levels of an elastic file, and the one passes run at (an index
    /// into its levels; the last is the whole model).
    pub(crate) elastic: Option<Arc<crate::Elastic>>,
    pub(crate) level: usize,
    /// LoRA adapters per level index, shared with drafts (see
    /// [`crate::lora`]); passes apply the current level's.
    pub(crate) lora: Vec<Option<Arc<crate::Lora<B::Tensor>>>>,
}

/// A tensor's index entry and bytes in `file`.
fn tensor<'f>(file: &'f GgufFile, e: &TensorEntry) -> Result<(&'f TensorInfo, &'f [u8])> {
    Ok(file.tensor(&e.name)?)
}

/// The held weight of tensor `e` (the token table when `table`): where the
/// backend holds it as the file stores it ([`Backend::holds_as_read`]), read
/// straight into the buffer it keeps; else copied from the file's map and
/// the mapped pages released. A copy holds the mapped pages beside it until
/// then: for a 445 MiB F16 head, twice its size at once.
fn held_weight<B: Backend>(
    backend: &B,
    file: &GgufFile,
    e: &TensorEntry,
    table: bool,
) -> Result<B::Weight> {
    let (info, bytes) = tensor(file, e)?;
    if backend.holds_as_read(e.ty, e.rows, e.cols) {
        let keep = SharedBytes::filled(bytes.len(), |out| file.read_tensor(info, out))?;
        return crate::weights::weight(backend, e, &keep, true, Some(&keep));
    }
    let w = match table {
        true => backend.embedding_table(WeightData {
            name: &e.name,
            ty: e.ty,
            rows: e.rows,
            cols: e.cols,
            bytes,
        })?,
        false => crate::weights::weight(backend, e, bytes, false, None)?,
    };
    file.release(info);
    Ok(w)
}

impl<B: Backend> Decoder<B> {
    /// Loads every weight of `file` onto `backend`, the token embedding
    /// included; `progress(done, total)` is called after each tensor.
    pub fn load(
        backend: B,
        file: &GgufFile,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let layout = Layout::from_gguf(file.header())?;
        let resident = vec![true; layout.config.n_layers];
        Self::load_partial(backend, file, &layout, &resident, None, progress)
    }

    /// Loads the layers marked in `resident` (one flag per layer) and
    /// everything outside the layers from `file`, whose layout is `layout`;
    /// the other layers must come from a [`LayerSource`] given with
    /// [`Decoder::set_layer_source`]. An untied token embedding is read
    /// row by row from `rows` when given (the table stays out of memory);
    /// a tied one is the head too, so it is loaded whole.
    pub fn load_partial(
        backend: B,
        file: &GgufFile,
        layout: &Layout,
        resident: &[bool],
        rows: Option<Box<dyn RowSource>>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::load_parts(backend, file, layout, resident, true, rows, progress)
    }

    /// [`Decoder::load_partial`], loading the output head only when
    /// `head_resident`. Without it the head must come from a
    /// [`HeadSource`] given with [`Decoder::set_head_source`], and the token
    /// embedding (tied or not) from `rows`, which is then required.
    pub fn load_parts(
        backend: B,
        file: &GgufFile,
        layout: &Layout,
        resident: &[bool],
        head_resident: bool,
        rows: Option<Box<dyn RowSource>>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        if !head_resident && rows.is_none() {
            return Err(ModelError::Input(
                "a decoder without its head resident reads its token embedding by rows: \
                 give it a row source"
                    .into(),
            ));
        }
        let config = layout.config.clone();
        let c = &config;
        if resident.len() != c.n_layers {
            return Err(ModelError::Input(format!(
                "{} residency flags for {} layers",
                resident.len(),
                c.n_layers
            )));
        }
        let total = file.header().tensors.len();
        let mut done = 0;
        let mut tick = || {
            done += 1;
            progress(done, total);
        };
        let mut resident_bytes = 0;
        let e = &layout.embedding;
        // An untied embedding, or a tied one whose head is not held, is read
        // by rows; a tied one with its head held is the head.
        let by_rows = layout.head.is_some() || !head_resident;
        let embed = match rows {
            Some(source) if by_rows => {
                tick();
                Embedding::Rows {
                    source,
                    ty: e.ty,
                    cols: e.cols,
                }
            }
            _ => {
                resident_bytes += e.len as u64;
                let w = held_weight(&backend, file, e, true)?;
                tick();
                Embedding::Table(Arc::new(w))
            }
        };
        let mut blocks = Vec::with_capacity(c.n_layers);
        for (entries, &keep) in layout.layers.iter().zip(resident) {
            if !keep {
                for _ in entries {
                    tick();
                }
                blocks.push(Block::Streamed);
                continue;
            }
            let tensors: Vec<_> = entries
                .iter()
                .map(|e| tensor(file, e))
                .collect::<Result<_>>()?;
            let bytes: Vec<&[u8]> = tensors.iter().map(|(_, b)| *b).collect();
            blocks.push(Block::Resident(Arc::new(LayerWeights::from_bytes(
                &backend, entries, &bytes, false,
            )?)));
            resident_bytes += held_bytes(&backend, entries);
            for (info, _) in tensors {
                file.release(info);
                tick();
            }
        }
        let n = &layout.norm;
        let norm = {
            let data = arbor_gguf::dequantize(n.ty, tensor(file, n)?.1, n.cols)?;
            tick();
            backend.tensor(&data, 1, n.cols)?
        };
        let output = match &layout.head {
            Some(h) if head_resident => {
                resident_bytes += backend.weight_bytes(h.ty, h.rows, h.cols);
                let w = held_weight(&backend, file, h, false)?;
                tick();
                Some(Arc::new(w))
            }
            _ => {
                if layout.head.is_some() {
                    tick();
                }
                None
            }
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
            head_source: None,
            head_rows: layout.head_rows(),
            head_keep: layout.head_rows(),
            approx: None,
            argmax_only: false,
            slots: vec![cache],
            slot: 0,
            resident_bytes,
            keep_last: false,
            kept: None,
            probes: None,
            level: layout.elastic.as_ref().map_or(0, |e| e.levels.len() - 1),
            elastic: layout.elastic.clone().map(Arc::new),
            lora: Vec::new(),
        })
    }

    /// Where non-resident layers come from.
    pub fn set_layer_source(&mut self, source: Box<dyn LayerSource<B>>) {
        self.source = Some(source);
    }

    /// Which layers are resident.
    pub fn resident_layers(&self) -> Vec<bool> {
        self.blocks
            .iter()
            .map(|b| matches!(b, Block::Resident(_)))
            .collect()
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
            Embedding::Table(w) => Ok(b.embed(w.as_ref(), tokens)?),
            Embedding::Rows { source, ty, cols } => {
                let d = *cols;
                let mut data = Vec::with_capacity(tokens.len() * d);
                for &t in tokens {
                    let row = source.row(t as usize)?;
                    data.extend(arbor_gguf::dequantize(*ty, row, d)?);
                }
                Ok(b.tensor(&data, tokens.len(), d)?)
            }
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Token embeddings of `tokens` as host rows, `tokens.len() × hidden`
    /// (e.g. to start trained embeddings from the embeddings of a text).
    pub fn embeddings(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        check_tokens(tokens.iter().copied(), self.config.vocab_size)?;
        let x = self.embed(tokens)?;
        Ok(self.backend.to_vec(&x)?)
    }

    /// The input of a pass over `rows`, `[n, hidden]`: token rows are
    /// embedded, vectors copied as they are (unchecked here: bad ids or
    /// widths come back as the backend's shape errors).
    pub fn embed_rows(&mut self, rows: &[Row<'_>]) -> Result<B::Tensor> {
        if let Some(tokens) = Row::all_tokens(rows) {
            return self.embed(&tokens);
        }
        let d = self.config.hidden;
        let tokens: Vec<u32> = rows.iter().filter_map(Row::token).collect();
        let embedded = match tokens.is_empty() {
            true => Vec::new(),
            false => self.embeddings(&tokens)?,
        };
        let mut from_tokens = embedded.chunks_exact(d);
        let mut data = Vec::with_capacity(rows.len() * d);
        for r in rows {
            match r {
                Row::Token(_) => data.extend_from_slice(from_tokens.next().expect("one per token")),
                Row::Vector(v) => data.extend_from_slice(v),
            }
        }
        Ok(self.backend.tensor(&data, rows.len(), d)?)
    }

    /// The final hidden states, `[n, hidden]`, of a pass over the input
    /// rows `x` (as [`Decoder::embed_rows`] makes them, or any tensor of
    /// that shape: a training loop's tracked leaf) at `positions` under
    /// `mask`, appending their keys and values to the cache. The tensor
    /// face of [`LanguageModel::forward`]; [`Decoder::head`] gives logits.
    pub fn forward_hidden(
        &mut self,
        x: B::Tensor,
        positions: &[u32],
        mask: &Mask,
    ) -> Result<B::Tensor> {
        let (n, d) = self.backend.shape(&x);
        if d != self.config.hidden {
            return Err(ModelError::Input(format!(
                "input rows of width {d} for a model of width {}",
                self.config.hidden
            )));
        }
        check_pass(n, self.cache_len(), positions, mask, &[])?;
        let one = [self.segment(0..n, mask)];
        self.layers(x, positions, &one)
    }

    /// The checked pass over input rows `x`: logits of `logit_rows` on
    /// the host.
    fn logits(
        &mut self,
        x: B::Tensor,
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits> {
        self.kept = None;
        let one = [self.segment(0..positions.len(), mask)];
        let x = self.layers(x, positions, &one)?;
        let logits = self.head(&x, logit_rows)?;
        if self.keep_last {
            self.kept = Some(x);
        }
        self.host_logits(logits, logit_rows.len())
    }

    /// Every row is a token of the vocabulary or a vector of the model's
    /// width.
    pub(crate) fn check_rows(&self, input: &[Row<'_>]) -> Result<()> {
        check_tokens(input.iter().filter_map(Row::token), self.config.vocab_size)?;
        let d = self.config.hidden;
        match input.iter().find_map(|r| match r {
            Row::Vector(v) if v.len() != d => Some(v),
            _ => None,
        }) {
            Some(v) => Err(ModelError::Input(format!(
                "an embedding row of {} values for a model of width {d}",
                v.len()
            ))),
            None => Ok(()),
        }
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
        check_pass(tokens.len(), self.cache_len(), positions, mask, logit_rows)?;
        check_tokens(tokens.iter().copied(), self.config.vocab_size)?;
        let x = self.embed(tokens)?;
        self.logits(x, positions, mask, logit_rows)
    }

    fn forward_rows(
        &mut self,
        rows: &[Row<'_>],
        positions: &[u32],
        mask: &Mask,
        logit_rows: &[usize],
    ) -> Result<Logits> {
        check_pass(rows.len(), self.cache_len(), positions, mask, logit_rows)?;
        self.check_rows(rows)?;
        let x = self.embed_rows(rows)?;
        self.logits(x, positions, mask, logit_rows)
    }

    fn keep_last_pass(&mut self, on: bool) -> bool {
        self.keep_last = on;
        if !on {
            self.kept = None;
        }
        true
    }

    fn later_logits(&mut self, rows: &[usize]) -> Result<Option<Logits>> {
        let Some(x) = &self.kept else {
            return Ok(None);
        };
        let logits = self.head(x, rows)?;
        Ok(Some(self.host_logits(logits, rows.len())?))
    }

    fn set_argmax_only(&mut self, on: bool) -> bool {
        self.argmax_only = on;
        self.approx.is_some()
    }

    fn cache_len(&self) -> usize {
        self.slot_len(self.slot)
    }

    fn truncate_cache(&mut self, len: usize) -> Result<()> {
        for kv in &mut self.slots[self.slot] {
            self.backend.kv_truncate(kv, len)?;
        }
        Ok(())
    }

    fn keep_cache(&mut self, positions: &[usize]) -> Result<()> {
        for kv in &mut self.slots[self.slot] {
            self.backend.kv_keep(kv, positions)?;
        }
        Ok(())
    }

    fn set_slots(&mut self, n: usize) -> Result<()> {
        Decoder::set_slots(self, n)
    }

    fn select_slot(&mut self, slot: usize) -> Result<()> {
        Decoder::select_slot(self, slot)
    }

    fn forward_slots(&mut self, passes: &[crate::SlotPass<'_>]) -> Result<Vec<Logits>> {
        Decoder::forward_slots(self, passes)
    }

    fn fork(&self) -> Result<Box<dyn LanguageModel>> {
        Ok(Box::new(Decoder::fork(self)?))
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn levels(&self) -> Option<&[f64]> {
        self.elastic.as_deref().map(|e| e.levels.as_slice())
    }

    fn set_level(&mut self, level: f64) -> Result<f64> {
        Decoder::set_level(self, level)
    }

    fn set_head_share(&mut self, share: f64) -> Result<Option<usize>> {
        match self.head_order().is_some() {
            true => Decoder::set_head_share(self, share).map(Some),
            false => Ok(None),
        }
    }

    fn without_layers(&self, keep: &[bool]) -> Result<Box<dyn LanguageModel>> {
        Ok(Box::new(self.self_draft_with(keep)?))
    }

    fn elastic_draft(&self, level: f64) -> Result<Box<dyn LanguageModel>> {
        Ok(Box::new(Decoder::elastic_draft(self, level)?))
    }

    fn attach_lora(&mut self, lora: &crate::Lora<crate::HostMatrix>) -> Result<()> {
        let b = self.backend.clone();
        let lora = lora.try_map(|m| b.tensor(&m.data, m.rows, m.cols))?;
        Decoder::attach_lora(self, lora)
    }

    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(self.resident_bytes)
    }

    fn device_reserved_bytes(&self) -> Option<u64> {
        self.backend.device_reserved_bytes()
    }

    fn notify_waits(&mut self, tx: Option<std::sync::mpsc::Sender<crate::WeightWait>>) {
        if let Some(source) = &mut self.source {
            source.notify_waits(tx);
        }
    }
}
