//! `arbor slim`: derive a slim draft from a draft GGUF — its output head
//! restricted to the K most frequent tokens of a corpus (ShareGPT by
//! default, which MT-Bench does not overlap), layers requantized.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use arbor_bench::progress::{self, human_bytes};
use arbor_drafts::slim::{Quant, SlimOptions, TokenCounts, derive, vocabulary_fingerprint};
use arbor_engine::{DEFAULT_DRAFT, Tokenizer};
use clap::Args;
use rayon::prelude::*;

#[derive(Args, Debug)]
pub struct SlimArgs {
    /// The draft model to derive from (a name or a GGUF path).
    #[arg(long, default_value = DEFAULT_DRAFT)]
    pub draft: String,
    /// Rows of the output head: special tokens, then the most frequent.
    #[arg(long, default_value_t = 32768)]
    pub k: usize,
    /// Storage of the layers and the head: keep, q8_0 or q5_0.
    #[arg(long, default_value = "q5_0")]
    pub quant: String,
    /// Storage of the head, when it differs from `--quant`.
    #[arg(long)]
    pub head_quant: Option<String>,
    /// Storage of the token table (read by rows at run time).
    #[arg(long, default_value = "keep")]
    pub embd_quant: String,
    /// Where the token counts come from: sharegpt (every turn), brown, or
    /// a text file.
    #[arg(long, default_value = "sharegpt")]
    pub corpus: String,
    /// Tokenize at most this many bytes of the corpus.
    #[arg(long, default_value_t = 8 << 20)]
    pub corpus_bytes: usize,
    /// Output file (default: `$ARBOR_HOME/slim/<draft>-k<K>-<quant>.gguf`).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also save the K most frequent ids of the corpus to this file (what
    /// `auto` derives slim drafts from without the corpus; see
    /// assets/slim/).
    #[arg(long)]
    pub save_ranking: Option<PathBuf>,
}

pub fn run(args: &SlimArgs) -> Result<()> {
    let quant: Quant = args.quant.parse()?;
    let opts = SlimOptions {
        k: args.k,
        layers: quant,
        head: match &args.head_quant {
            Some(q) => q.parse()?,
            None => quant,
        },
        embedding: args.embd_quant.parse()?,
    };
    let input = arbor_engine::resolve_or_fetch(&args.draft, &mut progress::open_bar())?;
    let output = match &args.output {
        Some(p) => p.clone(),
        None => default_output(&input, &opts),
    };
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let start = Instant::now();
    let texts = corpus_texts(&args.corpus, args.corpus_bytes)?;
    let counts = count_tokens(&input, &texts, &args.corpus)?;
    let counted = start.elapsed().as_secs_f64();
    if let Some(path) = &args.save_ranking {
        std::fs::write(path, counts.ranking(args.k))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "saved the {} most frequent ids to {}",
            args.k,
            path.display()
        );
    }
    eprintln!(
        "counted {} tokens in {} texts ({}) of {} in {counted:.1} s",
        counts.total(),
        counts.texts(),
        human_bytes(texts.iter().map(|t| t.len() as u64).sum()),
        args.corpus
    );
    let r = derive(
        &input,
        &output,
        &opts,
        &counts,
        &mut progress::count_bar("tensors"),
    )?;
    eprintln!(
        "{} → {}: {} → {}; head {} of {} rows ({} special, {}), covering {:.2}% of the corpus's tokens",
        input.display(),
        output.display(),
        human_bytes(r.input_bytes),
        human_bytes(r.output_bytes),
        r.head_rows,
        r.vocab,
        r.specials,
        r.head_type,
        100.0 * r.coverage()
    );
    eprintln!(
        "a draft pass reads {} (layers {}, head {}); token table {}; {:.1} s (+{counted:.1} s counting)",
        human_bytes(r.pass_bytes()),
        human_bytes(r.layer_bytes),
        human_bytes(r.head_bytes),
        human_bytes(r.embedding_bytes),
        r.secs
    );
    println!("{}", output.display());
    Ok(())
}

/// `$ARBOR_HOME/slim/<stem>-k<K>-<quant>.gguf`.
fn default_output(input: &Path, opts: &SlimOptions) -> PathBuf {
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "draft".into());
    let mut name = format!("{stem}-k{}-{}", opts.k, opts.layers);
    if opts.head != opts.layers {
        name += &format!("-head-{}", opts.head);
    }
    if opts.embedding != Quant::Keep {
        name += &format!("-embd-{}", opts.embedding);
    }
    arbor_fetch::arbor_home()
        .join("slim")
        .join(format!("{name}.gguf"))
}

/// Up to `max_bytes` of text from `corpus`: every turn of the ShareGPT
/// conversations, the lines of brown, or the paragraphs of a text file.
pub(crate) fn corpus_texts(corpus: &str, max_bytes: usize) -> Result<Vec<String>> {
    let (path, sharegpt) = if Path::new(corpus).exists() {
        (PathBuf::from(corpus), false)
    } else if arbor_fetch::dataset_entry(corpus).is_some() && corpus != "mt-bench" {
        let path = arbor_fetch::fetch_dataset(corpus, &mut progress::fetch_bar())?;
        (path, corpus == "sharegpt")
    } else {
        bail!(
            "no corpus `{corpus}` (sharegpt, brown, or a text file; not mt-bench, the benchmark)"
        );
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut texts = Vec::new();
    let mut taken = 0;
    let mut take = |s: &str| {
        if taken >= max_bytes || s.trim().is_empty() {
            return taken < max_bytes;
        }
        taken += s.len();
        texts.push(s.to_string());
        taken < max_bytes
    };
    if sharegpt {
        sharegpt_turns(&text, &mut take);
    } else {
        for para in text.split("\n\n") {
            if !take(para) {
                break;
            }
        }
    }
    Ok(texts)
}

/// Calls `take` with every turn of a ShareGPT dump, conversation by
/// conversation (a file cut off mid-way still yields everything before the
/// cut), until it returns false.
fn sharegpt_turns(text: &str, take: &mut dyn FnMut(&str) -> bool) {
    let mut rest = text.trim_start().strip_prefix('[').unwrap_or("");
    loop {
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let Some(Ok(v)) = it.next() else { return };
        rest = &rest[it.byte_offset()..];
        for turn in v["conversations"].as_array().into_iter().flatten() {
            if let Some(s) = turn["value"].as_str()
                && !take(s)
            {
                return;
            }
        }
    }
}

/// Token counts of `texts` with the tokenizer of the GGUF at `model`, on
/// every core.
pub(crate) fn count_tokens(model: &Path, texts: &[String], corpus: &str) -> Result<TokenCounts> {
    let file = arbor_gguf::GgufFile::open(model)?;
    let tokenizer = Tokenizer::from_gguf(file.header())?;
    let (vocab, fingerprint) = vocabulary_fingerprint(file.header())?;
    let chunk = texts.len().div_ceil(64).max(1);
    let total = texts.len().div_ceil(chunk);
    let bar = std::sync::Mutex::new((0, progress::count_bar("tokenizing")));
    let parts: Vec<TokenCounts> = texts
        .par_chunks(chunk)
        .map(|part| {
            let counts =
                TokenCounts::from_texts(part, vocab, fingerprint, corpus, |t| tokenizer.encode(t));
            let mut b = bar.lock().expect("bar lock");
            b.0 += 1;
            let done = b.0;
            (b.1)(done, total);
            counts
        })
        .collect::<Result<_, _>>()?;
    let mut counts = TokenCounts::new(vocab, fingerprint, corpus);
    for p in &parts {
        counts.merge(p)?;
    }
    Ok(counts)
}
