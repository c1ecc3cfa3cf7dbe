//! `arbor bench elastic`: each level of an elastic model against three
//! baselines — the same prefixes without reordering (file order), units
//! ordered by weight magnitude, and dropping whole layers — by perplexity
//! on a held-out text and greedy agreement with the whole original model
//! on benchmark prompts; prefill and decode speed per level; switching
//! time. A table (or JSON lines) and a PNG.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_elastic::Order;
use arbor_engine::{Engine, LanguageModel, RunConfig};
use arbor_plot::{LineChart, LineSeries, line_chart};

use crate::calibration::{ElasticFile, calibration_text, default_importance};
use crate::{progress, prompts, report};

#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct BenchElasticArgs {
    /// The original model (path or short name); its elastic files are
    /// built when missing (`arbor elastic build` with its defaults).
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: String,
    /// Held-out text for perplexity: a file or a dataset name.
    #[cfg_attr(feature = "clap", arg(long, default_value = "brown"))]
    pub text: String,
    /// Tokens of it to skip first (past the calibration tokens).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 8192))]
    pub skip: usize,
    /// Tokens evaluated.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2048))]
    pub tokens: usize,
    /// Perplexity window.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 256))]
    pub ctx: usize,
    /// Prompts for greedy agreement: mt-bench, sharegpt or a file.
    #[cfg_attr(feature = "clap", arg(long, default_value = "mt-bench"))]
    pub prompts: String,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 8))]
    pub limit: usize,
    /// Tokens of the original model's greedy continuation each level is
    /// compared on.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub max_tokens: usize,
    /// Tokens decoded for the speed columns (0: no speed).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub speed_tokens: usize,
    /// Baselines: file, magnitude, layers (whole layers dropped).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "file,magnitude,layers")
    )]
    pub baselines: Vec<String>,
    /// JSON lines on stdout (the table goes to stderr).
    #[cfg_attr(feature = "clap", arg(long))]
    pub json: bool,
    #[cfg_attr(feature = "clap", arg(long, default_value = "arbor-bench-elastic.png"))]
    pub plot: PathBuf,
}

/// One row of the table: a level under one way of choosing units.
#[derive(Debug, serde::Serialize)]
struct Row {
    method: String,
    level: f64,
    /// Share of the whole model's layer weights multiplied per token.
    weights: f64,
    perplexity: f64,
    /// Share of the original model's greedy tokens this level's greedy
    /// choice agrees with (teacher-forced along them).
    agreement: f64,
    prefill_tok_s: Option<f64>,
    decode_tok_s: Option<f64>,
}

