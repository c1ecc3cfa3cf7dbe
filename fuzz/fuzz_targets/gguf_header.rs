//! Any bytes through the GGUF header parser; whatever it accepts must be
//! fully usable: every tensor decodes (whole and by rows), and the file
//! survives a round trip through `GgufWriter`.

#![no_main]

use arbor_gguf::{GgufWriter, Header, dequantize, dequantize_rows, parse_header};
use libfuzzer_sys::fuzz_target;

/// At most this many elements are decoded per input, so a small input
/// declaring a large F32-free tensor cannot make one run slow.
const ELEMENT_BUDGET: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = parse_header(data) else {
        return;
    };
    let mut budget = ELEMENT_BUDGET;
    for t in &header.tensors {
        let n = usize::try_from(t.n_elements()).unwrap();
        let start = usize::try_from(header.data_offset + t.offset).unwrap();
        let bytes = &data[start..start + t.size as usize];
        if n > budget {
            continue;
        }
        budget -= n;
        let all = dequantize(t.ty, bytes, n).expect("a checked tensor decodes");
        assert_eq!(all.len(), n);
        let row_len = t.dims[0] as usize;
        let last = n / row_len - 1;
        let rows = dequantize_rows(t.ty, bytes, row_len, &[last, 0]).expect("rows decode");
        assert_eq!(bits(&rows[..row_len]), bits(&all[last * row_len..]));
        assert_eq!(bits(&rows[row_len..]), bits(&all[..row_len]));
    }
    round_trip(&header, data);
});

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn rewrite(header: &Header, data: &[u8]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in &header.metadata {
        w.add_meta(k.as_str(), v.clone());
    }
    for t in &header.tensors {
        let start = (header.data_offset + t.offset) as usize;
        w.add_tensor(t.name.as_str(), &t.dims, t.ty, &data[start..start + t.size as usize]);
    }
    w.to_bytes()
}

/// Writing what was read and reading it back gives the same file again.
fn round_trip(header: &Header, data: &[u8]) {
    let once = rewrite(header, data);
    let again = parse_header(&once).expect("the writer's output parses");
    assert_eq!(again.tensors.len(), header.tensors.len());
    assert_eq!(rewrite(&again, &once), once);
}
