//! The latency curves a run sizes its trees with: filled into a strategy
//! when it is set (read from the store, measured when missing, with the
//! reads a streamed pass adds), and healed when observed passes drift
//! from them.

use std::path::Path;

use arbor_planner::{Drift, Profiles};
use arbor_speculative::{Decoding, DraftPrompts, Strategy};

use crate::DraftSource;
use crate::events::OpenEvent;
use crate::run::Run;
use crate::{EngineError, Generation, Result};

impl Run {
    /// Fills in the latency profiles of a strategy that sizes its trees
    /// with them.
    pub(crate) fn prepare(
        &mut self,
        mut strategy: Strategy,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<Strategy> {
        self.forget_cached();
        if let Decoding::Ppd(c) = &mut strategy.decoding
            && c.prompts.is_none()
        {
            let hidden = self.engine.model().config().hidden;
            let (prompts, source) = crate::ppd::prompt_tokens_for(self.engine.path(), hidden)?;
            progress(OpenEvent::Note(&format!(
                "ppd: prompt tokens from {source}"
            )));
            c.prompts = Some(prompts);
        }
        if let Decoding::Tree(c) = &mut strategy.decoding
            && let Some(dp) = &mut c.draft_prompts
            && dp.prompts.is_none()
        {
            let (Some(DraftSource::Model(path)), Some(draft)) = (&self.draft, self.engine.draft())
            else {
                return Err(EngineError::Invalid(
                    "tree-ppd needs a draft model with trained prompt tokens (--draft)".into(),
                ));
            };
            let (prompts, source) = crate::ppd::prompt_tokens_for(path, draft.config().hidden)?;
            progress(OpenEvent::Note(&format!(
                "tree-ppd: the draft's prompt tokens from {source}"
            )));
            dp.prompts = Some(prompts);
        }
        if strategy.sized_by_profile() && self.config.tuning.profiled() {
            let wants_draft = strategy.needs_draft();
            if self
                .profiles
                .as_ref()
                .is_none_or(|p| wants_draft && p.draft.is_none())
            {
                self.profiles = Some(self.measure_profiles(progress)?);
            }
            match (&mut strategy.decoding, &self.profiles) {
                (Decoding::Tree(c), Some(p)) => {
                    c.profile = Some(p.target_under_budget());
                    c.draft_profile = p.draft.clone();
                }
                (Decoding::Ppd(c), Some(p)) => c.profile = Some(p.target_under_budget()),
                _ => {}
            }
        }
        if let Decoding::Tree(c) = &strategy.decoding
            && let Some(DraftPrompts {
                prompts: Some(prompts),
                count: None,
            }) = &c.draft_prompts
        {
            let q = arbor_speculative::draft_guesses(prompts, c.draft_profile.as_ref());
            let why = match &c.draft_profile {
                Some(_) => "sized by its latency curve and accuracy",
                None => "all of them: no latency curve",
            };
            progress(OpenEvent::Note(&format!(
                "tree-ppd: the draft carries {q} prompt tokens per step ({why})"
            )));
        }
        Ok(strategy)
    }

    /// The target's and the draft's curves from the store (measured now
    /// when missing), and the IO a streamed pass adds.
    fn measure_profiles(&mut self, progress: &mut dyn FnMut(OpenEvent<'_>)) -> Result<Profiles> {
        let read = self.engine.memory().map_or(0, |m| m.plan.read_per_pass);
        let target_path = self.engine.path().to_path_buf();
        // A curve measured while layers stream holds their reads: it is
        // used as it is (no IO added) and not cached as the resident one.
        let (target, measured_streaming) = {
            let (record, note) = self.latency(&target_path, false, read == 0, progress)?;
            (record.profile(), note.is_some() && read > 0)
        };
        // The resident curve as passes computed it while layers streamed.
        let target = match (read > 0 && !measured_streaming)
            .then(|| self.store.stream_compute(&target_path))
            .flatten()
        {
            Some(r) => r.apply(&target),
            None => target,
        };
        let running = match &self.draft {
            Some(DraftSource::Elastic(level)) => self.engine.elastic_share(*level)?,
            _ => self.engine.memory().map_or(1.0, |m| {
                1.0 - m.plan.streamed() as f64 / m.plan.resident.len().max(1) as f64
            }),
        };
        let draft = match self.draft.clone() {
            Some(DraftSource::Model(path)) => {
                Some(self.latency(&path, false, true, progress)?.0.profile())
            }
            Some(other) => other.derived_profile(&target, running),
            None => None,
        };
        let io_per_pass = if read == 0 || measured_streaming {
            0.0
        } else {
            // Under a GPU's budget every streamed byte is uploaded, and
            // only what host memory does not hold is read from the disk.
            let disk_read = self.engine.memory().map_or(0, |m| m.disk_read_per_pass);
            let upload_bw = match self.config.gpu_memory_budget {
                Some(_) => Some(arbor_load::backends::upload_rate(
                    self.backend,
                    &target_path,
                    &self.store,
                    progress,
                )?),
                None => None,
            };
            let disk_bw = match disk_read {
                0 => 1.0,
                _ => {
                    let (disk, note) = self.store.disk(&target_path, false)?;
                    if let Some(note) = note {
                        progress(OpenEvent::Note(&note));
                    }
                    disk.bandwidth_for(disk_read)
                }
            };
            arbor_planner::pass_io_secs(read, upload_bw, disk_read, disk_bw)
        };
        let pipelined = self
            .engine
            .memory()
            .is_some_and(|m| matches!(m.mode, crate::StreamMode::Pipelined { .. }));
        let streamed = self.engine.memory().map_or(0, |m| m.plan.streamed()).max(1);
        let io_exposed = if pipelined && self.config.tuning.io_aware() {
            io_per_pass / streamed as f64
        } else {
            io_per_pass
        };
        Ok(Profiles {
            target,
            draft,
            io_per_pass,
            io_exposed,
        })
    }

    /// The curve of the model at `path` (the target, or the draft), from
    /// the store or measured now; a measurement is announced.
    fn latency(
        &mut self,
        path: &Path,
        refresh: bool,
        save: bool,
        progress: &mut dyn FnMut(OpenEvent<'_>),
    ) -> Result<(crate::LatencyRecord, Option<String>)> {
        let kernels = self.backend.kernels();
        let threads = rayon::current_num_threads();
        if refresh || self.store.cached_latency(path, kernels, threads).is_none() {
            let note = format!("measuring forward latency L_fp(n) of {}", path.display());
            progress(OpenEvent::Note(&note));
        }
        let model = if path == self.engine.path() {
            self.engine.model_mut()
        } else {
            self.engine
                .draft_mut()
                .ok_or_else(|| EngineError::Invalid("no draft model is loaded".into()))?
        };
        let what = "latency sizes";
        let (record, note) =
            self.store
                .latency(path, kernels, model, refresh, save, &mut |done, total| {
                    progress(OpenEvent::Measure { what, done, total })
                })?;
        if let Some(n) = &note {
            progress(OpenEvent::Note(n));
        }
        Ok((record, note))
    }

    /// Folds a streamed generation's target passes into the store: each
    /// pass's compute (its time less its waits for weights) against the
    /// target's cached resident curve (none cached: nothing to compare).
    pub(crate) fn observe_stream_compute(&self, g: &Generation) -> Result<()> {
        use crate::Activity;
        let kernels = self.backend.kernels();
        let threads = rayon::current_num_threads();
        let Some(curve) = self
            .store
            .cached_latency(self.engine.path(), kernels, threads)
        else {
            return Ok(());
        };
        let curve = curve.profile();
        let waits: Vec<_> = (g.trace.segments.iter())
            .filter(|s| s.activity == Activity::Wait)
            .collect();
        let passes: Vec<(usize, f64, f64)> = (g.trace.target_passes().iter())
            .filter(|p| p.start >= g.trace.decode_start)
            .map(|p| {
                let waited: f64 = (waits.iter())
                    .map(|w| (w.end.min(p.end) - w.start.max(p.start)).max(0.0))
                    .sum();
                let rows = p.tokens.max(1);
                (rows, (p.end - p.start - waited).max(0.0), curve.at(rows))
            })
            .collect();
        Ok(self
            .store
            .observe_stream_compute(self.engine.path(), &passes)?)
    }

    /// Compares this generation's target passes (plain steps and
    /// verifications, each with its token count) with the target's curve;
    /// a sustained disagreement measures the target's and the draft's
    /// curves again and says so. Runs that
    /// stream weights are not watched: their passes are mostly disk time,
    /// which the resident curve does not describe.
    pub(crate) fn heal(&mut self, g: &Generation) -> Result<()> {
        let Some(p) = &self.profiles else {
            return Ok(());
        };
        if p.io_per_pass > 0.0
            || self
                .engine
                .memory()
                .is_some_and(|m| m.plan.read_per_pass > 0)
        {
            return Ok(());
        }
        for s in g.trace.target_passes() {
            self.drift
                .observe(s.end - s.start, p.target.at(s.tokens.max(1)));
        }
        let Some(ratio) = self.drift.stale() else {
            return Ok(());
        };
        self.drift.reset();
        let before = p.target.at(1);
        // Measuring runs the model: its cache no longer holds the prompt.
        self.forget_cached();
        let target_path = self.engine.path().to_path_buf();
        let (fresh, _) = self.latency(&target_path, true, true, &mut |_| {})?;
        let fresh = fresh.profile();
        // Whatever skewed the target's curve (another process on the
        // cores, a clock change) skewed the draft's, measured beside it.
        let draft = match self.draft.clone() {
            Some(DraftSource::Model(path)) if path == target_path => Some(fresh.clone()),
            Some(DraftSource::Model(path)) => {
                Some(self.latency(&path, true, true, &mut |_| {})?.0.profile())
            }
            Some(other) => other.derived_profile(&fresh, 1.0),
            None => None,
        };
        self.notes.push(format!(
            "target passes took {ratio:.2}x the time the cached latency profile predicts \
             (median of the last {}): re-measured the curves, target L_fp(1) {:.1} -> {:.1} ms",
            Drift::STRETCH,
            before * 1e3,
            fresh.at(1) * 1e3
        ));
        if let Some(p) = &mut self.profiles {
            p.target = fresh;
            p.draft = draft.or(p.draft.take());
        }
        let strategy = self.options.strategy.clone();
        self.options.strategy = self.prepare(strategy, &mut |_| {})?;
        Ok(())
    }
}
