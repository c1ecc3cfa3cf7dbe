//! LoRA recovery of an elastic level as a [`Job`]: the adapters
//! ([`LoraFile`]) with AdamW's state, the model at that level, the text's
//! training and held-out chunks, and the output file, which is the
//! checkpoint too (AdamW's moments and the step, seconds and losses in its
//! metadata). Validation is the level's held-out perplexity; the run keeps
//! the one before training (`perplexity_before`) and [`LoraJob::finish`]
//! adds the one after.

use std::collections::BTreeMap;
use std::path::PathBuf;

use arbor_backend_burn::BurnBackend;
use arbor_elastic::LoraFile;
use arbor_model::{Decoder, LanguageModel, Proj};

use crate::job::{Budget, Clock, Job};
use crate::optim::{AdamState, AdamW};
use crate::plot::loss_chart;
use crate::{Result, TrainError, attach_lora, lora_step, mean_loss};

/// Which adapters a run trains.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapters {
    /// The elastic level (1 for a plain model).
    pub level: f64,
    pub rank: usize,
    pub projs: Vec<Proj>,
    /// Seeds fresh adapters.
    pub seed: u64,
}

/// How a LoRA run trains.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraSettings {
    pub budget: Budget,
    /// Peak learning rate (AdamW, cosine to 0).
    pub lr: f32,
    /// Tokens per step (the chunks' length), for the provenance.
    pub chunk: usize,
}

/// A LoRA run being trained.
pub struct LoraJob {
    pub file: LoraFile,
    model: Decoder<BurnBackend>,
    adam: AdamState,
    opt: AdamW,
    /// Steps and seconds over every session.
    pub clock: Clock,
    /// `(seconds, loss)` of every step, over every session.
    pub losses: Vec<(f64, f64)>,
    train: Vec<Vec<u32>>,
    held_out: Vec<Vec<u32>>,
    settings: LoraSettings,
    out: PathBuf,
    resumed: bool,
}

impl LoraJob {
    /// The run that trains `adapters` of `model` (already at their level) into
    /// `out`: going on from `out` when it exists (unless `restart`; an
    /// error when it does not read or holds another level or rank), else
    /// fresh adapters. Steps take `train`'s chunks in order, validation
    /// measures `held_out`.
    pub fn open(
        model: Decoder<BurnBackend>,
        adapters: &Adapters,
        out: PathBuf,
        restart: bool,
        settings: LoraSettings,
        train: Vec<Vec<u32>>,
        held_out: Vec<Vec<u32>>,
    ) -> Result<Self> {
        if train.is_empty() || held_out.is_empty() {
            return Err(TrainError::Input(
                "LoRA training needs training and held-out chunks".into(),
            ));
        }
        let (level, rank) = (adapters.level, adapters.rank);
        let (mut file, resumed) = match std::fs::read(&out) {
            Ok(bytes) if !restart => {
                let f = LoraFile::from_bytes(&bytes)?;
                if f.level != level || f.rank != rank {
                    return Err(TrainError::Input(format!(
                        "{} holds level {} rank {} (--restart to start afresh)",
                        out.display(),
                        f.level,
                        f.rank
                    )));
                }
                (f, true)
            }
            _ => {
                let (c, e) = (model.config(), model.elastic());
                let f = LoraFile::new(c, e, level, rank, &adapters.projs, adapters.seed)?;
                (f, false)
            }
        };
        let mut adam = AdamState::default();
        if let Some((m, v)) = file.adam.take() {
            let step = meta_num(&file.meta, "step") as u64;
            adam = AdamState { m, v, step };
        }
        let seconds = meta_num(&file.meta, "seconds");
        let clock = Clock {
            step: adam.step,
            seconds,
            step_seconds: seconds,
        };
        let losses = parse_losses(file.meta.get("losses"));
        Ok(Self {
            file,
            model,
            adam,
            opt: AdamW::default(),
            clock,
            losses,
            train,
            held_out,
            settings,
            out,
            resumed,
        })
    }

    /// The step the run went on from, when it went on from a file.
    pub fn resumed_at(&self) -> Option<u64> {
        self.resumed
            .then(|| meta_num(&self.file.meta, "step") as u64)
    }

    /// Ends a run whose loop is done: the perplexity after training (in
    /// the metadata, not counted in the clock), the file, and the loss
    /// chart beside it (`<out>.loss.png`). Returns the perplexity.
    pub fn finish(&mut self) -> Result<f64> {
        let ppl = self.perplexity()?;
        self.file
            .meta
            .insert("perplexity_after".into(), format!("{ppl:.4}"));
        self.save()?;
        loss_chart(
            &self.losses,
            &format!(
                "LoRA recovery of level {}: next-token loss",
                self.file.level
            ),
            "loss (nats per token)",
            10,
            &self.out.with_extension("loss.png"),
        )?;
        Ok(ppl)
    }

    /// The level's held-out perplexity with the adapters as they stand
    /// (before any step they add nothing, and the level runs bare).
    fn perplexity(&mut self) -> Result<f64> {
        if self.clock.step == 0 {
            return Ok(mean_loss(&mut self.model, &self.held_out)?.exp());
        }
        attach_lora(&mut self.model, &self.file)?;
        let loss = mean_loss(&mut self.model, &self.held_out);
        self.model.detach_lora(self.file.level)?;
        Ok(loss?.exp())
    }
}

impl Job for LoraJob {
    /// Held-out perplexity.
    type Validation = f64;

    fn budget(&self) -> Budget {
        self.settings.budget
    }

    fn peak_lr(&self) -> f32 {
        self.settings.lr
    }

    fn clock(&mut self) -> &mut Clock {
        &mut self.clock
    }

    fn step(&mut self, lr: f32) -> Result<f64> {
        let tokens = &self.train[self.clock.step as usize % self.train.len()];
        let m = &mut self.model;
        let loss = lora_step(m, &mut self.file, tokens, lr, &self.opt, &mut self.adam)?;
        self.losses.push((self.clock.seconds, loss));
        self.clock.step += 1;
        Ok(loss)
    }

    fn validated(&self) -> bool {
        self.file.meta.contains_key("perplexity_before")
    }

    fn validate(&mut self) -> Result<f64> {
        self.perplexity()
    }

    /// Keeps the first: the level's perplexity before training.
    fn keep(&mut self, ppl: f64) {
        (self.file.meta)
            .entry("perplexity_before".into())
            .or_insert_with(|| format!("{ppl:.4}"));
    }

    fn save(&mut self) -> Result<()> {
        let (c, meta) = (self.clock, &mut self.file.meta);
        meta.insert("step".into(), c.step.to_string());
        meta.insert("seconds".into(), format!("{:.1}", c.seconds));
        meta.insert(
            "tokens_trained".into(),
            (c.step as usize * self.settings.chunk).to_string(),
        );
        let losses = (self.losses.iter())
            .map(|(s, l)| format!("{s:.1}:{l:.4}"))
            .collect::<Vec<_>>()
            .join(",");
        meta.insert("losses".into(), losses);
        self.file.adam = Some((self.adam.m.clone(), self.adam.v.clone()));
        let saved = self.file.save(&self.out);
        self.file.adam = None;
        Ok(saved?)
    }
}

fn meta_num(meta: &BTreeMap<String, String>, key: &str) -> f64 {
    meta.get(key).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn parse_losses(v: Option<&String>) -> Vec<(f64, f64)> {
    v.map_or_else(Vec::new, |v| {
        v.split(',')
            .filter_map(|p| p.split_once(':'))
            .filter_map(|(s, l)| Some((s.parse().ok()?, l.parse().ok()?)))
            .collect()
    })
}
