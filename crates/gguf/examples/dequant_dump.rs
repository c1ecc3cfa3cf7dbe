//! Writes dequantized tensors to stdout as raw little-endian `f32`, for
//! comparing against another implementation (see
//! `tests/compare_with_gguf_py.py`).
//!
//! - `dequant_dump FILE`: every tensor of a GGUF file, in index order.
//! - `dequant_dump --raw TYPE N`: `N` elements of type `TYPE` (e.g. `Q4_K`)
//!   read from stdin.

use std::io::{Read, Write};

use arbor_gguf::{GgmlType, GgufFile, dequantize, dequantize_into};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match args.as_slice() {
        [flag, ty, n] if flag == "--raw" => {
            let ty = (0..=40)
                .filter_map(GgmlType::from_u32)
                .find(|t| t.name() == ty)
                .ok_or_else(|| format!("unknown type {ty}"))?;
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes)?;
            let y = dequantize(ty, &bytes, n.parse()?)?;
            write_f32(&mut out, &y)?;
        }
        [path] => {
            let file = GgufFile::open(path)?;
            for info in &file.header().tensors {
                let bytes = file.tensor_bytes(info);
                // Row by row in chunks, so a big embedding never sits in
                // memory as f32 all at once.
                let row_len = info.dims[0] as usize;
                let row_bytes = bytes.len() / (info.n_elements() as usize / row_len);
                let mut buf = Vec::new();
                for chunk in bytes.chunks(row_bytes * 1024) {
                    buf.resize(chunk.len() / row_bytes * row_len, 0.0);
                    dequantize_into(info.ty, chunk, &mut buf)?;
                    write_f32(&mut out, &buf)?;
                }
            }
        }
        _ => return Err("usage: dequant_dump FILE | dequant_dump --raw TYPE N".into()),
    }
    out.flush()?;
    Ok(())
}

fn write_f32(out: &mut impl Write, y: &[f32]) -> std::io::Result<()> {
    let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    out.write_all(&bytes)
}
