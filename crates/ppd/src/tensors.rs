//! The one safetensors reader and writer of arbor's own files: named f32
//! or f64 tensors with their shapes, plus string metadata. Prompt-token
//! files and PPD checkpoints ([`crate::PromptFile`]), LoRA adapter files
//! (`arbor_elastic::LoraFile`) and importance files
//! (`arbor_train::ImportanceFile`) are each a [`TensorFile`] with their own
//! names and checks on top.
//!
//! It lives here because this crate depends on no other arbor crate, so
//! that `elastic` and `train` reach it by arrows pointing down; it holds
//! plain host vectors, no tensor type. Values are little-endian, as
//! safetensors stores them; the order of tensors in a written file is the
//! one safetensors itself chooses (by alignment, then by name), whatever
//! the order they were put in. (The metadata's order in the header is a
//! hash map's, as it always was.)

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// One tensor's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Values {
    fn dtype(&self) -> Dtype {
        match self {
            Values::F32(_) => Dtype::F32,
            Values::F64(_) => Dtype::F64,
        }
    }

    fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        match self {
            Values::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Values::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// What went wrong reading or writing a [`TensorFile`]; each file type
/// wraps it in its own error with its own prefix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct TensorFileError(pub String);

fn bad(m: impl std::fmt::Display) -> TensorFileError {
    TensorFileError(m.to_string())
}

/// Named tensors (shape and values) and string metadata: a safetensors
/// file's whole content as arbor uses it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TensorFile {
    pub tensors: BTreeMap<String, (Vec<usize>, Values)>,
    pub meta: BTreeMap<String, String>,
}

impl TensorFile {
    /// A file with this metadata and no tensors yet.
    pub fn with_meta(meta: BTreeMap<String, String>) -> Self {
        Self {
            tensors: BTreeMap::new(),
            meta,
        }
    }

    pub fn put_f32(&mut self, name: impl Into<String>, shape: Vec<usize>, values: Vec<f32>) {
        self.tensors
            .insert(name.into(), (shape, Values::F32(values)));
    }

