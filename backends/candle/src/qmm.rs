//! Our own matmul kernels on GGUF quantized blocks (x86-64: AVX2 + FMA +
//! F16C, or AVX-512 VNNI; aarch64: NEON, with `sdot` where the CPU has
//! dotprod, see [`neon`]), for the types the Qwen files are made of: Q5_0,
//! Q8_0, Q4_K and Q6_K.
//!
//! Why not candle's: its plain kernels compute one (weight row, token) dot
//! product per call, so a batch of tokens re-decodes every weight block once
//! per token, and its tile kernels round differently from its one-row
//! kernel. Here a weight block is decoded once and multiplied into up to
//! a tile of tokens while it sits in registers, and every token keeps its own
//! accumulator running through exactly the same instructions in the same
//! order, whatever the batch size: a token's logits never depend on which
//! tokens were batched with it (speculative verification relies on that).
//!
//! Activations are quantized by candle's own `from_float` (Q8_0 or Q8_K
//! blocks). Every type sums each row's products over a block into one
//! exact integer and takes one fused multiply-add per block with the block
//! scales' product (`qmm/lanes.rs` has the arithmetic in plain Rust): any
//! grouping of the products gives the same bits, which lets the 512-bit
//! kernels (`qmm/zmm.rs`) multiply with `vpdpbusd`. (ggml's dot products,
//! which candle ports, keep eight float lanes per row instead: outputs
//! differ from candle's `vec_dot` by rounding.) Every variant, on x86 and
//! aarch64, gives the same bits (tests check it).
//!
//! Weights hold exactly their GGUF bytes, unaligned. Loaded to stay, on
//! x86, rows are interleaved ([`groups`]): the K-quants eight rows at a
//! time, eight bytes of each row per 64-byte vector ([`q4k8`],
//! [`q6k8`]); Q8_0 and Q5_0 sixteen rows at a time, four bytes of each
//! ([`q8x16`]). Streamed layers keep GGUF rows: Q8_0 ones are transposed
//! in registers, passes of many tokens lay the others out group by group
//! in passing, and short passes take them row at a time. The NEON kernels
//! take every type row at a time. Rows are shared out to candle's spinning
//! thread pool, which the calling thread joins.

use arbor_tensor::{GgmlType, SharedBytes, Store};
use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8K, GgmlType as CandleBlock};
use std::mem::MaybeUninit;
use std::ops::Range;

/// A block type with a kernel here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
}

impl Kind {
    pub(crate) fn of(ty: GgmlType) -> Option<Kind> {
        match ty {
            GgmlType::Q5_0 => Some(Kind::Q5_0),
            GgmlType::Q8_0 => Some(Kind::Q8_0),
            GgmlType::Q4_K => Some(Kind::Q4K),
            GgmlType::Q6_K => Some(Kind::Q6K),
            _ => None,
        }
    }

    fn ty(self) -> GgmlType {
        match self {
            Kind::Q5_0 => GgmlType::Q5_0,
            Kind::Q8_0 => GgmlType::Q8_0,
            Kind::Q4K => GgmlType::Q4_K,
            Kind::Q6K => GgmlType::Q6_K,
        }
    }

    fn block_bytes(self) -> usize {
        self.ty().block_bytes()
    }

    fn block_len(self) -> usize {
        self.ty().block_len()
    }

    /// Rows per interleaved group (see [`groups`]).
    fn group_rows(self) -> usize {
        match self {
            Kind::Q4K | Kind::Q6K => groups::ROWS,
            Kind::Q5_0 | Kind::Q8_0 => q8x16::ROWS,
        }
    }

    /// Bytes of one group block (a group's rows at one block column).
    #[cfg(target_arch = "x86_64")]
    fn group_bytes(self) -> usize {
        match self {
            Kind::Q4K => q4k8::BYTES,
            Kind::Q6K => q6k8::BYTES,
            Kind::Q8_0 => q8x16::Q8_BYTES,
            Kind::Q5_0 => q8x16::Q5_BYTES,
        }
    }
}

/// One compiled variant of the kernels, per instruction set. All give the
/// same bits (integer sums are exact; the float steps are the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 VNNI (256-bit forms) besides.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// Plain NEON (e.g. Cortex-A72, the Raspberry Pi 4).
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// NEON with the dot product instructions (`sdot`; Armv8.2 cores and
    /// later: Cortex-A76/A78, Jetson Orin, recent phones).
    #[cfg(target_arch = "aarch64")]
    Dotprod,
    /// Dotprod and the int8 matrix multiply (`smmla`, [`mmla`]) for passes
    /// of two tokens or more (Armv8.6 cores, some Armv8.2 ones).
    #[cfg(target_arch = "aarch64")]
    I8mm,
}

impl Isa {
    /// The kernels' name in [`crate::CandleBackend::kernels`].
    pub(crate) fn kernels(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "candle-qmm8-avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => "candle-qmm8-vnni",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => "candle-qmm8-neon",
            #[cfg(target_arch = "aarch64")]
            Isa::Dotprod => "candle-qmm8-dotprod",
            #[cfg(target_arch = "aarch64")]
            Isa::I8mm => "candle-qmm8-i8mm",
        }
    }
}

/// The variants this CPU runs, plainest first (checked once).
pub(crate) fn variants() -> &'static [Isa] {
    static V: std::sync::OnceLock<Vec<Isa>> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        #[allow(unused_mut)]
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(Isa::Avx2);
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(Isa::Vnni);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(Isa::Neon);
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                v.push(Isa::Dotprod);
                if std::arch::is_aarch64_feature_detected!("i8mm") {
                    v.push(Isa::I8mm);
                }
            }
        }
        v
    })
}

/// The variant that runs here: the best this CPU has, unless
/// `ARBOR_NO_AVX512=1` / `ARBOR_NO_DOTPROD=1` holds it back; `None` where
/// none does (candle-core's kernels then run).
pub(crate) fn isa() -> Option<Isa> {
    static ISA: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let held_back = |var: &str| std::env::var(var).as_deref() == Ok("1");
        variants().iter().copied().rfind(|&isa| match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => !held_back("ARBOR_NO_AVX512"),
            #[cfg(target_arch = "aarch64")]
            Isa::Dotprod => !held_back("ARBOR_NO_DOTPROD"),
            #[cfg(target_arch = "aarch64")]
            Isa::I8mm => !held_back("ARBOR_NO_DOTPROD") && !held_back("ARBOR_NO_I8MM"),
            #[allow(unreachable_patterns)]
            _ => true,
        })
    })
}

/// Whether the x86 group kernels (interleaved rows) ask for weight blocks
/// ahead of use (`prefetcht0`) when they multiply them by one token.
/// Kernel calls of several tokens always do (AMD EPYC VM, 1.5B, 8 and 64 rows: 73-75 and
/// 473 ms with, 79-85 and 496 without). For one token, Intel cores need
/// them: the hardware prefetcher alone left a one-token product at 2/3 of
/// DRAM bandwidth (Xeon VM, 2026-11); AMD cores do not: the 1.5B's
/// one-token pass took 37-45 ms with them and 27-35 without (EPYC VM with
/// AVX-512, 2026-11-30), the hardware prefetchers keeping up alone. So:
/// on for Intel, off for other vendors; `ARBOR_PREFETCH=1` / `=0` decides
/// instead. The same bits either way.
#[cfg(target_arch = "x86_64")]
pub(crate) fn soft_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("ARBOR_PREFETCH").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => cpu_vendor() == *b"GenuineIntel",
    })
}

