//! LoRA recovery of an elastic level (ELMS §3.2): the level's sub-model
//! stays frozen and rank-`r` side branches beside its projections learn
//! the next-token loss of a text. Only the adapters are tracked; AdamW
//! moves them on the host ([`crate::optim`]), one vector for all pairs in
//! [`LoraFile::flatten`]'s order.

use arbor_backend_burn::{BurnBackend, BurnTensor};
use arbor_elastic::LoraFile;
use arbor_model::{Decoder, LanguageModel};
use arbor_tensor::Backend;

use crate::importance::next_token_loss;
use crate::optim::{AdamState, AdamW};
use crate::{Result, TrainError};

/// Attaches `file`'s adapters untracked (for evaluation) and runs later
/// passes at their level.
pub fn attach_lora(model: &mut Decoder<BurnBackend>, file: &LoraFile) -> Result<()> {
    set_level(model, file.level)?;
    LanguageModel::attach_lora(model, &file.to_host())?;
    Ok(())
}

fn set_level(model: &mut Decoder<BurnBackend>, level: f64) -> Result<()> {
    if model.elastic().is_some() {
        model.set_level(level)?;
    }
    Ok(())
}

/// One step on `tokens` (at least two, from an empty cache) at `file`'s
/// level: the mean next-token loss (nats) before the update, which moves
/// `file`'s adapters by AdamW at `lr`. The model's adapters for that level
/// are detached afterwards.
pub fn lora_step(
    model: &mut Decoder<BurnBackend>,
    file: &mut LoraFile,
    tokens: &[u32],
    lr: f32,
    opt: &AdamW,
    state: &mut AdamState,
) -> Result<f64> {
    if tokens.len() < 2 {
        return Err(TrainError::Input(
            "a training chunk needs two tokens".into(),
        ));
    }
    let b = model.backend().clone();
    let mut leaves: Vec<BurnTensor> = Vec::new();
    let lora = file.to_host().try_map(|m| {
        let t = b.leaf(&m.data, m.rows, m.cols)?;
        leaves.push(t.clone());
        Ok::<_, arbor_tensor::Error>(t)
    })?;
    set_level(model, file.level)?;
    model.attach_lora(lora)?;
    let loss = next_token_loss(model, tokens);
    model.detach_lora(file.level)?;
    model.truncate_cache(0)?;
    let loss = loss?;
    let n = (tokens.len() - 1) as f32;
    let value = b.to_vec(&loss)?[0] as f64 / n as f64;
    let refs: Vec<&BurnTensor> = leaves.iter().collect();
    let grads = b.gradients(&loss, &refs)?;
    let mut grad = Vec::with_capacity(file.len());
    for (g, t) in grads.into_iter().zip(&leaves) {
        let (r, c) = b.shape(t);
        match g {
            Some(g) => grad.extend(g.iter().map(|x| x / n)),
            None => grad.extend(std::iter::repeat_n(0.0, r * c)),
        }
    }
    let mut params = file.flatten();
    opt.step(&mut params, &grad, lr, state)?;
    file.unflatten(&params)?;
    Ok(value)
}
