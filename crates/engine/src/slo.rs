//! Per-request latency objectives over an elastic target (ELMS's service
//! half): a run measures once, and caches, its device profile (prefill
//! and time per token of every level) and its quality table (every model
//! level × prompt level pair against the full model); then each request
//! with an [`Slo`] is served by the pair [`arbor_slo::decide()`] picks — the
//! level switched (a pointer move), the prompt's least informative tokens
//! dropped — and its measured latency is held against the objective.

use std::path::Path;
use std::time::Instant;

pub use arbor_planner::slo::{
    Calibration, Elastic, Family, HEAD_SHARE, HEADROOM, PROFILE_DECODE, PROFILE_LENGTHS,
    PROFILE_REPS, ProfilePlan, Reference, Served, SloFiles, SloPrompt, SloReport, SloTables,
    Variants, answers, at_level, greedy, measure_profile, measure_quality, pair_agreement, prefill,
    read_json, serve_pair,
};
pub use arbor_slo::{
    Bigram, Choice, DeviceProfile, Latency, OnMiss, PROMPT_LEVELS, Pair, QualityTable, Scorer, Slo,
    SloError, protected_mask,
};

use crate::events::OpenEvent;
use crate::{
    EngineError, GenerateOptions, Generation, LanguageModel, Result, Run, TextEvent, Tokenizer,
};
use arbor_planner::stem;

/// The chat template's own tokens of `text`'s prompt (or the first and
/// last token without a template), which no prompt level drops.
pub fn slo_prompt(tokenizer: &Tokenizer, text: &str, chat: bool) -> Result<SloPrompt> {
    let tokens = crate::encode_prompt(tokenizer, text, chat)?;
    let empty = match chat {
        true => crate::encode_prompt(tokenizer, "", true)?,
        false => Vec::new(),
    };
    let protected = arbor_slo::protected_mask(&tokens, &empty);
    Ok(SloPrompt { tokens, protected })
}

/// The bigram scorer of `tokenizer`'s tokens counted over `text`, cached in
/// `path`.
pub fn bigram(tokenizer: &Tokenizer, text: &str, path: &Path) -> Result<Bigram> {
    if let Ok(bytes) = std::fs::read(path)
        && let Ok(b) = Bigram::from_bytes(&bytes)
        && b.vocab() == tokenizer.vocab_size()
    {
        return Ok(b);
    }
    let tokens = tokenizer.encode(text)?;
    let b = Bigram::train(&tokens, tokenizer.vocab_size()).map_err(EngineError::Slo)?;
    // A cache that cannot be written costs a recount next time.
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
        .and_then(|()| std::fs::write(path, b.to_bytes()));
    Ok(b)
}

impl Run {
    /// Runs an elastic target at `level` from now on (rounded down to a
    /// built level, which is returned) with its whole output head; the
    /// prompt cache forgets what it held, computed at another level.
    pub fn set_level(&mut self, level: f64) -> Result<f64> {
        let model = self.engine_mut().model_mut();
        let at = model.set_level(level)?;
        model.set_head_share(1.0)?;
        self.forget_cached();
        Ok(at)
    }

    /// [`Run::set_level`] as an objective's model level: a head in
    /// frequency order runs the level's share of its rows
    /// ([`at_level`]).
    pub fn set_slo_level(&mut self, level: f64) -> Result<f64> {
        let at = at_level(self.engine_mut().model_mut(), level)?;
        self.forget_cached();
        Ok(at)
    }

    /// `text`'s prompt and the tokens no prompt level drops.
    pub fn slo_prompt(&self, text: &str, chat: bool) -> Result<SloPrompt> {
        slo_prompt(self.engine().tokenizer(), text, chat)
    }

