//! What benchmarks and calibrations read besides prompt sets: calibration
//! texts (a file or a dataset), ShareGPT prompts of a useful length (the
//! first ones calibrate, later ones are held out), where the elastic
//! commands keep what they derive from a model, and an elastic run's
//! latency-objective tables (cached, or measured on that material).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use arbor_elastic::Order;
use arbor_engine::Run;
use arbor_engine::slo::{Calibration, SloTables};

use crate::{progress, prompts};

/// Calibration prompts for quality tables: ShareGPT first turns of this
/// many characters (long enough that dropping tokens matters, short
/// enough to measure 81 pairs on two cores).
const PROMPT_CHARS: std::ops::Range<usize> = 300..1500;
/// ShareGPT prompts of that size reserved for calibration; held-out
/// requests come after them.
const CALIBRATION_POOL: usize = 40;

/// How a benchmark gets `order`'s elastic file of a model (the `arbor`
/// command builds it with `arbor elastic build`'s defaults when missing).
pub type ElasticFile<'a> = &'a dyn Fn(&Path, Order) -> Result<PathBuf>;

/// A text file, or a dataset by name (fetched when missing), read whole.
pub fn calibration_text(name: &str) -> Result<String> {
    let path = if Path::new(name).exists() {
        PathBuf::from(name)
    } else if arbor_fetch::dataset_entry(name).is_some() {
        arbor_fetch::fetch_dataset(name, &mut progress::fetch_bar())?
    } else {
        bail!("no file `{name}` (and it is not a dataset name: mt-bench, sharegpt, brown)");
    };
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// `$ARBOR_HOME/elastic/<file stem of model><suffix>`: where the elastic
/// commands keep what they derive from a model.
pub fn in_home(model: &Path, suffix: &str) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());
    arbor_fetch::arbor_home()
        .join("elastic")
        .join(format!("{stem}{suffix}"))
}

/// Where `arbor elastic importance` writes `model`'s importance file.
pub fn default_importance(model: &Path) -> PathBuf {
    in_home(model, ".importance.safetensors")
}

/// Prompts of a useful length from ShareGPT: `skip` of them passed over,
/// then `n`.
pub fn sharegpt_slice(skip: usize, n: usize) -> Result<Vec<String>> {
    let all = prompts::load_prompts("sharegpt", Some(20_000))?;
    let out: Vec<String> = (all.into_iter())
        .map(|p| p.text)
        .filter(|t| PROMPT_CHARS.contains(&t.chars().count()))
        .skip(skip)
        .take(n)
        .collect();
    if out.len() < n {
        bail!(
            "ShareGPT has only {} prompts of {PROMPT_CHARS:?} characters past the first {skip}",
            out.len()
        );
    }
    Ok(out)
}

/// Held-out requests: ShareGPT prompts past the calibration pool.
pub fn held_out(n: usize) -> Result<Vec<String>> {
    sharegpt_slice(CALIBRATION_POOL, n)
}

/// The model an elastic file was built from (`arbor.elastic.source`),
/// beside it or among the fetched models, where it exists.
pub fn original_of(elastic: &Path) -> Option<PathBuf> {
    let file = arbor_gguf::GgufFile::open(elastic).ok()?;
    let name = file
        .header()
        .get_str("arbor.elastic.source")
        .ok()?
        .to_string();
    let beside = elastic.with_file_name(&name);
    [beside, arbor_fetch::arbor_home().join("models").join(&name)]
        .into_iter()
        .find(|p| !name.is_empty() && p.is_file())
}

/// The run's tables: cached, or measured now on `prompts` calibration
/// prompts (and Brown for the scorer).
pub fn tables(
    run: &mut Run,
    prompts: usize,
    answer_tokens: usize,
    refresh: bool,
) -> Result<SloTables> {
    let texts = sharegpt_slice(0, prompts.min(CALIBRATION_POOL))?;
    let text = calibration_text("brown")?;
    let original = original_of(run.engine().path());
    match &original {
        Some(p) => eprintln!("objectives are fractions of {}'s latency", p.display()),
        None => eprintln!(
            "the original of {} was not found: objectives are fractions of its full level's latency",
            run.engine().path().display()
        ),
    }
    let calibration = Calibration {
        prompts: &texts,
        text: &text,
        answer_tokens,
        reference: original.as_deref(),
    };
    Ok(run.slo_tables(&calibration, refresh, &mut progress::open_bar())?)
}

/// The profile and the quality table as markdown.
pub fn profile_table(t: &SloTables) -> String {
    let p = &t.profile;
    let lengths: Vec<usize> = p.levels[0].prefill.iter().map(|x| x.0).collect();
    let mut s = format!(
        "device profile of {} [{}, {} threads, {}]; scorer {:.2} µs/token; shares of {}\n| level |",
        p.model,
        p.kernels,
        p.threads,
        p.measured,
        p.scorer_per_token * 1e6,
        match p.reference {
            Some(_) => "the original model (last row)",
            None => "the full level",
        }
    );
    for n in &lengths {
        s.push_str(&format!(" prefill {n} (ms, share) |"));
    }
    s.push_str(" tpot ms (share) |\n|---|");
    s.push_str(&"---|".repeat(lengths.len() + 1));
    s.push('\n');
    let rows = (p.levels.iter().map(|l| (format!("{:.1}", l.level), l)))
        .chain(p.reference.iter().map(|l| ("original".to_string(), l)));
    for (name, l) in rows {
        s.push_str(&format!("| {name} |"));
        for &(n, secs) in &l.prefill {
            s.push_str(&format!(
                " {:.0} ({:.2}) |",
                secs * 1e3,
                secs / p.full(n).ttft
            ));
        }
        s.push_str(&format!(
            " {:.1} ({:.2}) |\n",
            l.tpot * 1e3,
            l.tpot / p.full(1).tpot
        ));
    }
    let q = &t.quality;
    s.push_str(&format!(
        "\nquality (greedy agreement with the full model, {} prompts × ≤ {} tokens, {} scorer): rows model level, columns prompt level\n| model \\ prompt |",
        q.prompts, q.answer_tokens, q.scorer
    ));
    for pl in &q.prompt_levels {
        s.push_str(&format!(" {pl:.1} |"));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(q.prompt_levels.len()));
    s.push('\n');
    for (m, row) in q.model_levels.iter().zip(&q.quality) {
        s.push_str(&format!("| {m:.1} |"));
        for v in row {
            s.push_str(&format!(" {v:.2} |"));
        }
        s.push('\n');
    }
    s
}
