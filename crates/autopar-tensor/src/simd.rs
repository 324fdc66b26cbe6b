//! Element-wise loops compiled for the widest vector unit the CPU has, chosen at run time.
//!
//! The crate is built for the baseline of its target (x86-64: SSE2, four f32 lanes, no FMA), so
//! a loop such as GeLU's `tanh` runs at a quarter of what an AVX-512 core can do. [`vectorized`]
//! runs a [`VectorLoop`] inside a function compiled with AVX-512 (or AVX2) enabled when the CPU
//! has it; everything the loop calls that is `#[inline(always)]` (or that the compiler inlines)
//! is compiled with those features too. Calls that are not inlined (rayon, allocation) run as
//! before, so wrap the innermost loop, not a parallel region. [`map1`] and [`map2`] are the
//! element-wise loops.
//!
//! [`sum`], [`dot`] and [`max`] reduce over 16 lanes in a fixed order, so that their loops
//! vectorise (a single running sum is a chain of dependent adds the compiler may not reorder).
//!
//! Results do not depend on the path taken: every element sees the same operations in the same
//! order (Rust never fuses a multiply and an add unless asked to, and a loop that carries a sum
//! is not reordered), so the vector width changes speed only.

/// A loop to run compiled for the CPU's widest vector unit by [`vectorized`]. Mark `run`
/// `#[inline(always)]` (and the per-element functions it calls): that is what compiles its body
/// into the AVX-512 / AVX2 functions.
pub trait VectorLoop {
    /// What the loop returns.
    type Output;
    /// The loop.
    fn run(self) -> Self::Output;
}

/// Runs `l` compiled for the CPU's widest vector unit (AVX-512, else AVX2 with FMA, else the
/// build's baseline).
#[inline(always)]
pub fn vectorized<L: VectorLoop>(l: L) -> L::Output {
    #[cfg(target_arch = "x86_64")]
    {
        match level() {
            // SAFETY: level() found the features these functions are compiled for.
            Level::Avx512 => return unsafe { x86::avx512(l) },
            Level::Avx2 => return unsafe { x86::avx2(l) },
            Level::Baseline => {}
        }
    }
    l.run()
}

/// A per-element function for [`map1`]. Implement it on a unit struct with `apply` marked
/// `#[inline(always)]`: a closure is not inlined into the vector loop by force, and a call per
/// element is far slower than the baseline loop it replaces.
pub trait UnaryFn<T>: Copy + Send + Sync {
    /// The value for one element.
    fn apply(self, x: T) -> T;
}

/// A per-element function of two arguments for [`map2`] (see [`UnaryFn`]).
pub trait BinaryFn<T>: Copy + Send + Sync {
    /// The value for one element.
    fn apply(self, a: T, b: T) -> T;
}

/// `out[i] = f(a[i])`, vectorised. The slices must have the same length.
#[inline(always)]
pub fn map1<T: Copy, F: UnaryFn<T>>(out: &mut [T], a: &[T], f: F) {
    vectorized(Map1 { out, a, f })
}

/// `out[i] = f(a[i], b[i])`, vectorised. The slices must have the same length.
#[inline(always)]
pub fn map2<T: Copy, F: BinaryFn<T>>(out: &mut [T], a: &[T], b: &[T], f: F) {
    vectorized(Map2 { out, a, b, f })
}

struct Map1<'a, T, F> {
    out: &'a mut [T],
    a: &'a [T],
    f: F,
}

impl<T: Copy, F: UnaryFn<T>> VectorLoop for Map1<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let n = self.out.len();
        for (o, &a) in self.out.iter_mut().zip(&self.a[..n]) {
            *o = self.f.apply(a);
        }
    }
}

struct Map2<'a, T, F> {
    out: &'a mut [T],
    a: &'a [T],
    b: &'a [T],
    f: F,
}

impl<T: Copy, F: BinaryFn<T>> VectorLoop for Map2<'_, T, F> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let n = self.out.len();
        for ((o, &a), &b) in self.out.iter_mut().zip(&self.a[..n]).zip(&self.b[..n]) {
            *o = self.f.apply(a, b);
        }
    }
}

/// Lanes of the fixed-order sums below: one AVX-512 register of f32.
const LANES: usize = 16;

/// Adds the lanes pairwise: `[0..8] + [8..16]`, then halves again down to one.
#[inline(always)]
fn fold_lanes<T: Float>(mut acc: [T; LANES]) -> T {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for j in 0..width {
            acc[j] += acc[j + width];
        }
    }
    acc[0]
}

