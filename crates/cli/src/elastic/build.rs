//! `arbor elastic build`: the elastic version of a model — units ranked by
//! importance (measured first when no importance file exists yet, so a
//! build cut short goes on from the measurement), levels in the metadata.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_bench::calibration::{default_importance, in_home};
use arbor_bench::progress;
use arbor_elastic::{BuildOptions, DownType, Order, Scores};
use arbor_train::ImportanceFile;
use clap::Args;

use super::ImportanceArgs;

#[derive(Args)]
pub struct BuildArgs {
    /// Model (path or short name).
    #[arg(long)]
    model: String,
    /// Output (default $ARBOR_HOME/elastic/<model>.elastic.gguf; other
    /// orders add their name).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Levels: fractions of each non-anchor layer's units kept (1 is
    /// always built).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0"
    )]
    levels: Vec<f64>,
    /// What ranks the units: importance, magnitude (of their weights) or
    /// file (no reordering) — the last two are baselines.
    #[arg(long, default_value = "importance")]
    order: String,
    /// What the permuted down projection is stored as: q8_0 or q5_0.
    #[arg(long, default_value = "q8_0")]
    down: String,
    /// Share of layers kept whole (the costliest to remove, by the
    /// importance file; with 0, magnitude and file orders need none).
    #[arg(long, default_value_t = 0.2)]
    anchors: f64,
    /// Importance file (default: `arbor elastic importance`'s output,
    /// measured now when missing).
    #[arg(long)]
    importance: Option<PathBuf>,
    /// Calibration text for a missing importance file: a file or a
    /// dataset name.
    #[arg(long, default_value = "brown")]
    calibration: String,
    /// Calibration tokens for a missing importance file.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Where the output head's frequency order comes from (its first rows
    /// then make a smaller head, for latency objectives): sharegpt, brown,
    /// a text file, or `none` to keep token order. A head tied to the
    /// embedding keeps token order.
    #[arg(long, default_value = "sharegpt")]
    vocab_corpus: String,
    /// Bytes of that corpus counted.
    #[arg(long, default_value_t = 8 << 20)]
    vocab_bytes: usize,
}

/// Where `order`'s elastic file of `model` goes by default.
pub(crate) fn default_out(model: &Path, order: Order) -> PathBuf {
    let tag = match order {
        Order::Importance => String::new(),
        o => format!("-{}", o.name()),
    };
    in_home(model, &format!(".elastic{tag}.gguf"))
}