/// The CPU's vendor string (`cpuid` leaf 0).
#[cfg(target_arch = "x86_64")]
fn cpu_vendor() -> [u8; 12] {
    let r = std::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    for (i, w) in [r.ebx, r.edx, r.ecx].into_iter().enumerate() {
        v[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    v
}

/// Whether this CPU runs the kernels.
pub(crate) fn available() -> bool {
    isa().is_some()
}

impl Kind {
    /// The kind of a `[rows, cols]` matrix of `ty` in `len` bytes, if its
    /// type has a kernel here and the CPU runs it; the caller has checked
    /// the shape (every raw read in the kernels relies on it).
    fn checked(ty: GgmlType, rows: usize, cols: usize, len: usize) -> Option<Kind> {
        let kind = Kind::of(ty).filter(|_| available())?;
        assert!(
            cols.is_multiple_of(kind.block_len())
                && len == rows * cols / kind.block_len() * kind.block_bytes(),
            "{len} bytes are not a {rows}x{cols} {ty} matrix"
        );
        Some(kind)
    }
}

/// A weight matrix in GGUF blocks, one row of blocks per output.
pub(crate) struct QWeight {
    kind: Kind,
    rows: usize,
    cols: usize,
    /// The blocks: a copy, or a streamed layer's read buffer kept in place.
    bytes: Store<u8>,
    /// Leading rows held in interleaved groups (of eight for the
    /// K-quants, [`q4k8`] and [`q6k8`]; of sixteen for Q8_0 and Q5_0,
    /// [`q8x16`]); the rest are GGUF rows.
    grouped: usize,
}

impl QWeight {
    /// The weight if its type has a kernel here and the CPU runs it; the
    /// caller has checked that `bytes` is a whole `[rows, cols]` matrix.
    #[cfg(test)]
    pub(crate) fn new(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<QWeight> {
        Self::with_layout(ty, rows, cols, bytes, true)
    }

    /// [`Self::new`], with rows interleaved in groups (faster kernels, at
    /// the cost of a pass over the bytes) or left as GGUF rows: both give
    /// the same bits. Only the x86 kernels have the interleaved layouts:
    /// elsewhere rows stay GGUF rows.
    pub(crate) fn with_layout(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        interleave: bool,
    ) -> Option<QWeight> {
        let kind = Kind::checked(ty, rows, cols, bytes.len())?;
        let interleave = interleave && cfg!(target_arch = "x86_64");
        let grouped = rows / kind.group_rows() * kind.group_rows();
        let nb = cols / kind.block_len();
        let (bytes, grouped) = match kind {
            _ if !interleave => (bytes.to_vec(), 0),
            Kind::Q4K => (q4k8::interleave(bytes, rows, nb), grouped),
            Kind::Q6K => (q6k8::interleave(bytes, rows, nb), grouped),
            Kind::Q8_0 => (q8x16::interleave_q8_0(bytes, rows, nb), grouped),
            Kind::Q5_0 => (q8x16::interleave_q5_0(bytes, rows, nb), grouped),
        };
        let bytes = Store::owned(bytes);
        Some(QWeight {
            kind,
            rows,
            cols,
            bytes,
            grouped,
        })
    }

    /// The weight kept in `bytes` as GGUF rows, without a copy (a streamed
    /// layer's read buffer); `None` where [`Self::with_layout`] would be.
    pub(crate) fn in_place(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &SharedBytes,
    ) -> Option<QWeight> {
        let kind = Kind::checked(ty, rows, cols, bytes.len())?;
        Some(QWeight {
            kind,
            rows,
            cols,
            bytes: Store::<u8>::shared(bytes)?,
            grouped: 0,
        })
    }

    /// Rows `rows`, one after another, as GGUF blocks.
    pub(crate) fn gguf_rows(&self, rows: &[usize]) -> Vec<u8> {
        let nb = self.cols / self.kind.block_len();
        let row_bytes = nb * self.kind.block_bytes();
        let mut out = Vec::with_capacity(rows.len() * row_bytes);
        for &r in rows {
            assert!(r < self.rows, "row {r} of {}", self.rows);
            match self.kind {
                Kind::Q4K if r < self.grouped => {
                    q4k8::gguf_row(&self.bytes, self.rows, nb, r, &mut out)
                }
                Kind::Q6K if r < self.grouped => {
                    q6k8::gguf_row(&self.bytes, self.rows, nb, r, &mut out)
                }
                Kind::Q8_0 if r < self.grouped => {
                    q8x16::gguf_row_q8_0(&self.bytes, self.rows, nb, r, &mut out)
                }
                Kind::Q5_0 if r < self.grouped => {
                    q8x16::gguf_row_q5_0(&self.bytes, self.rows, nb, r, &mut out)
                }
                _ => out.extend_from_slice(&self.bytes[r * row_bytes..][..row_bytes]),
            }
        }
        out
    }

    /// Rows held and computed in interleaved groups (the rest, fewer than
    /// a group, by the row-at-a-time kernels).
    fn grouped_rows(&self) -> usize {
        self.grouped
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// `out[t * rows + r] = x[t] · row r` for the `m` rows of `x`.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_part(x, m, &self.whole())
    }

    /// The whole matrix as a [`Part`].
    pub(crate) fn whole(&self) -> Part {
        Part {
            rows: self.rows,
            blocks: 0..self.cols / self.kind.block_len(),
        }
    }

    /// The part of the first `rows` rows over input columns `cols`, if the
    /// kernels can multiply it in place: `cols` on block boundaries, and,
    /// where K-quant rows are interleaved, `rows` whole groups of eight
    /// (Q8_0 and Q5_0 take any rows: a group cut short is computed whole
    /// on the side, see [`Self::group_cut_short`]).
    pub(crate) fn part(&self, rows: usize, cols: &Range<usize>) -> Option<Part> {
        let len = self.kind.block_len();
        let fits = rows > 0
            && rows <= self.rows
            && (rows >= self.grouped
                || rows.is_multiple_of(self.kind.group_rows())
                || matches!(self.kind, Kind::Q8_0 | Kind::Q5_0))
            && cols.start < cols.end
            && cols.end <= self.cols
            && cols.start.is_multiple_of(len)
            && cols.end.is_multiple_of(len);
        fits.then(|| Part {
            rows,
            blocks: cols.start / len..cols.end / len,
        })
    }

    /// `out[t * part.rows + r] = x[t] · row r's blocks part.blocks` for the
    /// `m` rows of `x` (each as wide as those blocks): the part read in
    /// place, with the bits of the part cut out as a matrix of its own.
    pub(crate) fn matmul_part(&self, x: &[f32], m: usize, part: &Part) -> Vec<f32> {
        let whole = 0..part.blocks.len();
        self.matmul_sum(x, m, part, std::slice::from_ref(&whole))
    }

    /// The part over input columns `0..e` (`e` where the last of `segs`
    /// ends) of the first `rows` rows, with `segs` as ranges of its blocks, if the
    /// fused sum can multiply it: rows not interleaved, every end on a
    /// block boundary.
    pub(crate) fn sum_part(
        &self,
        rows: usize,
        segs: &[Range<usize>],
    ) -> Option<(Part, Vec<Range<usize>>)> {
        let len = self.kind.block_len();
        let end = segs.last()?.end;
        let part = self.part(rows, &(0..end)).filter(|_| self.grouped == 0)?;
        let whole = |r: &Range<usize>| r.start.is_multiple_of(len) && r.end.is_multiple_of(len);
        (segs.iter().all(whole)).then(|| {
            (
                part,
                segs.iter().map(|r| r.start / len..r.end / len).collect(),
            )
        })
    }

    /// [`Self::matmul_part`] summed over `segs` (consecutive ranges of the
    /// part's blocks, from 0 to its end): each output is each segment's
    /// product, the same bits as a matrix of that segment alone would give,
    /// added in order; one pass over the rows instead of one per segment.
    pub(crate) fn matmul_sum(
        &self,
        x: &[f32],
        m: usize,
        part: &Part,
        segs: &[Range<usize>],
    ) -> Vec<f32> {
        assert!(
            segs.first().is_some_and(|s| s.start == 0)
                && segs.last().is_some_and(|s| s.end == part.blocks.len())
                && segs.windows(2).all(|w| w[0].end == w[1].start)
                && segs.iter().all(|s| s.start < s.end),
            "{segs:?} do not cover the {} blocks of {part:?}",
            part.blocks.len()
        );
        assert!(
            segs.len() == 1 || self.grouped == 0,
            "interleaved rows sum in one segment"
        );
        let isa = isa().expect("a QWeight is only built where a kernel variant runs");
        // Not cleared first: a long prompt's outputs are tens of MiB per
        // matrix, and clearing reused heap memory cost 4-5% of a 512-token
        // AVX2 pass of the 1.5B (`perf`, Intel VM kind, 2 threads).
        let n = m * part.rows;
        let mut out = Vec::with_capacity(n);
        self.matmul_sum_on(isa, x, m, part, segs, &mut out.spare_capacity_mut()[..n]);
        // SAFETY: `matmul_sum_on` writes all `m * part.rows` outputs (the
        // kernel tests start from NaN and compare every output).
        unsafe { out.set_len(n) };
        out
    }

    /// [`Self::matmul_part`] with one variant of the kernels (one of
    /// [`variants`]), for the tests.
    #[cfg(test)]
    fn matmul_on(&self, isa: Isa, x: &[f32], m: usize, part: &Part, out: &mut [f32]) {
        let whole = 0..part.blocks.len();
        let out = tests::as_uninit(out);
        self.matmul_sum_on(isa, x, m, part, std::slice::from_ref(&whole), out)
    }

    /// [`Self::matmul_sum`] with one variant of the kernels: writes every
    /// one of `out`'s values.
    fn matmul_sum_on(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        part: &Part,
        segs: &[Range<usize>],
        out: &mut [MaybeUninit<f32>],
    ) {
        let width = part.blocks.len() * self.kind.block_len();
        assert!(x.len() == m * width && out.len() == m * part.rows);
        assert!(
            self.part(
                part.rows,
                &(part.blocks.start * self.kind.block_len()
                    ..part.blocks.end * self.kind.block_len())
            )
            .as_ref()
                == Some(part),
            "{part:?} is not a part of a {}x{} matrix",
            self.rows,
            self.cols
        );
        assert!(variants().contains(&isa), "this CPU lacks {isa:?}");
        #[allow(unused_mut)]
        let mut act = Activations::quantize(self.kind, x, m, width);
        #[cfg(target_arch = "aarch64")]
        if isa == Isa::I8mm && m >= 2 {
            act.pairs = Some(mmla::Pairs::new(self.kind, &act, m, part.blocks.len()));
        }
        let out_at = SendPtr(out.as_mut_ptr().cast::<f32>());
        // Tokens taken a block at a time, every row for each block: each
        // rows' kernel call reads all of its tokens' activations, and the
        // activations of a long prompt against a wide matrix (512 tokens of
        // 8960 columns: 5 MiB) would otherwise stream from the last-level
        // cache once per eight rows. A token's results do not depend on
        // which tokens share its block (batch invariance).
        let block = if cfg!(target_arch = "x86_64") {
            (TOKEN_BLOCK_BYTES / act.stride.max(1)).max(8) / 8 * 8
        } else {
            m
        };
        let mut t = 0;
        while t < m {
            let tokens = t..(t + block).min(m);
            t = tokens.end;
            self.matmul_tokens(isa, part, segs, &act, tokens, out_at);
        }
    }

    /// One block of tokens of [`Self::matmul_sum_on`], every row, on the
    /// pool.
    fn matmul_tokens(
        &self,
        isa: Isa,
        part: &Part,
        segs: &[Range<usize>],
        act: &Activations,
        tokens: Range<usize>,
        out_at: SendPtr<f32>,
    ) {
        // Row chunks small enough to balance two threads, large enough that
        // each grab does real work.
        let chunk = 16;
        let n_chunks = part.rows.div_ceil(chunk);
        let pool = candle_core::utils::barrier_pool();
        let work = |range: Range<usize>| {
            let span = range.start * chunk..(range.end * chunk).min(part.rows);
            // Whole chunks are whole groups (of eight or sixteen rows),
            // but for a part whose rows end inside a group (Q8_0, Q5_0).
            let split = span.end.min(self.grouped_rows()).max(span.start);
            let n = self.kind.group_rows();
            let whole = (split / n * n).max(span.start);
            let (grouped, cut, single) = (span.start..whole, whole..split, split..span.end);
            #[cfg(target_arch = "x86_64")]
            if !cut.is_empty() {
                // SAFETY: as below.
                unsafe { self.group_cut_short(isa, part, act, &tokens, cut, out_at) };
            }
            #[cfg(not(target_arch = "x86_64"))]
            debug_assert!(cut.is_empty(), "no interleaved rows here");
            // SAFETY: the CPU has the variant's features (checked just
            // above); each row range is handed out once, so writes never
            // overlap.
            unsafe {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Vnni => {
                        vnni::groups(self, part, act, tokens.clone(), grouped, out_at);
                        let single =
                            self.laid_out_in_passing(isa, part, segs, act, &tokens, single, out_at);
                        // Q8_0 GGUF rows (streamed layers), transposed in
                        // registers.
                        let single =
                            vnni::gguf_q8_0(self, part, segs, act, &tokens, single, out_at);
                        vnni::rows(self, part, segs, act, tokens.clone(), single, out_at)
                    }
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => {
                        avx2::groups(self, part, act, tokens.clone(), grouped, out_at);
                        let single =
                            self.laid_out_in_passing(isa, part, segs, act, &tokens, single, out_at);
                        let single =
                            avx2::gguf_q8_0(self, part, segs, act, &tokens, single, out_at);
                        avx2::rows(self, part, segs, act, tokens.clone(), single, out_at)
                    }
                    // No interleaved rows here (`with_layout`).
                    #[cfg(target_arch = "aarch64")]
                    Isa::Dotprod => {
                        debug_assert!(grouped.is_empty());
                        neon::dotprod::rows(self, part, segs, act, tokens.end, single, out_at)
                    }
                    #[cfg(target_arch = "aarch64")]
                    Isa::I8mm => {
                        debug_assert!(grouped.is_empty());
                        match &act.pairs {
                            Some(pairs) => {
                                mmla::rows(self, part, segs, act, pairs, tokens.end, single, out_at)
                            }
                            None => neon::dotprod::rows(
                                self, part, segs, act, tokens.end, single, out_at,
                            ),
                        }
                    }
                    #[cfg(target_arch = "aarch64")]
                    Isa::Neon => {
                        debug_assert!(grouped.is_empty());
                        neon::plain::rows(self, part, segs, act, tokens.end, single, out_at)
                    }
                }
            };
        };
        pool.execute_chunked(n_chunks, work);
    }
}

impl QWeight {
    /// Rows `rows` of a part whose rows end inside an interleaved group
    /// (`rows` from the group's first row to the part's last): the group is
    /// computed whole, on the side, and those rows' outputs copied out. A
    /// row's bits never depend on the rows beside it, so they are the bits
    /// of the whole matrix.
    ///
    /// # Safety
    /// As the kernels': the CPU has `isa`'s features, `out` holds the
    /// pass's outputs and no other thread writes rows `rows`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn group_cut_short(
        &self,
        isa: Isa,
        part: &Part,
        act: &Activations,
        tokens: &Range<usize>,
        rows: Range<usize>,
        out: SendPtr<f32>,
    ) {
        let n = self.kind.group_rows();
        let (stride, bytes) = (self.cols / self.kind.block_len(), self.kind.group_bytes());
        let g = rows.start / n;
        let group = self.bytes[g * stride * bytes..(g + 1) * stride * bytes].to_vec();
        let whole = Part {
            rows: n,
            blocks: part.blocks.clone(),
        };
        let mut side = vec![0f32; tokens.end * n];
        let at = SendPtr(side.as_mut_ptr());
        // SAFETY: as this function's; `side` holds `tokens.end` rows of `n`.
        unsafe { self.one_group(isa, group, &whole, act, tokens, at) };
        for t in tokens.clone() {
            for (i, r) in rows.clone().enumerate() {
                // SAFETY: row `r` of token `t` within the pass's outputs.
                unsafe { *out.get().add(t * part.rows + r) = side[t * n + i] };
            }
        }
    }

    /// GGUF rows `single` of a K-quant or Q5_0 weight (a streamed layer)
    /// in a pass of at least [`LAID_OUT_FROM`] tokens (Q5_0, whose layout is
    /// cheaper: half that): each group of rows
    /// is laid out as the resident layers are (a copy of the group's
    /// bytes, on this thread) and multiplied by the group kernels, which
    /// pays for the copy from that many tokens on. The same bits. Returns
    /// the rows left for the row kernels (those after the last whole group;
    /// all of them for fewer tokens, other types, or several segments).
    ///
    /// # Safety
    /// As the kernels': the CPU has `isa`'s features, `out` holds the
    /// pass's outputs and no other thread writes rows `single`.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn laid_out_in_passing(
        &self,
        isa: Isa,
        part: &Part,
        segs: &[Range<usize>],
        act: &Activations,
        tokens: &Range<usize>,
        single: Range<usize>,
        out: SendPtr<f32>,
    ) -> Range<usize> {
        let n = self.kind.group_rows();
        let layout: fn(&[u8], usize, usize) -> Vec<u8> = match self.kind {
            Kind::Q4K => q4k8::interleave,
            // AVX2's Q6_K group kernel gains less than the copy costs.
            Kind::Q6K if isa == Isa::Avx2 => return single,
            Kind::Q6K => q6k8::interleave,
            Kind::Q5_0 => q8x16::interleave_q5_0,
            // Q8_0 GGUF rows are transposed in registers (`gguf_q8_0`).
            Kind::Q8_0 => return single,
        };
        let from = match self.kind {
            Kind::Q5_0 => LAID_OUT_FROM / 2,
            _ => LAID_OUT_FROM,
        };
        if tokens.len() < from || segs.len() != 1 || single.len() < n {
            return single;
        }
        let nb = self.cols / self.kind.block_len();
        let row_bytes = nb * self.kind.block_bytes();
        let whole = single.start + single.len() / n * n;
        for r in (single.start..whole).step_by(n) {
            let group = layout(&self.bytes[r * row_bytes..(r + n) * row_bytes], n, nb);
            // Row `r`'s outputs; `part.rows` apart per token as before.
            let out = SendPtr(out.get().wrapping_add(r));
            // SAFETY: as this function's.
            unsafe { self.one_group(isa, group, part, act, tokens, out) };
        }
        whole..single.end
    }

    /// `bytes`, one group of this weight's rows in its interleaved layout
    /// (over all its columns), multiplied by `isa`'s group kernels over
    /// `part.blocks`: the group's outputs go to `out`, `part.rows` apart
    /// per token.
    ///
    /// # Safety
    /// As [`Self::laid_out_in_passing`], for the group's rows at `out`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn one_group(
        &self,
        isa: Isa,
        bytes: Vec<u8>,
        part: &Part,
        act: &Activations,
        tokens: &Range<usize>,
        out: SendPtr<f32>,
    ) {
        let n = self.kind.group_rows();
        let group = QWeight {
            kind: self.kind,
            rows: n,
            cols: self.cols,
            bytes: Store::owned(bytes),
            grouped: n,
        };
        // SAFETY: as this function's.
        unsafe {
            match isa {
                Isa::Vnni => vnni::groups(&group, part, act, tokens.clone(), 0..n, out),
                Isa::Avx2 => avx2::groups(&group, part, act, tokens.clone(), 0..n, out),
            }
        }
    }
}

