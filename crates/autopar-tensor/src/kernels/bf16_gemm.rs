//! Matrix products of bfloat16 values with float32 accumulation.
//!
//! On a CPU with AVX-512 BF16 (detected at run time) the product runs on `vdpbf16ps`, which
//! multiplies pairs of bf16 values and adds both products to a float32 accumulator: 32
//! multiply-adds per instruction, twice an f32 FMA's 16, which pays where a core issues one
//! 512-bit FMA a cycle (AMD Zen 4 and 5). Intel cores with AVX-512 FP16 (Sapphire Rapids and
//! later) issue two f32 FMAs a cycle and one `vdpbf16ps`: there, and on CPUs without the
//! instruction, the inputs are widened to f32 and multiplied by the backend GEMM (the same
//! arithmetic up to the order of the sums). The choice depends on the CPU alone, so every
//! process of a job on like machines takes the same path. Either way the result is float32;
//! the caller rounds it.
//!
//! The fast path packs `A` as rows of bf16 pairs along `k` (one 32-bit word per pair) and `B` as
//! panels of 16 columns holding, for each pair of rows of `B`, the 16 columns' two values side
//! by side, so a broadcast pair of `A` against a panel is one `vdpbf16ps`. A micro-kernel keeps
//! an 8 x 32 block of `C` in 16 registers over a block of `k`.

use half::bf16;
use ndarray::{Array2, ArrayView2};

use crate::ExecCtx;

/// Rows of `C` a micro-kernel computes.
const MR: usize = 8;
/// Columns of a panel of packed `B` (one 512-bit register of f32).
const LANES: usize = 16;
/// Columns of `C` a micro-kernel computes (two panels).
const NR: usize = 2 * LANES;
/// Pairs of `k` per block (the packed `B` of a block of columns stays in the cache).
const KC: usize = 256;

