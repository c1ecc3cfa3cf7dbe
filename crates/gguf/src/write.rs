//! A small GGUF version 3 writer, mainly for tests that need tiny models.
//!
//! ```
//! use arbor_gguf::{GgmlType, GgufWriter, Value, parse_header};
//!
//! let mut w = GgufWriter::new();
//! w.add_meta("general.architecture", Value::String("llama".into()))
//!     .add_meta("llama.block_count", Value::U32(1))
//!     .add_tensor_f32("output_norm.weight", &[4], &[1.0, 1.0, 1.0, 1.0]);
//! let bytes = w.to_bytes();
//! let header = parse_header(&bytes).unwrap();
//! assert_eq!(header.architecture().unwrap(), "llama");
//! assert_eq!(header.tensor("output_norm.weight").unwrap().ty, GgmlType::F32);
//! ```

use std::path::Path;

use half::{bf16, f16};

use crate::{DEFAULT_ALIGNMENT, GgmlType, GgufError, MAGIC, MAX_ALIGNMENT, Result, Value};

/// Nesting limit of the reader; the writer refuses deeper arrays so that
/// everything it writes can be read back.
const MAX_DEPTH: usize = 4;

/// Builds a GGUF file in memory. Keys keep the order they were first added
/// in (adding a key again replaces its value); tensors are laid out in the
/// order they were added, each aligned.
///
/// The `add_*` methods panic on misuse (data that does not match the
/// dimensions, a duplicate tensor name, an array mixing value types): they
/// are programming errors in the code that builds the file, and catching
/// them there beats writing a file the reader rejects.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    /// The bytes, or `None` for a tensor declared with
    /// [`GgufWriter::add_tensor_later`] (its size is `ty`'s for `dims`).
    data: Option<Vec<u8>>,
}

impl PendingTensor {
    fn len(&self) -> usize {
        let n: u64 = self.dims.iter().product();
        self.ty.bytes_for(n).unwrap_or(0) as usize
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a metadata key. Setting `general.alignment`
    /// changes the alignment the tensors are written with.
    ///
    /// # Panics
    /// When an array mixes value types or nests deeper than the reader
    /// accepts, or `general.alignment` is not an integer power of two up to
    /// [`MAX_ALIGNMENT`] (the reader refuses any other, and a huge one
    /// would pad the file to match).
    pub fn add_meta(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        check_value(&key, &value, 0);
        if key == "general.alignment" {
            assert!(
                value.as_u64().is_some_and(valid_alignment),
                "general.alignment must be a power of two up to {MAX_ALIGNMENT}, got {value:?}"
            );
        }
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Sets `general.alignment` (a power of two up to [`MAX_ALIGNMENT`];
    /// panics otherwise).
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        self.add_meta("general.alignment", Value::U32(alignment))
    }

    /// Adds a tensor from its raw bytes. `dims` are in ggml order (innermost
    /// first: a `[rows, cols]` matrix is `&[cols, rows]`).
    ///
    /// # Panics
    /// When the name is taken, `dims` is empty or has a zero, `dims[0]` is
    /// not a whole number of `ty` blocks, or `bytes` is not the size the
    /// dimensions need.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.add(name.into(), dims, ty, Some(bytes.into()))
    }

    /// Declares a tensor whose bytes [`GgufWriter::write_with`] asks for
    /// when it writes it, so that a large file is written one tensor at a
    /// time. Panics as [`GgufWriter::add_tensor`] does.
    pub fn add_tensor_later(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> &mut Self {
        self.add(name.into(), dims, ty, None)
    }

    fn add(
        &mut self,
        name: String,
        dims: &[u64],
        ty: GgmlType,
        data: Option<Vec<u8>>,
    ) -> &mut Self {
        assert!(
            !self.tensors.iter().any(|t| t.name == name),
            "tensor `{name}` added twice"
        );
        assert!(
            !dims.is_empty() && dims.len() <= 4 && !dims.contains(&0),
            "tensor `{name}`: bad dimensions {dims:?}"
        );
        assert!(
            dims[0].is_multiple_of(ty.block_len() as u64),
            "tensor `{name}`: row length {} is not a multiple of the {ty} block length {}",
            dims[0],
            ty.block_len()
        );
        let n: u64 = dims.iter().product();
        let need = ty.bytes_for(n);
        assert!(
            need.is_some(),
            "tensor `{name}`: {n} {ty} elements overflow"
        );
        if let Some(data) = &data {
            assert_eq!(
                need,
                Some(data.len() as u64),
                "tensor `{name}`: {n} {ty} elements need {need:?} bytes, got {}",
                data.len()
            );
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        self
    }

    /// Adds an `F32` tensor.
    pub fn add_tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
    ) -> &mut Self {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, bytes)
    }

    /// Adds an `F16` tensor, rounding `data` to half precision.
    pub fn add_tensor_f16(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
    ) -> &mut Self {
        let bytes: Vec<u8> = data
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        self.add_tensor(name, dims, GgmlType::F16, bytes)
    }

    /// Adds a `BF16` tensor, rounding `data` to bfloat16.
    pub fn add_tensor_bf16(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        data: &[f32],
    ) -> &mut Self {
        let bytes: Vec<u8> = data
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        self.add_tensor(name, dims, GgmlType::BF16, bytes)
    }

    /// The alignment tensors are written with: `general.alignment` when it
    /// is set (`add_meta` checked it), else the GGUF default of 32.
    fn data_alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// The whole file (every tensor's bytes given).
    ///
    /// # Panics
    /// When a tensor was declared with [`GgufWriter::add_tensor_later`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut missing =
            |_: &str| -> Result<Vec<u8>> { panic!("to_bytes needs every tensor's bytes") };
        let in_memory = |source| GgufError::Io {
            path: Default::default(),
            source,
        };
        (self.write_to(&mut out, &mut missing, &in_memory)).expect("writing to memory cannot fail");
        out
    }

