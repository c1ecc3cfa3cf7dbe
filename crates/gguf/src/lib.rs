//! GGUF reading: header, metadata, tensor index and the byte layout of the
//! quantized block formats.
//!
//! The parser works on a byte slice (so it can be fuzzed and tested on
//! hand-made files); [`GgufFile`] memory-maps a file and hands out each
//! tensor's bytes without copying. Nothing here knows about models.
//!
//! Every count, length and offset read from the file is checked against the
//! bytes that are actually there before anything is allocated, so corrupt,
//! truncated or hostile files give a [`GgufError`], never a panic or a huge
//! allocation.

mod parse;
pub mod quant;
mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use parse::parse_header;
pub use quant::{
    dequantize, dequantize_into, dequantize_rows, quantize_q5_0, quantize_q8_0, repack_q5_0_to_q8_0,
};
pub use write::GgufWriter;

/// GGUF files start with these four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when the file does not say otherwise.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The largest `general.alignment` arbor reads or writes (1 MiB).
pub const MAX_ALIGNMENT: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file (magic bytes {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (arbor reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}"
    )]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("invalid GGUF: {0}")]
    Invalid(String),
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error("tensor `{name}` has unsupported type {ty}")]
    UnsupportedTensorType { name: String, ty: String },
    #[error("metadata key `{0}` is missing")]
    MissingKey(String),
    #[error("metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("no tensor named `{0}`")]
    MissingTensor(String),
    #[error("{n} elements is not a whole number of {ty} blocks ({} elements each)", .ty.block_len())]
    PartialBlock { ty: GgmlType, n: usize },
    #[error("{n} elements of {ty} take {expected} bytes, got {len}")]
    DataLength {
        ty: GgmlType,
        n: usize,
        expected: u64,
        len: usize,
    },
    #[error("row {row} is out of range for a matrix of {rows} rows")]
    RowOutOfRange { row: usize, rows: usize },
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// Tensor element types of ggml, with their on-disk numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    BF16,
}

impl GgmlType {
    /// Every type arbor reads.
    pub const ALL: [GgmlType; 15] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
    ];

    /// The type with this number in a GGUF tensor info, if arbor knows it.
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2_K,
            11 => Self::Q3_K,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            15 => Self::Q8_K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q2_K => 10,
            Self::Q3_K => 11,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::Q8_K => 15,
            Self::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 2 + 16,
            Self::Q4_1 => 2 + 2 + 16,
            Self::Q5_0 => 2 + 4 + 16,
            Self::Q5_1 => 2 + 2 + 4 + 16,
            Self::Q8_0 => 2 + 32,
            // Two f16 (scale and block sum), as ggml's block_q8_1 has them
            // (older ggml and the gguf Python package's size table have two
            // f32). ggml uses Q8_1 for activations; files rarely hold it.
            Self::Q8_1 => 2 + 2 + 32,
            Self::Q2_K => 256 / 16 + 256 / 4 + 2 + 2,
            Self::Q3_K => 256 / 8 + 256 / 4 + 12 + 2,
            Self::Q4_K => 2 + 2 + 12 + 256 / 2,
            Self::Q5_K => 2 + 2 + 12 + 256 / 8 + 256 / 2,
            Self::Q6_K => 256 / 2 + 256 / 4 + 256 / 16 + 2,
            Self::Q8_K => 4 + 256 + 2 * 256 / 16,
        }
    }

    /// Bytes taken by `n` elements, or `None` when `n` is not a whole number
    /// of blocks (or the size overflows).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::BF16 => "BF16",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value. Arrays hold values of one type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Any integer type that fits in a `u64` without loss.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as an `i64`, when it fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Either float type, or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor index.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one,
    /// so a `[rows, cols]` matrix is stored as `dims = [cols, rows]`.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the tensor data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Everything before the tensor data: version, metadata, tensor index.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
}

impl Header {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.into()))
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.into(),
            expected,
            found: v.type_name(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "string", v))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong(key, "unsigned integer", v))
    }

    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self.get_u64(key)?;
        usize::try_from(v).map_err(|_| GgufError::Invalid(format!("`{key}` = {v} is too large")))
    }

    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| Self::wrong(key, "number", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "array", v))
    }

    /// An array of strings, e.g. `tokenizer.ggml.tokens`.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| Self::wrong(key, "array of strings", v))
            })
            .collect()
    }

    /// An array of integers, e.g. `tokenizer.ggml.token_type`.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_i64()
                    .ok_or_else(|| Self::wrong(key, "array of integers", v))
            })
            .collect()
    }

    /// An array of numbers, e.g. `tokenizer.ggml.scores`.
    pub fn get_f64_array(&self, key: &str) -> Result<Vec<f64>> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| Self::wrong(key, "array of numbers", v))
            })
            .collect()
    }

    /// The model architecture (`general.architecture`).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))
    }
}

/// A memory-mapped GGUF file.
pub struct GgufFile {
    path: PathBuf,
    /// The file the map is of, for reads that bypass it.
    file: std::fs::File,
    map: memmap2::Mmap,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only; arbor never writes model files while
        // they are open. A file truncated by someone else under our feet can
        // still fault, which no reader of a mapped file can rule out.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let header = parse_header(&map)?;
        Ok(Self {
            path,
            file,
            map,
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The raw (possibly quantized) bytes of a tensor.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        // parse_header checked that every tensor lies inside the file.
        let start = (self.header.data_offset + info.offset) as usize;
        &self.map[start..start + info.size as usize]
    }

    /// Tells the OS that a tensor's pages will not be read again soon, so
    /// a loader that has copied the tensor does not keep the file's pages
    /// resident as well (the peak memory of loading is then about one copy
    /// of the weights, not two). Advisory: errors are ignored.
    pub fn release(&self, info: &TensorInfo) {
        let page = page_size();
        let start = (self.header.data_offset + info.offset) as usize;
        // Only whole pages inside the tensor, so neighbours stay cached.
        let first = start.next_multiple_of(page);
        let end = (start + info.size as usize) / page * page;
        if end > first {
            // SAFETY: the map is read-only and file-backed; dropping its pages
            // only means they are read from the file again if touched.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    end - first,
                )
            };
        }
    }

    /// Reads a tensor's bytes into `out` (exactly its size) with the file's
    /// read calls, not through the map: a loader that keeps the bytes as
    /// they are read then holds them once, where copying them from the map
    /// holds the mapped pages beside the copy until they are released.
    pub fn read_tensor(&self, info: &TensorInfo, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != info.size {
            return Err(GgufError::Invalid(format!(
                "a buffer of {} bytes for tensor `{}` of {}",
                out.len(),
                info.name,
                info.size
            )));
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            let start = self.header.data_offset + info.offset;
            self.file
                .read_exact_at(out, start)
                .map_err(|source| GgufError::Io {
                    path: self.path.clone(),
                    source,
                })
        }
        #[cfg(not(unix))]
        {
            out.copy_from_slice(self.tensor_bytes(info));
            Ok(())
        }
    }

    /// A tensor's index entry and its bytes, by name.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8])> {
        let info = self.header.tensor(name)?;
        Ok((info, self.tensor_bytes(info)))
    }

    /// A tensor converted to `f32`, in ggml element order.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (info, bytes) = self.tensor(name)?;
        dequantize(info.ty, bytes, info.n_elements() as usize)
    }
}

/// The OS page size: 4 KiB on x86-64, 4, 16 or 64 KiB on ARM64 kernels
/// (`madvise` ranges must start on one).
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if let Ok(p) = usize::try_from(p)
                && p.is_power_of_two()
            {
                return p;
            }
        }
        4096
    })
}
