//! The kernels against their arithmetic in plain Rust (`lanes.rs`), bit
//! for bit, and that against candle's one-pair `vec_dot`, within rounding.

use super::*;
#[cfg(target_arch = "x86_64")]
use candle_core::quantized::k_quants::{
    BlockQ4K, BlockQ6K, BlockQ8_0, BlockQ8K, GgmlType as Candle,
};

/// xorshift bytes and floats.
struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random blocks with sane f16 scales at `scale_at` in every block.
fn blocks(kind: Kind, n: usize, g: &mut Gen, scale_at: &[usize]) -> Vec<u8> {
    let size = kind.block_bytes();
    let mut out: Vec<u8> = (0..n * size).map(|_| g.next() as u8).collect();
    for block in out.chunks_mut(size) {
        for &o in scale_at {
            let v = half::f16::from_f32(0.002 + (g.next() % 100) as f32 * 1e-4);
            block[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Candle's blocks over a copy of `bytes` (aligned for `B`).
#[cfg(target_arch = "x86_64")]
fn candle_blocks<B: Candle>(bytes: &[u8]) -> Vec<B> {
    let n = bytes.len() / std::mem::size_of::<B>();
    let mut v = vec![B::zeros(); n];
    // SAFETY: the block types are plain-number `repr(C)` structs of exactly
    // these sizes; any bit pattern is a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            v.as_mut_ptr() as *mut u8,
            n * std::mem::size_of::<B>(),
        )
    };
    v
}

/// Each type with a kernel, and where its blocks hold f16 scales.
const KERNEL_TYPES: [(Kind, GgmlType, &[usize]); 4] = [
    (Kind::Q8_0, GgmlType::Q8_0, &[0]),
    (Kind::Q5_0, GgmlType::Q5_0, &[0]),
    (Kind::Q4K, GgmlType::Q4_K, &[0, 2]),
    (Kind::Q6K, GgmlType::Q6_K, &[208]),
];

/// Every (token, row) pair's dot product as the x86 kernels compute it
/// ([`super::lanes`]); on x86 also candle's `vec_dot` (ggml's AVX2 dot
/// products), which it must equal within rounding.
fn reference(kind: Kind, bytes: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f32> {
    let row_bytes = cols / kind.block_len() * kind.block_bytes();
    let mut out = vec![0f32; m * rows];
    for t in 0..m {
        for r in 0..rows {
            let (row, xt) = (&bytes[r * row_bytes..][..row_bytes], &x[t * cols..][..cols]);
            out[t * rows + r] = super::lanes::dot(kind, row, xt);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        let candle = match kind {
            Kind::Q8_0 => candle_vec_dot::<BlockQ8_0, BlockQ8_0>(bytes, rows, cols, x, m),
            Kind::Q4K => candle_vec_dot::<BlockQ4K, BlockQ8K>(bytes, rows, cols, x, m),
            Kind::Q6K => candle_vec_dot::<BlockQ6K, BlockQ8K>(bytes, rows, cols, x, m),
            Kind::Q5_0 => unreachable!("checked against its Q8_0 repacking"),
        };
        // Blocks are summed exactly (see `lanes`), where ggml rounds eight
        // lane sums apiece: close, not the same bits (K-quants: the scales
        // and mins' terms cancel, so within the outputs' size).
        let size = candle.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (a, b) in out.iter().zip(&candle) {
            assert!(
                (a - b).abs() <= 1e-4 * size,
                "{kind:?}: the reference {a} is far from candle's vec_dot {b} (outputs up to {size})"
            );
        }
    }
    out
}

/// candle's `vec_dot` for every (token, row) pair.
#[cfg(target_arch = "x86_64")]
fn candle_vec_dot<W, A: Candle>(
    bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32>
where
    W: Candle<VecDotType = A>,
{
    let w: Vec<W> = candle_blocks(bytes);
    let nb = cols / W::BLCK_SIZE;
    let mut out = vec![0f32; m * rows];
    for t in 0..m {
        let mut a = vec![A::zeros(); nb];
        A::from_float(&x[t * cols..][..cols], &mut a);
        for r in 0..rows {
            out[t * rows + r] = W::vec_dot(cols, &w[r * nb..][..nb], &a);
        }
    }
    out
}

fn check(kind: Kind, ty: GgmlType, scale_at: &[usize]) {
    if !available() {
        eprintln!("skipped: no kernel variant runs on this CPU");
        return;
    }
    let mut g = Gen(0xa7b0_0001 ^ kind.block_bytes() as u64);
    // 37 rows: not a whole number of the pool's row chunks; rows of 50
    // Q8_0 or 7 K-quant blocks: several of the kernels' block chunks, the
    // last one short.
    let rows = 37;
    let cols = if kind == Kind::Q8_0 { 50 * 32 } else { 7 * 256 };
    let bytes = blocks(kind, rows * cols / kind.block_len(), &mut g, scale_at);
    // Interleaved and GGUF rows: both must give the reference's bits.
    for interleave in [true, false] {
        let w = QWeight::with_layout(ty, rows, cols, &bytes, interleave).unwrap();
        for m in [1usize, 2, 3, 4, 5, 7, 8, 9, 17] {
            let x: Vec<f32> = (0..m * cols).map(|_| g.f32()).collect();
            let want = match kind {
                Kind::Q5_0 => unreachable!("checked against its Q8_0 repacking"),
                _ => reference(kind, &bytes, rows, cols, &x, m),
            };
            for &isa in variants() {
                let mut got = vec![f32::NAN; m * rows];
                w.matmul_on(isa, &x, m, &w.whole(), &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(a.is_finite(), "{ty}: non-finite output {a}");
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{ty}, {m} tokens, {isa:?}, interleaved {interleave}, output {i}: {a} vs the reference's {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_0_equals_its_exact_block_sums_bit_for_bit() {
    check(Kind::Q8_0, GgmlType::Q8_0, &[0]);
}

#[test]
fn q4_k_equals_its_exact_block_sums_bit_for_bit() {
    check(Kind::Q4K, GgmlType::Q4_K, &[0, 2]);
}

#[test]
fn q6_k_equals_its_exact_block_sums_bit_for_bit() {
    check(Kind::Q6K, GgmlType::Q6_K, &[208]);
}

/// The 512-bit K-quant kernels multiply a lane's sum over one sub-block
/// by its scale as an i16 (`vpdpwssd`): the largest quants (15, 63)
/// against the largest activations (-128) with the largest scales and mins
/// (63; Q6_K: -128 and 127) must still give the exact sums, in every
/// variant and layout.
#[test]
fn k_quants_largest_quants_and_scales_stay_exact() {
    if !available() {
        return;
    }
    let (rows, cols) = (16, 512);
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let mut q4k = [0xFFu8; 144];
    q4k[0..2].copy_from_slice(&f16(1.0));
    q4k[2..4].copy_from_slice(&f16(0.5));
    let mut q6k = [0xFFu8; 210];
    for (s, v) in q6k[192..208].iter_mut().enumerate() {
        *v = if s % 3 == 0 { 0x7F } else { 0x80 };
    }
    q6k[208..210].copy_from_slice(&f16(1.0));
    for (kind, ty, block) in [
        (Kind::Q4K, GgmlType::Q4_K, &q4k[..]),
        (Kind::Q6K, GgmlType::Q6_K, &q6k[..]),
    ] {
        let bytes = block.repeat(rows * cols / 256);
        for x0 in [-1.0f32, 1.0] {
            for interleave in [true, false] {
                let w = QWeight::with_layout(ty, rows, cols, &bytes, interleave).unwrap();
                for m in [1usize, 3, 8, 9] {
                    let x = vec![x0; m * cols];
                    let want = reference(kind, &bytes, rows, cols, &x, m);
                    for &isa in variants() {
                        let mut got = vec![f32::NAN; m * rows];
                        w.matmul_on(isa, &x, m, &w.whole(), &mut got);
                        assert!(
                            same_bits(&got, &want),
                            "{ty}: {m} tokens of {x0}, {isa:?}, interleaved {interleave}"
                        );
                    }
                }
            }
        }
    }
}

/// The group kernels multiply Q8_0 weights as `q + 128` and Q5_0 as `q`
/// (0..32), then take the offset times the token's block sum back off:
/// the extremes (Q8_0's -128 and 127, Q5_0's 0 and 31) against the
/// largest activations of either sign must still give the exact sums,
/// in every variant and layout, for groups of rows and rows after them.
#[test]
fn q8_0_and_q5_0_extremes_stay_exact() {
    if !available() {
        return;
    }
    let (rows, cols) = (17, 64);
    let f16 = half::f16::from_f32(0.75).to_le_bytes();
    let q8 = |q: u8| [&f16[..], &[q; 32]].concat();
    // Q5_0: every high bit set and every nibble 15 (q = 31), or none (0).
    let q5 = |v: u8| [&f16[..], &[v; 4], &[v; 16]].concat();
    let q5_repacked = |v: u8| q8(if v == 0 { (-16i8) as u8 } else { 15 });
    for (ty, block, repacked) in [
        (GgmlType::Q8_0, q8(0x80), q8(0x80)),
        (GgmlType::Q8_0, q8(0x7F), q8(0x7F)),
        (GgmlType::Q5_0, q5(0xFF), q5_repacked(0xFF)),
        (GgmlType::Q5_0, q5(0), q5_repacked(0)),
    ] {
        let bytes = block.repeat(rows * cols / 32);
        let repacked = repacked.repeat(rows * cols / 32);
        for x0 in [-1.0f32, 1.0] {
            for interleave in [true, false] {
                let w = QWeight::with_layout(ty, rows, cols, &bytes, interleave).unwrap();
                for m in [1usize, 3, 8, 9] {
                    let x = vec![x0; m * cols];
                    let want = reference(Kind::Q8_0, &repacked, rows, cols, &x, m);
                    for &isa in variants() {
                        let mut got = vec![f32::NAN; m * rows];
                        w.matmul_on(isa, &x, m, &w.whole(), &mut got);
                        assert!(
                            same_bits(&got, &want),
                            "{ty} {:?}: {m} tokens of {x0}, {isa:?}, interleaved {interleave}",
                            &block[2..4]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn other_types_have_no_kernel() {
    assert!(QWeight::new(GgmlType::Q4_0, 1, 32, &[0; 18]).is_none());
    assert!(QWeight::new(GgmlType::F32, 1, 32, &[0; 128]).is_none());
}

/// Q5_0 blocks multiply exactly like their Q8_0 repacking (`q8 = q5 - 16`),
/// which is what candle's kernels are given.
#[test]
fn q5_0_equals_its_q8_0_repacking_bit_for_bit() {
    if !available() {
        return;
    }
    let mut g = Gen(0x55);
    let (rows, cols) = (37, 50 * 32);
    let bytes = blocks(Kind::Q5_0, rows * cols / 32, &mut g, &[0]);
    let repacked = arbor_gguf::quant::repack_q5_0_to_q8_0(&bytes).unwrap();
    // Interleaved and GGUF rows (laid out in passing from 16 tokens on).
    for interleave in [true, false] {
        let q5 = QWeight::with_layout(GgmlType::Q5_0, rows, cols, &bytes, interleave).unwrap();
        let q8 = QWeight::with_layout(GgmlType::Q8_0, rows, cols, &repacked, interleave).unwrap();
        for m in [1usize, 3, 8, 11, 17] {
            let x: Vec<f32> = (0..m * cols).map(|_| g.f32()).collect();
            let want = reference(Kind::Q8_0, &repacked, rows, cols, &x, m);
            for &isa in variants() {
                for w in [&q5, &q8] {
                    let mut got = vec![f32::NAN; m * rows];
                    w.matmul_on(isa, &x, m, &w.whole(), &mut got);
                    assert!(
                        same_bits(&got, &want),
                        "{:?}, {m} tokens, {isa:?}, interleaved {interleave}",
                        w.kind
                    );
                }
            }
        }
    }
}

/// Row counts that leave 1, 2 or 3 rows after the four-row groups of the
/// one-token path, and rows of a single block.
#[test]
fn every_row_is_computed_for_any_shape() {
    if !available() {
        return;
    }
    let mut g = Gen(0x77);
    // The reference takes Q5_0 only through its Q8_0 repacking, which has
    // a test of its own.
    for (kind, ty, scale_at) in KERNEL_TYPES.into_iter().filter(|t| t.0 != Kind::Q5_0) {
        for rows in [1usize, 2, 3, 5, 6, 7, 17, 18, 19, 38, 39] {
            let cols = kind.block_len();
            let bytes = blocks(kind, rows, &mut g, scale_at);
            let w = QWeight::new(ty, rows, cols, &bytes).unwrap();
            for m in [1usize, 2, 9] {
                let x: Vec<f32> = (0..m * cols).map(|_| g.f32()).collect();
                let want = reference(kind, &bytes, rows, cols, &x, m);
                for &isa in variants() {
                    // NaN marks outputs the kernel never wrote.
                    let mut got = vec![f32::NAN; m * rows];
                    w.matmul_on(isa, &x, m, &w.whole(), &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty}: {rows} rows, {m} tokens, {isa:?}");
                }
            }
        }
    }
}

/// A long pass over a wide matrix is taken a block of tokens at a time
/// (`TOKEN_BLOCK_BYTES`); every token still gets the bits it gets alone.
#[test]
fn tokens_taken_in_blocks_get_the_bits_they_get_alone() {
    if !available() {
        return;
    }
    let mut g = Gen(0x5eed);
    for (kind, ty, scale_at) in KERNEL_TYPES {
        // Rows in interleaved groups and a single row after them.
        let (rows, cols) = (17, 8960);
        let nb = cols / kind.block_len();
        let bytes = blocks(kind, rows * nb, &mut g, scale_at);
        let w = QWeight::new(ty, rows, cols, &bytes).unwrap();
        let act_bytes = Activations::quantize(kind, &vec![0.5; 2 * cols], 2, cols)
            .bytes
            .len()
            / 2;
        // More tokens than one block holds, and not a whole number of blocks.
        let m = TOKEN_BLOCK_BYTES / act_bytes * 2 + 5;
        let x: Vec<f32> = (0..m * cols).map(|_| g.f32()).collect();
        for &isa in variants() {
            let mut all = vec![f32::NAN; m * rows];
            w.matmul_on(isa, &x, m, &w.whole(), &mut all);
            for t in [0, 1, m / 2, m - 1] {
                let mut one = vec![f32::NAN; rows];
                w.matmul_on(isa, &x[t * cols..][..cols], 1, &w.whole(), &mut one);
                assert!(
                    same_bits(&all[t * rows..][..rows], &one),
                    "{ty}, {isa:?}: token {t} of {m}"
                );
            }
        }
    }
}

/// Whether two outputs are equal bit for bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

/// The blocks `blocks` of the first `keep` rows of a matrix of `nb`
/// blocks of `size` bytes per row, as a matrix of their own.
fn cut_out(bytes: &[u8], nb: usize, size: usize, keep: usize, blocks: &Range<usize>) -> Vec<u8> {
    (0..keep)
        .flat_map(|r| &bytes[(r * nb + blocks.start) * size..(r * nb + blocks.end) * size])
        .copied()
        .collect()
}

/// A part read in place (leading rows, a range of each row's blocks) gives
/// the bits of the same part cut out as a matrix of its own, for every
/// kernel type, interleaved or not, one token or many.
#[test]
fn parts_equal_the_part_cut_out_bit_for_bit() {
    if !available() {
        return;
    }
    let mut g = Gen(0x99);
    for (kind, ty, scale_at) in KERNEL_TYPES {
        let (rows, nb) = (37, 7);
        let (len, size) = (kind.block_len(), kind.block_bytes());
        let cols = nb * len;
        let bytes = blocks(kind, rows * nb, &mut g, scale_at);
        for interleave in [true, false] {
            let w = QWeight::with_layout(ty, rows, cols, &bytes, interleave).unwrap();
            // Row prefixes of whole groups of eight (Q8_0 and Q5_0: of
            // sixteen, or cut short), or the whole matrix.
            for (keep, blocks) in [(16, 0..nb), (24, 2..5), (37, 1..7), (8, 6..7), (37, 0..nb)] {
                let part = w
                    .part(keep, &(blocks.start * len..blocks.end * len))
                    .unwrap();
                let cut = cut_out(&bytes, nb, size, keep, &blocks);
                let width = blocks.len() * len;
                let alone = QWeight::with_layout(ty, keep, width, &cut, interleave).unwrap();
                for m in [1usize, 3, 9] {
                    let x: Vec<f32> = (0..m * width).map(|_| g.f32()).collect();
                    for &isa in variants() {
                        let mut got = vec![f32::NAN; m * keep];
                        w.matmul_on(isa, &x, m, &part, &mut got);
                        let mut want = vec![0f32; m * keep];
                        alone.matmul_on(isa, &x, m, &alone.whole(), &mut want);
                        assert!(
                            same_bits(&got, &want),
                            "{ty}: rows ..{keep}, blocks {blocks:?}, {m} tokens, {isa:?}, interleaved {interleave}"
                        );
                    }
                }
            }
            // Parts the kernels cannot read in place are refused (only
            // x86 interleaves rows; elsewhere any row prefix is a part).
            if interleave && matches!(kind, Kind::Q4K | Kind::Q6K) {
                assert_eq!(
                    w.part(12, &(0..cols)).is_none(),
                    cfg!(target_arch = "x86_64"),
                    "{ty}: half a group of rows"
                );
            }
            assert!(
                w.part(8, &(1..cols)).is_none(),
                "{ty}: columns inside a block"
            );
            assert!(w.part(38, &(0..cols)).is_none(), "{ty}: too many rows");
        }
    }
}

/// A part summed segment by segment in one pass gives the bits of each
/// segment cut out as a matrix of its own, multiplied alone and the
/// products added in order — for one token or many, rows short enough to
/// take in one pass or long enough to take in chunks that straddle the
/// segments.
#[test]
fn segment_sums_equal_the_segments_added_bit_for_bit() {
    if !available() {
        return;
    }
    let mut g = Gen(0x5e6);
    // (kind, scale offsets, blocks per row, segment ends in blocks)
    type Case = (Kind, GgmlType, &'static [usize], usize, &'static [usize]);
    let cases: [Case; 5] = [
        (Kind::Q8_0, GgmlType::Q8_0, &[0], 9, &[2, 3, 7, 9]),
        (Kind::Q5_0, GgmlType::Q5_0, &[0], 9, &[4, 5]),
        (Kind::Q8_0, GgmlType::Q8_0, &[0], 120, &[50, 51, 120]),
        (Kind::Q4K, GgmlType::Q4_K, &[0, 2], 5, &[1, 3, 5]),
        (Kind::Q6K, GgmlType::Q6_K, &[208], 5, &[2, 4]),
    ];
    for (kind, ty, scale_at, nb, ends) in cases {
        let rows = 37;
        let (len, size) = (kind.block_len(), kind.block_bytes());
        let bytes = blocks(kind, rows * nb, &mut g, scale_at);
        let w = QWeight::with_layout(ty, rows, nb * len, &bytes, false).unwrap();
        let segs: Vec<Range<usize>> = std::iter::once(0)
            .chain(ends.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|e| e[0] * len..e[1] * len)
            .collect();
        for keep in [37, 16] {
            let (part, blocks) = w.sum_part(keep, &segs).unwrap();
            let width = part.blocks.len() * len;
            for m in [1usize, 3, 9] {
                let x: Vec<f32> = (0..m * width).map(|_| g.f32()).collect();
                for &isa in variants() {
                    let mut got = vec![f32::NAN; m * keep];
                    w.matmul_sum_on(isa, &x, m, &part, &blocks, as_uninit(&mut got));
                    let mut want = vec![0f32; m * keep];
                    for (k, seg) in blocks.iter().enumerate() {
                        let cut = cut_out(&bytes, nb, size, keep, seg);
                        let sw = seg.len() * len;
                        let alone = QWeight::with_layout(ty, keep, sw, &cut, false).unwrap();
                        let xs: Vec<f32> = (x.chunks_exact(width))
                            .flat_map(|r| r[seg.start * len..seg.end * len].iter().copied())
                            .collect();
                        let mut product = vec![0f32; m * keep];
                        alone.matmul_on(isa, &xs, m, &alone.whole(), &mut product);
                        for (o, p) in want.iter_mut().zip(&product) {
                            *o = if k == 0 { *p } else { *o + *p };
                        }
                    }
                    assert!(
                        same_bits(&got, &want),
                        "{ty}: {nb} blocks, ends {ends:?}, rows ..{keep}, {m} tokens, {isa:?}"
                    );
                }
            }
        }
    }
    // Interleaved rows (x86 only) and ends inside a block are not fused.
    let bytes = blocks(Kind::Q6K, 16 * 2, &mut g, &[208]);
    let w = QWeight::with_layout(GgmlType::Q6_K, 16, 512, &bytes, true).unwrap();
    assert_eq!(
        w.sum_part(16, &[0..256, 256..512]).is_none(),
        cfg!(target_arch = "x86_64")
    );
    let bytes = blocks(Kind::Q8_0, 8 * 2, &mut g, &[0]);
    let w = QWeight::new(GgmlType::Q8_0, 8, 64, &bytes).unwrap();
    assert!(w.sum_part(8, &[0..16, 16..64]).is_none());
}

/// The variant `ARBOR_EXPECT_KERNELS` names runs here, when it is set: the
/// ARM64 CI sets it per emulated CPU (`candle-qmm8-i8mm` on `-cpu max`,
/// `candle-qmm8-neon` on a Cortex-A72), so each run proves which kernels
/// the tests above checked.
#[test]
fn the_expected_variant_runs() {
    let got = isa().map_or("candle", Isa::kernels);
    match std::env::var("ARBOR_EXPECT_KERNELS") {
        Ok(want) => assert_eq!(got, want, "variants here: {:?}", variants()),
        Err(_) => eprintln!("kernels here: {got} (variants {:?})", variants()),
    }
    #[cfg(target_arch = "aarch64")]
    assert!(variants().contains(&Isa::Neon), "every ARM64 core has NEON");
}

/// `out` as the kernels' output type (they write only f32 values).
pub(super) fn as_uninit(out: &mut [f32]) -> &mut [std::mem::MaybeUninit<f32>] {
    // SAFETY: same layout; nothing uninitialized is written through it.
    unsafe { &mut *(out as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) }
}

/// The vendor string `soft_prefetch` decides by reads in register order
/// (ebx, edx, ecx): a wrong order gives no known vendor.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_cpu_vendor_is_a_known_one() {
    let v = super::cpu_vendor();
    let known: [&[u8; 12]; 5] = [
        b"GenuineIntel",
        b"AuthenticAMD",
        b"HygonGenuine",
        b"CentaurHauls",
        b"  Shanghai  ",
    ];
    assert!(known.contains(&&v), "{:?}", String::from_utf8_lossy(&v));
}