    /// Everything before the tensors' bytes, padded to the alignment.
    fn header_bytes(&self) -> Vec<u8> {
        let align = self.data_alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&type_code(value).to_le_bytes());
            put_value(&mut out, value);
        }
        // Tensor offsets are relative to the data section, each rounded up
        // to the alignment.
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                put_u64(&mut out, d);
            }
            out.extend_from_slice(&t.ty.to_u32().to_le_bytes());
            put_u64(&mut out, offset as u64);
            offset = (offset + t.len()).next_multiple_of(align);
        }
        let data_start = out.len().next_multiple_of(align);
        out.resize(data_start, 0);
        out
    }

    /// Writes the file to `path` (every tensor's bytes given).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        self.write_with(path, &mut |name: &str| -> Result<Vec<u8>> {
            Err(GgufError::Invalid(format!("tensor `{name}` has no bytes")))
        })
    }

    /// Writes the file to `path` a tensor at a time, asking `fill` for the
    /// bytes of each tensor declared with [`GgufWriter::add_tensor_later`]
    /// (by name, in order) as it comes to it: only one such tensor is held
    /// at once. Bytes of the wrong length are an error. A write that fails
    /// (`fill` too) removes what it wrote: no partial file stays behind.
    pub fn write_with<E: From<GgufError>>(
        &self,
        path: impl AsRef<Path>,
        fill: &mut dyn FnMut(&str) -> std::result::Result<Vec<u8>, E>,
    ) -> std::result::Result<(), E> {
        let path = path.as_ref();
        let written = self.write_into(path, fill);
        if written.is_err() {
            let _ = std::fs::remove_file(path);
        }
        written
    }

    fn write_into<E: From<GgufError>>(
        &self,
        path: &Path,
        fill: &mut dyn FnMut(&str) -> std::result::Result<Vec<u8>, E>,
    ) -> std::result::Result<(), E> {
        use std::io::Write;
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        self.write_to(&mut out, fill, &io)?;
        out.flush().map_err(io)?;
        Ok(())
    }

    /// The header, then every tensor's bytes (given, or asked of `fill`
    /// and checked against the declared size), each padded to the
    /// alignment.
    fn write_to<E: From<GgufError>>(
        &self,
        out: &mut impl std::io::Write,
        fill: &mut dyn FnMut(&str) -> std::result::Result<Vec<u8>, E>,
        io: &dyn Fn(std::io::Error) -> GgufError,
    ) -> std::result::Result<(), E> {
        let align = self.data_alignment() as usize;
        out.write_all(&self.header_bytes()).map_err(io)?;
        let zeros = vec![0u8; align];
        for t in &self.tensors {
            let later;
            let data = match &t.data {
                Some(d) => d,
                None => {
                    later = fill(&t.name)?;
                    if later.len() != t.len() {
                        return Err(GgufError::Invalid(format!(
                            "tensor `{}`: {} bytes given, {} declared",
                            t.name,
                            later.len(),
                            t.len()
                        ))
                        .into());
                    }
                    &later
                }
            };
            out.write_all(data).map_err(io)?;
            let pad = data.len().next_multiple_of(align) - data.len();
            out.write_all(&zeros[..pad]).map_err(io)?;
        }
        Ok(())
    }
}

/// An alignment the reader accepts.
fn valid_alignment(a: u64) -> bool {
    a.is_power_of_two() && a <= MAX_ALIGNMENT
}

/// Panics when `value` cannot be written as GGUF or read back by arbor.
fn check_value(key: &str, value: &Value, depth: usize) {
    if let Value::Array(items) = value {
        assert!(
            depth < MAX_DEPTH,
            "metadata `{key}`: arrays nested more than {MAX_DEPTH} deep"
        );
        if let Some(first) = items.first() {
            let code = type_code(first);
            assert!(
                items.iter().all(|v| type_code(v) == code),
                "metadata `{key}`: an array's items must all have one type"
            );
        }
        for item in items {
            check_value(key, item, depth + 1);
        }
    }
}

/// The on-disk number of a value's type.
fn type_code(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A value without its type code (arrays carry their items' code).
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // An empty array still needs an item type; u8 is as good as any.
            let code = items.first().map_or(0, type_code);
            out.extend_from_slice(&code.to_le_bytes());
            put_u64(out, items.len() as u64);
            for item in items {
                put_value(out, item);
            }
        }
    }
}
