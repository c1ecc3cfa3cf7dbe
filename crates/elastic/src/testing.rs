//! Elastic files of tiny random models, for the tests of this crate and
//! of the crates that run elastic models.

use std::path::Path;

use arbor_model::testing::TinyModel;

use crate::{BuildOptions, BuildReport, DownType, Order, Result, Scores, build};

/// Random unit scores for `m` from `seed`.
pub fn random_scores(m: &TinyModel, seed: u64) -> Scores {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    Scores {
        heads: (0..m.layers)
            .map(|_| (0..m.heads).map(|_| next()).collect())
            .collect(),
        neurons: (0..m.layers)
            .map(|_| (0..m.ffn).map(|_| next()).collect())
            .collect(),
    }
}

/// Levels 0.25, 0.5, 0.75 (and 1), layer 0 the anchor, Q8_0 down.
pub fn options(order: Order) -> BuildOptions {
    BuildOptions {
        levels: vec![0.25, 0.5, 0.75],
        anchors: vec![0],
        order,
        down: DownType::Q8_0,
        vocab: None,
    }
}

/// Builds the elastic file of `m` (written at `source`) at `out`, units
/// ranked by [`random_scores`] of its seed.
pub fn build_tiny(m: &TinyModel, source: &Path, out: &Path) -> Result<BuildReport> {
    build(
        source,
        out,
        Some(&random_scores(m, m.seed)),
        &options(Order::Importance),
        &mut |_, _| {},
    )
}
