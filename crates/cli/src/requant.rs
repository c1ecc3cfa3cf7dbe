//! `arbor requant`: rewrite a whole model in another storage (every matrix
//! as Q8_0, Q5_0 or F16): larger targets of the same model and tokenizer,
//! as deployments run them when quality matters.

use std::path::PathBuf;

use anyhow::{Context, Result};
use arbor_bench::progress::{self, human_bytes};
use arbor_drafts::requant::requantize;
use arbor_drafts::slim::Quant;
use clap::Args;

#[derive(Args, Debug)]
pub struct RequantArgs {
    /// The model to rewrite (a name or a GGUF path).
    #[arg(long, default_value = arbor_engine::DEFAULT_TARGET)]
    pub model: String,
    /// Storage of every matrix: q8_0, q5_0 or f16.
    #[arg(long)]
    pub quant: String,
    /// Output file (default: `$ARBOR_HOME/models/<model>-<quant>.gguf`).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: &RequantArgs) -> Result<()> {
    let quant: Quant = args.quant.parse()?;
    let input = arbor_engine::resolve_or_fetch(&args.model, &mut progress::open_bar())?;
    let output = match &args.output {
        Some(p) => p.clone(),
        None => {
            let stem = input
                .file_stem()
                .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
            arbor_fetch::arbor_home()
                .join("models")
                .join(format!("{stem}-{quant}.gguf"))
        }
    };
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let r = requantize(&input, &output, quant, &mut progress::count_bar("tensors"))?;
    eprintln!(
        "{} → {}: {} → {} ({} matrices rewritten, {} already {quant}) in {:.1} s",
        input.display(),
        output.display(),
        human_bytes(r.input_bytes),
        human_bytes(r.output_bytes),
        r.converted,
        r.copied,
        r.secs
    );
    println!("{}", output.display());
    Ok(())
}
