//! A small mutation fuzzer on stable Rust, run from ordinary `#[test]`s.
//!
//! A [`Fuzzer`] starts from a committed seed corpus, then feeds its target
//! inputs that are either generated whole (a structure-aware generator the
//! test supplies) or mutated from the corpus ([`mutate`]). There is no
//! coverage instrumentation; instead the target reports an *outcome*, a
//! hash of what it did with the input (the error variant, the status code
//! and field at fault, the shape of what it accepted), and an input with
//! an outcome not seen before joins the corpus. Any panic fails the test,
//! naming the input, which is saved to a file to commit as a regression.
//!
//! How long it runs is the only thing the clock decides:
//! - by default a fixed number of executions from a fixed seed, so plain
//!   `cargo test` is fast and the same on every machine;
//! - `ARBOR_FUZZ_SECS=N`: about N seconds per target (CI's fuzzing step);
//! - `ARBOR_FUZZ_EXECS=N`: exactly N executions;
//! - `ARBOR_FUZZ_SEED=S`: another input sequence (any string);
//! - `ARBOR_FUZZ_CORPUS=DIR`: load and keep grown corpora in `DIR/<target>`
//!   between runs;
//! - `ARBOR_FUZZ_TOTALS=FILE`: add each run's executions to running totals
//!   kept in `FILE`;
//! - `ARBOR_FUZZ_CRASHES=DIR`: where failing inputs are saved (default: a
//!   folder in the temporary directory);
//! - `ARBOR_FUZZ_LAST=FILE`: write each input there before running it, to
//!   find the input behind a hang or an aborted process (slow);
//! - `ARBOR_FUZZ_SLOW=MS`: print every input that took longer than MS
//!   milliseconds (the report always names the slowest time).

pub mod alloc;
mod corpus;
mod mutate;
mod rng;

use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use corpus::{escape, inputs_in, repo_path};
pub use mutate::mutate;
pub use rng::Rng;

/// Inputs the in-memory corpus holds at most.
const MAX_CORPUS: usize = 4096;

/// An outcome: a hash of anything describing what the target did.
pub fn outcome(what: impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

/// How much to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    Execs(u64),
    Time(Duration),
}

impl Budget {
    /// From `ARBOR_FUZZ_SECS` / `ARBOR_FUZZ_EXECS`, else `default_execs`.
    pub fn from_env(default_execs: u64) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(s) = var("ARBOR_FUZZ_SECS") {
            let secs: f64 = s.parse().expect("ARBOR_FUZZ_SECS is a number of seconds");
            return Budget::Time(Duration::from_secs_f64(secs));
        }
        if let Some(n) = var("ARBOR_FUZZ_EXECS") {
            return Budget::Execs(n.parse().expect("ARBOR_FUZZ_EXECS is a count"));
        }
        Budget::Execs(default_execs)
    }

    /// Half of this budget.
    fn half(self) -> Self {
        match self {
            Budget::Execs(n) => Budget::Execs(n / 2),
            Budget::Time(t) => Budget::Time(t / 2),
        }
    }

    /// Whether a run that started at `start` and made `execs` executions
    /// has spent this budget.
    fn spent(self, start: Instant, execs: u64) -> bool {
        match self {
            Budget::Execs(n) => execs >= n,
            Budget::Time(t) => start.elapsed() >= t,
        }
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub target: &'static str,
    pub seed: u64,
    pub execs: u64,
    /// Inputs that once failed, replayed first.
    pub regressions: usize,
    /// Inputs given at the start (committed seeds and any kept corpus).
    pub seeds: usize,
    /// Corpus size at the end: the seeds and every input with a new outcome.
    pub corpus: usize,
    /// Distinct outcomes seen.
    pub outcomes: usize,
    pub elapsed: Duration,
    /// The longest a single input took.
    pub slowest: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        write!(
            f,
            "fuzz {}: {} executions in {secs:.1}s ({:.0}/s), {} regressions replayed, \
             corpus {} ({} seeds + {} new), {} distinct outcomes, slowest input {:.0} ms, \
             seed {:#x}",
            self.target,
            self.execs,
            self.execs as f64 / secs.max(1e-9),
            self.regressions,
            self.corpus,
            self.seeds,
            self.corpus - self.seeds,
            self.outcomes,
            self.slowest.as_secs_f64() * 1e3,
            self.seed,
        )
    }
}

