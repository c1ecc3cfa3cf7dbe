//! Training with gradients, on burn's autodiff over the model's
//! dequantized, frozen weights (the `train` feature of the burn backend).
//!
//! [`ppd`]: parallel prompt decoding's prompt tokens learn to guess the
//! tokens after the text by distillation from the model's own
//! distributions. Only the prompt-token rows are tracked: the real tokens
//! run first, as constants in the cache, and the prompt rows of many
//! insertion points attend to them in one pass. [`optim`]: AdamW and the
//! cosine schedule that update them on the host. [`run`]: a PPD training
//! run's state, steps, validation and checkpoint. [`job`]: the one
//! training loop, over any [`Job`] — budget in steps or seconds,
//! validation cadence, checkpoints, resumption — which [`ppd_job`] (PPD
//! prompt tokens) and [`lora_job`] (LoRA adapters) implement; [`plot`]:
//! their loss chart. [`importance`]: the
//! first-order importance of heads and neurons (elastic sub-models), from
//! the gradients of probes multiplied into the pass; [`prune`]: the units
//! a level keeps, evaluated by zeroing the others' probes; [`lora`]: LoRA
//! adapters that recover an elastic level, trained on next-token loss.

pub mod importance;
pub mod job;
pub mod lora;
pub mod lora_job;
pub mod optim;
pub mod plot;
pub mod ppd;
pub mod ppd_job;
pub mod prune;
pub mod run;

pub use importance::{Importance, ImportanceFile, layer_costs, mean_loss};
pub use job::{Budget, Cadence, Clock, Event, Job, Session, train, wall_clock};
pub use lora::{attach_lora, lora_step};
pub use lora_job::{Adapters, LoraJob, LoraSettings};
pub use optim::{AdamState, AdamW, cosine_at, cosine_lr};
pub use plot::{loss_chart, running_mean};
pub use ppd::{Batch, ppd_loss, student_logits, teacher_log_probs};
pub use ppd_job::{PpdJob, checkpoint_path, open_run};
pub use run::{Example, PromptTraining, Settings, Validation, choose_points, shuffle};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] arbor_model::ModelError),
    #[error(transparent)]
    Tensor(#[from] arbor_tensor::Error),
    #[error(transparent)]
    Elastic(#[from] arbor_elastic::ElasticError),
    #[error(transparent)]
    Ppd(#[from] arbor_ppd::PpdError),
    #[error(transparent)]
    Plot(#[from] arbor_plot::PlotError),
    #[error("bad training input: {0}")]
    Input(String),
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Loads the model at `file` for training: weights dequantized to f32 on
/// burn's flex device (CPU); `progress(done, total)` counts tensors.
pub fn load_model(
    file: &arbor_gguf::GgufFile,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<arbor_model::Decoder<arbor_backend_burn::BurnBackend>> {
    Ok(arbor_model::Decoder::load(
        arbor_backend_burn::BurnBackend::flex(),
        file,
        progress,
    )?)
}