/// `Σ f(x[i])` over 16 running sums (sum `j` takes the `i` with `i % 16 == j`), added pairwise
/// at the end: an order fixed by the length alone, which a vector unit of any width runs as
/// independent lanes (a single running sum is a chain of dependent adds that never
/// vectorises). Inline it into a [`VectorLoop`] for the widest unit; elsewhere it still runs in
/// the build's baseline vectors.
#[inline(always)]
pub fn sum_map<T: Float>(x: &[T], f: impl Fn(T) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let (blocks, rest) = x.as_chunks::<LANES>();
    for b in blocks {
        for j in 0..LANES {
            acc[j] += f(b[j]);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += f(v);
    }
    fold_lanes(acc)
}

/// `Σ f(x[i], y[i])` in the lane order of [`sum_map`]. `y` must be at least as long as `x`.
#[inline(always)]
pub fn sum_map2<T: Float>(x: &[T], y: &[T], f: impl Fn(T, T) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let y = &y[..x.len()];
    let ((xb, xr), (yb, yr)) = (x.as_chunks::<LANES>(), y.as_chunks::<LANES>());
    for (a, b) in xb.iter().zip(yb) {
        for j in 0..LANES {
            acc[j] += f(a[j], b[j]);
        }
    }
    for ((acc, &a), &b) in acc.iter_mut().zip(xr).zip(yr) {
        *acc += f(a, b);
    }
    fold_lanes(acc)
}

/// `Σ f(x[i], y[i], z[i])` in the lane order of [`sum_map`]. `y` and `z` must be at least as
/// long as `x`.
#[inline(always)]
pub fn sum_map3<T: Float>(x: &[T], y: &[T], z: &[T], f: impl Fn(T, T, T) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let (y, z) = (&y[..x.len()], &z[..x.len()]);
    let ((xb, xr), (yb, yr), (zb, zr)) = (x.as_chunks::<LANES>(), y.as_chunks::<LANES>(), z.as_chunks::<LANES>());
    for ((a, b), c) in xb.iter().zip(yb).zip(zb) {
        for j in 0..LANES {
            acc[j] += f(a[j], b[j], c[j]);
        }
    }
    for (((acc, &a), &b), &c) in acc.iter_mut().zip(xr).zip(yr).zip(zr) {
        *acc += f(a, b, c);
    }
    fold_lanes(acc)
}

/// `Σ x` in the lane order of [`sum_map`].
#[inline(always)]
pub fn sum<T: Float>(x: &[T]) -> T {
    sum_map(x, |v| v)
}

/// `Σ x·y` in the lane order of [`sum_map`]. `y` must be at least as long as `x`.
#[inline(always)]
pub fn dot<T: Float>(x: &[T], y: &[T]) -> T {
    sum_map2(x, y, |a, b| a * b)
}

/// The largest element over lanes (`-inf` for none; NaNs are skipped, so all-NaN gives `-inf`,
/// as the sequential `if v > m` fold does).
#[inline(always)]
pub fn max<T: Float>(x: &[T]) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a = if v > *a { v } else { *a };
    }
    acc.iter().fold(T::neg_infinity(), |m, &v| if v > m { v } else { m })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Level {
    Baseline,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
}

/// The CPU's vector level, detected once (`AUTOPAR_SIMD=baseline` forces the build's baseline,
/// for comparing).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn level() -> Level {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if std::env::var("AUTOPAR_SIMD").is_ok_and(|v| v == "baseline") {
            return Level::Baseline;
        }
        detect()
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Level {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
    {
        Level::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Level::Avx2
    } else {
        Level::Baseline
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Level {
    Level::Baseline
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// # Safety
    /// The CPU must have AVX-512 F, VL, DQ, BW, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
    pub(super) unsafe fn avx512<L: super::VectorLoop>(l: L) -> L::Output {
        l.run()
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2<L: super::VectorLoop>(l: L) -> L::Output {
        l.run()
    }
}

use crate::Float;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    struct Probe;

    impl UnaryFn<f32> for Probe {
        #[inline(always)]
        fn apply(self, x: f32) -> f32 {
            crate::fastmath::tanh_f32(x)
        }
    }

    impl BinaryFn<f32> for Probe {
        #[inline(always)]
        fn apply(self, x: f32, y: f32) -> f32 {
            crate::fastmath::tanh_f32(x) * 0.5 + crate::fastmath::exp_f32(-x * y)
        }
    }

    #[test]
    fn sums_follow_the_lane_order_and_max_finds_the_largest() {
        for n in [0usize, 1, 5, 15, 16, 17, 33, 64, 100] {
            let x: Vec<f64> = (0..n).map(|i| ((i * 37) % 11) as f64 - 4.5).collect();
            let y: Vec<f64> = (0..n).map(|i| ((i * 13) % 7) as f64 * 0.25).collect();
            // The same sums written out: lane j adds elements j, j + 16, ...; lanes pairwise.
            let mut lanes = [0f64; LANES];
            for (i, v) in x.iter().enumerate() {
                lanes[i % LANES] += v;
            }
            let mut w = LANES;
            while w > 1 {
                w /= 2;
                for j in 0..w {
                    lanes[j] += lanes[j + w];
                }
            }
            assert_eq!(sum(&x), lanes[0], "n {n}");
            let d: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
            assert!((dot(&x, &y) - d).abs() < 1e-12, "n {n}");
            let t: f64 = x.iter().zip(&y).map(|(a, b)| a * b * a).sum();
            assert!((sum_map3(&x, &y, &x, |a, b, c| a * b * c) - t).abs() < 1e-12, "n {n}");
            let q: f64 = x.iter().map(|a| a * a).sum();
            assert!((sum_map(&x, |a| a * a) - q).abs() < 1e-12, "n {n}");
            assert_eq!(max(&x), x.iter().copied().fold(f64::NEG_INFINITY, f64::max), "n {n}");
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn every_path_gives_the_baseline_bits() {
        let xs: Vec<f32> = (-5000..5000).map(|i| i as f32 * 1.37e-3).collect();
        let rev: Vec<f32> = xs.iter().rev().copied().collect();
        let base2: Vec<f32> = xs.iter().zip(&rev).map(|(&x, &y)| BinaryFn::apply(Probe, x, y)).collect();
        let base1: Vec<f32> = xs.iter().map(|&x| UnaryFn::apply(Probe, x)).collect();
        let (mut one, mut two) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        map1(&mut one, &xs, Probe);
        map2(&mut two, &xs, &rev, Probe);
        assert_eq!(bits(&base1), bits(&one));
        assert_eq!(bits(&base2), bits(&two));
        #[cfg(target_arch = "x86_64")]
        if detect() == Level::Avx512 {
            let mut avx2 = vec![0f32; xs.len()];
            // SAFETY: an AVX-512 CPU has AVX2 and FMA.
            unsafe { x86::avx2(Map2 { out: &mut avx2, a: &xs, b: &rev, f: Probe }) };
            assert_eq!(bits(&base2), bits(&avx2));
        }
    }
}
