//! The one-shot measurements behind per-request objectives: a family of
//! sub-models' latency on this device ([`measure_profile`]), the quality of
//! every (model level, prompt level) pair against the full model
//! ([`measure_quality`]), and one request served at a chosen pair with its
//! latency measured ([`serve_pair`]).

mod tables;

pub use tables::{
    Calibration, HEADROOM, PROFILE_DECODE, PROFILE_LENGTHS, PROFILE_REPS, SloFiles, SloReport,
    SloTables, read_json,
};

use std::time::Instant;

use arbor_model::LanguageModel;
use arbor_slo::{DeviceProfile, LevelLatency, QualityTable, Scorer};
use arbor_speculative::PREFILL_CHUNK;

use crate::{PlannerError, Result};

/// Sub-models of one model, by level: an elastic model's prefixes, or a
/// baseline's (whole layers dropped, units in file order).
pub trait Family {
    /// Ascending, ending at 1 (the whole model).
    fn levels(&self) -> Vec<f64>;
    /// The sub-model at `level` (a listed one), ready to run from an empty
    /// cache.
    fn at(&mut self, level: f64) -> Result<&mut dyn LanguageModel>;
}

/// An elastic model's levels: switching moves prefix views, and a level
/// below the whole model runs part of a frequency-ordered output head
/// ([`at_level`]).
pub struct Elastic<'a>(pub &'a mut dyn LanguageModel);

/// Share of a frequency-ordered head that levels below the whole model
/// multiply (fewer at levels below it: a level's share of the rows). A
/// quarter of Qwen2.5's 151,936 rows is 37,984 tokens, which cover about
/// 99 % of ShareGPT's tokens (`docs/slim-drafts.md`: 32,768 cover 99.1 %).
pub const HEAD_SHARE: f64 = 0.25;

/// Runs `model` at the objective's model level `level`: the elastic level
/// at or below it, and — where the file's head rows are in frequency order
/// and the level is below the whole model — the first [`HEAD_SHARE`] of
/// its head (or the level's share, if smaller), so the time per token
/// falls with the level instead of stopping at the head's cost. The whole
/// model keeps its whole head. Returns the level.
pub fn at_level(model: &mut dyn LanguageModel, level: f64) -> Result<f64> {
    let at = model.set_level(level)?;
    model.set_head_share(if at < 1.0 { at.min(HEAD_SHARE) } else { 1.0 })?;
    Ok(at)
}

impl Family for Elastic<'_> {
    fn levels(&self) -> Vec<f64> {
        self.0
            .levels()
            .map(<[f64]>::to_vec)
            .unwrap_or_else(|| vec![1.0])
    }

    fn at(&mut self, level: f64) -> Result<&mut dyn LanguageModel> {
        at_level(&mut *self.0, level)?;
        Ok(&mut *self.0)
    }
}

/// One model on its own (the original an elastic file was built from):
/// its only level is 1.
pub struct Reference<'a>(pub &'a mut dyn LanguageModel);

impl Family for Reference<'_> {
    fn levels(&self) -> Vec<f64> {
        vec![1.0]
    }

    fn at(&mut self, _level: f64) -> Result<&mut dyn LanguageModel> {
        Ok(&mut *self.0)
    }
}

/// Sub-models held side by side (whole layers dropped), one per level.
pub struct Variants(pub Vec<(f64, Box<dyn LanguageModel>)>);

impl Family for Variants {
    fn levels(&self) -> Vec<f64> {
        self.0.iter().map(|v| v.0).collect()
    }

    fn at(&mut self, level: f64) -> Result<&mut dyn LanguageModel> {
        let i = (self.0.iter())
            .rposition(|v| v.0 <= level + 1e-9)
            .unwrap_or(0);
        Ok(self.0[i].1.as_mut())
    }
}

/// A prompt as the objective sees it: its tokens and which of them the
/// chat template wrote (never dropped).
#[derive(Debug, Clone, PartialEq)]
pub struct SloPrompt {
    pub tokens: Vec<u32>,
    pub protected: Vec<bool>,
}

impl SloPrompt {
    pub fn protected_count(&self) -> usize {
        self.protected.iter().filter(|&&p| p).count()
    }

    /// The tokens kept at `level` by `scorer`'s scores.
    pub fn compress(&self, scorer: &Scorer, level: f64) -> Result<Vec<u32>> {
        if level >= 1.0 {
            return Ok(self.tokens.clone());
        }
        let scores = scorer.scores(&self.tokens);
        let kept = arbor_slo::keep(&scores, &self.protected, level).map_err(slo_error)?;
        Ok(kept.iter().map(|&i| self.tokens[i]).collect())
    }
}

pub fn slo_error(e: arbor_slo::SloError) -> PlannerError {
    PlannerError::Slo(e)
}

/// Prefills `prompt` from an empty cache the way generation does (chunks
/// of [`PREFILL_CHUNK`]) and returns the last position's logits.
pub fn prefill(model: &mut dyn LanguageModel, prompt: &[u32]) -> Result<Vec<f32>> {
    model.truncate_cache(0)?;
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        logits = model.step(chunk)?;
    }
    Ok(logits)
}

