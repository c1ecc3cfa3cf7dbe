//! `arbor bench ppd`: how well a model's prompt tokens guess, and what
//! that buys. On each prompt the model's greedy continuation is generated
//! plainly; the prompt tokens inserted at every point of it give the
//! top-k accuracy by distance (the form of the PPD thesis' Table 6.4);
//! then `ppd` decodes the same prompts, for its tokens per pass, its
//! candidate tree sizes, its speed against plain decoding and identical
//! output.

use anyhow::Result;
use arbor_engine::{Engine, RunConfig, Sampling};
use arbor_ppd::AccuracyTally;

use crate::progress;
use crate::prompts::load_prompts;
use crate::report::print_results;

#[derive(Debug)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchPpdArgs {
    #[cfg_attr(feature = "clap", arg(long, default_value = "qwen2.5-coder-1.5b"))]
    pub model: String,
    /// mt-bench, sharegpt, or a file with one JSON string per line.
    #[cfg_attr(feature = "clap", arg(long, default_value = "mt-bench"))]
    pub prompts: String,
    /// Use at most N prompts (spread over the categories).
    #[cfg_attr(feature = "clap", arg(long))]
    pub limit: Option<usize>,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 64))]
    pub max_tokens: usize,
    /// One JSON object on stdout (the table goes to stderr).
    #[cfg_attr(feature = "clap", arg(long))]
    pub json: bool,
    #[cfg_attr(feature = "clap", arg(long))]
    pub backend: Option<String>,
}

#[derive(serde::Serialize)]
struct Report {
    model: String,
    prompts: usize,
    prompt_tokens: usize,
    /// `topk[d][k]`: top-(k+1) accuracy at distance d+1.
    topk: Vec<Vec<f64>>,
    guesses_per_distance: u64,
    autoregressive_tok_s: f64,
    ppd_tok_s: f64,
    speedup: f64,
    /// Tokens committed per target pass.
    mean_accepted: f64,
    /// Candidate rows per verifying pass (the tree size the planner chose).
    candidates_per_pass: f64,
    identical: usize,
}

pub fn run(args: &BenchPpdArgs, device: &RunConfig) -> Result<()> {
    anyhow::ensure!(args.max_tokens >= 4, "--max-tokens must be at least 4");
    let prompts = load_prompts(&args.prompts, args.limit)?;
    let config = device
        .clone()
        .merge(RunConfig {
            target: Some(args.model.clone()),
            backend: args.backend.clone(),
            strategy: Some("autoregressive".into()),
            max_tokens: Some(args.max_tokens),
            ..RunConfig::default()
        })
        .target_only();
    let config = RunConfig {
        sampling: Sampling::default(),
        memory_budget: None,
        ..config
    };
    let mut events = progress::open_bar();
    let mut run = Engine::open(&config, &mut events)?;
    let hidden = run.engine().model().config().hidden;
    let (tokens, source) = arbor_engine::ppd::prompt_tokens_for(run.engine().path(), hidden)?;
    eprintln!("prompt tokens: {source}");
    let count = tokens.count();
    let mut tally = AccuracyTally::new(count, 10);
    let mut references = Vec::new();
    let (mut ar_tokens, mut ar_secs) = (0usize, 0.0f64);
    let mut bar = progress::count_bar("plain decoding + accuracy");
    for (i, p) in prompts.iter().enumerate() {
        bar(i, prompts.len());
        let ids = run.prompt_tokens(&p.text, true)?;
        let g = run.generate(&ids, &mut |_| {})?;
        ar_tokens += g.stats.generated_tokens.saturating_sub(1);
        ar_secs += g.stats.decode_secs;
        let seq: Vec<u32> = ids.iter().chain(&g.tokens).copied().collect();
        let model = run.engine_mut().model_mut();
        arbor_engine::ppd::tally_guesses(model, &seq, ids.len(), &tokens, &mut tally)?;
        references.push((ids, g.tokens));
    }
    bar(prompts.len(), prompts.len());
    let table = tally.accuracy()?;

    run.use_strategy("ppd", &mut events)?;
    let (mut tok, mut secs, mut produced, mut passes, mut verifs, mut cands, mut same) =
        (0usize, 0.0f64, 0usize, 0usize, 0usize, 0usize, 0usize);
    let mut bar = progress::count_bar("ppd decoding");
    for (i, (ids, reference)) in references.iter().enumerate() {
        bar(i, references.len());
        let g = run.generate(ids, &mut |_| {})?;
        let s = &g.stats;
        tok += s.generated_tokens.saturating_sub(1);
        secs += s.decode_secs;
        produced += s.produced_after_prefill();
        passes += s.verifications + s.target_steps;
        verifs += s.verifications;
        cands += s.draft_tokens;
        same += usize::from(&g.tokens == reference);
    }
    bar(references.len(), references.len());
    let (ar, ppd) = (
        ar_tokens as f64 / ar_secs.max(1e-9),
        tok as f64 / secs.max(1e-9),
    );
    let report = Report {
        model: args.model.clone(),
        prompts: prompts.len(),
        prompt_tokens: count,
        topk: (1..=count)
            .map(|d| (1..=10).map(|k| table.top(d, k)).collect())
            .collect(),
        guesses_per_distance: tally.seen(1),
        autoregressive_tok_s: ar,
        ppd_tok_s: ppd,
        speedup: ppd / ar.max(1e-9),
        mean_accepted: produced as f64 / passes.max(1) as f64,
        candidates_per_pass: cands as f64 / verifs.max(1) as f64,
        identical: same,
    };
    print_results(&render(&report, args), &[&report], args.json)
}

fn render(r: &Report, args: &BenchPpdArgs) -> String {
    let mut s = format!(
        "{} prompts from {}, {} new tokens, greedy, model {} ({} prompt tokens, {} guesses per distance)\n\n",
        r.prompts, args.prompts, args.max_tokens, r.model, r.prompt_tokens, r.guesses_per_distance
    );
    s += "| distance | top-1 | top-5 | top-10 |\n|---|---|---|---|\n";
    for (d, row) in r.topk.iter().enumerate() {
        s += &format!(
            "| @{} | {:.3} | {:.3} | {:.3} |\n",
            d + 1,
            row[0],
            row[4],
            row[9]
        );
    }
    s += &format!(
        "\nppd: {:.2} tokens per pass, {:.1} candidates per verifying pass, {:.2} tok/s vs \
         autoregressive {:.2} ({:.2}×), identical {}/{}\n",
        r.mean_accepted,
        r.candidates_per_pass,
        r.ppd_tok_s,
        r.autoregressive_tok_s,
        r.speedup,
        r.identical,
        r.prompts
    );
    s
}
