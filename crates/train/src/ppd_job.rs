//! PPD prompt tokens as a [`Job`]: a [`PromptTraining`] with its model, its training
//! and held-out sequences and its checkpoint file. [`PpdJob::finish`]
//! writes what a run ends with: the prompt tokens with their accuracy
//! table, `<out>.loss.png` and `<out>.accuracy.png`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arbor_backend_burn::BurnBackend;
use arbor_model::{Decoder, LanguageModel};
use arbor_plot::{LineChart, LineSeries, line_chart};
use arbor_ppd::PromptFile;

use crate::job::{Budget, Clock, Job};
use crate::plot::loss_chart;
use crate::run::{Example, PromptTraining, Settings, Validation};
use crate::{Result, TrainError};

/// A PPD run being trained.
pub struct PpdJob {
    pub run: PromptTraining,
    model: Decoder<BurnBackend>,
    train: Vec<Example>,
    held_out: Vec<Example>,
    checkpoint: PathBuf,
    /// Provenance written into the checkpoint and the output.
    pub meta: BTreeMap<String, String>,
}

/// Where the checkpoint of the prompt tokens at `out` goes.
pub fn checkpoint_path(out: &Path) -> PathBuf {
    out.with_extension("ckpt.safetensors")
}

/// The run to train: the one in `checkpoint` when it reads (and not
/// `restart`), given `settings`' budget; else a new one whose prompt
/// tokens start at the embeddings of the tokens `init` (repeated to the
/// count). Also says whether it resumed.
pub fn open_run(
    model: &mut Decoder<BurnBackend>,
    settings: Settings,
    checkpoint: &Path,
    restart: bool,
    init: &[u32],
) -> Result<(PromptTraining, bool)> {
    let hidden = model.config().hidden;
    if !restart && let Ok(f) = PromptFile::load(checkpoint) {
        let mut run = PromptTraining::from_file(&f)?;
        if run.hidden != hidden || run.settings.count != settings.count {
            return Err(TrainError::Input(format!(
                "{} holds {} prompt tokens of width {}, not {} of {hidden} (--restart to start afresh)",
                checkpoint.display(),
                run.settings.count,
                run.hidden,
                settings.count
            )));
        }
        run.settings.steps = settings.steps;
        run.settings.seconds = settings.seconds;
        return Ok((run, true));
    }
    if init.is_empty() {
        return Err(TrainError::Input(
            "no tokens to start the prompt tokens from".into(),
        ));
    }
    let ids: Vec<u32> = (0..settings.count).map(|i| init[i % init.len()]).collect();
    let values = model.embeddings(&ids)?;
    Ok((PromptTraining::new(settings, hidden, values)?, false))
}

impl PpdJob {
    /// The job of `run` on `model`, stepping through `train` in order and
    /// validating on `held_out`; checkpoints go to `checkpoint`.
    pub fn new(
        run: PromptTraining,
        model: Decoder<BurnBackend>,
        train: Vec<Example>,
        held_out: Vec<Example>,
        checkpoint: PathBuf,
        meta: BTreeMap<String, String>,
    ) -> Result<Self> {
        if train.is_empty() || held_out.is_empty() {
            return Err(TrainError::Input(
                "PPD training needs training and held-out sequences".into(),
            ));
        }
        Ok(Self {
            run,
            model,
            train,
            held_out,
            checkpoint,
            meta,
        })
    }

    /// Ends a run whose loop is done: a last validation (kept, its time
    /// counted, unless the run's last is as recent), the checkpoint, the
    /// prompt tokens at `out` with that validation's accuracy table, and
    /// the charts beside it. Returns the last validation.
    pub fn finish(&mut self, out: &Path, now: &mut dyn FnMut() -> f64) -> Result<Validation> {
        let t = now();
        let (v, table) = self.run.validate(&mut self.model, &self.held_out)?;
        if (self.run.validations.last()).is_none_or(|last| last.seconds < self.run.clock.seconds) {
            self.run.clock.seconds += now() - t;
            self.run.validations.push(v.clone());
        }
        self.save()?;
        let mut meta = self.meta.clone();
        meta.insert(
            "seconds_per_step".to_string(),
            format!("{:.2}", self.run.clock.seconds_per_step()),
        );
        self.run.to_prompts_file(table, &meta).save(out)?;
        plots(&self.run, out)?;
        Ok(v)
    }
}

impl Job for PpdJob {
    type Validation = Validation;

    fn budget(&self) -> Budget {
        self.run.budget()
    }

    fn peak_lr(&self) -> f32 {
        self.run.settings.lr
    }

    fn clock(&mut self) -> &mut Clock {
        &mut self.run.clock
    }

    fn step(&mut self, lr: f32) -> Result<f64> {
        let ex = &self.train[self.run.clock.step as usize % self.train.len()];
        Ok(self.run.step(&mut self.model, ex, lr)? as f64)
    }

    fn validated(&self) -> bool {
        !self.run.validations.is_empty()
    }

    fn validate(&mut self) -> Result<Validation> {
        Ok(self.run.validate(&mut self.model, &self.held_out)?.0)
    }

    fn keep(&mut self, v: Validation) {
        self.run.validations.push(v);
    }

    fn save(&mut self) -> Result<()> {
        Ok(self.run.to_file(&self.meta).save(&self.checkpoint)?)
    }
}

/// `<out>.loss.png` (each step's loss and a running mean against minutes)
/// and `<out>.accuracy.png` (validation top-1 and top-5 by distance).
fn plots(run: &PromptTraining, out: &Path) -> Result<()> {
    let losses: Vec<(f64, f64)> = run.losses.iter().map(|&(s, l)| (s, l as f64)).collect();
    loss_chart(
        &losses,
        "PPD prompt tokens: training loss (sum over prompt tokens of 0.8^i KL)",
        "loss",
        25,
        &out.with_extension("loss.png"),
    )?;
    let mut series = Vec::new();
    for (k, pick) in [(1, 0usize), (5, 1)] {
        for d in 0..run.settings.count {
            series.push(LineSeries {
                name: format!("top-{k} @{}", d + 1),
                points: run
                    .validations
                    .iter()
                    .map(|v| {
                        let xs = if pick == 0 { &v.top1 } else { &v.top5 };
                        (v.seconds / 60.0, xs[d])
                    })
                    .collect(),
            });
        }
    }
    line_chart(
        &LineChart {
            title: "PPD prompt tokens: held-out accuracy by distance".into(),
            x_label: "minutes of training".into(),
            y_label: "accuracy".into(),
            series,
        },
        &out.with_extension("accuracy.png"),
    )?;
    Ok(())
}
