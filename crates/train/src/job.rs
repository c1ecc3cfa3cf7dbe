//! The one training loop. A [`Job`] is what trains (PPD prompt tokens in
//! [`crate::PpdJob`], LoRA adapters in [`crate::LoraJob`]): it takes a
//! step, validates, and saves its checkpoint; [`train`] drives it through
//! its [`Budget`] (steps, seconds of training, or both: whichever ends
//! first), with the learning rate on a cosine over the share of the
//! budget spent, a validation every [`Cadence::validate_every`] seconds of
//! training and a checkpoint every [`Cadence::save_every`] seconds of the
//! session. A job resumes from its checkpoint by being opened from it: its
//! [`Clock`] (steps and seconds over every session) goes on from there.
//!
//! Time comes from a caller's clock ([`wall_clock`] in a real run), so
//! that tests can count it instead of waiting for it.

use std::time::Instant;

use crate::{Result, TrainError, cosine_at};

/// Steps taken and seconds spent over every session of a run; a job keeps
/// it in its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Clock {
    pub step: u64,
    /// Seconds of steps and of the validations between them.
    pub seconds: f64,
    /// Seconds of steps alone.
    pub step_seconds: f64,
}

impl Clock {
    /// Mean seconds of a step (validation not counted).
    pub fn seconds_per_step(&self) -> f64 {
        self.step_seconds / self.step.max(1) as f64
    }
}

/// How long a run trains: this many steps, this many seconds of training,
/// or both (whichever ends first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub steps: Option<u64>,
    pub seconds: Option<f64>,
}

impl Budget {
    /// The budget of `--minutes` and `--steps`: minutes when given, steps
    /// when given, and `default_minutes` when neither is.
    pub fn from_flags(minutes: Option<f64>, steps: Option<u64>, default_minutes: f64) -> Self {
        let seconds = match (minutes, steps) {
            (None, Some(_)) => None,
            (m, _) => Some(m.unwrap_or(default_minutes) * 60.0),
        };
        Self { steps, seconds }
    }

    /// How far `clock` is through the budget, in `[0, 1]`.
    pub fn fraction(&self, clock: &Clock) -> f64 {
        let by_steps = self
            .steps
            .map_or(0.0, |n| clock.step as f64 / n.max(1) as f64);
        let by_time = self.seconds.map_or(0.0, |s| clock.seconds / s.max(1e-9));
        by_steps.max(by_time).min(1.0)
    }

    pub fn done(&self, clock: &Clock) -> bool {
        self.fraction(clock) >= 1.0
    }
}

/// What trains: the parameters, their optimiser state, the data, the
/// model and where the checkpoint goes.
pub trait Job {
    /// What a validation measures.
    type Validation;

    fn budget(&self) -> Budget;

    /// The learning rate at the start of the budget.
    fn peak_lr(&self) -> f32;

    /// The run's steps and seconds; the job counts its steps (in
    /// [`Job::step`]), the loop adds the time.
    fn clock(&mut self) -> &mut Clock;

    /// One step at learning rate `lr`: counts itself in the clock, logs
    /// its loss at the clock's seconds before the step, and returns it.
    fn step(&mut self, lr: f32) -> Result<f64>;

    /// Whether the run holds a validation already (a resumed run), so that
    /// the loop need not measure where it starts.
    fn validated(&self) -> bool;

    /// Measures the held-out data as the parameters stand.
    fn validate(&mut self) -> Result<Self::Validation>;

    /// Keeps a validation in the run's history.
    fn keep(&mut self, validation: Self::Validation);

    /// Writes the checkpoint the job can be opened from again.
    fn save(&mut self) -> Result<()>;
}

/// How often the loop validates and saves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cadence {
    /// Seconds of training between validations; `None`: only where the
    /// run starts (and whatever the job does when it ends).
    pub validate_every: Option<f64>,
    /// Seconds of the session between checkpoints.
    pub save_every: f64,
}

/// What the loop reports as it goes.
#[derive(Debug)]
pub enum Event<'a, V> {
    /// A validation and the seconds it took; `first` for the one where a
    /// run starts, before its first step (not counted in the clock).
    Validated {
        validation: &'a V,
        seconds: f64,
        first: bool,
    },
    /// A step: its loss and seconds, the clock after it, the share of the
    /// budget spent and the next step's learning rate.
    Stepped {
        loss: f64,
        seconds: f64,
        clock: Clock,
        fraction: f64,
        lr: f32,
    },
    /// A checkpoint was written.
    Saved,
}

/// What one session of [`train`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Session {
    pub steps: u64,
    /// Seconds from the first step to the end of the loop.
    pub seconds: f64,
}

/// Seconds since the call, from the wall clock.
pub fn wall_clock() -> impl FnMut() -> f64 {
    let start = Instant::now();
    move || start.elapsed().as_secs_f64()
}

/// Trains `job` until its budget is spent: validates first when the run
/// holds no validation, then steps, validating and saving at `cadence`;
/// `now` tells the time in seconds. The job's own last validation and
/// outputs are for the caller, as is a last save.
pub fn train<J: Job + ?Sized>(
    job: &mut J,
    cadence: &Cadence,
    now: &mut dyn FnMut() -> f64,
    on: &mut dyn FnMut(Event<'_, J::Validation>),
) -> Result<Session> {
    let (budget, peak) = (job.budget(), job.peak_lr());
    if budget.steps.is_none() && budget.seconds.is_none() {
        return Err(TrainError::Input(
            "a run needs a budget in steps or seconds".into(),
        ));
    }
    if !job.validated() {
        let t = now();
        let validation = job.validate()?;
        on(Event::Validated {
            validation: &validation,
            seconds: now() - t,
            first: true,
        });
        job.keep(validation);
    }
    let start = now();
    let first_step = job.clock().step;
    let mut saved = start;
    let mut validated = job.clock().seconds;
    while !budget.done(job.clock()) {
        let lr = cosine_at(peak, budget.fraction(job.clock()));
        let before = job.clock().step;
        let t = now();
        let loss = job.step(lr)?;
        let seconds = now() - t;
        let clock = job.clock();
        if clock.step != before + 1 {
            return Err(TrainError::Input(format!(
                "a step took the clock from step {before} to {}",
                clock.step
            )));
        }
        clock.seconds += seconds;
        clock.step_seconds += seconds;
        let clock = *clock;
        let fraction = budget.fraction(&clock);
        on(Event::Stepped {
            loss,
            seconds,
            clock,
            fraction,
            lr: cosine_at(peak, fraction),
        });
        if cadence
            .validate_every
            .is_some_and(|every| clock.seconds - validated >= every)
        {
            let t = now();
            let validation = job.validate()?;
            let seconds = now() - t;
            job.clock().seconds += seconds;
            validated = job.clock().seconds;
            on(Event::Validated {
                validation: &validation,
                seconds,
                first: false,
            });
            job.keep(validation);
        }
        if now() - saved >= cadence.save_every {
            job.save()?;
            saved = now();
            on(Event::Saved);
        }
    }
    Ok(Session {
        steps: job.clock().step - first_step,
        seconds: now() - start,
    })
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;