/// Greedy continuation of `prompt`: up to `tokens` tokens, ending before
/// a token of `stop`.
pub fn greedy(
    model: &mut dyn LanguageModel,
    prompt: &[u32],
    tokens: usize,
    stop: &[u32],
) -> Result<Vec<u32>> {
    let mut logits = prefill(model, prompt)?;
    let mut out = Vec::new();
    while out.len() < tokens {
        let next = arbor_sampling::argmax(&logits).unwrap_or(0);
        if stop.contains(&next) {
            break;
        }
        out.push(next);
        if out.len() < tokens {
            logits = model.step(&[next])?;
        }
    }
    Ok(out)
}

/// What a device profile measures.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfilePlan {
    /// Prompt lengths prefill is timed at (ascending).
    pub lengths: Vec<usize>,
    /// Greedy steps the time per token is taken over.
    pub decode: usize,
    /// Runs per point; the median counts.
    pub reps: usize,
}

/// Each level's prefill time at each of the plan's lengths (tokens of
/// `text`, which must hold the longest) and time per output token, each
/// the median of the plan's runs, and the same of `reference` (the
/// original model objectives are fractions of) when given; `model` and
/// `kernels` name what was measured. `progress(done, total)`.
pub fn measure_profile(
    family: &mut dyn Family,
    mut reference: Option<&mut dyn LanguageModel>,
    (model, kernels): (&str, &str),
    text: &[u32],
    plan: &ProfilePlan,
    scorer: &Scorer,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DeviceProfile> {
    let longest = plan.lengths.iter().copied().max().unwrap_or(0);
    if text.len() < longest.max(2) || plan.decode < 2 || plan.reps == 0 {
        return Err(PlannerError::Invalid(format!(
            "a device profile needs {longest} tokens of text (got {}), ≥ 2 decode steps and ≥ 1 repetition",
            text.len()
        )));
    }
    let levels = family.levels();
    // Rounds over every model (the levels, then the reference), each round
    // one run of every point; the median run per point counts. Requests
    // are served once, so the profile predicts a typical run, not the
    // best one; and a slow spell of a noisy host costs one round of a few
    // models, not a whole model's every run.
    let models = levels.len() + usize::from(reference.is_some());
    let total = models * plan.reps;
    let mut runs: Vec<Vec<LevelLatency>> = vec![Vec::new(); models];
    for round in 0..plan.reps {
        for (i, slot) in runs.iter_mut().enumerate() {
            progress(round * models + i, total);
            slot.push(match (levels.get(i), reference.as_mut()) {
                (Some(&level), _) => measure_level(family.at(level)?, level, text, plan)?,
                (None, Some(m)) => measure_level(&mut **m, 1.0, text, plan)?,
                (None, None) => {
                    return Err(PlannerError::Invalid(
                        "a device profile lost its reference model".into(),
                    ));
                }
            });
        }
    }
    let mut out: Vec<LevelLatency> = runs.iter().map(|r| median_run(r)).collect();
    let reference = match reference {
        Some(_) => out.pop(),
        None => None,
    };
    progress(total, total);
    // The scorer's cost per token, over the whole text (many times, it is quick).
    let start = Instant::now();
    let mut rounds = 0usize;
    while rounds < 3 || start.elapsed().as_secs_f64() < 0.05 {
        std::hint::black_box(scorer.scores(&text[..longest]));
        rounds += 1;
    }
    let scorer_per_token = start.elapsed().as_secs_f64() / (rounds * longest) as f64;
    let profile = DeviceProfile {
        model: model.to_string(),
        kernels: kernels.to_string(),
        threads: rayon::current_num_threads(),
        measured: crate::profiles::now_utc(),
        levels: out,
        scorer_per_token,
        reference,
    };
    profile.validate().map_err(slo_error)?;
    Ok(profile)
}

/// The median of each point over `runs` of one model (at least one).
fn median_run(runs: &[LevelLatency]) -> LevelLatency {
    use arbor_slo::median;
    LevelLatency {
        level: runs[0].level,
        prefill: (0..runs[0].prefill.len())
            .map(|p| {
                let n = runs[0].prefill[p].0;
                (n, median(runs.iter().map(|r| r.prefill[p].1).collect()))
            })
            .collect(),
        tpot: median(runs.iter().map(|r| r.tpot).collect()),
    }
}

/// One run of a model's prefill curve and time per token under `plan`.
fn measure_level(
    m: &mut dyn LanguageModel,
    level: f64,
    text: &[u32],
    plan: &ProfilePlan,
) -> Result<LevelLatency> {
    let lengths = &plan.lengths[..];
    prefill(m, &text[..lengths[0]])?; // warm-up
    let mut points = Vec::new();
    for &n in lengths {
        let start = Instant::now();
        prefill(m, &text[..n])?;
        points.push((n, start.elapsed().as_secs_f64()));
    }
    let mut logits = prefill(m, &text[..lengths[0]])?;
    let start = Instant::now();
    for _ in 0..plan.decode {
        let next = arbor_sampling::argmax(&logits).unwrap_or(0);
        logits = m.step(&[next])?;
    }
    Ok(LevelLatency {
        level,
        prefill: points,
        tpot: start.elapsed().as_secs_f64() / plan.decode as f64,
    })
}

/// The full model's greedy answers to `prompts` (up to `tokens` each,
/// ending before a `stop` token): what pairs are compared against.
pub fn answers(
    family: &mut dyn Family,
    prompts: &[SloPrompt],
    tokens: usize,
    stop: &[u32],
) -> Result<Vec<Vec<u32>>> {
    let m = family.at(1.0)?;
    prompts
        .iter()
        .map(|p| greedy(m, &p.tokens, tokens, stop))
        .collect()
}

/// Agreement of the sub-model at `level`, reading `prompt` compressed to
/// `prompt_level`, with `answer` (the full model's): `(agreeing, counted)`
/// of its greedy choices teacher-forced along the answer.
pub fn pair_agreement(
    family: &mut dyn Family,
    prompt: &SloPrompt,
    answer: &[u32],
    scorer: &Scorer,
    level: f64,
    prompt_level: f64,
) -> Result<(usize, usize)> {
    if answer.is_empty() {
        return Ok((0, 0));
    }
    let mut text = prompt.compress(scorer, prompt_level)?;
    let from = text.len();
    text.extend_from_slice(answer);
    crate::eval::greedy_agreement(family.at(level)?, &text, from)
}

/// The quality table of `family` with prompts compressed by `scorer`:
/// per pair, the share of the full model's answer tokens its greedy choice
/// agrees with. `progress(done, total)` counts model levels.
pub fn measure_quality(
    family: &mut dyn Family,
    model: &str,
    prompts: &[SloPrompt],
    answers: &[Vec<u32>],
    scorer: &Scorer,
    prompt_levels: &[f64],
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QualityTable> {
    if prompts.len() != answers.len() || answers.iter().all(Vec::is_empty) {
        return Err(PlannerError::Invalid(
            "a quality table needs an answer of the full model for every prompt, and some tokens in them"
                .into(),
        ));
    }
    let levels = family.levels();
    let mut quality = Vec::new();
    for (i, &level) in levels.iter().enumerate() {
        progress(i, levels.len());
        let mut row = Vec::new();
        for &pl in prompt_levels {
            let (mut agree, mut count) = (0, 0);
            for (p, a) in prompts.iter().zip(answers) {
                let (x, n) = pair_agreement(family, p, a, scorer, level, pl)?;
                agree += x;
                count += n;
            }
            row.push(agree as f64 / count.max(1) as f64);
        }
        quality.push(row);
    }
    progress(levels.len(), levels.len());
    let table = QualityTable {
        model: model.to_string(),
        scorer: scorer.name().to_string(),
        model_levels: levels,
        prompt_levels: prompt_levels.to_vec(),
        quality,
        prompts: prompts.len(),
        answer_tokens: answers.iter().map(Vec::len).max().unwrap_or(0),
        measured: crate::profiles::now_utc(),
    };
    table.validate().map_err(slo_error)?;
    Ok(table)
}

/// One request served at a pair, timed as a client would see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// Seconds from the request to its first token: scoring, choosing the
    /// kept tokens, switching the level and the prefill.
    pub ttft: f64,
    /// Seconds per output token after the first.
    pub tpot: f64,
    /// Seconds of that TTFT spent switching the level.
    pub switch_secs: f64,
    /// Seconds of that TTFT spent scoring and selecting prompt tokens.
    pub score_secs: f64,
    pub tokens: Vec<u32>,
}

/// Serves `prompt` at (`level`, `prompt_level`): `tokens` greedy tokens
/// (no stop token, so every request decodes the same count).
pub fn serve_pair(
    family: &mut dyn Family,
    prompt: &SloPrompt,
    scorer: &Scorer,
    level: f64,
    prompt_level: f64,
    tokens: usize,
) -> Result<Served> {
    let start = Instant::now();
    let kept = prompt.compress(scorer, prompt_level)?;
    let score_secs = start.elapsed().as_secs_f64();
    let switched = Instant::now();
    let m = family.at(level)?;
    let switch_secs = switched.elapsed().as_secs_f64();
    let mut logits = prefill(m, &kept)?;
    let ttft = start.elapsed().as_secs_f64();
    let mut out = vec![arbor_sampling::argmax(&logits).unwrap_or(0)];
    let decode = Instant::now();
    while out.len() < tokens.max(2) {
        logits = m.step(&out[out.len() - 1..])?;
        out.push(arbor_sampling::argmax(&logits).unwrap_or(0));
    }
    let tpot = decode.elapsed().as_secs_f64() / (out.len() - 1) as f64;
    Ok(Served {
        ttft,
        tpot,
        switch_secs,
        score_secs,
        tokens: out,
    })
}
