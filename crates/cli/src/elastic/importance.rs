//! `arbor elastic importance`: each unit's first-order importance on a
//! calibration text and each layer's removal cost.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use arbor_bench::calibration::{calibration_text, default_importance};
use arbor_bench::progress;
use arbor_engine::{LanguageModel, Tokenizer};
use arbor_plot::{BarChart, Series, bar_chart};
use arbor_train::{Importance, ImportanceFile, layer_costs};

use super::ImportanceArgs;

pub(super) fn importance(args: &ImportanceArgs) -> Result<()> {
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
    f.save(&out)?;
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