/// `order`'s elastic file of `model` at its default place, built with the
/// defaults when missing.
pub(crate) fn ensure_built(model: &Path, order: Order) -> Result<PathBuf> {
    let out = default_out(model, order);
    if !out.exists() {
        eprintln!(
            "building {} (arbor elastic build --order {})",
            out.display(),
            order.name()
        );
        // Called by other commands: the table goes to stderr, their stdout
        // (JSON with --json) stays theirs.
        let table = write(&BuildArgs {
            model: model.display().to_string(),
            out: Some(out.clone()),
            levels: vec![0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
            order: order.name().into(),
            down: "q8_0".into(),
            anchors: 0.2,
            importance: None,
            calibration: "brown".into(),
            tokens: 4096,
            vocab_corpus: "sharegpt".into(),
            vocab_bytes: 8 << 20,
        })?;
        eprint!("{table}");
    }
    Ok(out)
}

/// The head's rows most frequent first (special tokens ahead), counted over
/// `corpus`; `None` for `none` or a head tied to the embedding.
fn vocab_order(model: &Path, corpus: &str, bytes: usize) -> Result<Option<Vec<u32>>> {
    let file = arbor_gguf::GgufFile::open(model)?;
    let h = file.header();
    if corpus == "none" || arbor_model::Layout::from_gguf(h)?.head.is_none() {
        return Ok(None);
    }
    let texts = crate::slim::corpus_texts(corpus, bytes)?;
    let counts = crate::slim::count_tokens(model, &texts, corpus)?;
    let specials = arbor_drafts::slim::special_ids(h, counts.vocab_size())?;
    eprintln!(
        "head rows ranked by {} tokens of {corpus} ({} special tokens first)",
        counts.total(),
        specials.len()
    );
    Ok(Some(arbor_drafts::slim::ranked_ids(
        counts.counts(),
        &specials,
    )?))
}

/// `arbor elastic build`: the table of levels goes to stdout.
pub(super) fn build(args: &BuildArgs) -> Result<()> {
    print!("{}", write(args)?);
    Ok(())
}

/// The importance file of `args` (measured now when missing), with layer
/// costs.
fn read_importance(args: &BuildArgs, model_path: &Path) -> Result<ImportanceFile> {
    let imp_path = args
        .importance
        .clone()
        .unwrap_or_else(|| default_importance(model_path));
    if !imp_path.exists() {
        eprintln!(
            "no importance file at {}: measuring it first ({} tokens of {})",
            imp_path.display(),
            args.tokens,
            args.calibration
        );
        super::importance::importance(&ImportanceArgs {
            model: args.model.clone(),
            calibration: args.calibration.clone(),
            tokens: args.tokens,
            chunk: 256,
            layer_tokens: 1024,
            out: Some(imp_path.clone()),
        })?;
    }
    let f = ImportanceFile::from_bytes(
        &std::fs::read(&imp_path).with_context(|| format!("reading {}", imp_path.display()))?,
    )?;
    if f.layer_costs.is_empty() {
        bail!("{} holds no layer costs", imp_path.display());
    }
    Ok(f)
}

/// Builds the file; returns the table of levels.
fn write(args: &BuildArgs) -> Result<String> {
    let order: Order = args.order.parse()?;
    let down: DownType = args.down.parse()?;
    if !(0.0..1.0).contains(&args.anchors) {
        bail!("--anchors must be in [0, 1)");
    }
    let model_path = arbor_fetch::resolve_model(&args.model)?;
    // The importance file ranks units (importance order) and layers (the
    // anchors); magnitude and file orders without anchors need none.
    let importance = if order == Order::Importance || args.anchors > 0.0 {
        Some(read_importance(args, &model_path)?)
    } else {
        None
    };
    let mut anchors: Vec<usize> = match &importance {
        Some(f) => {
            let n_layers = f.layer_costs.len();
            let mut by_cost: Vec<usize> = (0..n_layers).collect();
            by_cost.sort_by(|&a, &b| f.layer_costs[b].total_cmp(&f.layer_costs[a]));
            by_cost[..(n_layers as f64 * args.anchors).round() as usize].to_vec()
        }
        None => Vec::new(),
    };
    anchors.sort_unstable();
    let scores = match order {
        Order::Importance => importance.map(|f| Scores {
            heads: f.importance.heads,
            neurons: f.importance.neurons,
        }),
        Order::Magnitude => {
            let file = arbor_gguf::GgufFile::open(&model_path)?;
            let layout = arbor_model::Layout::from_gguf(file.header())?;
            Some(arbor_elastic::magnitude_scores(&file, &layout)?)
        }
        Order::File => None,
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_out(&model_path, order));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let opts = BuildOptions {
        levels: args.levels.clone(),
        anchors: anchors.clone(),
        order,
        down,
        vocab: vocab_order(&model_path, &args.vocab_corpus, args.vocab_bytes)?,
    };
    let report = arbor_elastic::build(
        &model_path,
        &out,
        scores.as_ref(),
        &opts,
        &mut progress::count_bar("layers"),
    )?;
    eprintln!(
        "{} → {} ({:.0} → {:.0} MB, {:.1} s): {} order, anchors {anchors:?}, heads move in runs of {}, \
         down projection as {}{}",
        model_path.display(),
        out.display(),
        report.input_bytes as f64 / 1e6,
        report.output_bytes as f64 / 1e6,
        report.secs,
        order.name(),
        report.head_run,
        down.ty(),
        match report.requantized_o {
            0 => String::new(),
            n => format!(", {n} output projections quantized again to Q8_0"),
        }
    );
    let whole = *report.level_bytes.last().unwrap_or(&1) as f64;
    let mut table = String::from(
        "| level | layer weights read per token (MB) | share of the whole |\n|---|---|---|\n",
    );
    for (l, b) in report.levels.iter().zip(&report.level_bytes) {
        table.push_str(&format!(
            "| {l:.2} | {:.1} | {:.3} |\n",
            *b as f64 / 1e6,
            *b as f64 / whole
        ));
    }
    Ok(table)
}