    /// The run's objective tables: cached ones, or (missing, unreadable,
    /// or `refresh`) measured now from `calibration` and cached. Needs an
    /// elastic target.
    pub fn slo_tables(
        &mut self,
        calibration: &Calibration<'_>,
        refresh: bool,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<SloTables> {
        let path = self.engine().path().to_path_buf();
        if self.engine().model().levels().is_none() {
            return Err(EngineError::Invalid(format!(
                "{} is not an elastic model: latency objectives choose among its levels \
                 (make one with `arbor elastic build`)",
                path.display()
            )));
        }
        let kernels = self.backend().kernels();
        let files = SloFiles::new(&self.store, &path, kernels, rayon::current_num_threads());
        let scorer = Scorer::Bigram(bigram(
            self.engine().tokenizer(),
            calibration.text,
            &files.bigram,
        )?);
        let name = stem(&path);
        self.forget_cached();
        let level = self.config().level.unwrap_or(1.0);
        let cached_profile = read_json::<DeviceProfile>(&files.profile).filter(|p| {
            !refresh
                && p.validate().is_ok()
                && p.reference.is_some() == calibration.reference.is_some()
        });
        let cached_quality = read_json::<QualityTable>(&files.quality)
            .filter(|q| !refresh && q.validate().is_ok() && q.scorer == scorer.name());
        // The original model, where something is to be measured against it.
        let mut original = match calibration.reference {
            Some(path) if cached_profile.is_none() || cached_quality.is_none() => {
                let file = arbor_gguf::GgufFile::open(path)?;
                Some(crate::load_model(
                    self.backend_spec(),
                    &file,
                    &mut |_, _| {},
                )?)
            }
            _ => None,
        };
        let profile = match cached_profile {
            Some(p) => p,
            None => {
                let text = self.engine().tokenizer().encode(calibration.text)?;
                let lengths: Vec<usize> = (PROFILE_LENGTHS.iter().copied())
                    .filter(|&n| n <= text.len())
                    .collect();
                let mut bar = |done, total| {
                    progress(OpenEvent::Measure {
                        what: "device profile (levels)",
                        done,
                        total,
                    })
                };
                let mut family = Elastic(self.engine_mut().model_mut());
                let plan = ProfilePlan {
                    lengths,
                    decode: PROFILE_DECODE,
                    reps: PROFILE_REPS,
                };
                let p = measure_profile(
                    &mut family,
                    original
                        .as_mut()
                        .map(|m| &mut **m as &mut dyn LanguageModel),
                    (&name, kernels),
                    &text,
                    &plan,
                    &scorer,
                    &mut bar,
                )?;
                let note = self
                    .store
                    .saved(&files.profile, &p, "measured the device profile");
                progress(OpenEvent::Note(&note));
                p
            }
        };
        let quality = match cached_quality {
            Some(q) => q,
            None => {
                let tokenizer = self.engine().tokenizer();
                let prompts: Vec<SloPrompt> = (calibration.prompts.iter())
                    .map(|t| slo_prompt(tokenizer, t, true))
                    .collect::<Result<_>>()?;
                let stop = tokenizer.stop_ids();
                // The answers pairs are held to: the original model's, or
                // the full level's without one.
                let answers = {
                    let mut from: Box<dyn Family + '_> = match original.as_mut() {
                        Some(m) => Box::new(Reference(m.as_mut())),
                        None => Box::new(Elastic(self.engine_mut().model_mut())),
                    };
                    answers(from.as_mut(), &prompts, calibration.answer_tokens, &stop)?
                };
                let mut family = Elastic(self.engine_mut().model_mut());
                let mut bar = |done, total| {
                    progress(OpenEvent::Measure {
                        what: "quality table (levels)",
                        done,
                        total,
                    })
                };
                let q = measure_quality(
                    &mut family,
                    &name,
                    &prompts,
                    &answers,
                    &scorer,
                    &PROMPT_LEVELS,
                    &mut bar,
                )?;
                let note = self
                    .store
                    .saved(&files.quality, &q, "measured the quality table");
                progress(OpenEvent::Note(&note));
                q
            }
        };
        self.set_level(level)?;
        Ok(SloTables {
            profile,
            quality,
            scorer,
        })
    }

    /// Generates from `prompt` at the pair chosen for `slo`, streaming
    /// text to `on`; the run's level is switched for it and stays there.
    /// With [`OnMiss::Refuse`], a request no pair is predicted to meet is
    /// an error before anything runs.
    pub fn generate_slo(
        &mut self,
        prompt: &SloPrompt,
        (slo, on_miss): (&Slo, OnMiss),
        tables: &SloTables,
        options: &GenerateOptions,
        cancel: Option<&std::sync::atomic::AtomicBool>,
        on: &mut dyn FnMut(TextEvent<'_>),
    ) -> Result<(Generation, SloReport)> {
        let start = Instant::now();
        let n = prompt.tokens.len();
        let choice = arbor_slo::decide(
            &tables.profile,
            &tables.quality,
            slo,
            n,
            prompt.protected_count(),
            HEADROOM,
            on_miss,
        )
        .map_err(EngineError::Slo)?;
        let kept = prompt.compress(&tables.scorer, choice.pair.prompt)?;
        let score_secs = start.elapsed().as_secs_f64();
        let switched = Instant::now();
        // Forgets the prompt cache: keys and values cached at another
        // level are not this level's.
        self.set_slo_level(choice.pair.model)?;
        let switch_secs = switched.elapsed().as_secs_f64();
        let g = self.generate_with(&kept, options, cancel, on)?;
        let s = &g.stats;
        let measured = Latency {
            ttft: score_secs + switch_secs + s.prefill_secs,
            tpot: match s.generated_tokens {
                0 | 1 => 0.0,
                k => s.decode_secs / (k - 1) as f64,
            },
        };
        let report = SloReport {
            slo: *slo,
            full: tables.profile.full(n),
            choice,
            measured,
            switch_secs,
            score_secs,
        };
        Ok((g, report))
    }
}
