//! `arbor elastic`: elastic sub-models (ELMS). So far `importance`: each
//! query head's and MLP neuron's first-order importance on a calibration
//! text, and each layer's removal cost (the anchor layers are the costliest
//! ~20%), written to a file the build will order units by; and `eval`: the
//! perplexity of each level's sub-model by masking units, against file
//! order and against dropping whole layers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_engine::{LanguageModel, Tokenizer};
use arbor_plot::{BarChart, LineChart, LineSeries, Series, bar_chart, line_chart};
use arbor_train::{Importance, ImportanceFile, layer_costs};
use clap::{Args, Subcommand};

use crate::progress;

#[derive(Subcommand)]
pub enum ElasticCommand {
    /// Importance of every query head and MLP neuron (|Σ ∂L/∂w·w| on a
    /// calibration text) and each layer's removal cost.
    Importance(ImportanceArgs),
    /// Perplexity of the sub-model each level keeps (units masked, no file
    /// rebuilt), by importance order, by file order, and by dropping whole
    /// layers instead.
    Eval(EvalArgs),
}

#[derive(Args)]
pub struct EvalArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Importance file (default: `arbor elastic importance`'s output).
    #[arg(long)]
    importance: Option<PathBuf>,
    /// Levels: fractions of each non-anchor layer's units kept.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0"
    )]
    levels: Vec<f64>,
    /// Held-out text: a file or a dataset name.
    #[arg(long, default_value = "brown")]
    text: String,
    /// Tokens of it to skip first (past the calibration tokens).
    #[arg(long, default_value_t = 8192)]
    skip: usize,
    /// Tokens evaluated.
    #[arg(long, default_value_t = 2048)]
    tokens: usize,
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Share of layers kept whole (the costliest to remove).
    #[arg(long, default_value_t = 0.2)]
    anchors: f64,
    /// Where to draw perplexity against level.
    #[arg(long, default_value = "arbor-elastic-eval.png")]
    plot: PathBuf,
}

#[derive(Args)]
pub struct ImportanceArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Calibration text: a file or a dataset name.
    #[arg(long, default_value = "brown")]
    calibration: String,
    /// Calibration tokens for unit importance.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Tokens per pass (each pass holds its logits and their gradients).
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Calibration tokens for the layers' removal costs (a pass per layer
    /// over them).
    #[arg(long, default_value_t = 1024)]
    layer_tokens: usize,
    /// Output (default $ARBOR_HOME/elastic/<model>.importance.safetensors;
    /// a bar chart of the layer costs goes beside it).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(which: ElasticCommand) -> Result<()> {
    match which {
        ElasticCommand::Importance(args) => importance(&args),
        ElasticCommand::Eval(args) => eval(&args),
    }
}

fn default_importance(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    arbor_fetch::arbor_home()
        .join("elastic")
        .join(format!("{stem}.importance.safetensors"))
}