pub fn run(args: &BenchElasticArgs, device: &RunConfig, elastic_file: ElasticFile) -> Result<()> {
    if args.tokens < 2 || args.ctx < 2 || args.limit == 0 || args.max_tokens == 0 {
        bail!("--tokens, --ctx, --limit and --max-tokens must be positive (windows of ≥ 2)");
    }
    let original = arbor_fetch::resolve_model(&args.model)?;
    let tokenizer = {
        let file = arbor_gguf::GgufFile::open(&original)?;
        arbor_engine::Tokenizer::from_gguf(file.header())?
    };
    let text = calibration_text(&args.text)?;
    let all = tokenizer.encode(&text)?;
    if all.len() < args.skip + args.tokens {
        bail!(
            "the text has {} tokens, fewer than --skip + --tokens",
            all.len()
        );
    }
    let held = &all[args.skip..args.skip + args.tokens];

    // The original model: its greedy continuations are the reference.
    let mut base = open(device, &original)?;
    base.set_max_tokens(args.max_tokens);
    let prompts = prompts::load_prompts(&args.prompts, Some(args.limit))?;
    let mut refs = Vec::new();
    for p in &prompts {
        let mut prompt = base.prompt_tokens(&p.text, true)?;
        let g = base.generate(&prompt, &mut |_| {})?;
        let from = prompt.len();
        prompt.extend(&g.tokens);
        if g.tokens.is_empty() {
            continue;
        }
        refs.push((prompt, from));
    }
    if refs.is_empty() {
        bail!("the original model generated nothing for any prompt");
    }
    let start = Instant::now();
    let original_ppl = perplexity(base.engine_mut().model_mut(), held, args.ctx)?;
    eprintln!(
        "original: perplexity {original_ppl:.3} ({:.0} s); {} reference continuations of ≤ {} tokens",
        start.elapsed().as_secs_f64(),
        refs.len(),
        args.max_tokens
    );

    let mut rows = Vec::new();
    let mut orders = vec![Order::Importance];
    for b in &args.baselines {
        match b.as_str() {
            "file" => orders.push(Order::File),
            "magnitude" => orders.push(Order::Magnitude),
            "layers" => {}
            other => bail!("unknown baseline `{other}` (file, magnitude, layers)"),
        }
    }
    let mut levels = Vec::new();
    for order in orders {
        let path = elastic_file(&original, order)?;
        let mut run = open(device, &path)?;
        let (layout, e) = elastic_layout(&path)?;
        levels = e.levels.clone();
        let whole = e.level_bytes(&layout, levels.len() - 1) as f64;
        let mut bar = progress::count_bar(&format!("{} levels", order.name()));
        for (l, &level) in levels.iter().enumerate() {
            bar(l, levels.len());
            let m = run.engine_mut().model_mut();
            m.set_level(level)?;
            let (prefill, decode) = match order == Order::Importance && args.speed_tokens > 0 {
                true => {
                    let (p, d) = speed(m, &refs[0].0, args.speed_tokens)?;
                    (Some(p), Some(d))
                }
                false => (None, None),
            };
            rows.push(Row {
                method: order.name().into(),
                level,
                weights: e.level_bytes(&layout, l) as f64 / whole,
                perplexity: perplexity(m, held, args.ctx)?,
                agreement: agreement(m, &refs)?,
                prefill_tok_s: prefill,
                decode_tok_s: decode,
            });
        }
        bar(levels.len(), levels.len());
        if order == Order::Importance {
            switching(run.engine_mut().model_mut(), &levels)?;
        }
    }
    if args.baselines.iter().any(|b| b == "layers") {
        rows.extend(drop_layers(
            &original,
            base.engine().model(),
            &levels,
            held,
            &refs,
            args,
        )?);
    }

    let mut table = format!(
        "elastic levels of {}: perplexity on {} held-out tokens of {} (original {original_ppl:.2}), \
         greedy agreement on {} continuations of {} prompts from {}\n",
        args.model,
        args.tokens,
        args.text,
        refs.len(),
        prompts.len(),
        args.prompts
    );
    table.push_str(
        "| method | level | weights | perplexity | agreement | prefill tok/s | decode tok/s |\n",
    );
    table.push_str("|---|---|---|---|---|---|---|\n");
    let num = |v: Option<f64>| v.map_or("".into(), |v| format!("{v:.1}"));
    for r in &rows {
        table.push_str(&format!(
            "| {} | {:.2} | {:.3} | {:.2} | {:.3} | {} | {} |\n",
            r.method,
            r.level,
            r.weights,
            r.perplexity,
            r.agreement,
            num(r.prefill_tok_s),
            num(r.decode_tok_s)
        ));
    }
    report::print_results(&table, &rows, args.json)?;
    plot(&rows, &args.model, &args.plot)?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}

/// `path` opened as a target-only run with the device's settings.
pub fn open(device: &RunConfig, path: &Path) -> Result<arbor_engine::Run> {
    let config = device.clone().merge(RunConfig {
        target: Some(path.display().to_string()),
        ..RunConfig::default()
    });
    Ok(Engine::open(
        &config.target_only(),
        &mut progress::open_bar(),
    )?)
}

fn elastic_layout(path: &Path) -> Result<(arbor_model::Layout, arbor_model::Elastic)> {
    let file = arbor_gguf::GgufFile::open(path)?;
    let layout = arbor_model::Layout::from_gguf(file.header())?;
    let e = layout
        .elastic
        .clone()
        .with_context(|| format!("{} is not elastic", path.display()))?;
    Ok((layout, e))
}

fn perplexity(m: &mut dyn LanguageModel, tokens: &[u32], ctx: usize) -> Result<f64> {
    Ok(arbor_engine::perplexity(m, tokens, ctx, &mut |_, _| {})?)
}

