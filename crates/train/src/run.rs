//! A PPD training run: its settings and budget, the steps, validation and
//! the checkpoint that lets a run stop and go on (in another session too).
//!
//! One step takes one sequence: its real tokens run once as constants
//! (the teacher's distributions come from that pass), prompt tokens are
//! inserted at `points` random places of the span that may hold them (an
//! assistant reply), and AdamW moves the prompt tokens along the gradient
//! of the distillation loss. The learning rate falls on a cosine over the
//! run's budget, in steps or in seconds, whichever ends first.

use std::collections::BTreeMap;
use std::ops::Range;

use arbor_backend_burn::BurnBackend;
use arbor_model::{Decoder, LanguageModel};
use arbor_ppd::{Accuracy, AccuracyTally, PromptFile, rank_of};
use arbor_tensor::Backend;

use crate::job::{Budget, Clock};
use crate::optim::{AdamState, AdamW, cosine_at};
use crate::ppd::{student_logits, teacher_log_probs};
use crate::{Result, TrainError, ppd_loss};

/// One training sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub tokens: Vec<u32>,
    /// Where prompt tokens may stand (the tokens they replace, so the
    /// teacher rows they learn from lie in the reply too).
    pub span: Range<usize>,
}

/// How a run trains; stored in its checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Prompt tokens (the thesis: 3).
    pub count: usize,
    /// Ensemble prompt tokens per prompt token (1: plain prompt tokens).
    /// The `j`-th EPTs of successive prompt tokens form a chain that sees
    /// the text and its own earlier rows; a guess is the mean of a prompt
    /// token's EPTs' logits.
    pub epts: usize,
    /// Weight of prompt token `i` is `alpha^i` (0.8).
    pub alpha: f32,
    /// Peak learning rate (0.01), cosine to 0, no warm-up.
    pub lr: f32,
    /// Insertion points per sequence.
    pub points: usize,
    pub seed: u64,
    /// The run ends after this many steps…
    pub steps: Option<u64>,
    /// …or this many seconds of training, whichever comes first.
    pub seconds: Option<f64>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            count: 3,
            epts: 1,
            alpha: 0.8,
            lr: 0.01,
            points: 32,
            seed: 1,
            steps: None,
            seconds: Some(45.0 * 60.0),
        }
    }
}

/// A validation result at some point of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    pub seconds: f64,
    pub loss: f32,
    /// Top-1 and top-5 accuracy at each distance.
    pub top1: Vec<f64>,
    pub top5: Vec<f64>,
}

/// A run in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTraining {
    pub settings: Settings,
    pub hidden: usize,
    /// `count × epts × hidden`, prompt token by prompt token.
    pub prompts: Vec<f32>,
    pub adam: AdamState,
    /// Steps, seconds of steps and validation, and seconds of steps
    /// alone, over every session.
    pub clock: Clock,
    /// `(seconds, loss)` of every step.
    pub losses: Vec<(f64, f32)>,
    pub validations: Vec<Validation>,
}