    pub fn put_f64(&mut self, name: impl Into<String>, shape: Vec<usize>, values: Vec<f64>) {
        self.tensors
            .insert(name.into(), (shape, Values::F64(values)));
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Removes the f32 tensor `name`: its shape and values; an error when
    /// there is none or it holds f64.
    pub fn take_f32(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), TensorFileError> {
        match self.tensors.remove(name) {
            Some((shape, Values::F32(v))) => Ok((shape, v)),
            Some((_, Values::F64(_))) => Err(bad(format!("{name} is F64, not F32"))),
            None => Err(bad(format!("no tensor `{name}`"))),
        }
    }

    /// [`TensorFile::take_f32`] for an f64 tensor.
    pub fn take_f64(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f64>), TensorFileError> {
        match self.tensors.remove(name) {
            Some((shape, Values::F64(v))) => Ok((shape, v)),
            Some((_, Values::F32(_))) => Err(bad(format!("{name} is F32, not F64"))),
            None => Err(bad(format!("no tensor `{name}`"))),
        }
    }

    /// The safetensors bytes; an error when a shape does not hold its
    /// values.
    pub fn to_bytes(&self) -> Result<Vec<u8>, TensorFileError> {
        let owned: Vec<(&str, Dtype, &[usize], Vec<u8>)> = (self.tensors.iter())
            .map(|(name, (shape, v))| {
                if shape.iter().product::<usize>() != v.len() {
                    return Err(bad(format!(
                        "{name}: {} values for shape {shape:?}",
                        v.len()
                    )));
                }
                Ok((name.as_str(), v.dtype(), &shape[..], v.to_bytes()))
            })
            .collect::<Result<_, _>>()?;
        let views = (owned.iter())
            .map(|(name, dtype, shape, bytes)| {
                TensorView::new(*dtype, shape.to_vec(), bytes).map(|v| (*name, v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        let meta: HashMap<String, String> = self.meta.clone().into_iter().collect();
        safetensors::serialize(views, Some(meta)).map_err(bad)
    }

    /// Reads safetensors bytes whose tensors are all f32 or f64.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TensorFileError> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(bad)?;
        let st = SafeTensors::deserialize(bytes).map_err(bad)?;
        let mut tensors = BTreeMap::new();
        for (name, t) in st.tensors() {
            let data = t.data();
            let values = match t.dtype() {
                Dtype::F32 => Values::F32(
                    (data.chunks_exact(4))
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect(),
                ),
                Dtype::F64 => Values::F64(
                    (data.chunks_exact(8))
                        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                ),
                other => return Err(bad(format!("{name} is {other:?}, not F32 or F64"))),
            };
            tensors.insert(name, (t.shape().to_vec(), values));
        }
        let meta = (header.metadata().clone())
            .unwrap_or_default()
            .into_iter()
            .collect();
        Ok(Self { tensors, meta })
    }

    /// Writes the file whole: through a temporary file beside it, so that
    /// an interrupted save leaves the old file (directories made as
    /// needed).
    pub fn save(&self, path: &Path) -> Result<(), TensorFileError> {
        let bytes = self.to_bytes()?;
        let io = |e: std::io::Error| bad(format!("{}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads the file at `path` (errors name it).
    pub fn load(path: &Path) -> Result<Self, TensorFileError> {
        let bytes = std::fs::read(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes).map_err(|e| bad(format!("{}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TensorFile {
        let mut f = TensorFile::with_meta([("k".to_string(), "v".to_string())].into());
        f.put_f32("b", vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, f32::MIN, 7.0]);
        f.put_f64("a", vec![2], vec![0.25, -1e300]);
        f.put_f32("c", vec![0], vec![]);
        f
    }

    #[test]
    fn a_file_reads_back_as_written_whatever_the_insertion_order() {
        let f = sample();
        let bytes = f.to_bytes().unwrap();
        assert_eq!(TensorFile::from_bytes(&bytes).unwrap(), f);
        // The same content put in another order writes the same tensors.
        let mut g = TensorFile::with_meta(f.meta.clone());
        for (name, (shape, v)) in f.tensors.iter().rev() {
            match v {
                Values::F32(v) => g.put_f32(name.clone(), shape.clone(), v.clone()),
                Values::F64(v) => g.put_f64(name.clone(), shape.clone(), v.clone()),
            }
        }
        assert_eq!(g.to_bytes().unwrap(), bytes);
    }

    #[test]
    fn it_reads_what_safetensors_writes_directly() {
        // The layout the file types wrote before they shared this module.
        let data: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let view = TensorView::new(Dtype::F32, vec![1, 2], &data).unwrap();
        let meta: HashMap<String, String> = [("m".to_string(), "1".to_string())].into();
        let bytes = safetensors::serialize([("x", view)], Some(meta)).unwrap();
        let mut f = TensorFile::from_bytes(&bytes).unwrap();
        assert_eq!(f.meta["m"], "1");
        assert_eq!(f.take_f32("x").unwrap(), (vec![1, 2], vec![1.5, -2.0]));
        assert!(f.tensors.is_empty());
        let mut again = TensorFile::with_meta(f.meta.clone());
        again.put_f32("x", vec![1, 2], vec![1.5, -2.0]);
        assert_eq!(again.to_bytes().unwrap(), bytes);
    }

    #[test]
    fn wrong_types_shapes_and_bytes_are_errors() {
        let mut f = sample();
        assert!(f.take_f64("b").unwrap_err().0.contains("F32, not F64"));
        assert!(f.take_f32("a").unwrap_err().0.contains("F64, not F32"));
        assert!(f.take_f32("zz").unwrap_err().0.contains("no tensor `zz`"));
        let mut ragged = TensorFile::default();
        ragged.put_f32("r", vec![2, 2], vec![1.0; 3]);
        assert!(ragged.to_bytes().is_err());
        let bytes = sample().to_bytes().unwrap();
        assert!(TensorFile::from_bytes(&bytes[..bytes.len() - 4]).is_err());
        assert!(TensorFile::from_bytes(b"not a safetensors file").is_err());
        let half = [0u8; 4];
        let view = TensorView::new(Dtype::F16, vec![2], &half).unwrap();
        let bytes = safetensors::serialize([("h", view)], None).unwrap();
        assert!(
            TensorFile::from_bytes(&bytes)
                .unwrap_err()
                .0
                .contains("F16")
        );
    }

    #[test]
    fn save_replaces_the_file_and_load_names_the_path() {
        let dir = std::env::temp_dir().join(format!("arbor-tensors-{}", std::process::id()));
        let path = dir.join("sub").join("f.safetensors");
        sample().save(&path).unwrap();
        assert_eq!(TensorFile::load(&path).unwrap(), sample());
        assert!(!path.with_extension("tmp").exists());
        let missing = TensorFile::load(&dir.join("none")).unwrap_err();
        assert!(missing.0.contains("none"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