fn agreement(m: &mut dyn LanguageModel, refs: &[(Vec<u32>, usize)]) -> Result<f64> {
    let (mut agree, mut count) = (0, 0);
    for (text, from) in refs {
        let (a, c) = arbor_engine::greedy_agreement(m, text, *from)?;
        agree += a;
        count += c;
    }
    Ok(agree as f64 / count.max(1) as f64)
}

/// Prefill tok/s over `prompt` and decode tok/s over `tokens` greedy steps
/// after it.
fn speed(m: &mut dyn LanguageModel, prompt: &[u32], tokens: usize) -> Result<(f64, f64)> {
    m.truncate_cache(0)?;
    m.step(prompt)?; // warm-up
    m.truncate_cache(0)?;
    let start = Instant::now();
    let mut logits = m.step(prompt)?;
    let prefill = prompt.len() as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 0..tokens {
        let next = arbor_engine::argmax(&logits).unwrap_or(0);
        logits = m.step(&[next])?;
    }
    Ok((prefill, tokens as f64 / start.elapsed().as_secs_f64()))
}

/// Times switching between every pair of levels (a thousand switches), and
/// says so on stderr.
fn switching(m: &mut dyn LanguageModel, levels: &[f64]) -> Result<()> {
    let n = 1000;
    let start = Instant::now();
    for i in 0..n {
        m.set_level(levels[i % levels.len()])?;
    }
    let each = start.elapsed().as_secs_f64() / n as f64;
    eprintln!("switching levels: {:.2} µs each (mean of {n})", each * 1e6);
    Ok(())
}

/// Per level, the layers the layer-dropping baseline keeps: the cheapest
/// whole non-anchor layers to remove (by the importance file's layer
/// costs) are dropped, as many as the level drops of their units.
pub fn layer_masks(original: &Path, levels: &[f64]) -> Result<Vec<Vec<bool>>> {
    let imp = default_importance(original);
    let f = arbor_train::ImportanceFile::from_bytes(
        &std::fs::read(&imp).with_context(|| format!("reading {}", imp.display()))?,
    )?;
    let n = f.layer_costs.len();
    let anchors = (n as f64 * 0.2).round() as usize;
    let mut cheap: Vec<usize> = (0..n).collect();
    cheap.sort_by(|&a, &b| f.layer_costs[a].total_cmp(&f.layer_costs[b]));
    Ok((levels.iter())
        .map(|&level| {
            let drop = ((n - anchors) as f64 * (1.0 - level)).round() as usize;
            (0..n).map(|l| !cheap[..drop].contains(&l)).collect()
        })
        .collect())
}

/// The original model with the cheapest whole non-anchor layers dropped,
/// as many as each level drops of their units.
fn drop_layers(
    original: &Path,
    model: &dyn LanguageModel,
    levels: &[f64],
    held: &[u32],
    refs: &[(Vec<u32>, usize)],
    args: &BenchElasticArgs,
) -> Result<Vec<Row>> {
    let masks = layer_masks(original, levels)?;
    let mut rows = Vec::new();
    let mut bar = progress::count_bar("layer-dropping levels");
    for (i, (&level, keep)) in levels.iter().zip(&masks).enumerate() {
        bar(i, levels.len());
        let mut m = model.without_layers(keep)?;
        rows.push(Row {
            method: "layers".into(),
            level,
            weights: keep.iter().filter(|&&k| k).count() as f64 / keep.len() as f64,
            perplexity: perplexity(m.as_mut(), held, args.ctx)?,
            agreement: agreement(m.as_mut(), refs)?,
            prefill_tok_s: None,
            decode_tok_s: None,
        });
    }
    bar(levels.len(), levels.len());
    Ok(rows)
}

fn plot(rows: &[Row], model: &str, path: &Path) -> Result<()> {
    let mut methods: Vec<&str> = rows.iter().map(|r| r.method.as_str()).collect();
    methods.dedup();
    let chart = LineChart {
        title: format!("Elastic levels of {model}: perplexity"),
        x_label: "level (share of each non-anchor layer's units kept)".into(),
        y_label: "ln perplexity".into(),
        series: methods
            .iter()
            .map(|m| LineSeries {
                name: (*m).into(),
                points: (rows.iter().filter(|r| r.method == *m))
                    .map(|r| (r.level, r.perplexity.ln()))
                    .collect(),
            })
            .collect(),
    };
    line_chart(&chart, path).map_err(|e| anyhow::anyhow!("{e}"))
}