/// Tokens in a pass from which streamed K-quant rows are laid out in
/// passing (see [`QWeight::laid_out_in_passing`]). `qmm_rows --streamed`,
/// Intel VM kind, 2 threads: a Q4_K 8960×1536 pass of 8 rows costs about
/// the same either way (1.2 ms), of 16 rows 2.46 ms row at a time against
/// 1.45 laid out.
#[cfg(target_arch = "x86_64")]
const LAID_OUT_FROM: usize = 16;

/// A part of a weight matrix: its first `rows` rows, over a range of
/// each row's blocks (see [`QWeight::part`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) rows: usize,
    pub(crate) blocks: Range<usize>,
}

/// A pointer the pool's threads write through, each to its own elements,
/// while the caller holds the buffer (the output of `matmul_on`, the blocks
/// of `quantize_rows`).
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: see above: writes through it never overlap, and the buffer
// outlives the pool call that uses it.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `SendPtr`).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// The tokens quantized for the weight's kernel: Q8_0 blocks for Q8_0
/// weights (scales widened to f32 once), Q8_K blocks for the K-quants.
struct Activations {
    /// Q8_0: 32 quants per block. Q8_K: candle's blocks, for Q4_K with pair
    /// sums in place of the 16-quant sums, for Q6_K and several tokens on
    /// x86 each followed by 256 bytes of offset sums.
    bytes: Vec<u8>,
    /// Q8_0 block scales as f32 (empty for Q8_K).
    scales: Vec<f32>,
    /// Q8_0 on x86: each block's sum of quants (for the group kernels'
    /// unsigned weights, [`q8x16`]); empty for Q8_K and elsewhere.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    sums: Vec<i32>,
    /// Bytes per token.
    stride: usize,
    /// The tokens in pairs, for the `smmla` kernels (i8mm, two tokens or
    /// more).
    #[cfg(target_arch = "aarch64")]
    pairs: Option<mmla::Pairs>,
}

