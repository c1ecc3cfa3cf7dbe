//! LoRA adapters of one elastic level on the host, and their file: a
//! safetensors file with `blk.N.PROJ.lora_a` (`[in, rank]`) and
//! `blk.N.PROJ.lora_b` (`[rank, out]`) in f32, the level and rank in its
//! metadata, and — in a training checkpoint — AdamW's moments (`adam.m`,
//! `adam.v`, flat in [`LoraFile::flatten`]'s order) beside them; read and
//! written through [`arbor_ppd::TensorFile`].

use std::collections::BTreeMap;

use arbor_model::{Config, Elastic, HostMatrix, Lora, LoraPair, Proj};
use arbor_ppd::TensorFile;

use crate::{ElasticError, Result};

const LEVEL: &str = "arbor.lora.level";
const RANK: &str = "arbor.lora.rank";

/// One adapter pair's values.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPair {
    pub inputs: usize,
    pub outputs: usize,
    /// `[inputs, rank]`, row-major.
    pub a: Vec<f32>,
    /// `[rank, outputs]`, row-major.
    pub b: Vec<f32>,
}

/// The adapters of one level, with free-form provenance and, in a
/// checkpoint, the optimiser's state.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraFile {
    pub level: f64,
    pub rank: usize,
    /// Per layer, per projection (as [`Proj::ALL`]).
    pub layers: Vec<[Option<HostPair>; 7]>,
    pub meta: BTreeMap<String, String>,
    /// AdamW's first and second moments over [`LoraFile::flatten`].
    pub adam: Option<(Vec<f32>, Vec<f32>)>,
}

fn bad(m: impl std::fmt::Display) -> ElasticError {
    ElasticError::Input(format!("LoRA file: {m}"))
}

