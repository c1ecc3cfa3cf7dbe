//! Attention over the KV cache ([`crate::HostKv`]), and the arithmetic
//! attention and the norms share: f16 rounding of what attention sees, and
//! vectorisable dot products and `axpy`.

use std::borrow::Cow;

use arbor_tensor::{Heads, Mask, Result};
use half::slice::HalfFloatSliceExt;

use crate::{CandleBackend, HostKv, HostTensor, qmm, shape_err};

/// Attention with fewer (query row × key × head) scores than this runs on
/// the calling thread.
pub(crate) const PARALLEL_ATTENTION_MIN: usize = 1 << 10;

/// Keys (or values) a pass of several query rows widens to `f32` once, at
/// most (8 MiB each: 8,192 positions of a 256-wide cache).
const WIDEN_MAX: usize = 1 << 21;

/// `Σ a[i] b[i]` in eight lanes (lane `l` takes `i ≡ l mod 8`), added in
/// lane order, then the tail: the same bits with 256-bit vectors (chosen
/// at run time) as with the baseline's 128-bit ones, since every product
/// and sum is rounded on its own (no fused multiply-adds).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { dot_avx2(a, b) };
    }
    dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent accumulators so the compiler vectorises the loop.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out[g] = dot(q_g, k)` for the heads `q_g`, `q`'s consecutive slices of
/// `k.len()` values: each the bits [`dot`] gives, with the heads' chains of
/// additions interleaved (one head's eight lanes are one chain of dependent
/// adds; several hide each other's latency).
pub(crate) fn dots(q: &[f32], k: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { dots_avx2(q, k, out) };
    }
    dots_heads(q, k, out)
}

/// [`dots_heads`] in AVX2 intrinsics (the compiler's vectorisation of the
/// portable loop shuffled lanes about): per head, the same eight lanes,
/// products and adds, then the same sum across.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_avx2(q: &[f32], k: &[f32], out: &mut [f32]) {
    let d = k.len();
    let mut g0 = 0;
    while g0 < out.len() {
        let g = (out.len() - g0).min(4);
        let (q, o) = (&q[g0 * d..], &mut out[g0..g0 + g]);
        // SAFETY: the CPU has AVX2; `q` holds `g` heads of `d` values.
        unsafe {
            match g {
                1 => dots_ymm::<1>(q, k, o),
                2 => dots_ymm::<2>(q, k, o),
                3 => dots_ymm::<3>(q, k, o),
                _ => dots_ymm::<4>(q, k, o),
            }
        }
        g0 += g;
    }
}

/// `G` heads of [`dots_avx2`].
///
/// # Safety
/// The CPU has AVX2; `q` holds at least `G` heads of `k.len()` values and
/// `out` `G` results.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dots_ymm<const G: usize>(q: &[f32], k: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let d = k.len();
    let whole = d / 8 * 8;
    assert!(q.len() >= G * d && out.len() >= G);
    let mut acc = [_mm256_setzero_ps(); G];
    for c in (0..whole).step_by(8) {
        // SAFETY: `c + 8 <= whole <= d`, and head `g`'s values are
        // `q[g * d..][..d]`.
        unsafe {
            let y = _mm256_loadu_ps(k.as_ptr().add(c));
            for (g, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(q.as_ptr().add(g * d + c));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, y));
            }
        }
    }
    for (g, acc) in acc.iter().enumerate() {
        let mut lanes = [0f32; 8];
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *acc) };
        let tail: f32 = q[g * d + whole..(g + 1) * d]
            .iter()
            .zip(&k[whole..])
            .map(|(x, y)| x * y)
            .sum();
        out[g] = lanes.iter().sum::<f32>() + tail;
    }
}

#[inline(always)]
fn dots_heads(q: &[f32], k: &[f32], out: &mut [f32]) {
    let d = k.len();
    let (mut q, mut out) = (q, out);
    while !out.is_empty() {
        let g = out.len().min(4);
        let (now, rest) = out.split_at_mut(g);
        match g {
            1 => dots_lanes::<1>(q, k, now),
            2 => dots_lanes::<2>(q, k, now),
            3 => dots_lanes::<3>(q, k, now),
            _ => dots_lanes::<4>(q, k, now),
        }
        (q, out) = (&q[g * d..], rest);
    }
}

/// [`dot_lanes`] of `G` heads at once, the same operations per head.
#[inline(always)]
fn dots_lanes<const G: usize>(q: &[f32], k: &[f32], out: &mut [f32]) {
    let d = k.len();
    let whole = d / 8 * 8;
    let mut acc = [[0f32; 8]; G];
    for (c, y) in k[..whole].chunks_exact(8).enumerate() {
        for (g, acc) in acc.iter_mut().enumerate() {
            let x = &q[g * d + 8 * c..][..8];
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
    }
    for (g, (acc, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let tail: f32 = q[g * d + whole..(g + 1) * d]
            .iter()
            .zip(&k[whole..])
            .map(|(x, y)| x * y)
            .sum();
        *o = acc.iter().sum::<f32>() + tail;
    }
}

/// `out += w x`, element by element (the same bits at any vector width).
pub(crate) fn axpy(out: &mut [f32], w: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { axpy_avx2(out, w, x) };
    }
    axpy_plain(out, w, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(out: &mut [f32], w: f32, x: &[f32]) {
    axpy_plain(out, w, x)
}

#[inline(always)]
fn axpy_plain(out: &mut [f32], w: f32, x: &[f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o += w * v;
    }
}

impl CandleBackend {
    /// Values as the attention sees them: rounded to f16 (exactly
    /// representable in the f32 they are kept in) unless f32 attention was
    /// asked for.
    pub(crate) fn round<'a>(&self, x: &'a [f32]) -> Cow<'a, [f32]> {
        if !self.f16_attention {
            return Cow::Borrowed(x);
        }
        let mut h = vec![half::f16::ZERO; x.len()];
        h.convert_from_f32_slice(x);
        let mut out = vec![0f32; x.len()];
        h.convert_to_f32_slice(&mut out);
        Cow::Owned(out)
    }

    pub(crate) fn round_one(&self, x: f32) -> f32 {
        if self.f16_attention {
            half::f16::from_f32(x).to_f32()
        } else {
            x
        }
    }
}

impl CandleBackend {
    /// Scaled dot-product attention of `q` over the whole of `kv` (see
    /// [`arbor_tensor::Backend::attention`]). Keys and values are read once
    /// per run of query heads sharing a KV head, widened from the cache's
    /// storage.
    pub(crate) fn attend(
        &self,
        q: &HostTensor,
        kv: &HostKv,
        mask: &Mask,
        h: &Heads,
    ) -> Result<HostTensor> {
        let d = h.head_dim;
        if q.cols != h.n_heads * d || kv.kv_dim != h.n_kv_heads * d || !h.is_valid() {
            return Err(shape_err(
                "attention",
                format!("q [{}, {}] with heads {h:?}", q.rows, q.cols),
            ));
        }
        mask.validate(q.rows, kv.len)?;
        let q = HostTensor {
            data: self.round(&q.data).into_owned(),
            ..*q
        };
        let (n, t, kvd) = (q.rows, kv.len, kv.kv_dim);
        // Several query rows read every key and value once per row and
        // head: widen them once (the same values) unless that would take
        // much memory; one row (decode) widens what it reads.
        let widened =
            (n > 1 && t * kvd <= WIDEN_MAX).then(|| (kv.k.widen(t, kvd), kv.v.widen(t, kvd)));
        let scale = 1.0 / (d as f32).sqrt();
        // Runs of consecutive heads that read the same KV head (a group of
        // grouped-query attention): one task per (query row, run) reads each
        // key and value once for all of the run's heads, not once per head.
        let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
        for head in 0..h.n_heads {
            match runs.last_mut() {
                Some(r) if h.kv_head(r.start) == h.kv_head(head) => r.end = head + 1,
                _ => runs.push(head..head + 1),
            }
        }
        // A pass of few rows (decode) halves each run, so that two threads
        // share out a model with few KV heads (SmolLM2's three) evenly.
        if n < 4 {
            runs = runs
                .into_iter()
                .flat_map(|r| {
                    let mid = r.start + r.len().div_ceil(2);
                    [r.start..mid, mid..r.end]
                })
                .filter(|r| !r.is_empty())
                .collect();
        }
        let mut out = vec![0f32; n * q.cols];
        // Each head's arithmetic is the same as alone (the same dot products,
        // softmax and `axpy`s in the same order): the same bits whatever its
        // run's length.
        let one = |i: usize, run: &std::ops::Range<usize>, o: &mut [f32]| {
            let at = h.kv_head(run.start) * d;
            let qs = &q.data[i * q.cols + run.start * d..][..run.len() * d];
            let keys: Vec<usize> = mask.allowed[i * t..(i + 1) * t]
                .iter()
                .enumerate()
                .filter_map(|(j, a)| a.then_some(j))
                .collect();
            let nk = keys.len();
            let mut buf = vec![0f32; d];
            // Head-major: the run's head `g`'s score of key `keys[x]` at
            // `g * nk + x`, then its weight.
            let mut w = vec![0f32; run.len() * nk];
            let mut qk = vec![0f32; run.len()];
            for (x, &j) in keys.iter().enumerate() {
                let k = match &widened {
                    Some((k, _)) => &k[j * kvd + at..][..d],
                    None => kv.k.read(j, kvd, at, d, &mut buf),
                };
                dots(qs, k, &mut qk);
                for (g, &s) in qk.iter().enumerate() {
                    w[g * nk + x] = s * scale;
                }
            }
            for scores in w.chunks_exact_mut(nk.max(1)) {
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                for s in scores.iter_mut() {
                    *s = self.round_one(*s / sum);
                }
            }
            for (x, &j) in keys.iter().enumerate() {
                let v = match &widened {
                    Some((_, v)) => &v[j * kvd + at..][..d],
                    None => kv.v.read(j, kvd, at, d, &mut buf),
                };
                for (g, o) in o.chunks_exact_mut(d).enumerate() {
                    axpy(o, w[g * nk + x], v);
                }
            }
        };
        let tasks = n * runs.len();
        // On the matmuls' spinning pool: even one decode step's attention
        // (tens of microseconds per layer) outweighs its hand-off, and the
        // pool's other thread would otherwise spin idle meanwhile.
        let at = qmm::SendPtr(out.as_mut_ptr());
        // Task `task` owns its row's run of heads: `d` values per head.
        let run_task = |task: usize| {
            let (i, run) = (task / runs.len(), &runs[task % runs.len()]);
            let (from, len) = (i * q.cols + run.start * d, run.len() * d);
            // SAFETY: runs partition the heads, so tasks own disjoint slices
            // of `out`, which outlives every call.
            let o = unsafe { std::slice::from_raw_parts_mut(at.get().add(from), len) };
            one(i, run, o);
        };
        if n * t * h.n_heads < PARALLEL_ATTENTION_MIN {
            (0..tasks).for_each(run_task);
        } else {
            candle_core::utils::barrier_pool().execute_chunked(tasks, |tasks| {
                tasks.for_each(run_task);
            });
        }
        Ok(HostTensor {
            data: out,
            rows: n,
            cols: q.cols,
        })
    }
}

#[cfg(test)]
mod tests {
    use arbor_tensor::{Backend, Heads, KvFormat, Mask};

    use crate::CandleBackend;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(97);
                ((v >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    /// Appends 40 positions in two passes, then attends 5 new rows over all
    /// 45 with a causal mask; the output and the cache's bytes.
    fn attend(b: &CandleBackend) -> (Vec<f32>, usize) {
        let heads = Heads::grouped(4, 2, 64);
        let width = 2 * 64;
        let mut kv = b.kv_new(&heads).unwrap();
        for (n, seed) in [(33, 1), (12, 2)] {
            let k = b.tensor(&values(n * width, seed), n, width).unwrap();
            let v = b.tensor(&values(n * width, seed + 10), n, width).unwrap();
            b.kv_append(&mut kv, &k, &v).unwrap();
        }
        let q = b.tensor(&values(5 * 4 * 64, 3), 5, 4 * 64).unwrap();
        let out = b.attention(&q, &kv, &Mask::causal(40, 5), &heads).unwrap();
        (out.data, kv.held_bytes())
    }

    /// Several heads' dot products at once are each head's alone, bit for
    /// bit, with and without a tail of fewer than eight values.
    #[test]
    fn dots_of_several_heads_equal_each_dot_alone() {
        for d in [5, 13, 64, 128] {
            for heads in 1..=9 {
                let q = values(heads * d, heads as u32);
                let k = values(d, 77);
                let mut got = vec![0f32; heads];
                super::dots(&q, &k, &mut got);
                for (g, got) in got.iter().enumerate() {
                    let want = super::dot(&q[g * d..][..d], &k);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "d {d}, {heads} heads, head {g}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_f16_cache_gives_the_bits_of_f16_rounded_values_in_half_the_bytes() {
        let (f16, f16_bytes) = attend(&CandleBackend::new());
        let (f32, f32_bytes) = attend(&CandleBackend::new().with_kv(KvFormat::F32));
        assert_eq!(f16, f32, "the same values, read from f16 or from f32");
        assert_eq!(f16_bytes * 2, f32_bytes);
        // f32 attention keeps f32 values: other bits.
        let (exact, _) = attend(&CandleBackend::with_f32_attention());
        assert_ne!(exact, f16);
    }

    #[test]
    fn a_q8_cache_stays_close_in_a_quarter_of_the_bytes() {
        let (f16, f16_bytes) = attend(&CandleBackend::new());
        let (q8, q8_bytes) = attend(&CandleBackend::new().with_kv(KvFormat::Q8_0));
        assert_eq!(
            q8_bytes * 64,
            f16_bytes * 34,
            "34 bytes per 32 values against 64"
        );
        let worst = f16
            .iter()
            .zip(&q8)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst > 0.0 && worst < 0.05, "{worst}");
        // Keeping positions moves Q8_0 rows as whole blocks.
        let b = CandleBackend::new().with_kv(KvFormat::Q8_0);
        let heads = Heads::grouped(2, 1, 64);
        let mut kv = b.kv_new(&heads).unwrap();
        let k = b.tensor(&values(4 * 64, 5), 4, 64).unwrap();
        b.kv_append(&mut kv, &k, &k).unwrap();
        let q = b.tensor(&values(2 * 64, 6), 1, 128).unwrap();
        let only_3 = Mask {
            rows: 1,
            cols: 4,
            allowed: vec![false, false, false, true],
        };
        let want = b.attention(&q, &kv, &only_3, &heads).unwrap();
        b.kv_keep(&mut kv, &[1, 3]).unwrap();
        let last = Mask {
            rows: 1,
            cols: 2,
            allowed: vec![false, true],
        };
        assert_eq!(b.attention(&q, &kv, &last, &heads).unwrap(), want);
    }
}