impl Activations {
    fn quantize(kind: Kind, x: &[f32], m: usize, cols: usize) -> Activations {
        let nb = cols / kind.block_len();
        match kind {
            Kind::Q5_0 | Kind::Q8_0 => {
                let blocks = quantize_rows(x, m, cols, nb, quantize::q8_0);
                let raw = as_bytes(&blocks);
                let mut bytes = Vec::with_capacity(m * nb * 32);
                let mut scales = Vec::with_capacity(m * nb);
                let mut sums = Vec::with_capacity(m * nb);
                for b in raw.chunks_exact(34) {
                    scales.push(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
                    bytes.extend_from_slice(&b[2..]);
                    if cfg!(target_arch = "x86_64") {
                        sums.push(b[2..].iter().map(|&q| i32::from(q as i8)).sum());
                    }
                }
                Activations {
                    bytes,
                    scales,
                    sums,
                    stride: nb * 32,
                    #[cfg(target_arch = "aarch64")]
                    pairs: None,
                }
            }
            Kind::Q4K | Kind::Q6K => {
                let blocks = quantize_rows(x, m, cols, nb, quantize::q8k);
                let mut bytes = as_bytes(&blocks).to_vec();
                let block = if kind == Kind::Q4K {
                    // The Q4_K kernel only needs the sums of 32 quants (for
                    // the sub-block mins): pairs of the 16-quant sums, added
                    // as `_mm_hadd_epi16` would, in place of those.
                    for block in bytes.chunks_exact_mut(Q8K_BYTES) {
                        let sums = &mut block[Q8K_SUMS..];
                        for i in 0..8 {
                            let at = |j: usize| i16::from_le_bytes([sums[2 * j], sums[2 * j + 1]]);
                            let pair = at(2 * i).wrapping_add(at(2 * i + 1));
                            sums[2 * i..2 * i + 2].copy_from_slice(&pair.to_le_bytes());
                        }
                    }
                    Q8K_BYTES
                } else if m > 1 && cfg!(target_arch = "x86_64") {
                    // Tokens sharing a decoded block each save a multiply
                    // per 32 quants by loading these; a lone token computes
                    // them (loading twice the activations costs more). The
                    // NEON kernels take `q - 32` as i8 and need none.
                    bytes = with_offset_sums(&bytes);
                    Q6K_ACT
                } else {
                    Q8K_BYTES
                };
                Activations {
                    bytes,
                    scales: Vec::new(),
                    sums: Vec::new(),
                    stride: nb * block,
                    #[cfg(target_arch = "aarch64")]
                    pairs: None,
                }
            }
        }
    }
}

/// Q8_K blocks each followed by what the Q6_K kernel subtracts for the
/// quants' offset of 32: `32 * (q[2j] + q[2j + 1])` as i16, 16 per 32
/// quants (what `_mm256_maddubs_epi16` of 32s and the quants gives).
fn with_offset_sums(blocks: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks.len() / Q8K_BYTES * Q6K_ACT);
    for block in blocks.chunks_exact(Q8K_BYTES) {
        out.extend_from_slice(block);
        for pair in block[4..4 + 256].chunks_exact(2) {
            let v = 32 * (pair[0] as i8 as i16 + pair[1] as i8 as i16);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Quantizes the `m` rows of `x` with `quantize` (candle's `from_float`,
/// in vector registers: [`quantize`]; on the thread pool when there are
/// several).
fn quantize_rows<B: CandleBlock>(
    x: &[f32],
    m: usize,
    cols: usize,
    nb: usize,
    quantize: fn(&[f32], &mut [B]),
) -> Vec<B> {
    let mut blocks = vec![B::zeros(); m * nb];
    let at = SendPtr(blocks.as_mut_ptr());
    let one = |t: usize| {
        // SAFETY: each row `t` is quantized once, into its own `nb` blocks.
        let dst = unsafe { std::slice::from_raw_parts_mut(at.get().add(t * nb), nb) };
        quantize(&x[t * cols..][..cols], dst);
    };
    if m < 4 {
        (0..m).for_each(one);
    } else {
        candle_core::utils::barrier_pool().execute_chunked(m, |range| range.for_each(one));
    }
    blocks
}

/// Activation bytes of the tokens one pass over a matrix's rows takes at
/// a time (see [`QWeight::matmul_sum`]): well inside a core's L2 beside
/// the rows' weights.
const TOKEN_BLOCK_BYTES: usize = 512 << 10;

/// Bytes of candle's Q8_K block: f32 scale, 256 quants, 16 i16 sums.
const Q8K_BYTES: usize = 4 + 256 + 32;
/// Where the sums start in a Q8_K block.
const Q8K_SUMS: usize = 4 + 256;
/// Bytes per block of a Q6_K kernel's activations: the Q8_K block, then
/// 256 bytes of offset sums (see [`with_offset_sums`]).
const Q6K_ACT: usize = Q8K_BYTES + 256;
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == Q8K_BYTES);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

fn as_bytes<T>(blocks: &[T]) -> &[u8] {
    // SAFETY: candle's blocks are `repr(C)` structs of plain numbers with no
    // padding (sizes asserted above and in candle), so every byte is
    // initialised.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr() as *const u8, std::mem::size_of_val(blocks))
    }
}

/// The kernels, compiled once per instruction set: `avx2` everywhere, and
/// `vnni` with AVX-512 VNNI, whose fused integer multiply-adds give exactly
/// the same integer sums, so both produce the same bits; `vnni` sends
/// interleaved K-quant rows to the 512-bit group kernels (`qmm/zmm.rs`), which
/// multiply each decoded vector into eight tokens.
#[cfg(target_arch = "x86_64")]
macro_rules! kernels {
    ($name:ident, $features:literal, vnni: $vnni:literal) => {
        pub(super) mod $name {
            use super::{Activations, Kind, Part, Q6K_ACT, Q8K_BYTES, Q8K_SUMS, QWeight, SendPtr};
            use std::arch::x86_64::*;
            use std::ops::Range;
            use std::ptr::read_unaligned;

            const VNNI: bool = $vnni;
            /// Tokens multiplied by one decoded weight block: a Q8_0 block
            /// decodes in one load, K-quant blocks take registers to hold.
            const TILE_Q8: usize = 8;
            const TILE_K: usize = if VNNI { 8 } else { 4 };
            const TILE: usize = if TILE_Q8 > TILE_K { TILE_Q8 } else { TILE_K };
            /// Rows computed side by side for a single token.
            const ROWS: usize = 4;

            /// Rows whose accumulators are held while a batch walks the
            /// weight rows' blocks in chunks.
            const GROUP: usize = 16;

            /// Computes output rows `rows` for all `m` tokens.
            ///
            /// For each group of rows and tile of tokens, the blocks of a
            /// row are taken a chunk at a time, every row of the group
            /// before the next chunk, so the tile's activations for the
            /// chunk stay in L1 (a Q6_K row of 8960 against 8 tokens would
            /// otherwise stream 150 KiB of activations from L2 per row).
            /// Each (row, token) accumulator still sees every block in
            /// order: the result is the same as one pass.
            ///
            /// # Safety
            /// The CPU has the module's features; `out` points to
            /// `m * w.rows` floats and no other thread writes these rows.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn rows(
                w: &QWeight,
                part: &Part,
                segs: &[Range<usize>],
                act: &Activations,
                tokens: Range<usize>,
                rows: Range<usize>,
                out: SendPtr<f32>,
            ) {
                let m = tokens.end;
                // Blocks computed per row; a row's blocks are a stride.
                let nb = part.blocks.len();
                let row_bytes = w.cols / w.kind.block_len() * w.kind.block_bytes();
                let base = unsafe {
                    w.bytes
                        .as_ptr()
                        .add(part.blocks.start * w.kind.block_bytes())
                };
                let width = if matches!(w.kind, Kind::Q5_0 | Kind::Q8_0) {
                    TILE_Q8
                } else {
                    TILE_K
                };
                // Blocks per chunk: about 12 KiB of an 8-token tile's
                // activations (half that for AVX2's 4-token K-quant tiles).
                let chunk = match w.kind {
                    Kind::Q5_0 | Kind::Q8_0 => 48,
                    Kind::Q4K => 6,
                    Kind::Q6K => 3,
                };
                // Accumulators between chunks (untouched when a row is one
                // chunk: the kernel then keeps them in registers).
                let mut acc = [[_mm256_setzero_ps(); TILE]; GROUP];
                let mut acc_m = [[_mm_setzero_ps(); TILE]; GROUP];
                let mut g0 = rows.start;
                while g0 < rows.end {
                    let g1 = (g0 + GROUP).min(rows.end);
                    let mut t0 = tokens.start;
                    while t0 < m {
                        let n = (m - t0).min(width);
                        // Chunk only when the tile's whole rows of
                        // activations would not fit L1 (the jumps between
                        // rows then defeat the hardware prefetcher, so
                        // `tile` prefetches each row's next chunk).
                        let step = if n * act.stride <= 24 << 10 {
                            nb
                        } else {
                            chunk
                        };
                        // Segment by segment (see `QWeight::matmul_sum`),
                        // each from zero, its sum added to the last's.
                        let chunks = segs.iter().enumerate().flat_map(|(k, seg)| {
                            (seg.start..seg.end)
                                .step_by(step)
                                .map(move |b0| (k > 0, b0..(b0 + step).min(seg.end), seg.clone()))
                        });
                        for (add, blocks, seg) in chunks {
                            let mut r = g0;
                            while r < g1 {
                                // A lone token takes several rows at once,
                                // so that their (serial) accumulations
                                // overlap; so do up to four tokens against
                                // Q8_0 and Q5_0 rows (a 2-, 3- or 4-row
                                // pass of the 0.5B cost 1.6-1.9 one-row
                                // passes, now 1.0-1.4).
                                let several = match w.kind {
                                    Kind::Q6K => false,
                                    Kind::Q4K => n == 1,
                                    Kind::Q5_0 | Kind::Q8_0 => n <= 4,
                                };
                                let g = if several && g1 - r >= ROWS { ROWS } else { 1 };
                                let at = Tile {
                                    w,
                                    base,
                                    nb,
                                    out_rows: part.rows,
                                    row_bytes,
                                    r,
                                    act,
                                    t0,
                                    first: blocks.start == seg.start,
                                    last: blocks.end == seg.end,
                                    add,
                                    blocks: blocks.clone(),
                                    // From the whole arrays: a kernel call
                                    // may cover several rows.
                                    acc: acc
                                        .as_mut_ptr()
                                        .cast::<__m256>()
                                        .wrapping_add((r - g0) * TILE),
                                    acc_m: acc_m
                                        .as_mut_ptr()
                                        .cast::<__m128>()
                                        .wrapping_add((r - g0) * TILE),
                                    out,
                                };
                                unsafe {
                                    match (n, g) {
                                        (1, ROWS) => tile::<ROWS, 1>(at),
                                        (2, ROWS) => tile::<ROWS, 2>(at),
                                        (3, ROWS) => tile::<ROWS, 3>(at),
                                        (4, ROWS) => tile::<ROWS, 4>(at),
                                        (1, _) => tile::<1, 1>(at),
                                        (2, _) => tile::<1, 2>(at),
                                        (3, _) => tile::<1, 3>(at),
                                        (4, _) => tile::<1, 4>(at),
                                        (5, _) => tile::<1, 5>(at),
                                        (6, _) => tile::<1, 6>(at),
                                        (7, _) => tile::<1, 7>(at),
                                        (8, _) => tile::<1, 8>(at),
                                        _ => unreachable!("tiles hold at most {TILE} tokens"),
                                    }
                                }
                                r += g;
                            }
                        }
                        t0 += n;
                    }
                    g0 = g1;
                }
            }

            /// Where one kernel call reads and accumulates: rows `r..r + R`
            /// and tokens `t0..t0 + T`, over `blocks`; accumulator (i, t)
            /// at `acc + i * TILE + t` (and `acc_m`, for Q4_K's mins),
            /// starting from zero on the `first` chunk and written to `out`
            /// as results after the `last` (added to it, if `add`).
            struct Tile<'a> {
                w: &'a QWeight,
                /// The first block of row 0 in the part; `nb` blocks of
                /// each row are computed, rows `row_bytes` apart, into an
                /// output of `out_rows` values per token.
                base: *const u8,
                nb: usize,
                out_rows: usize,
                row_bytes: usize,
                r: usize,
                act: &'a Activations,
                t0: usize,
                first: bool,
                last: bool,
                add: bool,
                blocks: Range<usize>,
                acc: *mut __m256,
                acc_m: *mut __m128,
                out: SendPtr<f32>,
            }

            #[target_feature(enable = $features)]
            unsafe fn tile<const R: usize, const T: usize>(at: Tile<'_>) {
                let Tile {
                    w,
                    base,
                    nb,
                    out_rows,
                    row_bytes,
                    r,
                    act,
                    t0,
                    first,
                    last,
                    add,
                    blocks,
                    acc,
                    acc_m,
                    out,
                } = at;
                const { assert!(T <= TILE && R <= ROWS) };
                let wr: [*const u8; R] =
                    std::array::from_fn(|i| unsafe { base.add((r + i) * row_bytes) });
                let a: [*const u8; T] = std::array::from_fn(|t| unsafe {
                    act.bytes.as_ptr().add((t0 + t) * act.stride)
                });
                if R > 1 {
                    // Interleaved rows hide the hardware prefetcher's
                    // stream: fetch the rows four groups ahead ourselves.
                    prefetch(wr[0].wrapping_add(4 * R * row_bytes), R * row_bytes);
                }
                if !last {
                    let bb = w.kind.block_bytes();
                    prefetch(wr[0].wrapping_add(blocks.end * bb), blocks.len() * bb);
                }
                let mut main = [[_mm256_setzero_ps(); T]; R];
                let mut mins = [[_mm_setzero_ps(); T]; R];
                if !first {
                    for i in 0..R {
                        for t in 0..T {
                            unsafe {
                                main[i][t] = *acc.add(i * TILE + t);
                                mins[i][t] = *acc_m.add(i * TILE + t);
                            }
                        }
                    }
                }
                unsafe {
                    match w.kind {
                        Kind::Q5_0 | Kind::Q8_0 => {
                            let s: [*const f32; T] =
                                std::array::from_fn(|t| act.scales.as_ptr().add((t0 + t) * nb));
                            if w.kind == Kind::Q5_0 {
                                q8_0::<R, T, true>(wr, blocks, a, s, &mut main)
                            } else {
                                q8_0::<R, T, false>(wr, blocks, a, s, &mut main)
                            }
                        }
                        Kind::Q4K => q4k::<R, T>(wr, blocks, a, &mut main, &mut mins),
                        Kind::Q6K if act.stride == nb * Q6K_ACT => {
                            q6k::<R, T, true>(wr, blocks, a, &mut main)
                        }
                        Kind::Q6K => q6k::<R, T, false>(wr, blocks, a, &mut main),
                    }
                }
                for i in 0..R {
                    for t in 0..T {
                        if !last {
                            unsafe {
                                *acc.add(i * TILE + t) = main[i][t];
                                *acc_m.add(i * TILE + t) = mins[i][t];
                            }
                            continue;
                        }
                        // One value per accumulator, in every lane.
                        let v = match w.kind {
                            Kind::Q4K => _mm256_cvtss_f32(main[i][t]) + _mm_cvtss_f32(mins[i][t]),
                            _ => _mm256_cvtss_f32(main[i][t]),
                        };
                        let o = unsafe { out.get().add((t0 + t) * out_rows + r + i) };
                        unsafe { *o = if add { *o + v } else { v } };
                    }
                }
            }

            /// Tokens multiplied by one decoded group block of eight
            /// interleaved K-quant rows (the 512-bit kernels' registers
            /// hold eight tokens' sums).
            const TILE_Q4: usize = if VNNI { 8 } else { 2 };
            /// The same for sixteen Q8_0 or Q5_0 rows.
            const TILE_Q8G: usize = if VNNI { 8 } else { 4 };

            /// Computes output rows `rows` (whole groups of interleaved
            /// rows: eight K-quant rows, see [`super::q4k8`] and
            /// [`super::q6k8`], or sixteen Q8_0 or Q5_0 rows,
            /// [`super::q8x16`]) for all `m` tokens: each group block is
            /// decoded once per tile of tokens.
            ///
            /// # Safety
            /// As [`rows`]; `rows` starts and ends on group boundaries.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn groups(
                w: &QWeight,
                part: &Part,
                act: &Activations,
                tokens: Range<usize>,
                rows: Range<usize>,
                out: SendPtr<f32>,
            ) {
                let m = tokens.end;
                let n_rows = w.kind.group_rows();
                debug_assert!(
                    rows.start % n_rows == 0 && rows.end % n_rows == 0 && rows.end <= w.rows
                );
                // Group blocks per group, and those computed.
                let (stride, nb) = (w.cols / w.kind.block_len(), part.blocks.len());
                let (bytes, tile) = match w.kind {
                    Kind::Q4K => (super::q4k8::BYTES, TILE_Q4),
                    Kind::Q6K => (super::q6k8::BYTES, TILE_Q4),
                    Kind::Q8_0 => (super::q8x16::Q8_BYTES, TILE_Q8G),
                    Kind::Q5_0 => (super::q8x16::Q5_BYTES, TILE_Q8G),
                };
                for r in rows.step_by(n_rows) {
                    let at = (r / n_rows * stride + part.blocks.start) * bytes;
                    let g = unsafe { w.bytes.as_ptr().add(at) };
                    let mut t0 = tokens.start;
                    while t0 < m {
                        let n = (m - t0).min(tile);
                        let at = Group {
                            g,
                            nb,
                            out_rows: part.rows,
                            r,
                            act,
                            t0,
                            out,
                        };
                        unsafe {
                            match (w.kind, n) {
                                (Kind::Q4K, 1) => q4k8_any::<1>(at),
                                (Kind::Q4K, 2) => q4k8_any::<2>(at),
                                (Kind::Q4K, 3) => q4k8_any::<3>(at),
                                (Kind::Q4K, 4) => q4k8_any::<4>(at),
                                (Kind::Q4K, 5) => q4k8_any::<5>(at),
                                (Kind::Q4K, 6) => q4k8_any::<6>(at),
                                (Kind::Q4K, 7) => q4k8_any::<7>(at),
                                (Kind::Q4K, 8) => q4k8_any::<8>(at),
                                (Kind::Q8_0, 1) => q8x16_any::<1, false>(at),
                                (Kind::Q8_0, 2) => q8x16_any::<2, false>(at),
                                (Kind::Q8_0, 3) => q8x16_any::<3, false>(at),
                                (Kind::Q8_0, 4) => q8x16_any::<4, false>(at),
                                (Kind::Q8_0, 5) => q8x16_any::<5, false>(at),
                                (Kind::Q8_0, 6) => q8x16_any::<6, false>(at),
                                (Kind::Q8_0, 7) => q8x16_any::<7, false>(at),
                                (Kind::Q8_0, 8) => q8x16_any::<8, false>(at),
                                (Kind::Q5_0, 1) => q8x16_any::<1, true>(at),
                                (Kind::Q5_0, 2) => q8x16_any::<2, true>(at),
                                (Kind::Q5_0, 3) => q8x16_any::<3, true>(at),
                                (Kind::Q5_0, 4) => q8x16_any::<4, true>(at),
                                (Kind::Q5_0, 5) => q8x16_any::<5, true>(at),
                                (Kind::Q5_0, 6) => q8x16_any::<6, true>(at),
                                (Kind::Q5_0, 7) => q8x16_any::<7, true>(at),
                                (Kind::Q5_0, 8) => q8x16_any::<8, true>(at),
                                (_, 1) => q6k8_any::<1>(at),
                                (_, 2) => q6k8_any::<2>(at),
                                (_, 3) => q6k8_any::<3>(at),
                                (_, 4) => q6k8_any::<4>(at),
                                (_, 5) => q6k8_any::<5>(at),
                                (_, 6) => q6k8_any::<6>(at),
                                (_, 7) => q6k8_any::<7>(at),
                                (_, 8) => q6k8_any::<8>(at),
                                _ => unreachable!("group tiles hold at most {tile} tokens"),
                            }
                        }
                        t0 += n;
                    }
                }
            }

            /// Q4_K group tiles: 512-bit `vpdpbusd` where the module has
            /// VNNI ([`super::zmm`]), else 256-bit; the same bits.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q4k8_any<const T: usize>(at: Group<'_>) {
                let (a, o) = at.tokens::<T>();
                if VNNI {
                    // SAFETY: this module's CPU has AVX-512 VNNI.
                    #[allow(unused_unsafe)]
                    unsafe {
                        super::zmm::q4k8::<T>(at.g, at.nb, a, o)
                    }
                } else {
                    unsafe { q4k8::<T>(at.g, at.nb, a, o) }
                }
            }

