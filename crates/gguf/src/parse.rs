//! The GGUF header parser, over a byte slice.

use std::collections::BTreeMap;

use crate::{
    DEFAULT_ALIGNMENT, GgmlType, GgufError, Header, MAGIC, MAX_ALIGNMENT, Result, TensorInfo, Value,
};

/// Arrays nest at most this deep; real files use one level.
const MAX_DEPTH: u32 = 4;
/// Tensors have at most this many dimensions (ggml's limit).
const MAX_DIMS: u32 = 4;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        Ok(self
            .take(N as u64, what)?
            .try_into()
            .expect("length checked"))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count: checked so that `count * min_item_bytes` still fits in what
    /// is left of the file, which bounds every allocation by the file size.
    fn count(&mut self, min_item_bytes: u64, what: &'static str) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.pos) as u64;
        match n.checked_mul(min_item_bytes.max(1)) {
            Some(need) if need <= left => Ok(n as usize),
            _ => Err(GgufError::Truncated {
                what,
                offset: self.pos as u64,
                needed: n.saturating_mul(min_item_bytes.max(1)),
                len: self.buf.len() as u64,
            }),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.count(1, what)?;
        let bytes = self.take(len as u64, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::Invalid(format!("{what} is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        const W: &str = "metadata value";
        Ok(match ty {
            0 => Value::U8(self.u8(W)?),
            1 => Value::I8(self.u8(W)? as i8),
            2 => Value::U16(self.u16(W)?),
            3 => Value::I16(self.u16(W)? as i16),
            4 => Value::U32(self.u32(W)?),
            5 => Value::I32(self.u32(W)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(W)?)),
            7 => match self.u8(W)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::Invalid(format!("boolean with byte {b}"))),
            },
            8 => Value::String(self.string("metadata string")?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(GgufError::Invalid("arrays nested too deeply".into()));
                }
                let item_ty = self.u32("array item type")?;
                let min = min_value_bytes(item_ty)?;
                let n = self.count(min, "metadata array")?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(item_ty, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(W)?),
            11 => Value::I64(self.u64(W)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(W)?)),
            t => return Err(GgufError::UnknownValueType(t)),
        })
    }
}

/// The fewest bytes one value of this type takes on disk.
fn min_value_bytes(ty: u32) -> Result<u64> {
    Ok(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        t => return Err(GgufError::UnknownValueType(t)),
    })
}

/// Parses everything up to the tensor data and checks the tensor index
/// against the length of `buf`: every tensor must be a whole number of
/// blocks, aligned, inside the file, and not overlap another.
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut r = Reader { buf, pos: 0 };
    let magic = r.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // Minimum on-disk size of a tensor info: name length, dim count, one
    // dimension, type, offset.
    let n_tensors = r.count(8 + 4 + 8 + 4 + 8, "tensor count")?;
    // Minimum size of a key/value pair: key length, value type, one byte.
    let n_kv = r.count(8 + 4 + 1, "metadata count")?;

    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = r.string("metadata key")?;
        let ty = r.u32("metadata value type")?;
        let value = r.value(ty, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufError::Invalid(format!(
                "duplicate metadata key `{key}`"
            )));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
            _ => {
                return Err(GgufError::Invalid(format!(
                    "general.alignment must be a power of two up to 1 MiB, got {v:?}"
                )));
            }
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = r.string("tensor name")?;
        let n_dims = r.u32("tensor dimension count")?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::Invalid(format!(
                "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64("tensor dimension")?);
        }
        let raw_ty = r.u32("tensor type")?;
        let ty = GgmlType::from_u32(raw_ty).ok_or_else(|| GgufError::UnsupportedTensorType {
            name: name.clone(),
            ty: format!("#{raw_ty}"),
        })?;
        let offset = r.u64("tensor offset")?;
        let n = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                GgufError::Invalid(format!("tensor `{name}` has bad dimensions {dims:?}"))
            })?;
        if !dims[0].is_multiple_of(ty.block_len() as u64) {
            return Err(GgufError::Invalid(format!(
                "tensor `{name}`: row length {} is not a multiple of the {ty} block length {}",
                dims[0],
                ty.block_len()
            )));
        }
        let size = ty
            .bytes_for(n)
            .ok_or_else(|| GgufError::Invalid(format!("tensor `{name}` is too large")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Invalid(format!(
                "tensor `{name}` offset {offset} is not aligned to {alignment}"
            )));
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        });
    }

    let data_offset = (r.pos as u64).next_multiple_of(alignment);
    let data_len = (buf.len() as u64).saturating_sub(data_offset);

    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    for t in &tensors {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::Invalid(format!(
                "duplicate tensor name `{}`",
                t.name
            )));
        }
        let end = t.offset.checked_add(t.size);
        if end.is_none_or(|e| e > data_len) {
            return Err(GgufError::Truncated {
                what: "tensor data",
                offset: data_offset.saturating_add(t.offset),
                needed: t.size,
                len: buf.len() as u64,
            });
        }
    }
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .map(|t| (t.offset, t.offset + t.size, t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(GgufError::Invalid(format!(
                "tensors `{}` and `{}` overlap",
                w[0].2, w[1].2
            )));
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
