//! A GGUF model's logits on the candle backend, reduced to a digest of
//! their bits: the same file and tokens must give the same digest on every
//! machine whose kernels claim the same arithmetic (x86 AVX2 / AVX-512,
//! aarch64 NEON with or without dotprod).
//!
//! `cargo run --release -p arbor-model --example logit_bits -- MODEL.gguf [N]`
//! prefills a fixed 12-token prompt in one pass (logits of every row), then
//! decodes `N` (default 8) tokens greedily one at a time; it prints the
//! kernels, the greedy tokens, each step's top-2 margin and an FNV-1a
//! digest of every logit's bits.

use arbor_backend_candle::CandleBackend;
use arbor_gguf::GgufFile;
use arbor_model::{Decoder, LanguageModel, Mask};

/// Small ids, valid in any of our models' vocabularies.
const PROMPT: [u32; 12] = [40, 1079, 264, 3234, 311, 3270, 1045, 2038, 13, 576, 374, 25];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: logit_bits MODEL.gguf [N]")?;
    let n: usize = args.next().map_or(Ok(8), |s| s.parse())?;
    let backend = CandleBackend::new();
    println!("kernels: {}", backend.kernels());
    let file = GgufFile::open(std::path::Path::new(&path))?;
    let mut model = Decoder::load(backend, &file, &mut |_, _| {})?;
    let mut digest = Fnv(0xcbf2_9ce4_8422_2325);
    let len = PROMPT.len();
    let positions: Vec<u32> = (0..len as u32).collect();
    let rows: Vec<usize> = (0..len).collect();
    let logits = model.forward(&PROMPT, &positions, &Mask::causal(0, len), &rows)?;
    digest.add(&logits.data);
    let (mut next, margin) = top2(logits.row(len - 1));
    let (mut tokens, mut margins) = (vec![next], vec![margin]);
    for step in 0..n.saturating_sub(1) {
        let pos = (len + step) as u32;
        let logits = model.forward(&[next], &[pos], &Mask::causal(len + step, 1), &[0])?;
        digest.add(&logits.data);
        (next, _) = top2(logits.row(0));
        tokens.push(next);
        margins.push(top2(logits.row(0)).1);
    }
    println!("tokens: {tokens:?}");
    println!("top-2 margins: {margins:.3?}");
    println!("digest: {:016x}", digest.0);
    Ok(())
}

/// The first maximum and its margin over the runner-up.
fn top2(row: &[f32]) -> (u32, f32) {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    let second = (row.iter().enumerate())
        .filter(|(i, _)| *i != best)
        .map(|(_, v)| *v)
        .fold(f32::NEG_INFINITY, f32::max);
    (best as u32, row[best] - second)
}

struct Fnv(u64);

impl Fnv {
    fn add(&mut self, values: &[f32]) {
        for v in values {
            for b in v.to_bits().to_le_bytes() {
                self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }
}