fn calibration_text(name: &str) -> Result<String> {
    let path = if Path::new(name).exists() {
        PathBuf::from(name)
    } else if arbor_fetch::dataset_entry(name).is_some() {
        arbor_fetch::fetch_dataset(name, &mut progress::fetch_bar())?
    } else {
        bail!("no file `{name}` (and it is not a dataset name: mt-bench, sharegpt, brown)");
    };
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

fn importance(args: &ImportanceArgs) -> Result<()> {
    if args.chunk < 2 || args.tokens < args.chunk || args.layer_tokens < 2 {
        bail!("need --chunk ≥ 2, --tokens ≥ --chunk and --layer-tokens ≥ 2");
    }
    let model_path = arbor_fetch::resolve_model(&args.model)?;
    let file = arbor_gguf::GgufFile::open(&model_path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let text = calibration_text(&args.calibration)?;
    let mut tokens = tokenizer.encode(&text)?;
    if tokens.len() < args.tokens {
        bail!(
            "the calibration text has {} tokens, fewer than --tokens {}",
            tokens.len(),
            args.tokens
        );
    }
    tokens.truncate(args.tokens);
    let chunks: Vec<Vec<u32>> = tokens.chunks(args.chunk).map(<[u32]>::to_vec).collect();
    let chunks: Vec<Vec<u32>> = chunks.into_iter().filter(|c| c.len() >= 2).collect();
    let mut model = arbor_train::load_model(&file, &mut progress::load_bar(&model_path))?;

    let start = Instant::now();
    let mut imp = Importance::new(model.config());
    let mut bar = progress::count_bar("chunks");
    for (i, c) in chunks.iter().enumerate() {
        bar(i, chunks.len());
        imp.add_chunk(&mut model, c)?;
    }
    bar(chunks.len(), chunks.len());
    let unit_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let take = args.layer_tokens.div_ceil(args.chunk).min(chunks.len());
    let (base, costs) = layer_costs(&model, &chunks[..take], &mut progress::count_bar("layers"))?;
    let layer_secs = start.elapsed().as_secs_f64();

    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_importance(&model_path));
    let meta: BTreeMap<String, String> = [
        ("model", model_path.display().to_string()),
        ("calibration", args.calibration.clone()),
        (
            "layer_tokens",
            (take * args.chunk).min(tokens.len()).to_string(),
        ),
        ("unit_seconds", format!("{unit_secs:.1}")),
        ("layer_seconds", format!("{layer_secs:.1}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let f = ImportanceFile {
        importance: imp,
        layer_costs: costs,
        meta,
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, f.to_bytes()?).with_context(|| format!("writing {}", out.display()))?;
    report(&f, base, unit_secs, layer_secs);
    let png = out.with_extension("png");
    plot(&f, &png)?;
    eprintln!("importance: {}\nchart: {}", out.display(), png.display());
    Ok(())
}

/// Per layer: its removal cost, and how unevenly its units matter (the
/// share of the summed |importance| held by the top half of its heads and
/// of its neurons).
fn report(f: &ImportanceFile, base: f64, unit_secs: f64, layer_secs: f64) {
    let imp = &f.importance;
    eprintln!(
        "{} tokens, mean loss {:.3} nats (units: {unit_secs:.0} s, layers: {layer_secs:.0} s; full model {base:.3} on the layer tokens)",
        imp.tokens,
        imp.mean_loss()
    );
    let top_half = |v: &[f64]| {
        let mut a: Vec<f64> = v.iter().map(|x| x.abs()).collect();
        a.sort_by(|x, y| y.total_cmp(x));
        let total: f64 = a.iter().sum();
        a[..a.len().div_ceil(2)].iter().sum::<f64>() / total.max(f64::MIN_POSITIVE)
    };
    let mut order: Vec<usize> = (0..f.layer_costs.len()).collect();
    order.sort_by(|&a, &b| f.layer_costs[b].total_cmp(&f.layer_costs[a]));
    let anchors = order.len().div_ceil(5);
    println!(
        "| layer | removal cost (nats) | anchor | top-half share, heads | top-half share, neurons |"
    );
    println!("|---|---|---|---|---|");
    for (l, cost) in f.layer_costs.iter().enumerate() {
        let anchor = if order[..anchors].contains(&l) {
            "yes"
        } else {
            ""
        };
        println!(
            "| {l} | {cost:.4} | {anchor} | {:.2} | {:.2} |",
            top_half(&imp.heads[l]),
            top_half(&imp.neurons[l])
        );
    }
}

fn plot(f: &ImportanceFile, path: &Path) -> Result<()> {
    let chart = BarChart {
        title: "Loss increase when a layer is removed".into(),
        y_label: "nats per token".into(),
        groups: (0..f.layer_costs.len()).map(|l| l.to_string()).collect(),
        series: vec![Series {
            name: "removal cost".into(),
            values: f.layer_costs.iter().map(|c| c.max(0.0)).collect(),
        }],
        reference: None,
    };
    bar_chart(&chart, path).map_err(|e| anyhow::anyhow!("{e}"))
}

fn eval(args: &EvalArgs) -> Result<()> {
    use arbor_train::prune::{Order, keep_at, masks};
    if args.levels.iter().any(|&l| !(l > 0.0 && l <= 1.0)) || !(0.0..1.0).contains(&args.anchors) {
        bail!("levels must be in (0, 1] and --anchors in [0, 1)");
    }
    if args.chunk < 2 || args.tokens < args.chunk {
        bail!("need --chunk ≥ 2 and --tokens ≥ --chunk");
    }
    let model_path = arbor_fetch::resolve_model(&args.model)?;
    let imp_path = args
        .importance
        .clone()
        .unwrap_or_else(|| default_importance(&model_path));
    let bytes = std::fs::read(&imp_path).with_context(|| {
        format!(
            "reading {} (run `arbor elastic importance --model {}` first)",
            imp_path.display(),
            args.model
        )
    })?;
    let f = ImportanceFile::from_bytes(&bytes)?;
    let file = arbor_gguf::GgufFile::open(&model_path)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let tokens = tokenizer.encode(&calibration_text(&args.text)?)?;
    if tokens.len() < args.skip + args.tokens {
        bail!(
            "the text has {} tokens, fewer than --skip + --tokens",
            tokens.len()
        );
    }
    let chunks: Vec<Vec<u32>> = tokens[args.skip..args.skip + args.tokens]
        .chunks(args.chunk)
        .filter(|c| c.len() >= 2)
        .map(<[u32]>::to_vec)
        .collect();
    let mut model = arbor_train::load_model(&file, &mut progress::load_bar(&model_path))?;
    let c = model.config().clone();
    let anchors = ((c.n_layers as f64 * args.anchors).round() as usize).min(c.n_layers);
    // Layers in order of removal cost, cheapest first (for dropping).
    let mut cheap: Vec<usize> = (0..c.n_layers).collect();
    cheap.sort_by(|&a, &b| f.layer_costs[a].total_cmp(&f.layer_costs[b]));
    let droppable = c.n_layers - anchors;
    let start = Instant::now();
    let mut rows = Vec::new();
    let mut bar = progress::count_bar("levels");
    for (i, &level) in args.levels.iter().enumerate() {
        bar(i, args.levels.len());
        let mut ppl = Vec::new();
        for order in [Order::Importance, Order::Global, Order::File] {
            let keep = keep_at(&f, &c, level, anchors, order)?;
            model.set_probes(Some(masks(model.backend(), &c, &keep)?))?;
            ppl.push(arbor_train::mean_loss(&mut model, &chunks)?.exp());
        }
        model.set_probes(None)?;
        let drop = ((droppable as f64) * (1.0 - level)).round() as usize;
        let keep: Vec<bool> = (0..c.n_layers)
            .map(|l| !cheap[..drop].contains(&l))
            .collect();
        ppl.push(arbor_train::mean_loss(&mut model.self_draft_with(&keep)?, &chunks)?.exp());
        rows.push((level, ppl));
    }
    bar(args.levels.len(), args.levels.len());
    eprintln!(
        "{} held-out tokens of {} (after {}), {anchors} anchor layers, {:.0} s",
        args.tokens,
        args.text,
        args.skip,
        start.elapsed().as_secs_f64()
    );
    println!(
        "| level | perplexity, importance order | importance across layers | file order | whole layers dropped |"
    );
    println!("|---|---|---|---|---|");
    for (level, p) in &rows {
        println!(
            "| {level:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p[0], p[1], p[2], p[3]
        );
    }
    let names = [
        "importance order",
        "importance across layers",
        "file order",
        "whole layers dropped",
    ];
    let chart = LineChart {
        title: format!("Sub-models of {} by masking", args.model),
        x_label: "level (share of non-anchor units kept)".into(),
        y_label: "perplexity (log scale: ln)".into(),
        series: (0..4)
            .map(|k| LineSeries {
                name: names[k].into(),
                points: rows.iter().map(|(l, p)| (*l, p[k].ln())).collect(),
            })
            .collect(),
    };
    line_chart(&chart, &args.plot).map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("chart: {}", args.plot.display());
    Ok(())
}