/// `init` (`count × hidden`) with each prompt token repeated `epts`
/// times, EPT `j > 0` moved by seeded noise of 1% of the vector's RMS.
fn spread(init: &[f32], hidden: usize, epts: usize, seed: u64) -> Vec<f32> {
    let mut out = Vec::with_capacity(init.len() * epts);
    for (i, v) in init.chunks_exact(hidden).enumerate() {
        let rms = (v.iter().map(|x| x * x).sum::<f32>() / hidden as f32).sqrt();
        for j in 0..epts {
            out.extend(v.iter().enumerate().map(|(k, &x)| {
                if j == 0 {
                    return x;
                }
                let z = mix(seed ^ mix(((i * epts + j) * hidden + k) as u64));
                x + rms * 0.01 * ((z >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0)
            }));
        }
    }
    out
}

/// splitmix64: the run's only randomness, seeded by the step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Shuffles `items` in the order `seed` gives (Fisher-Yates on splitmix64).
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = mix(state);
        items.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

/// Up to `n` distinct insertion points in `span` (each leaving `count`
/// teacher rows before the end and a real token before it), sorted.
pub fn choose_points(example: &Example, count: usize, n: usize, seed: u64) -> Vec<usize> {
    let lo = example.span.start.max(1);
    let hi = example
        .span
        .end
        .min(example.tokens.len())
        .saturating_sub(count - 1);
    let mut all: Vec<usize> = (lo..hi.max(lo)).collect();
    let take = n.min(all.len());
    let mut state = seed;
    for i in 0..take {
        state = mix(state);
        let j = i + (state % (all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(take);
    all.sort_unstable();
    all
}

impl PromptTraining {
    /// A new run from the prompt tokens' initial values: `count × hidden`
    /// (each EPT of a prompt token starts there, all but the first moved by
    /// a little seeded noise, so that they can learn apart) or a whole
    /// `count × epts × hidden`.
    pub fn new(settings: Settings, hidden: usize, init: Vec<f32>) -> Result<Self> {
        if settings.count == 0 || settings.points == 0 || settings.epts == 0 {
            return Err(TrainError::Input(
                "a run needs prompt tokens and points".into(),
            ));
        }
        if settings.steps.is_none() && settings.seconds.is_none() {
            return Err(TrainError::Input(
                "a run needs a budget in steps or seconds".into(),
            ));
        }
        if settings.lr.is_nan() || settings.lr <= 0.0 || !(0.0..=1.0).contains(&settings.alpha) {
            return Err(TrainError::Input(format!(
                "learning rate {} and alpha {} (need lr > 0 and alpha in [0, 1])",
                settings.lr, settings.alpha
            )));
        }
        let (count, epts) = (settings.count, settings.epts);
        let prompts = if init.len() == count * epts * hidden {
            init
        } else if init.len() == count * hidden {
            spread(&init, hidden, epts, settings.seed)
        } else {
            return Err(TrainError::Input(format!(
                "{} initial values for {count} prompt tokens of {epts} EPTs of width {hidden}",
                init.len(),
            )));
        };
        Ok(Self {
            settings,
            hidden,
            prompts,
            adam: AdamState::default(),
            clock: Clock::default(),
            losses: Vec::new(),
            validations: Vec::new(),
        })
    }

    /// The budget of the settings.
    pub fn budget(&self) -> Budget {
        Budget {
            steps: self.settings.steps,
            seconds: self.settings.seconds,
        }
    }

    /// How far the run is through its budget, in `[0, 1]`.
    pub fn fraction(&self) -> f64 {
        self.budget().fraction(&self.clock)
    }

    pub fn done(&self) -> bool {
        self.budget().done(&self.clock)
    }

    /// The learning rate of the next step.
    pub fn lr(&self) -> f32 {
        cosine_at(self.settings.lr, self.fraction())
    }

    /// One AdamW step on `example` at learning rate `lr` (the schedule's
    /// is [`PromptTraining::lr`]); returns the loss before the update. The caller adds
    /// the step's time to the clock ([`crate::train`] does).
    pub fn step(
        &mut self,
        model: &mut Decoder<BurnBackend>,
        example: &Example,
        lr: f32,
    ) -> Result<f32> {
        let count = self.settings.count;
        let seed = mix(self.settings.seed ^ mix(self.clock.step));
        let points = choose_points(example, count, self.settings.points, seed);
        if points.is_empty() {
            return Err(TrainError::Input(format!(
                "no insertion point in span {:?} of a sequence of {}",
                example.span,
                example.tokens.len()
            )));
        }
        let batch = teacher_log_probs(model, &example.tokens, &points, count)?;
        let b = model.backend().clone();
        let leaf = b.leaf(&self.prompts, count * self.settings.epts, self.hidden)?;
        let loss = ppd_loss(model, &leaf, &batch, self.settings.alpha)?;
        let value = b.to_vec(&loss)?[0];
        let grad = b.gradient(&loss, &leaf)?;
        model.truncate_cache(batch.len)?;
        let grad = grad.ok_or_else(|| TrainError::Input("the loss has no gradient".into()))?;
        AdamW::default().step(&mut self.prompts, &grad, lr, &mut self.adam)?;
        self.clock.step += 1;
        self.losses.push((self.clock.seconds, value));
        Ok(value)
    }

    /// The loss and top-k accuracies on held-out sequences (insertion
    /// points from a fixed seed, so validations compare), with the table
    /// of top-1 to top-10 accuracies by distance. A prompt token's guess is
    /// right when it is the model's own greedy token given the true text.
    pub fn validate(
        &self,
        model: &mut Decoder<BurnBackend>,
        examples: &[Example],
    ) -> Result<(Validation, Accuracy)> {
        let count = self.settings.count;
        let mut tally = AccuracyTally::new(count, 10);
        let (mut loss, mut n) = (0.0f32, 0usize);
        for (i, ex) in examples.iter().enumerate() {
            let points = choose_points(ex, count, self.settings.points, mix(i as u64));
            if points.is_empty() {
                continue;
            }
            let batch = teacher_log_probs(model, &ex.tokens, &points, count)?;
            let b = model.backend().clone();
            let x = b.tensor(&self.prompts, count * self.settings.epts, self.hidden)?;
            let logits = student_logits(model, &x, &batch)?;
            let l = crate::ppd::distill_loss(&logits, &batch, self.settings.alpha, b.device())?;
            loss += b.to_vec(&l)?[0];
            n += 1;
            let host = b.to_vec(&logits)?;
            model.truncate_cache(batch.len)?;
            let v = batch.vocab;
            for (r, (student, teacher)) in host
                .chunks_exact(v)
                .zip(batch.teacher.chunks_exact(v))
                .enumerate()
            {
                let truth = argmax(teacher);
                tally.add(r % count + 1, rank_of(student, truth, 10));
            }
        }
        if n == 0 {
            return Err(TrainError::Input(
                "no validation sequence has room for prompt tokens".into(),
            ));
        }
        let acc = tally
            .accuracy()
            .map_err(|e| TrainError::Input(e.to_string()))?;
        let v = Validation {
            seconds: self.clock.seconds,
            loss: loss / n as f32,
            top1: (1..=count).map(|d| acc.top(d, 1)).collect(),
            top5: (1..=count).map(|d| acc.top(d, 5)).collect(),
        };
        Ok((v, acc))
    }

    /// The run as a checkpoint file.
    pub fn to_file(&self, meta: &BTreeMap<String, String>) -> PromptFile {
        let s = &self.settings;
        let mut meta = meta.clone();
        let num = |x: Option<f64>| x.map_or("none".to_string(), |x| x.to_string());
        for (k, v) in [
            ("count", s.count.to_string()),
            ("epts", s.epts.to_string()),
            ("alpha", s.alpha.to_string()),
            ("lr", s.lr.to_string()),
            ("points", s.points.to_string()),
            ("seed", s.seed.to_string()),
            ("budget_steps", num(s.steps.map(|n| n as f64))),
            ("budget_seconds", num(s.seconds)),
            ("step", self.clock.step.to_string()),
            ("seconds", self.clock.seconds.to_string()),
            ("step_seconds", self.clock.step_seconds.to_string()),
            ("adam_step", self.adam.step.to_string()),
        ] {
            meta.insert(k.into(), v);
        }
        meta.insert("validations".into(), validations_text(&self.validations));
        let mut extra = BTreeMap::new();
        extra.insert("adam.m".into(), self.adam.m.clone());
        extra.insert("adam.v".into(), self.adam.v.clone());
        extra.insert(
            "loss.seconds".into(),
            self.losses.iter().map(|l| l.0 as f32).collect(),
        );
        extra.insert(
            "loss.value".into(),
            self.losses.iter().map(|l| l.1).collect(),
        );
        PromptFile {
            hidden: self.hidden,
            epts: s.epts,
            vectors: self.prompts.clone(),
            accuracy: None,
            extra,
            meta,
        }
    }

    /// The trained prompt tokens as the file inference loads: `accuracy`
    /// measured for them, the provenance in `meta` plus the run's figures.
    pub fn to_prompts_file(
        &self,
        accuracy: Accuracy,
        meta: &BTreeMap<String, String>,
    ) -> PromptFile {
        let mut file = self.to_file(meta);
        file.extra.clear();
        file.meta.remove("adam_step");
        file.accuracy = Some(accuracy);
        file
    }

    /// A run from its checkpoint file.
    pub fn from_file(file: &PromptFile) -> Result<Self> {
        let bad = |m: String| TrainError::Input(format!("checkpoint: {m}"));
        let get = |k: &str| file.meta.get(k).ok_or_else(|| bad(format!("no `{k}`")));
        fn parse<T: std::str::FromStr>(k: &str, v: &str) -> Result<T> {
            v.parse()
                .map_err(|_| TrainError::Input(format!("checkpoint: `{k}` is `{v}`")))
        }
        let opt = |k: &str| -> Result<Option<f64>> {
            match get(k)?.as_str() {
                "none" => Ok(None),
                v => parse(k, v).map(Some),
            }
        };
        let settings = Settings {
            count: parse("count", get("count")?)?,
            // Checkpoints from before EPTs had one per prompt token.
            epts: file.meta.get("epts").map_or(Ok(1), |v| parse("epts", v))?,
            alpha: parse("alpha", get("alpha")?)?,
            lr: parse("lr", get("lr")?)?,
            points: parse("points", get("points")?)?,
            seed: parse("seed", get("seed")?)?,
            steps: opt("budget_steps")?.map(|n| n as u64),
            seconds: opt("budget_seconds")?,
        };
        let vec = |k: &str| {
            file.extra
                .get(k)
                .cloned()
                .ok_or_else(|| bad(format!("no `{k}`")))
        };
        let (secs, values) = (vec("loss.seconds")?, vec("loss.value")?);
        if secs.len() != values.len()
            || settings.count != file.count()
            || settings.epts != file.epts.max(1)
        {
            return Err(bad("its parts disagree in length".into()));
        }
        let mut run = Self::new(settings, file.hidden, file.vectors.clone())?;
        run.adam = AdamState {
            m: vec("adam.m")?,
            v: vec("adam.v")?,
            step: parse("adam_step", get("adam_step")?)?,
        };
        run.clock.step = parse("step", get("step")?)?;
        run.clock.seconds = parse("seconds", get("seconds")?)?;
        // Checkpoints from before step times were kept count all time.
        run.clock.step_seconds = match file.meta.get("step_seconds") {
            Some(v) => parse("step_seconds", v)?,
            None => run.clock.seconds,
        };
        run.losses = secs.iter().map(|&s| s as f64).zip(values).collect();
        run.validations = parse_validations(get("validations")?).map_err(bad)?;
        Ok(run)
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// One line per validation: `seconds loss top1… | top5…`.
fn validations_text(v: &[Validation]) -> String {
    let join = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.5}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    v.iter()
        .map(|v| {
            format!(
                "{:.1} {:.5} {} | {}",
                v.seconds,
                v.loss,
                join(&v.top1),
                join(&v.top5)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn parse_validations(text: &str) -> std::result::Result<Vec<Validation>, String> {
    let num = |s: &str| {
        s.parse::<f64>()
            .map_err(|_| format!("validation value `{s}`"))
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (head, top5) = line.split_once('|').ok_or("a validation without `|`")?;
            let mut head = head.split_whitespace();
            let seconds = num(head.next().ok_or("an empty validation")?)?;
            let loss = num(head.next().ok_or("a validation without loss")?)? as f32;
            Ok(Validation {
                seconds,
                loss,
                top1: head.map(num).collect::<std::result::Result<_, _>>()?,
                top5: top5
                    .split_whitespace()
                    .map(num)
                    .collect::<std::result::Result<_, _>>()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_distinct_sorted_and_inside_the_span() {
        let ex = Example {
            tokens: vec![0; 50],
            span: 10..40,
        };
        let p = choose_points(&ex, 3, 8, 7);
        assert_eq!(p.len(), 8);
        assert!(p.windows(2).all(|w| w[0] < w[1]));
        assert!(p.iter().all(|&x| (10..=37).contains(&x)));
        assert_ne!(p, choose_points(&ex, 3, 8, 8));
        // A short span gives what it holds; an empty one nothing.
        let short = Example {
            tokens: vec![0; 12],
            span: 0..12,
        };
        assert_eq!(
            choose_points(&short, 3, 100, 1),
            (1..=9).collect::<Vec<_>>()
        );
        let none = Example {
            tokens: vec![0; 12],
            span: 11..12,
        };
        assert!(choose_points(&none, 3, 4, 1).is_empty());
    }

    #[test]
    fn a_run_reads_back_from_its_checkpoint() {
        let mut run = PromptTraining::new(Settings::default(), 2, vec![0.5; 6]).unwrap();
        run.clock = Clock {
            step: 7,
            seconds: 12.5,
            step_seconds: 10.0,
        };
        run.adam = AdamState {
            m: vec![0.1; 6],
            v: vec![0.2; 6],
            step: 7,
        };
        run.losses = vec![(0.0, 9.5), (2.0, 8.25)];
        run.validations = vec![Validation {
            seconds: 12.5,
            loss: 3.5,
            top1: vec![0.5, 0.25, 0.125],
            top5: vec![0.75, 0.5, 0.25],
        }];
        let meta = [("model".to_string(), "tiny".to_string())].into();
        let file = PromptFile::from_bytes(&run.to_file(&meta).to_bytes().unwrap()).unwrap();
        assert_eq!(file.meta["model"], "tiny");
        assert_eq!(PromptTraining::from_file(&file).unwrap(), run);
    }

    #[test]
    fn the_budget_ends_the_run_and_the_rate_falls() {
        let settings = Settings {
            steps: Some(10),
            seconds: Some(100.0),
            ..Settings::default()
        };
        let mut run = PromptTraining::new(settings, 1, vec![0.0; 3]).unwrap();
        assert_eq!(run.lr(), 0.01);
        run.clock.step = 5;
        assert!((run.fraction() - 0.5).abs() < 1e-12);
        run.clock.seconds = 80.0;
        assert!((run.fraction() - 0.8).abs() < 1e-12);
        assert!(run.lr() < 0.005);
        run.clock.step = 10;
        assert!(run.done());
        assert_eq!(run.lr(), 0.0);
        let no_budget = Settings {
            steps: None,
            seconds: None,
            ..Settings::default()
        };
        assert!(PromptTraining::new(no_budget, 1, vec![0.0; 3]).is_err());
        assert!(PromptTraining::new(Settings::default(), 2, vec![0.0; 3]).is_err());
    }
}
