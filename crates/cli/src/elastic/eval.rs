//! `arbor elastic eval`: each level's perplexity by masking units, before
//! any file is rebuilt.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_bench::calibration::{calibration_text, default_importance};
use arbor_bench::progress;
use arbor_engine::{LanguageModel, Tokenizer};
use arbor_plot::{LineChart, LineSeries, line_chart};
use arbor_train::ImportanceFile;

use super::EvalArgs;

pub(super) fn eval(args: &EvalArgs) -> Result<()> {
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