            /// Q6_K group tiles, as [`q4k8_any`]; the activations' blocks
            /// may carry the row kernels' offset sums (`block` bytes each).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6k8_any<const T: usize>(at: Group<'_>) {
                let (a, o) = at.tokens::<T>();
                let block = at.act.stride / at.nb;
                if VNNI {
                    // SAFETY: this module's CPU has AVX-512 VNNI.
                    #[allow(unused_unsafe)]
                    unsafe {
                        super::zmm::q6k8::<T>(at.g, at.nb, a, block, o)
                    }
                } else {
                    unsafe { q6k8::<T>(at.g, at.nb, a, block, o) }
                }
            }

            /// Q8_0 (`Q5`: Q5_0) group tiles: 512-bit `vpdpbusd` where the
            /// module has VNNI ([`super::zmm`]), else 256-bit; the same
            /// bits.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q8x16_any<const T: usize, const Q5: bool>(at: Group<'_>) {
                let (a, o) = at.tokens::<T>();
                let (s, sums) = at.q8_scales::<T>();
                if VNNI {
                    // SAFETY: this module's CPU has AVX-512 VNNI.
                    #[allow(unused_unsafe)]
                    unsafe {
                        super::zmm::q8x16::<T, Q5>(at.g, at.nb, a, s, sums, o)
                    }
                } else {
                    unsafe { q8x16::<T, Q5>(at.g, at.nb, a, s, sums, o) }
                }
            }

            /// Sixteen interleaved Q8_0 rows (`Q5`: Q5_0 rows) against `T`
            /// tokens' Q8_0 quants `a`, scales `s` and block sums `sums`,
            /// 256 bits at a time: rows 0..8 from the low half of each
            /// group vector, then rows 8..16 from the high half. Q8_0
            /// weights go back to i8 and multiply as ggml's do (`|w|` by
            /// `y` with `w`'s sign); Q5_0's `q` (0..32) multiply `y` and
            /// the kernel subtracts `16 Σ y`. Each row's block sum is the
            /// same exact integer as the 512-bit kernel's.
            #[target_feature(enable = $features)]
            unsafe fn q8x16<const T: usize, const Q5: bool>(
                g: *const u8,
                nb: usize,
                a: [*const u8; T],
                s: [*const f32; T],
                sums: [*const i32; T],
                out: [*mut f32; T],
            ) {
                use super::q8x16::{Q5_BYTES, Q5_MASKS_AT, Q5_NIBBLES_AT, Q8_BYTES, Q8_QUANTS_AT};
                let bytes = if Q5 { Q5_BYTES } else { Q8_BYTES };
                let m4 = _mm256_set1_epi8(0xF);
                let mut acc = [[_mm256_setzero_ps(); 2]; T];
                for b in 0..nb {
                    let blk = unsafe { g.add(b * bytes) };
                    prefetch_group(blk.wrapping_add(8 * bytes), bytes, T);
                    for h in 0..2 {
                        let wd = _mm256_cvtph_ps(unsafe {
                            _mm_loadu_si128(blk.add(16 * h) as *const __m128i)
                        });
                        let mut sumi = [_mm256_setzero_si256(); T];
                        for v in 0..8 {
                            let (x, ax) = if Q5 {
                                let n =
                                    unsafe { load(blk.add(Q5_NIBBLES_AT + 64 * (v % 4) + 32 * h)) };
                                let n = if v < 4 { n } else { _mm256_srli_epi16(n, 4) };
                                let bits = unsafe {
                                    read_unaligned(
                                        blk.add(Q5_MASKS_AT + 8 * v + 4 * h) as *const u32
                                    )
                                };
                                let q = _mm256_or_si256(_mm256_and_si256(n, m4), high_bits(bits));
                                (q, q)
                            } else {
                                let u = unsafe { load(blk.add(Q8_QUANTS_AT + 64 * v + 32 * h)) };
                                let x = _mm256_xor_si256(u, _mm256_set1_epi8(0x80u8 as i8));
                                (x, _mm256_sign_epi8(x, x))
                            };
                            for t in 0..T {
                                let y = unsafe {
                                    read_unaligned(a[t].add(b * 32 + 4 * v) as *const i32)
                                };
                                let y = _mm256_set1_epi32(y);
                                let y = if Q5 { y } else { _mm256_sign_epi8(y, x) };
                                sumi[t] = _mm256_add_epi32(sumi[t], dot4(ax, y));
                            }
                        }
                        for t in 0..T {
                            let (ys, yd) = unsafe { (*sums[t].add(b), *s[t].add(b)) };
                            let sumi = if Q5 {
                                _mm256_sub_epi32(sumi[t], _mm256_set1_epi32(16 * ys))
                            } else {
                                sumi[t]
                            };
                            let d = _mm256_mul_ps(wd, _mm256_set1_ps(yd));
                            acc[t][h] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t][h]);
                        }
                    }
                }
                for t in 0..T {
                    unsafe {
                        _mm256_storeu_ps(out[t], acc[t][0]);
                        _mm256_storeu_ps(out[t].add(8), acc[t][1]);
                    }
                }
            }

            /// GGUF rows of a Q8_0 weight (as streamed layers hold them)
            /// at a time: sixteen with VNNI, eight without.
            const GGUF_Q8_ROWS: usize = if VNNI { 16 } else { 8 };

            /// Rows `single` of `w` (GGUF rows) for tokens `tokens`, when
            /// `w` is Q8_0 and the part one segment: whole groups of
            /// [`GGUF_Q8_ROWS`] rows, each block of them transposed in
            /// registers so that a row's block sum is one lane's, as in
            /// [`q8x16`] (the same bits). Returns the rows left for the
            /// row kernels.
            ///
            /// # Safety
            /// As [`rows`].
            #[target_feature(enable = $features)]
            pub(super) unsafe fn gguf_q8_0(
                w: &QWeight,
                part: &Part,
                segs: &[Range<usize>],
                act: &Activations,
                tokens: &Range<usize>,
                single: Range<usize>,
                out: SendPtr<f32>,
            ) -> Range<usize> {
                if w.kind != Kind::Q8_0 || segs.len() != 1 {
                    return single;
                }
                let whole = single.start + single.len() / GGUF_Q8_ROWS * GGUF_Q8_ROWS;
                let nb = part.blocks.len();
                let row_bytes = w.cols / 32 * 34;
                for r in (single.start..whole).step_by(GGUF_Q8_ROWS) {
                    // SAFETY (pointer arithmetic): within the weight.
                    let g = unsafe { w.bytes.as_ptr().add(r * row_bytes + part.blocks.start * 34) };
                    let mut t0 = tokens.start;
                    while t0 < tokens.end {
                        let n = (tokens.end - t0).min(TILE_Q8G);
                        let at = Group {
                            g,
                            nb,
                            out_rows: part.rows,
                            r,
                            act,
                            t0,
                            out,
                        };
                        unsafe {
                            match n {
                                1 => gguf_q8_0_any::<1>(at, row_bytes),
                                2 => gguf_q8_0_any::<2>(at, row_bytes),
                                3 => gguf_q8_0_any::<3>(at, row_bytes),
                                4 => gguf_q8_0_any::<4>(at, row_bytes),
                                5 => gguf_q8_0_any::<5>(at, row_bytes),
                                6 => gguf_q8_0_any::<6>(at, row_bytes),
                                7 => gguf_q8_0_any::<7>(at, row_bytes),
                                8 => gguf_q8_0_any::<8>(at, row_bytes),
                                _ => unreachable!("tiles hold at most {TILE_Q8G} tokens"),
                            }
                        }
                        t0 += n;
                    }
                }
                whole..single.end
            }

            /// One tile of [`gguf_q8_0`]: the 512-bit kernel
            /// ([`super::zmm::gguf_q8_0_tile`]) where the module has VNNI,
            /// else the 256-bit one; the same bits.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn gguf_q8_0_any<const T: usize>(at: Group<'_>, row_bytes: usize) {
                let (a, o) = at.tokens::<T>();
                let (s, sums) = at.q8_scales::<T>();
                if VNNI {
                    // SAFETY: this module's CPU has AVX-512 VNNI.
                    #[allow(unused_unsafe)]
                    unsafe {
                        super::zmm::gguf_q8_0_tile::<T>(at.g, row_bytes, at.nb, a, s, sums, o)
                    }
                } else {
                    unsafe { gguf_q8_0_tile::<T>(at.g, row_bytes, at.nb, a, s, o) }
                }
            }

            /// Eight GGUF Q8_0 rows at `base`, `row_bytes` apart, against
            /// `T` tokens' quants `a` and scales `s`: results to `out[t]`
            /// (the VNNI module's [`gguf_q8_0_any`] takes the 512-bit
            /// kernel instead).
            #[cfg_attr($vnni, allow(dead_code))]
            #[target_feature(enable = $features)]
            unsafe fn gguf_q8_0_tile<const T: usize>(
                base: *const u8,
                row_bytes: usize,
                nb: usize,
                a: [*const u8; T],
                s: [*const f32; T],
                out: [*mut f32; T],
            ) {
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let blk = unsafe { base.add(b * 34) };
                    if b % 2 == 0 {
                        for i in 0..8 {
                            _mm_prefetch::<_MM_HINT_T0>(
                                blk.wrapping_add(i * row_bytes + 8 * 34) as *const i8
                            );
                        }
                    }
                    let z: [__m256i; 8] =
                        std::array::from_fn(|i| unsafe { load(blk.add(i * row_bytes + 2)) });
                    // An 8×8 transpose of 32-bit words: vector j holds
                    // quants 4j..4j + 4 of the eight rows, in row order.
                    let t: [__m256i; 8] = std::array::from_fn(|k| {
                        let (x, y) = (z[2 * (k / 2)], z[2 * (k / 2) + 1]);
                        if k % 2 == 0 {
                            _mm256_unpacklo_epi32(x, y)
                        } else {
                            _mm256_unpackhi_epi32(x, y)
                        }
                    });
                    let u: [__m256i; 8] = std::array::from_fn(|k| {
                        let (c, g) = (k % 4, 4 * (k / 4));
                        let (x, y) = (t[g + (c / 2)], t[g + 2 + (c / 2)]);
                        if c % 2 == 0 {
                            _mm256_unpacklo_epi64(x, y)
                        } else {
                            _mm256_unpackhi_epi64(x, y)
                        }
                    });
                    let q: [__m256i; 8] = std::array::from_fn(|j| {
                        if j < 4 {
                            _mm256_permute2x128_si256::<0x20>(u[j], u[j + 4])
                        } else {
                            _mm256_permute2x128_si256::<0x31>(u[j - 4], u[j])
                        }
                    });
                    let mut sumi = [_mm256_setzero_si256(); T];
                    for (v, q) in q.iter().enumerate() {
                        // ggml's sign trick: |q| times y with q's sign.
                        let aq = _mm256_sign_epi8(*q, *q);
                        for t in 0..T {
                            let y =
                                unsafe { read_unaligned(a[t].add(b * 32 + 4 * v) as *const i32) };
                            let y = _mm256_sign_epi8(_mm256_set1_epi32(y), *q);
                            sumi[t] = _mm256_add_epi32(sumi[t], dot4(aq, y));
                        }
                    }
                    let d: [u16; 8] = std::array::from_fn(|i| unsafe {
                        read_unaligned(blk.add(i * row_bytes) as *const u16)
                    });
                    let wd =
                        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(d.as_ptr() as *const __m128i) });
                    for t in 0..T {
                        let yd = _mm256_set1_ps(unsafe { *s[t].add(b) });
                        let dd = _mm256_mul_ps(wd, yd);
                        acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
                    }
                }
                for t in 0..T {
                    unsafe { _mm256_storeu_ps(out[t], acc[t]) };
                }
            }

            /// Byte `j` = 16 where bit `j` of `bits` is set, else 0.
            #[inline]
            #[target_feature(enable = $features)]
            fn high_bits(bits: u32) -> __m256i {
                let spread = _mm256_shuffle_epi8(
                    _mm256_set1_epi32(bits as i32),
                    _mm256_set_epi64x(
                        0x0303030303030303,
                        0x0202020202020202,
                        0x0101010101010101,
                        0,
                    ),
                );
                let set = _mm256_cmpeq_epi8(
                    _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                    _mm256_set1_epi8(-1),
                );
                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
            }

            /// One group kernel call: the `nb` group blocks at `g` (rows
            /// `r..r + 8`, or `r..r + 16`) against tokens `t0..t0 + T`.
            struct Group<'a> {
                g: *const u8,
                nb: usize,
                /// Output values per token.
                out_rows: usize,
                r: usize,
                act: &'a Activations,
                t0: usize,
                out: SendPtr<f32>,
            }

            impl Group<'_> {
                /// Where tokens `t0..t0 + T`' activations are read and
                /// their eight outputs written.
                fn tokens<const T: usize>(&self) -> ([*const u8; T], [*mut f32; T]) {
                    // SAFETY (pointer arithmetic): within the activations
                    // and the output the caller holds.
                    let a = std::array::from_fn(|t| unsafe {
                        self.act.bytes.as_ptr().add((self.t0 + t) * self.act.stride)
                    });
                    let o = std::array::from_fn(|t| unsafe {
                        self.out.get().add((self.t0 + t) * self.out_rows + self.r)
                    });
                    (a, o)
                }

                /// Tokens `t0..t0 + T`' Q8_0 block scales and block sums.
                fn q8_scales<const T: usize>(&self) -> ([*const f32; T], [*const i32; T]) {
                    // SAFETY (pointer arithmetic): each token's `nb` blocks.
                    let s = std::array::from_fn(|t| unsafe {
                        self.act.scales.as_ptr().add((self.t0 + t) * self.nb)
                    });
                    let sums = std::array::from_fn(|t| unsafe {
                        self.act.sums.as_ptr().add((self.t0 + t) * self.nb)
                    });
                    (s, sums)
                }
            }

            /// Eight interleaved Q4_K rows against `T` tokens' Q8_K blocks,
            /// 256 bits at a time: a group block's 64-byte vector is two
            /// halves of four rows, whose lanes `2r + h` sum the same
            /// integers as the 512-bit kernel's ([`super::zmm`]); the
            /// arguments are its. `acc[t]` and `acc_m[t]` hold one value
            /// per row.
            #[target_feature(enable = $features)]
            unsafe fn q4k8<const T: usize>(
                g: *const u8,
                nb: usize,
                a: [*const u8; T],
                out: [*mut f32; T],
            ) {
                use super::q4k8::{BYTES, PICK_MINS, QUANTS_AT};
                let m4 = _mm256_set1_epi8(0xF);
                let pick = unsafe { load(PICK_MINS.as_ptr()) };
                let mut acc = [_mm256_setzero_ps(); T];
                let mut acc_m = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let blk = unsafe { g.add(b * BYTES) };
                    // The hardware prefetcher alone leaves a one-token
                    // product at 2/3 of DRAM bandwidth: ask for the group
                    // blocks six ahead (into the next group's, which
                    // follow in memory).
                    prefetch_group(blk.wrapping_add(6 * BYTES), BYTES, T);
                    let (xd, nxmin, u) = unsafe { q4k8_head(blk) };
                    let mins = q4k8_mins(&u, pick);
                    let mut d = [_mm256_setzero_ps(); T];
                    for t in 0..T {
                        let y = unsafe { a[t].add(b * Q8K_BYTES) };
                        let yd = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
                        d[t] = _mm256_mul_ps(yd, xd);
                        let summ = unsafe { q4k8_min_sum(&mins, y) };
                        let dmin = _mm256_mul_ps(yd, nxmin);
                        acc_m[t] = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summ), acc_m[t]);
                    }
                    // Lanes 2r + h of rows 0..4 (half 0) and 4..8 (half 1).
                    let mut sumi = [[_mm256_setzero_si256(); 2]; T];
                    for c in 0..4 {
                        // Sub-block scales 2c and 2c + 1 in the i16 lanes
                        // of each half's rows.
                        let sc: [[__m256i; 2]; 2] = std::array::from_fn(|h| {
                            let k = 2 * c + h;
                            let x = scale_bytes(u[k / 4], k % 4);
                            [
                                _mm256_cvtepu8_epi16(_mm_unpacklo_epi16(x, x)),
                                _mm256_cvtepu8_epi16(_mm_unpackhi_epi16(x, x)),
                            ]
                        });
                        // A sub-block's pair products summed in i16 lanes
                        // before its scale: four of `maddubs`'s pairs are at
                        // most 4 * 2 * 15 * 128 = 15,360 (no saturation), so
                        // one `madd` per sub-block gives the same integers
                        // as one per eight elements.
                        let mut part = [[[_mm256_setzero_si256(); 2]; 2]; T];
                        for j in 0..4 {
                            let at = QUANTS_AT + 64 * (4 * c + j);
                            let q: [[__m256i; 2]; 2] = std::array::from_fn(|half| {
                                let bits = unsafe { load(blk.add(at + 32 * half)) };
                                [
                                    _mm256_and_si256(bits, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                                ]
                            });
                            for (t, part) in part.iter_mut().enumerate() {
                                // Elements 8j..8j + 8 of sub-blocks 2c, 2c + 1.
                                let q8 = unsafe { a[t].add(b * Q8K_BYTES + 4 + 64 * c + 8 * j) };
                                let y = unsafe {
                                    [
                                        _mm256_set1_epi64x(read_unaligned(q8 as *const i64)),
                                        _mm256_set1_epi64x(
                                            read_unaligned(q8.add(32) as *const i64),
                                        ),
                                    ]
                                };
                                for half in 0..2 {
                                    for h in 0..2 {
                                        let p = _mm256_maddubs_epi16(q[half][h], y[h]);
                                        part[half][h] = _mm256_add_epi16(part[half][h], p);
                                    }
                                }
                            }
                        }
                        for t in 0..T {
                            for half in 0..2 {
                                for h in 0..2 {
                                    sumi[t][half] =
                                        madd_add(sumi[t][half], sc[h][half], part[t][half][h]);
                                }
                            }
                        }
                    }
                    for t in 0..T {
                        // Rows 0, 1, 4, 5 | 2, 3, 6, 7, then in order.
                        let s = _mm256_hadd_epi32(sumi[t][0], sumi[t][1]);
                        let s = _mm256_permute4x64_epi64(s, 0b11_01_10_00);
                        acc[t] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(s), acc[t]);
                    }
                }
                for t in 0..T {
                    unsafe { _mm256_storeu_ps(out[t], _mm256_add_ps(acc[t], acc_m[t])) };
                }
            }

            /// A Q4_K group block's row scales `d` and `-dmin` (as f32),
            /// and its unpacked six-bit scales and mins: 128 bytes in four
            /// vectors, byte `8k + r` the scale of sub-block `k`, row `r`,
            /// then the mins likewise (see [`super::q4k8`]).
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn q4k8_head(blk: *const u8) -> (__m256, __m256, [__m256i; 4]) {
                use super::q4k8::SCALES_AT;
                let (m4, m30) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(0x30));
                let xd = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(blk as *const __m128i) });
                let xmin =
                    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(blk.add(16) as *const __m128i) });
                let (pa, pb, pc) = unsafe {
                    (
                        load(blk.add(SCALES_AT)),
                        load(blk.add(SCALES_AT + 32)),
                        load(blk.add(SCALES_AT + 64)),
                    )
                };
                let u = [
                    _mm256_or_si256(
                        _mm256_and_si256(pa, m4),
                        _mm256_and_si256(_mm256_slli_epi16(pc, 4), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(pa, 4), m4),
                        _mm256_and_si256(_mm256_slli_epi16(pc, 2), m30),
                    ),
                    _mm256_or_si256(_mm256_and_si256(pb, m4), _mm256_and_si256(pc, m30)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(pb, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(pc, 2), m30),
                    ),
                ];
                (xd, _mm256_xor_ps(xmin, _mm256_set1_ps(-0.0)), u)
            }

            /// A Q4_K group block's mins (the last two of
            /// [`q4k8_head`]'s vectors) for [`q4k8_min_sum`]: vector `i`
            /// holds those of sub-blocks `2i` and `2i + 1` of row `r` in
            /// i16 lanes `2r` and `2r + 1` (`pick` is
            /// [`super::q4k8::PICK_MINS`]).
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) fn q4k8_mins(u: &[__m256i; 4], pick: __m256i) -> [__m256i; 4] {
                std::array::from_fn(|i| {
                    let v = u[2 + i / 2];
                    let mn = if i % 2 == 0 {
                        _mm256_permute2x128_si256(v, v, 0x00)
                    } else {
                        _mm256_permute2x128_si256(v, v, 0x11)
                    };
                    _mm256_shuffle_epi8(mn, pick)
                })
            }

            /// Each row's `Σ_k min_k s_k`, `s_k` the sum of sub-block `k`'s
            /// quants of the token's Q8_K block at `y` (Q4_K's pair sums).
            ///
            /// # Safety
            /// `y` points at a Q8_K block with its sums.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn q4k8_min_sum(mins: &[__m256i; 4], y: *const u8) -> __m256i {
                unsafe { sums_times(mins, y) }
            }

            /// `Σ_i madd(v[i], the token's i16 sums 2i and 2i + 1)`: the
            /// Q8_K block at `y`'s sums (pair sums for Q4_K) against two
            /// per-row factors per 32-bit lane.
            ///
            /// # Safety
            /// `y` points at a Q8_K block with its sums.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn sums_times<const N: usize>(v: &[__m256i; N], y: *const u8) -> __m256i {
                let mut acc = _mm256_setzero_si256();
                for (i, v) in v.iter().enumerate() {
                    let s = unsafe { read_unaligned(y.add(Q8K_SUMS + 4 * i) as *const i32) };
                    acc = madd_add(acc, *v, _mm256_set1_epi32(s));
                }
                acc
            }

            /// The eight rows' scales of Q6_K sub-block `s` in a group
            /// block, in the low 8 bytes.
            ///
            /// # Safety
            /// `blk` points at a Q6_K group block.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn q6k8_scales(blk: *const u8, s: usize) -> __m128i {
                use super::q6k8::SCALES_AT;
                unsafe { _mm_loadl_epi64(blk.add(SCALES_AT + 8 * s) as *const __m128i) }
            }

            /// A Q6_K group block's sub-block scales for [`q6k8_offset`]:
            /// vector `p` holds scales `2p` and `2p + 1` of row `r` in i16
            /// lanes `2r` and `2r + 1`.
            ///
            /// # Safety
            /// As [`q6k8_scales`].
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn q6k8_scale_pairs(blk: *const u8) -> [__m256i; 8] {
                std::array::from_fn(|p| unsafe {
                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(
                        q6k8_scales(blk, 2 * p),
                        q6k8_scales(blk, 2 * p + 1),
                    ))
                })
            }

            /// Each row's `Σ_s scale_s sum_s`, `sum_s` the sum of the 16
            /// quants of sub-block `s` of the token's Q8_K block at `y`:
            /// what the quants' offset of 32 takes away, divided by 32.
            ///
            /// # Safety
            /// `y` points at a Q8_K block with its sums.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn q6k8_offset(pairs: &[__m256i; 8], y: *const u8) -> __m256i {
                unsafe { sums_times(pairs, y) }
            }

            /// The eight row scales at bytes `8i..8i + 8` of `v`, each
            /// doubled: bytes `2r` and `2r + 1` hold row `r`'s.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) fn scale_bytes(v: __m256i, i: usize) -> __m128i {
                let x = if i < 2 {
                    _mm256_castsi256_si128(v)
                } else {
                    _mm256_extracti128_si256(v, 1)
                };
                if i % 2 == 0 {
                    _mm_unpacklo_epi8(x, x)
                } else {
                    _mm_unpackhi_epi8(x, x)
                }
            }

            /// Eight interleaved Q6_K rows against `T` tokens' Q8_K blocks,
            /// 256 bits at a time: as [`q4k8`], two halves of four rows
            /// whose lanes sum the same integers as [`super::zmm::q6k8`]'s.
            #[target_feature(enable = $features)]
            unsafe fn q6k8<const T: usize>(
                g: *const u8,
                nb: usize,
                a: [*const u8; T],
                block: usize,
                out: [*mut f32; T],
            ) {
                use super::q6k8::{BYTES, QUANTS_AT};
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let blk = unsafe { g.add(b * BYTES) };
                    // As in `q4k8`.
                    prefetch_group(blk.wrapping_add(4 * BYTES), BYTES, T);
                    let mut sumi = [[_mm256_setzero_si256(); 2]; T];
                    for n in 0..2 {
                        for j in 0..4 {
                            let v = unsafe { blk.add(QUANTS_AT + 192 * (4 * n + j)) };
                            let q: [[__m256i; 4]; 2] = std::array::from_fn(|half| unsafe {
                                let v = v.add(32 * half);
                                q6_quants(load(v), load(v.add(64)), load(v.add(128)))
                            });
                            for i in 0..4 {
                                // Sub-block (128n + 32i + 8j) / 16's scale
                                // in the i16 lanes of each half's rows.
                                let x = unsafe { q6k8_scales(blk, 8 * n + 2 * i + j / 2) };
                                let x = _mm_unpacklo_epi8(x, x);
                                let sc = [
                                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi16(x, x)),
                                    _mm256_cvtepi8_epi16(_mm_unpackhi_epi16(x, x)),
                                ];
                                for (t, sumi) in sumi.iter_mut().enumerate() {
                                    let y = unsafe {
                                        a[t].add(b * block + 4 + 128 * n + 32 * i + 8 * j)
                                    };
                                    let y = _mm256_set1_epi64x(unsafe {
                                        read_unaligned(y as *const i64)
                                    });
                                    for half in 0..2 {
                                        let p = _mm256_maddubs_epi16(q[half][i], y);
                                        sumi[half] = madd_add(sumi[half], sc[half], p);
                                    }
                                }
                            }
                        }
                    }
                    let xd = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(blk as *const __m128i) });
                    let pairs = unsafe { q6k8_scale_pairs(blk) };
                    for t in 0..T {
                        let y = unsafe { a[t].add(b * block) };
                        let off = unsafe { q6k8_offset(&pairs, y) };
                        // Rows 0, 1, 4, 5 | 2, 3, 6, 7, then in order.
                        let s = _mm256_hadd_epi32(sumi[t][0], sumi[t][1]);
                        let s = _mm256_permute4x64_epi64(s, 0b11_01_10_00);
                        let s = _mm256_sub_epi32(s, _mm256_slli_epi32(off, 5));
                        let yd = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
                        acc[t] =
                            _mm256_fmadd_ps(_mm256_mul_ps(yd, xd), _mm256_cvtepi32_ps(s), acc[t]);
                    }
                }
                for t in 0..T {
                    unsafe { _mm256_storeu_ps(out[t], acc[t]) };
                }
            }

            /// Four vectors of Q6_K quants (0..64, offset not yet taken)
            /// from two vectors of low bits and one of high bits, as ggml
            /// decodes them: low nibbles of `lo1`, `lo2`, then their high
            /// nibbles, each with the next two high bits.
            #[inline]
            #[target_feature(enable = $features)]
            fn q6_quants(lo1: __m256i, lo2: __m256i, hi: __m256i) -> [__m256i; 4] {
                let (m4, m2) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(3));
                let high = |shift: i32| {
                    let h = match shift {
                        0 => hi,
                        2 => _mm256_srli_epi16(hi, 2),
                        4 => _mm256_srli_epi16(hi, 4),
                        _ => _mm256_srli_epi16(hi, 6),
                    };
                    _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)
                };
                [
                    _mm256_or_si256(_mm256_and_si256(lo1, m4), high(0)),
                    _mm256_or_si256(_mm256_and_si256(lo2, m4), high(2)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m4), high(4)),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo2, 4), m4), high(6)),
                ]
            }

            #[inline]
            #[target_feature(enable = $features)]
            fn f16_at(p: *const u8) -> f32 {
                // SAFETY (callers): `p` points at a block's f16 field.
                let bits = unsafe { read_unaligned(p as *const u16) };
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
            }

            /// [`prefetch`] for a group kernel call of `tokens` tokens: for
            /// one token only where [`super::soft_prefetch`] says it pays.
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) fn prefetch_group(p: *const u8, len: usize, tokens: usize) {
                if tokens > 1 || super::soft_prefetch() {
                    prefetch(p, len);
                }
            }

            /// Asks for the cache lines of `len` bytes from `p` (which may
            /// lie past the weights: prefetches never fault).
            #[inline]
            #[target_feature(enable = $features)]
            pub(super) fn prefetch(p: *const u8, len: usize) {
                let mut off = 0;
                while off < len {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
                    off += 64;
                }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const u8) -> __m256i {
                unsafe { _mm256_loadu_si256(p as *const __m256i) }
            }

            /// `acc + madd(s, p)`: i16 pairs multiplied and summed into i32.
            #[inline]
            #[target_feature(enable = $features)]
            fn madd_add(acc: __m256i, s: __m256i, p: __m256i) -> __m256i {
                if VNNI {
                    // SAFETY: only reached in the module that enables it.
                    #[allow(unused_unsafe)]
                    unsafe {
                        _mm256_dpwssd_epi32(acc, s, p)
                    }
                } else {
                    _mm256_add_epi32(acc, _mm256_madd_epi16(s, p))
                }
            }

            /// Sums of four consecutive u8 × i8 products, as i32 lanes
            /// (pairs never saturate i16 for these operands: |a| ≤ 128 and
            /// Q8_0 activations within ±127).
            #[inline]
            #[target_feature(enable = $features)]
            fn dot4(a: __m256i, b: __m256i) -> __m256i {
                if VNNI {
                    // SAFETY: as in `madd_add`.
                    #[allow(unused_unsafe)]
                    unsafe {
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b)
                    }
                } else {
                    _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(a, b))
                }
            }

            /// Q8_0 row (`nb` blocks of 34 bytes) against `T` tokens' Q8_0
            /// quants (`a`, 32 bytes per block) and scales (`s`).
            #[target_feature(enable = $features)]
            unsafe fn q8_0<const R: usize, const T: usize, const Q5: bool>(
                w: [*const u8; R],
                blocks: Range<usize>,
                a: [*const u8; T],
                s: [*const f32; T],
                acc_out: &mut [[__m256; T]; R],
            ) {
                // Local copies stay in registers through the loop.
                let mut acc = *acc_out;
                for b in blocks {
                    for r in 0..R {
                        let blk = unsafe { w[r].add(b * if Q5 { 22 } else { 34 }) };
                        let wdv = _mm256_set1_ps(f16_at(blk));
                        let bx = if Q5 {
                            unsafe { q5_0_quants(blk) }
                        } else {
                            unsafe { load(blk.add(2)) }
                        };
                        let ax = _mm256_sign_epi8(bx, bx);
                        for t in 0..T {
                            let by = unsafe { load(a[t].add(b * 32)) };
                            let sy = _mm256_sign_epi8(by, bx);
                            // The block's one integer (see `lanes::q8_0`)
                            // in every lane; lane 0 is read.
                            let q = _mm256_cvtepi32_ps(all_lanes8(dot4(ax, sy)));
                            // wd * the token's block scale, in every lane.
                            let d = _mm256_mul_ps(wdv, _mm256_set1_ps(unsafe { *s[t].add(b) }));
                            acc[r][t] = _mm256_fmadd_ps(d, q, acc[r][t]);
                        }
                    }
                }
                *acc_out = acc;
            }

            /// A Q5_0 block's quants as i8 `q - 16` (exactly the Q8_0 quants
            /// of its repacking): low nibbles are elements 0..16, high
            /// nibbles 16..32, bit j of the u32 after the scale is bit 4 of
            /// element j.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q5_0_quants(blk: *const u8) -> __m256i {
                let qh = unsafe { read_unaligned(blk.add(2) as *const u32) };
                let lo = unsafe { _mm_loadu_si128(blk.add(6) as *const __m128i) };
                let nibbles = _mm256_and_si256(
                    _mm256_set_m128i(_mm_srli_epi16(lo, 4), lo),
                    _mm256_set1_epi8(0x0F),
                );
                // Byte j = 0xFF where bit j of `qh` is set.
                let spread = _mm256_shuffle_epi8(
                    _mm256_set1_epi32(u32::from_le(qh) as i32),
                    _mm256_set_epi64x(
                        0x0303030303030303,
                        0x0202020202020202,
                        0x0101010101010101,
                        0,
                    ),
                );
                let bits = _mm256_cmpeq_epi8(
                    _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                    _mm256_set1_epi8(-1),
                );
                // Without bit 4, q - 16 = nibble | 0xF0 (as i8).
                _mm256_or_si256(
                    nibbles,
                    _mm256_andnot_si256(bits, _mm256_set1_epi8(0xF0u8 as i8)),
                )
            }

            /// Which of two integer partial sums sub-block `k` adds to: with
            /// few tokens two chains halve the dependent multiply-adds, with
            /// many the tokens already overlap (integer sums are exact, so
            /// the split never changes a result).
            #[inline(always)]
            const fn split(tokens: usize, k: usize) -> usize {
                if tokens >= 4 { 0 } else { k % 2 }
            }

            /// Q6_K row (`nb` blocks of 210 bytes: low 4 bits, high 2 bits,
            /// 16 i8 sub-block scales, f16 scale) against `T` tokens' Q8_K
            /// blocks.
            #[target_feature(enable = $features)]
            unsafe fn q6k<const R: usize, const T: usize, const OFFSETS: bool>(
                w: [*const u8; R],
                blocks: Range<usize>,
                a: [*const u8; T],
                acc_out: &mut [[__m256; T]; R],
            ) {
                let mut acc = *acc_out;
                let m32s = _mm256_set1_epi8(32);
                let mut sc = [_mm256_setzero_si256(); 4];
                for b in blocks {
                    for r in 0..R {
                        let blk = unsafe { w[r].add(b * 210) };
                        let xd = f16_at(unsafe { blk.add(208) });
                        let scales = unsafe { _mm_loadu_si128(blk.add(192) as *const __m128i) };
                        let mut sumi = [[_mm256_setzero_si256(); 2]; T];
                        // Half a block (128 quants, four sub-block pairs) at
                        // a time: the decoded quants and scales of a whole
                        // block would not fit AVX2's sixteen registers.
                        for j in 0..2 {
                            let (ql, qh) = unsafe { (blk.add(64 * j), blk.add(128 + 32 * j)) };
                            let q6 = unsafe { q6_quants(load(ql), load(ql.add(32)), load(qh)) };
                            // Sub-block scale 2k in the low eight i16 lanes,
                            // 2k + 1 in the high eight.
                            for (i, s) in sc.iter_mut().enumerate() {
                                let pick = unsafe {
                                    _mm_loadu_si128(
                                        super::Q6K_SCALE[4 * j + i].as_ptr() as *const __m128i
                                    )
                                };
                                *s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                            }
                            for (t, sumi) in sumi.iter_mut().enumerate() {
                                let y = unsafe {
                                    a[t].add(b * if OFFSETS { Q6K_ACT } else { Q8K_BYTES })
                                };
                                let (q8, q8s) = unsafe { (y.add(4), y.add(Q8K_BYTES)) };
                                for i in 0..4 {
                                    let k = 4 * j + i;
                                    let q8v = unsafe { load(q8.add(32 * k)) };
                                    let q8sv = if OFFSETS {
                                        unsafe { load(q8s.add(32 * k)) }
                                    } else {
                                        _mm256_maddubs_epi16(m32s, q8v)
                                    };
                                    let p16 =
                                        _mm256_sub_epi16(_mm256_maddubs_epi16(q6[i], q8v), q8sv);
                                    let h = split(T, k);
                                    sumi[h] = madd_add(sumi[h], sc[i], p16);
                                }
                            }
                        }
                        let xdv = _mm256_set1_ps(xd);
                        for t in 0..T {
                            let y =
                                unsafe { a[t].add(b * if OFFSETS { Q6K_ACT } else { Q8K_BYTES }) };
                            let sumi = all_lanes8(_mm256_add_epi32(sumi[t][0], sumi[t][1]));
                            // yd * xd in every lane.
                            let d = _mm256_mul_ps(
                                _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) }),
                                xdv,
                            );
                            acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r][t]);
                        }
                    }
                }
                *acc_out = acc;
            }

            /// Q4_K row (`nb` blocks of 144 bytes: f16 scale and min scale,
            /// 12 bytes of 6-bit sub-block scales and mins, 4-bit quants)
            /// against `T` tokens' Q8_K blocks.
            #[target_feature(enable = $features)]
            unsafe fn q4k<const R: usize, const T: usize>(
                w: [*const u8; R],
                blocks: Range<usize>,
                a: [*const u8; T],
                acc_out: &mut [[__m256; T]; R],
                acc_m_out: &mut [[__m128; T]; R],
            ) {
                let (mut acc, mut acc_m) = (*acc_out, *acc_m_out);
                const KMASK1: u32 = 0x3f3f3f3f;
                const KMASK2: u32 = 0x0f0f0f0f;
                const KMASK3: u32 = 0x03030303;
                let m4 = _mm256_set1_epi8(0xF);
                let mut q4 = [_mm256_setzero_si256(); 8];
                let mut sc = [_mm256_setzero_si256(); 8];
                for b in blocks {
                    for r in 0..R {
                        let blk = unsafe { w[r].add(b * 144) };
                        let (xd, xmin) = (f16_at(blk), f16_at(unsafe { blk.add(2) }));
                        let mut u = [0u32; 4];
                        for (i, v) in u.iter_mut().take(3).enumerate() {
                            *v = u32::from_le(unsafe {
                                read_unaligned(blk.add(4 + 4 * i) as *const u32)
                            });
                        }
                        u[3] = ((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4);
                        let uaux = u[1] & KMASK1;
                        u[1] = (u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4);
                        u[2] = uaux;
                        u[0] &= KMASK1;
                        // i16 lanes 0..8: the eight sub-block scales; 8..16: mins.
                        let sm = _mm256_cvtepu8_epi16(_mm_set_epi32(
                            u[3] as i32,
                            u[2] as i32,
                            u[1] as i32,
                            u[0] as i32,
                        ));
                        let mins = _mm256_extracti128_si256(sm, 1);
                        let scales = _mm256_permute2x128_si256(sm, sm, 0);
                        for (k, s) in sc.iter_mut().enumerate() {
                            let pick = unsafe { load(super::Q4K_SCALE[k].as_ptr()) };
                            *s = _mm256_shuffle_epi8(scales, pick);
                        }
                        for j in 0..4 {
                            let bits = unsafe { load(blk.add(16 + 32 * j)) };
                            q4[2 * j] = _mm256_and_si256(bits, m4);
                            q4[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                        }
                        let (xdv, nxminv) = (_mm256_set1_ps(xd), _mm256_set1_ps(-xmin));
                        for t in 0..T {
                            let y = unsafe { a[t].add(b * Q8K_BYTES) };
                            let ydv = _mm256_set1_ps(unsafe { read_unaligned(y as *const f32) });
                            // yd * xd and -yd * xmin, in every lane.
                            let (d, dmin) = (_mm256_mul_ps(ydv, xdv), _mm256_mul_ps(ydv, nxminv));
                            // Sums of 32 quants (see `Activations::quantize`).
                            let q8s = unsafe { _mm_loadu_si128(y.add(Q8K_SUMS) as *const __m128i) };
                            let prod = all_lanes4(_mm_madd_epi16(mins, q8s));
                            acc_m[r][t] = _mm_fmadd_ps(
                                _mm256_castps256_ps128(dmin),
                                _mm_cvtepi32_ps(prod),
                                acc_m[r][t],
                            );
                            let q8 = unsafe { y.add(4) };
                            let mut sumi = [_mm256_setzero_si256(); 2];
                            for k in 0..8 {
                                let q8v = unsafe { load(q8.add(32 * k)) };
                                let h = split(T, k);
                                sumi[h] =
                                    madd_add(sumi[h], sc[k], _mm256_maddubs_epi16(q4[k], q8v));
                            }
                            // The block's one integer (see `lanes::q4k`) in
                            // every lane: each lane's float steps are then
                            // the row's, and lane 0 is read.
                            let sumi = all_lanes8(_mm256_add_epi32(sumi[0], sumi[1]));
                            acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r][t]);
                        }
                    }
                }
                *acc_out = acc;
                *acc_m_out = acc_m;
            }

            /// The sum of `x`'s eight lanes, in every lane (exact
            /// integers: any order).
            #[inline]
            #[target_feature(enable = $features)]
            fn all_lanes8(x: __m256i) -> __m256i {
                let x = _mm256_add_epi32(x, _mm256_permute2x128_si256(x, x, 0x01));
                let x = _mm256_add_epi32(x, _mm256_shuffle_epi32(x, 0b01_00_11_10));
                _mm256_add_epi32(x, _mm256_shuffle_epi32(x, 0b10_11_00_01))
            }

            /// The sum of `x`'s four lanes, in every lane (exact integers:
            /// any order).
            #[inline]
            #[target_feature(enable = $features)]
            fn all_lanes4(x: __m128i) -> __m128i {
                let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
                _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01))
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
kernels!(avx2, "avx2,fma,f16c", vnni: false);
#[cfg(target_arch = "x86_64")]
kernels!(vnni, "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", vnni: true);

#[cfg(target_arch = "x86_64")]
/// `_mm_shuffle_epi8` picks that spread Q6_K sub-block scales 2k and 2k + 1
/// over eight bytes each.
const Q6K_SCALE: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut k = 0;
    while k < 8 {
        let mut i = 0;
        while i < 16 {
            t[k][i] = (2 * k + i / 8) as u8;
            i += 1;
        }
        k += 1;
    }
    t
};

#[cfg(target_arch = "x86_64")]
/// `_mm256_shuffle_epi8` picks that broadcast i16 lane `k` (a Q4_K
/// sub-block scale) over each 128-bit half.
const Q4K_SCALE: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut k = 0;
    while k < 8 {
        let mut i = 0;
        while i < 32 {
            t[k][i] = (2 * k + i % 2) as u8;
            i += 1;
        }
        k += 1;
    }
    t
};

mod groups;
#[cfg(test)]
mod lanes;
#[cfg(target_arch = "aarch64")]
mod mmla;
#[cfg(target_arch = "aarch64")]
mod neon;
mod q4k8;
mod q6k8;
mod q8x16;
mod quantize;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod zmm;