impl LoraFile {
    /// Fresh adapters for `level` of an elastic model (or level 1 of a plain
    /// one) on the projections `projs`: `a` uniform in ±1/√inputs from
    /// `seed`, `b` zero, so the branches start adding nothing.
    pub fn new(
        c: &Config,
        elastic: Option<&Elastic>,
        level: f64,
        rank: usize,
        projs: &[Proj],
        seed: u64,
    ) -> Result<Self> {
        if rank == 0 || rank > 256 {
            return Err(bad(format!("rank {rank} is outside 1..=256")));
        }
        let (_, cuts) = arbor_model::lora::level_cuts(c, elastic, level)?;
        let mut state = seed;
        let layers = cuts
            .iter()
            .map(|&cut| {
                Proj::ALL.map(|p| {
                    projs.contains(&p).then(|| {
                        let (inputs, outputs) = p.shape(c, cut);
                        let bound = 1.0 / (inputs as f32).sqrt();
                        let a = (0..inputs * rank)
                            .map(|_| {
                                state = splitmix(state);
                                ((state >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0) * bound
                            })
                            .collect();
                        HostPair {
                            inputs,
                            outputs,
                            a,
                            b: vec![0.0; rank * outputs],
                        }
                    })
                })
            })
            .collect();
        Ok(Self {
            level,
            rank,
            layers,
            meta: BTreeMap::new(),
            adam: None,
        })
    }

    /// Every pair in order: layer by layer, projection by projection.
    pub fn pairs(&self) -> impl Iterator<Item = &HostPair> {
        self.layers.iter().flatten().flatten()
    }

    /// Parameters in all: `a` then `b` of each pair in [`LoraFile::pairs`] order.
    pub fn len(&self) -> usize {
        self.pairs().map(|p| p.a.len() + p.b.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All parameters as one vector (the optimiser's view).
    pub fn flatten(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        for p in self.pairs() {
            out.extend_from_slice(&p.a);
            out.extend_from_slice(&p.b);
        }
        out
    }

    /// Writes back what [`LoraFile::flatten`] gave.
    pub fn unflatten(&mut self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.len() {
            return Err(bad(format!(
                "{} values for {} parameters",
                flat.len(),
                self.len()
            )));
        }
        let mut rest = flat;
        for p in self.layers.iter_mut().flatten().flatten() {
            let (a, r) = rest.split_at(p.a.len());
            let (b, r) = r.split_at(p.b.len());
            p.a.copy_from_slice(a);
            p.b.copy_from_slice(b);
            rest = r;
        }
        Ok(())
    }

    /// The adapters as host matrices, for
    /// [`arbor_model::LanguageModel::attach_lora`] (or mapped to tracked
    /// tensors for training, [`Lora::try_map`]).
    pub fn to_host(&self) -> Lora<HostMatrix> {
        let m = |rows, cols, data: &Vec<f32>| HostMatrix {
            rows,
            cols,
            data: data.clone(),
        };
        let layers = (self.layers.iter())
            .map(|l| {
                l.clone().map(|p| {
                    p.map(|p| LoraPair {
                        a: m(p.inputs, self.rank, &p.a),
                        b: m(self.rank, p.outputs, &p.b),
                    })
                })
            })
            .collect();
        Lora {
            level: self.level,
            layers,
        }
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.to_tensors().to_bytes().map_err(bad)
    }

    fn to_tensors(&self) -> TensorFile {
        let mut file = TensorFile::with_meta(self.meta.clone());
        file.meta.insert(LEVEL.into(), self.level.to_string());
        file.meta.insert(RANK.into(), self.rank.to_string());
        for (i, l) in self.layers.iter().enumerate() {
            for (p, pair) in Proj::ALL.iter().zip(l) {
                if let Some(h) = pair {
                    let n = format!("blk.{i}.{}", p.name());
                    file.put_f32(
                        format!("{n}.lora_a"),
                        vec![h.inputs, self.rank],
                        h.a.clone(),
                    );
                    file.put_f32(
                        format!("{n}.lora_b"),
                        vec![self.rank, h.outputs],
                        h.b.clone(),
                    );
                }
            }
        }
        if let Some((m, v)) = &self.adam {
            file.put_f32("adam.m", vec![m.len()], m.clone());
            file.put_f32("adam.v", vec![v.len()], v.clone());
        }
        file
    }

    /// Reads a file written by [`LoraFile::to_bytes`]; its shapes are
    /// checked against a model when attached.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut file = TensorFile::from_bytes(bytes).map_err(bad)?;
        let mut num = |k: &str| -> Result<f64> {
            let v = file
                .meta
                .remove(k)
                .ok_or_else(|| bad(format!("no `{k}`")))?;
            v.parse().map_err(|_| bad(format!("`{k}` is `{v}`")))
        };
        let (level, rank) = (num(LEVEL)?, num(RANK)? as usize);
        if !(level > 0.0 && level <= 1.0) || rank == 0 {
            return Err(bad(format!("level {level}, rank {rank}")));
        }
        let mut layers: Vec<[Option<HostPair>; 7]> = Vec::new();
        let names: Vec<String> = file.tensors.keys().cloned().collect();
        for name in &names {
            let Some(rest) = name.strip_prefix("blk.") else {
                continue;
            };
            let Some(stem) = rest.strip_suffix(".lora_a") else {
                continue;
            };
            let (i, p) = stem
                .split_once('.')
                .ok_or_else(|| bad(format!("tensor `{name}`")))?;
            let i: usize = i.parse().map_err(|_| bad(format!("tensor `{name}`")))?;
            let p = Proj::parse(p).ok_or_else(|| bad(format!("tensor `{name}`")))?;
            let (sa, a) = file.take_f32(name).map_err(bad)?;
            let (sb, b) = file.take_f32(&format!("blk.{stem}.lora_b")).map_err(bad)?;
            match (&sa[..], &sb[..]) {
                ([inputs, ra], [rb, outputs]) if *ra == rank && *rb == rank => {
                    if layers.len() <= i {
                        layers.resize(i + 1, Default::default());
                    }
                    layers[i][p as usize] = Some(HostPair {
                        inputs: *inputs,
                        outputs: *outputs,
                        a,
                        b,
                    });
                }
                _ => return Err(bad(format!("`{stem}` is {sa:?}·{sb:?} at rank {rank}"))),
            }
        }
        if layers.is_empty() {
            return Err(bad("no adapters"));
        }
        let adam = match file.contains("adam.m") {
            true => Some((
                file.take_f32("adam.m").map_err(bad)?.1,
                file.take_f32("adam.v").map_err(bad)?.1,
            )),
            false => None,
        };
        Ok(Self {
            level,
            rank,
            layers,
            meta: file.meta,
            adam,
        })
    }

    /// Writes the file whole (through a temporary file beside it, so that
    /// an interrupted save leaves the old one).
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        self.to_tensors().save(path).map_err(bad)
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
