//! The two real jobs through the one loop on a tiny random model: a run
//! stopped at its checkpoint file and opened again ends where an unbroken
//! run ends, with the files written where it finishes. Time is a counter
//! that never moves, so only the step budgets end the runs.

use std::path::{Path, PathBuf};

use arbor_elastic::LoraFile;
use arbor_model::Proj;
use arbor_ppd::PromptFile;
use arbor_train::{
    Adapters, Budget, Cadence, Clock, Event, Example, Job, LoraJob, LoraSettings, PpdJob, Settings,
    train,
};

use crate::common;

/// A checkpoint after every step.
const EVERY_STEP: Cadence = Cadence {
    validate_every: None,
    save_every: 0.0,
};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("arbor-jobs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Trains `job` to its budget; returns the steps of the session and the
/// checkpoints it wrote.
fn run<J: Job>(job: &mut J) -> (u64, usize) {
    let mut saves = 0;
    let session = train(job, &EVERY_STEP, &mut || 0.0, &mut |e| {
        if let Event::Saved = e {
            saves += 1;
        }
    })
    .unwrap();
    (session.steps, saves)
}

/// `job` killed when its clock reaches step `at` (after the checkpoint of
/// the step before).
struct Killed<J> {
    job: J,
    at: u64,
}

impl<J: Job> Job for Killed<J> {
    type Validation = J::Validation;
    fn budget(&self) -> Budget {
        self.job.budget()
    }
    fn peak_lr(&self) -> f32 {
        self.job.peak_lr()
    }
    fn clock(&mut self) -> &mut Clock {
        self.job.clock()
    }
    fn step(&mut self, lr: f32) -> arbor_train::Result<f64> {
        if self.job.clock().step == self.at {
            return Err(arbor_train::TrainError::Input("killed".into()));
        }
        self.job.step(lr)
    }
    fn validated(&self) -> bool {
        self.job.validated()
    }
    fn validate(&mut self) -> arbor_train::Result<J::Validation> {
        self.job.validate()
    }
    fn keep(&mut self, v: J::Validation) {
        self.job.keep(v)
    }
    fn save(&mut self) -> arbor_train::Result<()> {
        self.job.save()
    }
}

/// Runs `job` until it is killed at step `at`.
fn kill_at<J: Job>(job: J, at: u64) -> J {
    let mut killed = Killed { job, at };
    let err = train(&mut killed, &EVERY_STEP, &mut || 0.0, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("killed"));
    killed.job
}

fn steps(n: u64) -> Budget {
    Budget {
        steps: Some(n),
        seconds: None,
    }
}

fn examples(n: u32, salt: u32) -> Vec<Example> {
    (0..n)
        .map(|e| Example {
            tokens: (0..24u32).map(|i| (i * 7 + e * 13 + salt) % 64).collect(),
            span: 6..24,
        })
        .collect()
}

fn ppd_job(ckpt: &Path, budget: u64, restart: bool) -> (PpdJob, bool) {
    let mut m = common::tiny("jobs-ppd", 9);
    let settings = Settings {
        points: 6,
        steps: Some(budget),
        seconds: None,
        ..Settings::default()
    };
    let (run, resumed) = arbor_train::open_run(&mut m, settings, ckpt, restart, &[1, 2]).unwrap();
    let meta = [("model".to_string(), "tiny".to_string())].into();
    let job = PpdJob::new(run, m, examples(4, 0), examples(2, 5), ckpt.into(), meta).unwrap();
    (job, resumed)
}

#[test]
fn a_ppd_job_resumes_from_its_checkpoint_and_writes_its_files() {
    let d = dir("ppd");
    let out = d.join("p.ppd.safetensors");
    let ckpt = arbor_train::checkpoint_path(&out);
    assert_eq!(ckpt, d.join("p.ppd.ckpt.safetensors"));

    let (mut whole, resumed) = ppd_job(&d.join("whole.ckpt.safetensors"), 6, false);
    assert!(!resumed);
    // Fresh prompt tokens start at the embeddings of the tokens given.
    let mut m = common::tiny("jobs-ppd", 9);
    assert_eq!(whole.run.prompts, m.embeddings(&[1, 2, 1]).unwrap());
    run(&mut whole);
    assert_eq!(whole.run.clock.step, 6);

    let (first, _) = ppd_job(&ckpt, 6, false);
    assert_eq!(kill_at(first, 4).run.clock.step, 4);
    let (mut second, resumed) = ppd_job(&ckpt, 6, false);
    assert!(resumed);
    assert_eq!(second.run.clock.step, 4);
    assert_eq!(run(&mut second), (2, 2));
    assert_eq!(second.run.prompts, whole.run.prompts);
    assert_eq!(second.run.losses, whole.run.losses);
    // One validation where the run started, none again on resuming.
    assert_eq!(second.run.validations.len(), 1);

    let last = second.finish(&out, &mut || 0.0).unwrap();
    let written = PromptFile::load(&out).unwrap();
    assert_eq!(written.vectors, whole.run.prompts);
    assert_eq!(written.accuracy.unwrap().distances(), 3);
    assert_eq!(written.meta["model"], "tiny");
    assert!(written.extra.is_empty());
    let ckpt_file = PromptFile::load(&ckpt).unwrap();
    assert_eq!(ckpt_file.meta["step"], "6");
    assert_eq!(last.top1.len(), 3);
    // No time passed: the last validation is no more recent than the
    // first, so it is not kept twice.
    assert_eq!(second.run.validations.len(), 1);
    for png in ["p.ppd.loss.png", "p.ppd.accuracy.png"] {
        assert!(d.join(png).exists(), "{png}");
    }
    // --restart starts afresh even where a checkpoint is.
    let (restarted, resumed) = ppd_job(&ckpt, 6, true);
    assert!(!resumed);
    assert_eq!(restarted.run.clock.step, 0);
    std::fs::remove_dir_all(&d).unwrap();
}

const TEXT: [u32; 14] = [3, 17, 42, 8, 8, 51, 2, 33, 19, 60, 7, 1, 12, 40];

fn lora_job(out: &Path, budget: u64, rank: usize) -> arbor_train::Result<LoraJob> {
    let m = common::model("jobs-lora");
    let adapters = Adapters {
        level: 1.0,
        rank,
        projs: Proj::ALL.to_vec(),
        seed: 3,
    };
    let settings = LoraSettings {
        budget: steps(budget),
        lr: 1e-2,
        chunk: 7,
    };
    let train = vec![TEXT[..7].to_vec(), TEXT[7..].to_vec()];
    let held = vec![TEXT.to_vec()];
    LoraJob::open(m, &adapters, out.into(), false, settings, train, held)
}

#[test]
fn a_lora_job_resumes_from_its_file_and_ends_with_both_perplexities() {
    let d = dir("lora");
    let (whole_out, out) = (d.join("whole.safetensors"), d.join("a.safetensors"));
    let mut whole = lora_job(&whole_out, 6, 2).unwrap();
    assert_eq!(whole.resumed_at(), None);
    run(&mut whole);

    let first = lora_job(&out, 6, 2).unwrap();
    assert_eq!(kill_at(first, 4).clock.step, 4);
    let mut second = lora_job(&out, 6, 2).unwrap();
    assert_eq!(second.resumed_at(), Some(4));
    assert_eq!(second.clock.step, 4);
    assert_eq!(run(&mut second), (2, 2));
    assert_eq!(second.file.flatten(), whole.file.flatten());
    // The file keeps losses to four places.
    let losses = |j: &LoraJob| {
        j.losses
            .iter()
            .map(|l| format!("{:.4}", l.1))
            .collect::<Vec<_>>()
    };
    assert_eq!(losses(&second), losses(&whole));

    let before: f64 = second.file.meta["perplexity_before"].parse().unwrap();
    let after = second.finish().unwrap();
    assert!(after < before, "{before} -> {after}");
    let written = LoraFile::from_bytes(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(written.meta["step"], "6");
    assert_eq!(written.meta["tokens_trained"], "42");
    assert_eq!(written.meta["perplexity_after"], format!("{after:.4}"));
    assert!(written.adam.is_some());
    assert!(d.join("a.loss.png").exists());
    // Another rank cannot go on from this file.
    let err = lora_job(&out, 6, 4).err().unwrap().to_string();
    assert!(err.contains("rank 2"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}
