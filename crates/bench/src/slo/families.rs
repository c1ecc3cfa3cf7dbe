//! The models `bench slo` serves its policies with, and the baselines'
//! tables (measured once, cached beside the profiles).

use std::path::Path;

use anyhow::{Context, Result};
use arbor_engine::slo::{
    self, DeviceProfile, Elastic, Family, QualityTable, Reference, Scorer, SloPrompt, SloTables,
    Variants,
};
use arbor_engine::{LanguageModel, ProfileStore, Run, RunConfig};

use crate::calibration::calibration_text;
use crate::elastic::layer_masks;
use crate::progress;
use crate::slo::args::BenchSloArgs;

/// The models the policies are served with.
pub(super) struct Families<'a> {
    pub(super) elastic: &'a mut Run,
    pub(super) layers: Option<&'a mut Variants>,
    pub(super) file: Option<&'a mut Run>,
    pub(super) original: &'a mut Run,
}

impl Families<'_> {
    /// Family `i`: 0 elastic, 1 layers dropped, 2 file order, 3 the original.
    pub(super) fn get(&mut self, i: usize) -> Result<Box<dyn Family + '_>> {
        Ok(match i {
            0 => Box::new(Elastic(self.elastic.engine_mut().model_mut())),
            1 => Box::new(Reborrow(self.layers.as_deref_mut().context("layers")?)),
            2 => Box::new(Elastic(
                self.file
                    .as_deref_mut()
                    .context("file")?
                    .engine_mut()
                    .model_mut(),
            )),
            _ => Box::new(Reference(self.original.engine_mut().model_mut())),
        })
    }
}

/// A family behind a mutable borrow.
struct Reborrow<'a>(&'a mut Variants);

impl Family for Reborrow<'_> {
    fn levels(&self) -> Vec<f64> {
        self.0.levels()
    }
    fn at(&mut self, level: f64) -> Result<&mut dyn LanguageModel, arbor_engine::PlannerError> {
        self.0.at(level)
    }
}

/// The original model (`base`, loaded from `original`) with the cheapest
/// whole non-anchor layers dropped, as many per level as the elastic levels
/// drop of their units.
pub(super) fn layer_family(original: &Path, base: &Run, elastic_run: &Run) -> Result<Variants> {
    let levels = elastic_run
        .engine()
        .model()
        .levels()
        .context("the elastic model has no levels")?
        .to_vec();
    let masks = layer_masks(original, &levels)?;
    let out = (levels.iter().zip(&masks))
        .map(|(&level, keep)| Ok((level, base.engine().model().without_layers(keep)?)))
        .collect::<Result<_>>()?;
    Ok(Variants(out))
}

/// A baseline family's tables, cached under its name.
pub(super) fn family_tables(
    v: &mut Variants,
    name: &str,
    store: &ProfileStore,
    (calibration, answers): (&[SloPrompt], &[Vec<u32>]),
    scorer: &Scorer,
    args: &BenchSloArgs,
    device: &RunConfig,
) -> Result<SloTables> {
    let kernels = arbor_engine::pick_backend(device.backend.as_deref())?.kernels();
    let threads = rayon::current_num_threads();
    let text = arbor_engine::Tokenizer::from_gguf(
        arbor_gguf::GgufFile::open(&arbor_fetch::resolve_model(&args.model)?)?.header(),
    )?
    .encode(&calibration_text("brown")?)?;
    let profile: DeviceProfile = cached(
        &store
            .dir()
            .join(format!("slo-device-{name}-{kernels}-t{threads}.json")),
        args.refresh,
        || {
            let plan = slo::ProfilePlan {
                lengths: slo::PROFILE_LENGTHS.to_vec(),
                decode: slo::PROFILE_DECODE,
                reps: slo::PROFILE_REPS,
            };
            Ok(slo::measure_profile(
                v,
                None,
                (name, kernels),
                &text,
                &plan,
                scorer,
                &mut progress::count_bar(&format!("{name} profile")),
            )?)
        },
    )?;
    let quality: QualityTable = cached(
        &store.dir().join(format!("slo-quality-{name}.json")),
        args.refresh,
        || {
            Ok(slo::measure_quality(
                v,
                name,
                calibration,
                answers,
                scorer,
                &slo::PROMPT_LEVELS,
                &mut progress::count_bar(&format!("{name} quality")),
            )?)
        },
    )?;
    Ok(SloTables {
        profile,
        quality,
        scorer: scorer.clone(),
    })
}

/// `path`'s JSON, or `make()` written there.
pub(super) fn cached<T: serde::Serialize + serde::de::DeserializeOwned>(
    path: &Path,
    refresh: bool,
    make: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if !refresh
        && let Ok(text) = std::fs::read_to_string(path)
        && let Ok(v) = serde_json::from_str(&text)
    {
        return Ok(v);
    }
    let v = make()?;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    eprintln!("cached {}", path.display());
    Ok(v)
}