/// Whether products run on this CPU's bf16 dot-product instructions (see the module's note).
pub fn has_bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bf16")
            && !std::is_x86_feature_detected!("avx512fp16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `a @ b` in float32 for bf16 `a` [m, k] and `b` [k, n] (any strides).
pub fn gemm_bf16(ctx: &ExecCtx, a: ArrayView2<'_, bf16>, b: ArrayView2<'_, bf16>) -> Array2<f32> {
    let (m, k) = a.dim();
    let n = b.ncols();
    if m == 0 || n == 0 || k == 0 || !has_bf16_dot() {
        return portable(ctx, a, b);
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the CPU has avx512f and avx512bf16 (checked above).
        unsafe { dot::gemm(ctx, a, b) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable(ctx, a, b)
    }
}

/// The widened product: every value to f32, the backend GEMM.
pub fn portable(ctx: &ExecCtx, a: ArrayView2<'_, bf16>, b: ArrayView2<'_, bf16>) -> Array2<f32> {
    let a32 = a.mapv(f32::from);
    let b32 = b.mapv(f32::from);
    ctx.gemm_new(a32.view(), b32.view())
}

#[cfg(target_arch = "x86_64")]
mod dot {
    use std::arch::x86_64::*;

    use half::bf16;
    use ndarray::{Array2, ArrayView2};
    use rayon::prelude::*;

    use super::{KC, LANES, MR, NR};
    use crate::ExecCtx;

    /// Two bf16 values as one 32-bit word, the first in the low half.
    fn pair(lo: bf16, hi: bf16) -> u32 {
        u32::from(lo.to_bits()) | (u32::from(hi.to_bits()) << 16)
    }

    /// `A` in blocks of `MR` rows: block `blk`, pair `p`, row `r` at `(blk * kp + p) * MR + r`
    /// (zero beyond `m` rows and `k` columns), so a micro-kernel reads its rows' pairs in order.
    fn pack_a(a: &ArrayView2<'_, bf16>, m_pad: usize, kp: usize) -> Vec<u32> {
        let (m, k) = a.dim();
        let zero = bf16::ZERO;
        let mut out = vec![0u32; m_pad * kp];
        let mut row = vec![zero; 2 * kp];
        for (i, src) in a.rows().into_iter().enumerate().take(m) {
            row.iter_mut().zip(src.iter()).for_each(|(d, s)| *d = *s);
            let (blk, r) = (i / MR, i % MR);
            for p in 0..kp {
                out[(blk * kp + p) * MR + r] = pair(row[2 * p], if 2 * p + 1 < k { row[2 * p + 1] } else { zero });
            }
        }
        out
    }

    /// `B` as panels of `LANES` columns: panel `c`, pair `p`, lane `j` at
    /// `(c * kp + p) * LANES + j` (zero beyond `k` rows and `n` columns).
    fn pack_b(b: &ArrayView2<'_, bf16>, panels: usize, kp: usize) -> Vec<u32> {
        let (k, n) = b.dim();
        let zero = bf16::ZERO;
        let mut out = vec![0u32; panels * kp * LANES];
        let (mut lo, mut hi) = (vec![zero; n], vec![zero; n]);
        let fill = |r: usize, buf: &mut [bf16]| buf.iter_mut().zip(b.row(r).iter()).for_each(|(d, s)| *d = *s);
        for p in 0..kp {
            // Rows 2p and 2p + 1 of `B` (a row past `k` is zero).
            fill(2 * p, &mut lo);
            if 2 * p + 1 < k {
                fill(2 * p + 1, &mut hi);
            } else {
                hi.fill(zero);
            }
            for (col, (&l, &h)) in lo.iter().zip(&hi).enumerate() {
                out[((col / LANES) * kp + p) * LANES + col % LANES] = pair(l, h);
            }
        }
        out
    }

    /// # Safety
    /// The CPU must have avx512f and avx512bf16.
    pub(super) unsafe fn gemm(ctx: &ExecCtx, a: ArrayView2<'_, bf16>, b: ArrayView2<'_, bf16>) -> Array2<f32> {
        let (m, k) = a.dim();
        let n = b.ncols();
        let kp = k.div_ceil(2);
        let m_pad = m.div_ceil(MR) * MR;
        let panels = n.div_ceil(NR) * 2;
        let n_pad = panels * LANES;
        let pa = pack_a(&a, m_pad, kp);
        let pb = pack_b(&b, panels, kp);
        let mut c = vec![0f32; m_pad * n_pad];
        let rows_of = |block: usize, out: &mut [f32]| {
            // SAFETY: the caller guarantees avx512f and avx512bf16.
            unsafe { row_block(&pa[block * MR * kp..(block + 1) * MR * kp], &pb, out, kp, panels, n_pad) }
        };
        let flops = m * n * k;
        if ctx.is_parallel() && rayon::current_num_threads() > 1 && flops >= 1 << 18 {
            c.par_chunks_mut(MR * n_pad).enumerate().for_each(|(blk, out)| rows_of(blk, out));
        } else {
            c.chunks_mut(MR * n_pad).enumerate().for_each(|(blk, out)| rows_of(blk, out));
        }
        let mut out = Array2::<f32>::zeros((m, n));
        for (i, mut row) in out.rows_mut().into_iter().enumerate() {
            row.as_slice_mut().expect("a fresh array is row-major").copy_from_slice(&c[i * n_pad..i * n_pad + n]);
        }
        out
    }

    /// `MR` rows of `C` (`out`, row stride `n_pad`) from their packed rows of `A` and all of `B`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn row_block(pa: &[u32], pb: &[u32], out: &mut [f32], kp: usize, panels: usize, n_pad: usize) {
        for k0 in (0..kp).step_by(KC) {
            let kc = KC.min(kp - k0);
            for c in (0..panels).step_by(2) {
                let mut acc = [[_mm512_setzero_ps(); 2]; MR];
                if k0 > 0 {
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let o = out.as_ptr().add(r * n_pad + c * LANES);
                        acc[0] = _mm512_loadu_ps(o);
                        acc[1] = _mm512_loadu_ps(o.add(LANES));
                    }
                }
                let b0 = pb.as_ptr().add((c * kp + k0) * LANES);
                let b1 = pb.as_ptr().add(((c + 1) * kp + k0) * LANES);
                for p in 0..kc {
                    let v0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b0.add(p * LANES) as *const _));
                    let v1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b1.add(p * LANES) as *const _));
                    let words = pa.as_ptr().add((k0 + p) * MR);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let w = *words.add(r);
                        let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(w as i32));
                        acc[0] = _mm512_dpbf16_ps(acc[0], av, v0);
                        acc[1] = _mm512_dpbf16_ps(acc[1], av, v1);
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    let o = out.as_mut_ptr().add(r * n_pad + c * LANES);
                    _mm512_storeu_ps(o, acc[0]);
                    _mm512_storeu_ps(o.add(LANES), acc[1]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array2;
    use proptest::prelude::*;

    fn bf(v: &Array2<f32>) -> Array2<bf16> {
        v.mapv(bf16::from_f32)
    }

    fn exact(a: &Array2<bf16>, b: &Array2<bf16>) -> Array2<f64> {
        let a = a.mapv(|x| f64::from(f32::from(x)));
        let b = b.mapv(|x| f64::from(f32::from(x)));
        a.dot(&b)
    }

    proptest! {
        /// Any shape, transposed views included: within float32 accumulation of the exact product
        /// of the bf16 values, on this CPU's path (and the portable one).
        #[test]
        fn products_equal_the_exact_product_of_the_bf16_values(m in 1usize..40, k in 1usize..70, n in 1usize..70, t in any::<bool>(), seed in 0u64..1000) {
            let draw = |(i, j): (usize, usize), which: u64| crate::random::normal01(seed * 2 + which, (i * 1000 + j) as u64) as f32;
            let a32 = Array2::from_shape_fn((m, k), |ij| draw(ij, 0));
            let b32 = Array2::from_shape_fn(if t { (n, k) } else { (k, n) }, |ij| draw(ij, 1));
            let (a, b) = (bf(&a32), bf(&b32));
            let bv = if t { b.t() } else { b.view() };
            let want = exact(&a, &bv.to_owned());
            let mut paths = vec![gemm_bf16(&ExecCtx::serial(), a.view(), bv), portable(&ExecCtx::serial(), a.view(), bv), gemm_bf16(&ExecCtx::parallel(), a.view(), bv)];
            #[cfg(target_arch = "x86_64")]
            if can_dot() {
                // SAFETY: checked just above.
                paths.push(unsafe { dot::gemm(&ExecCtx::parallel(), a.view(), bv) });
            }
            for got in paths {
                prop_assert_eq!(got.dim(), (m, n));
                for (g, w) in got.iter().zip(want.iter()) {
                    prop_assert!((f64::from(*g) - w).abs() <= 1e-5 * (k as f64).sqrt() * (1.0 + w.abs()), "{g} vs {w}");
                }
            }
        }
    }

    /// Whether this CPU can run the dot-product path (taken or not).
    #[cfg(target_arch = "x86_64")]
    fn can_dot() -> bool {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
    }

    #[test]
    fn a_long_sum_crosses_several_k_blocks() {
        let k = 2 * KC * 3 + 3;
        let a = Array2::from_elem((MR + 3, k), bf16::from_f32(0.5));
        let b = Array2::from_elem((k, NR + 5), bf16::from_f32(2.0));
        let got = gemm_bf16(&ExecCtx::serial(), a.view(), b.view());
        assert!(got.iter().all(|&v| v == k as f32));
        #[cfg(target_arch = "x86_64")]
        if can_dot() {
            // SAFETY: checked just above.
            let dot = unsafe { dot::gemm(&ExecCtx::serial(), a.view(), b.view()) };
            assert!(dot.iter().all(|&v| v == k as f32));
        }
    }
}
