//! Prompt-token files: the trained embeddings of one model's prompt tokens,
//! the accuracy table measured for them and free-form provenance, in a
//! safetensors file. Training checkpoints use the same format with the
//! optimizer's state as extra vectors.
//!
//! Tensors: `prompts` (`[count, hidden]`, or `[count, epts, hidden]` with
//! ensemble prompt tokens; f32), `accuracy`
//! (`[distances, ranks]`, f64, optional) and any extra 1-D f32 vectors;
//! the provenance is the file's string metadata. Reading and writing go
//! through [`TensorFile`].

use std::collections::BTreeMap;
use std::path::Path;

use crate::tensors::TensorFile;
use crate::{Accuracy, PpdError, Result};

const PROMPTS: &str = "prompts";
const ACCURACY: &str = "accuracy";

/// One model's prompt tokens as stored on disk.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptFile {
    /// The model's width: each prompt token is a vector of this length.
    pub hidden: usize,
    /// Vectors per prompt token (ensemble prompt tokens, EPTs; 0 is read
    /// as 1).
    pub epts: usize,
    /// `count × epts × hidden`, prompt token by prompt token.
    pub vectors: Vec<f32>,
    pub accuracy: Option<Accuracy>,
    /// Other named vectors (a checkpoint's optimizer moments).
    pub extra: BTreeMap<String, Vec<f32>>,
    /// Provenance: the model, the command, steps, seconds, loss.
    pub meta: BTreeMap<String, String>,
}

fn bad(m: impl Into<String>) -> PpdError {
    PpdError::File(m.into())
}

impl PromptFile {
    /// Prompt tokens in the file.
    pub fn count(&self) -> usize {
        self.vectors.len() / (self.hidden * self.epts.max(1)).max(1)
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.to_tensors()?.to_bytes().map_err(|e| bad(e.0))
    }

    fn to_tensors(&self) -> Result<TensorFile> {
        let width = self.hidden * self.epts.max(1);
        if width == 0 || self.vectors.is_empty() || !self.vectors.len().is_multiple_of(width) {
            return Err(bad(format!(
                "{} values are not whole prompt tokens of {} EPTs of width {}",
                self.vectors.len(),
                self.epts.max(1),
                self.hidden
            )));
        }
        let shape = match self.epts {
            0 | 1 => vec![self.count(), self.hidden],
            e => vec![self.count(), e, self.hidden],
        };
        if self.extra.contains_key(PROMPTS) || self.extra.contains_key(ACCURACY) {
            return Err(bad("an extra vector takes a reserved name"));
        }
        let mut file = TensorFile::with_meta(self.meta.clone());
        file.put_f32(PROMPTS, shape, self.vectors.clone());
        if let Some(a) = &self.accuracy {
            let values = (1..=a.distances())
                .flat_map(|d| (1..=a.ranks()).map(move |k| a.top(d, k)))
                .collect();
            file.put_f64(ACCURACY, vec![a.distances(), a.ranks()], values);
        }
        for (name, v) in &self.extra {
            file.put_f32(name.clone(), vec![v.len()], v.clone());
        }
        Ok(file)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::from_tensors(TensorFile::from_bytes(bytes).map_err(|e| bad(e.0))?)
    }

    fn from_tensors(mut file: TensorFile) -> Result<Self> {
        let (shape, vectors) = file.take_f32(PROMPTS).map_err(|e| bad(e.0))?;
        let (count, epts, hidden) = match shape[..] {
            [count, hidden] => (count, 1, hidden),
            [count, epts, hidden] => (count, epts, hidden),
            _ => {
                return Err(bad(format!(
                    "prompts has shape {shape:?}, not [count, hidden] or [count, epts, hidden]"
                )));
            }
        };
        if count == 0 || epts == 0 || hidden == 0 {
            return Err(bad("no prompt tokens"));
        }
        if vectors.iter().any(|x| !x.is_finite()) {
            return Err(bad("a prompt-token value is not finite"));
        }
        let accuracy = match file.contains(ACCURACY) {
            true => {
                let (shape, values) = file.take_f64(ACCURACY).map_err(|e| bad(e.0))?;
                let [_, ranks] = shape[..] else {
                    return Err(bad(format!("accuracy has shape {shape:?}")));
                };
                let rows = values.chunks(ranks.max(1)).map(<[f64]>::to_vec).collect();
                Some(Accuracy::new(rows)?)
            }
            false => None,
        };
        let mut extra = BTreeMap::new();
        for name in file.tensors.keys().cloned().collect::<Vec<_>>() {
            let (_, v) = file.take_f32(&name).map_err(|e| bad(e.0))?;
            extra.insert(name, v);
        }
        Ok(Self {
            hidden,
            epts,
            vectors,
            accuracy,
            extra,
            meta: file.meta,
        })
    }

    /// Writes the file whole (through a temporary file beside it, so an
    /// interrupted save leaves the old file).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.to_tensors()?.save(path).map_err(|e| bad(e.0))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let file = TensorFile::load(path).map_err(|e| bad(e.0))?;
        Self::from_tensors(file).map_err(|e| bad(format!("{}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PromptFile {
        PromptFile {
            hidden: 3,
            epts: 1,
            vectors: vec![0.5, -1.0, 2.0, 3.0, 4.0, -5.5],
            accuracy: Some(Accuracy::new(vec![vec![0.4, 0.7], vec![0.2, 0.5]]).unwrap()),
            extra: [("adam.m".to_string(), vec![1.0, 2.0])].into(),
            meta: [("model".to_string(), "tiny".to_string())].into(),
        }
    }

    #[test]
    fn a_file_reads_back_as_written() {
        let f = sample();
        let back = PromptFile::from_bytes(&f.to_bytes().unwrap()).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.count(), 2);
        // Two prompt tokens of three EPTs.
        let ensemble = PromptFile {
            epts: 3,
            vectors: (0..18).map(|x| x as f32).collect(),
            ..sample()
        };
        let back = PromptFile::from_bytes(&ensemble.to_bytes().unwrap()).unwrap();
        assert_eq!(back, ensemble);
        assert_eq!(back.count(), 2);
    }

    #[test]
    fn bad_files_are_typed_errors() {
        assert!(PromptFile::from_bytes(b"not a safetensors file").is_err());
        let mut bytes = sample().to_bytes().unwrap();
        bytes.truncate(bytes.len() - 4);
        assert!(PromptFile::from_bytes(&bytes).is_err());
        let ragged = PromptFile {
            vectors: vec![1.0; 4],
            ..sample()
        };
        assert!(ragged.to_bytes().is_err());
        let reserved = PromptFile {
            extra: [("prompts".to_string(), vec![0.0])].into(),
            ..sample()
        };
        assert!(reserved.to_bytes().is_err());
    }
}