type Generator<'a> = Box<dyn FnMut(&mut Rng) -> Vec<u8> + 'a>;

/// One fuzz target's set-up; [`Fuzzer::run`] runs it.
pub struct Fuzzer<'a> {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    regressions: Vec<Vec<u8>>,
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
    default_execs: u64,
    budget: Option<Budget>,
    crashes: PathBuf,
    generate: Option<Generator<'a>>,
    last: Option<PathBuf>,
    slow: Option<Duration>,
    slowest: Duration,
    kept_dir: Option<PathBuf>,
}

impl<'a> Fuzzer<'a> {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            seeds: Vec::new(),
            regressions: Vec::new(),
            dictionary: Vec::new(),
            max_len: 64 << 10,
            default_execs: 2000,
            budget: None,
            crashes: crash_dir(name),
            generate: None,
            last: std::env::var_os("ARBOR_FUZZ_LAST").map(PathBuf::from),
            slow: (std::env::var("ARBOR_FUZZ_SLOW").ok())
                .map(|ms| {
                    ms.parse()
                        .expect("ARBOR_FUZZ_SLOW is a number of milliseconds")
                })
                .map(Duration::from_millis),
            slowest: Duration::ZERO,
            kept_dir: corpus::kept_dir(name),
        }
    }

    /// Every file in `dir` (a committed corpus: it must exist and hold at
    /// least one file).
    pub fn seeds_from(mut self, dir: impl AsRef<Path>) -> Self {
        let inputs = inputs_in(dir.as_ref());
        assert!(!inputs.is_empty(), "no seeds in {}", dir.as_ref().display());
        self.seeds.extend(inputs.into_iter().map(|(_, b)| b));
        self
    }

    /// Every file in `dir`, which may be missing: inputs that once failed,
    /// replayed first on every run (but not mutated: one that once hung
    /// would make its mutants slow).
    pub fn regressions_from(mut self, dir: impl AsRef<Path>) -> Self {
        let inputs = inputs_in(dir.as_ref());
        self.regressions.extend(inputs.into_iter().map(|(_, b)| b));
        self
    }

    /// Loads and keeps the grown corpus in `dir` (default:
    /// `ARBOR_FUZZ_CORPUS/<target>`).
    pub fn keep_corpus_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kept_dir = Some(dir.into());
        self
    }

    pub fn seed(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.seeds.push(input.into());
        self
    }

    /// Words of the input's language to insert.
    pub fn dictionary<W: AsRef<[u8]>>(mut self, words: &[W]) -> Self {
        self.dictionary
            .extend(words.iter().map(|w| w.as_ref().to_vec()));
        self
    }

    /// The longest input to try (mutations are cut to it).
    pub fn max_len(mut self, n: usize) -> Self {
        self.max_len = n;
        self
    }

    /// Executions when neither `ARBOR_FUZZ_SECS` nor `ARBOR_FUZZ_EXECS`
    /// is set.
    pub fn execs(mut self, n: u64) -> Self {
        self.default_execs = n;
        self
    }

    /// A fixed budget, whatever the environment says.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Where a failing input is saved (default: `ARBOR_FUZZ_CRASHES`, else
    /// a folder in the temporary directory).
    pub fn crash_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.crashes = dir.into();
        self
    }

    /// A structure-aware generator: a quarter of the inputs are made by it
    /// rather than mutated from the corpus.
    pub fn generator(mut self, f: impl FnMut(&mut Rng) -> Vec<u8> + 'a) -> Self {
        self.generate = Some(Box::new(f));
        self
    }

    /// Runs `target` on the seeds, then on new inputs until the budget is
    /// spent; panics (failing the test) on the first input that makes
    /// `target` panic, after saving it. Returns what it did, after
    /// printing it.
    pub fn run(mut self, mut target: impl FnMut(&[u8]) -> u64) -> Report {
        let budget = (self.budget).unwrap_or_else(|| Budget::from_env(self.default_execs));
        let seed = seed_for(self.name);
        let mut rng = Rng::new(seed);
        let kept_dir = self.kept_dir.take();
        let mut kept: Vec<Vec<u8>> = (kept_dir.iter())
            .flat_map(|dir| inputs_in(dir).into_iter().map(|(_, b)| b))
            .collect();
        rng.shuffle(&mut kept);
        let start = Instant::now();
        let mut seen = std::collections::HashSet::new();
        let mut corpus: Vec<Vec<u8>> = Vec::new();
        let mut execs = 0u64;
        let n_regressions = self.regressions.len();
        for input in std::mem::take(&mut self.regressions) {
            seen.insert(self.exec(&mut target, &input, execs, seed));
            execs += 1;
        }
        let n_seeds = self.seeds.len() + kept.len();
        for input in std::mem::take(&mut self.seeds) {
            let o = self.exec(&mut target, &input, execs, seed);
            execs += 1;
            seen.insert(o);
            corpus.push(input);
        }
        // A kept corpus grows with every run: it is replayed (in an order
        // the seed picks) for at most half the budget, and the rest joins
        // the corpus unrun, still there to mutate.
        for input in kept {
            if budget.half().spent(start, execs) {
                corpus.push(input);
                continue;
            }
            let o = self.exec(&mut target, &input, execs, seed);
            execs += 1;
            seen.insert(o);
            corpus.push(input);
        }
        let mut new = Vec::new();
        while !budget.spent(start, execs) {
            let input = self.next_input(&mut rng, &corpus);
            let o = self.exec(&mut target, &input, execs, seed);
            execs += 1;
            if seen.insert(o) && corpus.len() < MAX_CORPUS {
                new.push(corpus.len());
                corpus.push(input);
            }
        }
        if let Some(dir) = &kept_dir {
            corpus::keep(dir, new.iter().map(|&i| &corpus[i][..]));
        }
        let report = Report {
            target: self.name,
            seed,
            execs,
            regressions: n_regressions,
            seeds: n_seeds,
            corpus: corpus.len(),
            outcomes: seen.len(),
            elapsed: start.elapsed(),
            slowest: self.slowest,
        };
        eprintln!("{report}");
        corpus::add_to_totals(&report);
        report
    }

    fn next_input(&mut self, rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
        if let Some(generate) = &mut self.generate
            && (corpus.is_empty() || rng.one_in(4))
        {
            let mut input = generate(rng);
            // Half of the generated inputs are mutated too.
            if rng.one_in(2) && !corpus.is_empty() {
                let other = rng.pick(corpus);
                mutate(rng, &mut input, other, &self.dictionary, self.max_len, 2);
            }
            input.truncate(self.max_len);
            return input;
        }
        if corpus.is_empty() {
            let n = rng.below(64);
            return rng.bytes(n);
        }
        let mut input = rng.pick(corpus).clone();
        let other = rng.pick(corpus);
        mutate(rng, &mut input, other, &self.dictionary, self.max_len, 4);
        input
    }

    fn exec(
        &mut self,
        target: &mut impl FnMut(&[u8]) -> u64,
        input: &[u8],
        index: u64,
        seed: u64,
    ) -> u64 {
        if let Some(path) = &self.last {
            std::fs::write(path, input).expect("ARBOR_FUZZ_LAST is writable");
        }
        let began = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| target(input))) {
            Ok(o) => {
                let took = began.elapsed();
                self.slowest = self.slowest.max(took);
                if self.slow.is_some_and(|slow| took > slow) {
                    eprintln!(
                        "fuzz {}: input #{index} took {:.0} ms ({} bytes): {}",
                        self.name,
                        took.as_secs_f64() * 1e3,
                        input.len(),
                        escape(&input[..input.len().min(512)]),
                    );
                }
                o
            }
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| payload.downcast_ref::<&str>().copied())
                    .unwrap_or("(not a string)");
                let saved = corpus::save_crash(&self.crashes, input);
                panic!(
                    "fuzz {}: input #{index} (seed {seed:#x}) panicked: {msg}\n\
                     saved to {}; commit it as a regression input\n\
                     input ({} bytes): {}",
                    self.name,
                    saved.display(),
                    input.len(),
                    escape(&input[..input.len().min(2048)]),
                );
            }
        }
    }
}

/// The target's seed: its name mixed with `ARBOR_FUZZ_SEED`.
fn seed_for(name: &str) -> u64 {
    let extra = std::env::var("ARBOR_FUZZ_SEED").unwrap_or_default();
    outcome((name, extra))
}

/// Where a failing input of `target` is written.
fn crash_dir(target: &str) -> PathBuf {
    let base = std::env::var_os("ARBOR_FUZZ_CRASHES")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("arbor-fuzz-crashes"));
    base.join(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_bug_is_found_and_saved() {
        // The target panics on inputs holding "BUG"; the seed holds "BUF".
        let crashes = std::env::temp_dir().join(format!("arbor-fuzz-self-{}", std::process::id()));
        let r = catch_unwind(|| {
            Fuzzer::new("planted")
                .seed(b"xxBUFxx".to_vec())
                .crash_dir(&crashes)
                .budget(Budget::Execs(200_000))
                .run(|input| {
                    assert!(!input.windows(3).any(|w| w == b"BUG"), "found the bug");
                    outcome(input.len())
                })
        });
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("found the bug"), "{msg}");
        let files = inputs_in(&crashes);
        std::fs::remove_dir_all(&crashes).unwrap();
        assert_eq!(files.len(), 1);
        assert!(files[0].1.windows(3).any(|w| w == b"BUG"));
    }

    #[test]
    fn a_kept_corpus_is_replayed_for_half_the_budget_at_most() {
        let dir = std::env::temp_dir().join(format!("arbor-fuzz-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..100 {
            std::fs::write(dir.join(format!("{i:03}")), format!("kept-{i:03}")).unwrap();
        }
        let mut calls: Vec<Vec<u8>> = Vec::new();
        let r = Fuzzer::new("kept")
            .seed(b"seed".to_vec())
            .keep_corpus_in(&dir)
            .budget(Budget::Execs(20))
            .run(|input| {
                calls.push(input.to_vec());
                outcome(input)
            });
        std::fs::remove_dir_all(&dir).unwrap();
        // The committed seed, then kept inputs up to half of 20 executions,
        // then mutations of a corpus that holds all 101.
        assert_eq!(r.execs, 20);
        assert_eq!(r.seeds, 101);
        assert!(r.corpus >= 101, "{r}");
        assert_eq!(calls[0], b"seed");
        let replayed: std::collections::HashSet<_> = calls[1..10].iter().collect();
        assert_eq!(replayed.len(), 9);
        assert!(replayed.iter().all(|c| c.starts_with(b"kept-")));
    }

    #[test]
    fn new_outcomes_grow_the_corpus() {
        let r = Fuzzer::new("lengths")
            .seed(b"a".to_vec())
            .generator(|rng| {
                let n = rng.below(8);
                rng.bytes(n)
            })
            .budget(Budget::Execs(500))
            .run(|input| outcome(input.len().min(20)));
        assert_eq!(r.execs, 500);
        assert_eq!(r.seeds, 1);
        // Lengths 0..=20 are 21 outcomes, each kept once.
        assert_eq!(r.outcomes, 21);
        assert_eq!(r.corpus, 21);
    }
}
