//! The execution context every kernel takes, and the backend trait behind the matrix products.
//!
//! [`ExecCtx`] is a small `Copy` value: whether this call may use several threads, the element
//! count above which element-wise work and reductions go parallel, and the [`Backend`] that runs
//! GEMMs. The simulated devices of the parallel runtime run one executor per rank on few cores,
//! so each uses [`ExecCtx::serial`]; a single-device run uses [`ExecCtx::parallel`]. Parallel
//! execution uses the current rayon pool (wrap a call in `ThreadPool::install` to pin a count).
//!
//! Every kernel gives bit-identical results serially and in parallel: work is split over output
//! elements (or fixed-size chunks), never over a reduction in a thread-count-dependent way.

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

/// The compute primitives a device must provide. The CPU backend ([`Cpu`]) uses `gemm`; a GPU
/// backend would route these to cuBLAS. Kernels reach it through [`ExecCtx::backend`].
pub trait Backend: Send + Sync {
    /// A short name for reports (`"cpu"`).
    fn name(&self) -> &'static str;
    /// `c := a*b`, or `c += a*b` when `accumulate`; any strides (transposes are stride swaps).
    fn gemm_f32(&self, parallel: bool, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: ArrayViewMut2<'_, f32>, accumulate: bool);
    /// As [`Backend::gemm_f32`] in f64.
    fn gemm_f64(&self, parallel: bool, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>, c: ArrayViewMut2<'_, f64>, accumulate: bool);
    /// `a*b` as a new row-major array. By default a zero-filled array given to
    /// [`Backend::gemm_f32`]; a backend that writes every element without reading it skips the fill.
    fn gemm_new_f32(&self, parallel: bool, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Array2<f32> {
        let mut c = Array2::zeros((a.nrows(), b.ncols()));
        self.gemm_f32(parallel, a, b, c.view_mut(), false);
        c
    }
    /// As [`Backend::gemm_new_f32`] in f64.
    fn gemm_new_f64(&self, parallel: bool, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Array2<f64> {
        let mut c = Array2::zeros((a.nrows(), b.ncols()));
        self.gemm_f64(parallel, a, b, c.view_mut(), false);
        c
    }
}

/// The CPU backend: `gemm` 0.19 (AVX-512 kernels picked at run time) with rayon parallelism.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// The process-wide CPU backend instance.
pub static CPU: Cpu = Cpu;

/// `c := a*b`, or `c += a*b` when `accumulate`. Without `accumulate`, every element of `c` is
/// written and none is read, so `c` may view uninitialised memory when it is not a vector
/// ([`gemm_cpu_new`]; the gemm crate's matrix-vector path makes a slice of the output).
fn gemm_cpu<T: 'static + Copy + num_traits::Zero + num_traits::One>(
    parallel: bool,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    mut c: ArrayViewMut2<'_, T>,
    accumulate: bool,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert!(k == k2 && c.dim() == (m, n), "gemm: shapes [{m}, {k}] x [{k2}, {n}] -> {:?}", c.dim());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            let (p, rs, cs) = (c.as_mut_ptr(), c.strides()[0], c.strides()[1]);
            for i in 0..m as isize {
                for j in 0..n as isize {
                    // SAFETY: (i, j) lies inside the view; written without reading.
                    unsafe { p.offset(i * rs + j * cs).write(T::zero()) };
                }
            }
        }
        return;
    }
    // The GEMM kernels run a column-major right-hand side at a quarter of the speed when the
    // destination is row-major (measured; every other layout combination runs at full speed).
    // Then either the product is formed column-major in a scratch buffer and copied into `c`
    // (m x n elements moved), or `b` is copied to row-major (k x n moved): whichever moves less.
    // A forward `x W^T` with few rows takes the first, so weights are never transposed.
    let b_cols = b.strides()[0] == 1 && b.strides()[1] != 1 && n >= 16;
    let c_rows = c.strides()[1] == 1 && c.strides()[0] != 1;
    if b_cols && c_rows && m > 1 {
        if m < k {
            let mut t = Array2::<T>::uninit((n, m));
            // SAFETY: the view covers `t`'s own buffer, every element of which `gemm_cpu`
            // writes (without `accumulate`) and none of which it reads.
            let t = unsafe {
                gemm_cpu(parallel, a, b, ArrayViewMut2::from_shape_ptr((n, m), t.as_mut_ptr() as *mut T).reversed_axes(), false);
                t.assume_init()
            };
            add_transposed(t.view(), c, accumulate);
            return;
        }
        let b_owned = to_row_major(b);
        return gemm_cpu(parallel, a, b_owned.view(), c, accumulate);
    }
    let par = if parallel && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    let (ars, acs) = (a.strides()[0], a.strides()[1]);
    let (brs, bcs) = (b.strides()[0], b.strides()[1]);
    let (crs, ccs) = (c.strides()[0], c.strides()[1]);
    // SAFETY: the pointers and strides come from live ndarray views whose dimensions were checked
    // above; `c` is a unique mutable view, so the destination does not alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            ccs,
            crs,
            accumulate,
            a.as_ptr(),
            acs,
            ars,
            b.as_ptr(),
            bcs,
            brs,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        );
    }
}

/// `c := t^T` (or `c += t^T`) for a row-major `t` and a row-major `c`, in tiles.
fn add_transposed<T: 'static + Copy + num_traits::Zero + num_traits::One>(
    t: ArrayView2<'_, T>,
    mut c: ArrayViewMut2<'_, T>,
    accumulate: bool,
) {
    const TILE: usize = 16;
    let (m, n) = c.dim();
    let (p, rs, cs) = (c.as_mut_ptr(), c.strides()[0], c.strides()[1]);
    for i0 in (0..m).step_by(TILE) {
        for j0 in (0..n).step_by(TILE) {
            for i in i0..(i0 + TILE).min(m) {
                for j in j0..(j0 + TILE).min(n) {
                    let v = t[(j, i)];
                    // SAFETY: (i, j) lies inside the view; without `accumulate` the element is
                    // only written (it may be uninitialised, see `gemm_cpu`).
                    unsafe {
                        let d = p.offset(i as isize * rs + j as isize * cs);
                        d.write(if accumulate { d.read() + v } else { v });
                    }
                }
            }
        }
    }
}

/// `a*b` in a new row-major array, each element written once by [`gemm_cpu`] (no zero fill
/// first: for a weight gradient of a data-parallel rank that fill was a tenth of its step).
fn gemm_cpu_new<T: 'static + Copy + num_traits::Zero + num_traits::One>(
    parallel: bool,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
) -> Array2<T> {
    let (m, n) = (a.nrows(), b.ncols());
    if m <= 1 || n <= 1 {
        // A vector: the gemm crate's matrix-vector kernels take the output as a slice, which
        // must not hold uninitialised values; its fill costs nothing beside the product.
        let mut c = Array2::zeros((m, n));
        gemm_cpu(parallel, a, b, c.view_mut(), false);
        return c;
    }
    let mut c = Array2::<T>::uninit((m, n));
    // SAFETY: the view covers `c`'s own (row-major, m x n) buffer; `gemm_cpu` without
    // `accumulate` writes every element of it and reads none, so `c` is initialised after.
    unsafe {
        let view = ArrayViewMut2::from_shape_ptr((m, n), c.as_mut_ptr() as *mut T);
        gemm_cpu(parallel, a, b, view, false);
        c.assume_init()
    }
}

/// Row-major copy of a column-major matrix (unit row stride), in 8x8 tiles: small enough that
/// the strided side of the copy does not thrash the cache sets at power-of-two strides.
fn to_row_major<T: Copy + num_traits::Zero>(a: ArrayView2<'_, T>) -> ndarray::Array2<T> {
    const TILE: usize = 8;
    let (rows, cols) = a.dim();
    let cs = a.strides()[1];
    debug_assert_eq!(a.strides()[0], 1);
    let mut out = vec![T::zero(); rows * cols];
    let base = a.as_ptr();
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            for r in r0..(r0 + TILE).min(rows) {
                for (j, o) in out[r * cols + c0..r * cols + c1].iter_mut().enumerate() {
                    // SAFETY: (r, c0 + j) lies inside the view; its element is at r + c * cs.
                    *o = unsafe { *base.offset(r as isize + (c0 + j) as isize * cs) };
                }
            }
        }
    }
    ndarray::Array2::from_shape_vec((rows, cols), out).expect("sized")
}

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn gemm_f32(&self, parallel: bool, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, c: ArrayViewMut2<'_, f32>, accumulate: bool) {
        gemm_cpu(parallel, a, b, c, accumulate)
    }
    fn gemm_f64(&self, parallel: bool, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>, c: ArrayViewMut2<'_, f64>, accumulate: bool) {
        gemm_cpu(parallel, a, b, c, accumulate)
    }
    fn gemm_new_f32(&self, parallel: bool, a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Array2<f32> {
        gemm_cpu_new(parallel, a, b)
    }
    fn gemm_new_f64(&self, parallel: bool, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Array2<f64> {
        gemm_cpu_new(parallel, a, b)
    }
}

/// Per-call execution settings. Cheap to copy; pass `&ExecCtx` to every kernel.
#[derive(Clone, Copy)]
pub struct ExecCtx {
    parallel: bool,
    min_parallel_len: usize,
    backend: &'static dyn Backend,
}

impl std::fmt::Debug for ExecCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCtx")
            .field("parallel", &self.parallel)
            .field("min_parallel_len", &self.min_parallel_len)
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl Default for ExecCtx {
    fn default() -> Self {
        ExecCtx::parallel()
    }
}

impl ExecCtx {
    /// Element count above which element-wise work and reductions use rayon.
    pub const DEFAULT_MIN_PARALLEL_LEN: usize = 1 << 15;

    /// Multi-threaded on the current rayon pool (the default).
    pub fn parallel() -> Self {
        ExecCtx { parallel: true, min_parallel_len: Self::DEFAULT_MIN_PARALLEL_LEN, backend: &CPU }
    }

    /// Single-threaded: every kernel (GEMM included) runs on the calling thread.
    pub fn serial() -> Self {
        ExecCtx { parallel: false, ..Self::parallel() }
    }

    /// Sets the threshold (in elements) for going parallel; 0 parallelises everything.
    pub fn with_min_parallel_len(mut self, len: usize) -> Self {
        self.min_parallel_len = len;
        self
    }

    /// Replaces the backend.
    pub fn with_backend(mut self, backend: &'static dyn Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Whether this context may use several threads at all.
    pub fn is_parallel(&self) -> bool {
        self.parallel
    }

    /// Whether work of `len` elements should be split across threads.
    pub fn par(&self, len: usize) -> bool {
        self.parallel && len >= self.min_parallel_len && rayon::current_num_threads() > 1
    }

    /// The backend running matrix products.
    pub fn backend(&self) -> &'static dyn Backend {
        self.backend
    }

    /// `c := a*b` or `c += a*b` on this context's backend.
    pub fn gemm<T: crate::Float>(&self, a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, c: ArrayViewMut2<'_, T>, accumulate: bool) {
        T::backend_gemm(self.backend, self.parallel, a, b, c, accumulate)
    }

    /// `a*b` as a new row-major array on this context's backend (the CPU writes each element
    /// once, with no zero fill first).
    pub fn gemm_new<T: crate::Float>(&self, a: ArrayView2<'_, T>, b: ArrayView2<'_, T>) -> Array2<T> {
        T::backend_gemm_new(self.backend, self.parallel, a, b)
    }

    /// As [`ExecCtx::gemm`] but always on the calling thread (used inside parallel loops).
    pub fn gemm_serial<T: crate::Float>(&self, a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, c: ArrayViewMut2<'_, T>, accumulate: bool) {
        T::backend_gemm(self.backend, false, a, b, c, accumulate)
    }

    /// Runs `f` on a worker thread of the current rayon pool when this context is parallel and
    /// the caller is outside the pool (the caller waits); else on the calling thread. A graph
    /// run from the main thread pays a pool wake-up (a futex wake and a context switch or two)
    /// at every parallel kernel; run on a worker, the kernels' parallel parts are joins among
    /// workers that are still awake from the last one (GPT step at 2 threads: about 10% faster).
    pub fn on_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.parallel && rayon::current_thread_index().is_none() && rayon::current_num_threads() > 1 {
            rayon::scope(|_| f())
        } else {
            f()
        }
    }

    /// Runs `f(i, chunk)` over consecutive `chunk`-sized pieces of `data`, in parallel when the
    /// total is large. Each piece is handled by one call, so results do not depend on threading.
    pub fn for_chunks<T: Send, F>(&self, data: &mut [T], chunk: usize, f: F)
    where
        F: Fn(usize, &mut [T]) + Send + Sync,
    {
        use rayon::prelude::*;
        if chunk == 0 {
            return;
        }
        if self.par(data.len()) && data.len() > chunk {
            data.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        } else {
            data.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ShapeBuilder};

    fn naive(a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
        let (m, k) = a.dim();
        let n = b.dim().1;
        Array2::from_shape_fn((m, n), |(i, j)| (0..k).map(|p| a[(i, p)] * b[(p, j)]).sum())
    }

    fn filled(shape: (usize, usize), col_major: bool, seed: f64) -> Array2<f64> {
        let f = |(i, j): (usize, usize)| ((i * 7 + j * 13) as f64 * 0.37 + seed).sin();
        if col_major {
            Array2::from_shape_fn(shape.f(), f)
        } else {
            Array2::from_shape_fn(shape, f)
        }
    }

    #[test]
    fn every_layout_of_every_operand_gives_the_product_with_and_without_accumulation() {
        // Shapes that take each path: few rows (the product formed column-major and copied),
        // many rows (the right-hand side copied), and small ones (no copy at all).
        for (m, k, n) in [(16, 40, 24), (48, 8, 20), (3, 5, 4), (1, 30, 17)] {
            for (a_cols, b_cols, c_cols) in (0..8).map(|i| (i & 1 == 1, i & 2 == 2, i & 4 == 4)) {
                let (a, b) = (filled((m, k), a_cols, 0.1), filled((k, n), b_cols, 0.7));
                let want = naive(&a, &b);
                for accumulate in [false, true] {
                    // Without accumulation the destination is only written: NaNs there must
                    // not reach the product (0 * NaN is NaN).
                    let mut c = if accumulate { filled((m, n), c_cols, 1.3) } else { filled((m, n), c_cols, 1.3).mapv(|_| f64::NAN) };
                    let before = c.clone();
                    ExecCtx::serial().gemm(a.view(), b.view(), c.view_mut(), accumulate);
                    let expected = if accumulate { &before + &want } else { want.clone() };
                    let err = (&c - &expected).iter().fold(0f64, |e, v| e.max(v.abs()));
                    assert!(err < 1e-12, "m{m} k{k} n{n} a_cols {a_cols} b_cols {b_cols} c_cols {c_cols} acc {accumulate}: {err}");
                }
            }
        }
    }

    #[test]
    fn a_new_product_is_every_element_written_over_whatever_memory_it_gets() {
        // `gemm_new` skips the zero fill; the allocator hands back freed NaN-filled buffers of
        // the same size, so an element left unwritten (or read before written) shows as NaN.
        for (m, k, n) in [(16, 40, 24), (48, 8, 20), (3, 5, 4), (1, 30, 17), (5, 0, 7), (7, 1, 20), (7, 2, 20), (9, 30, 1)] {
            for (a_cols, b_cols) in (0..4).map(|i| (i & 1 == 1, i & 2 == 2)) {
                let (a, b) = (filled((m, k), a_cols, 0.1), filled((k, n), b_cols, 0.7));
                let want = naive(&a, &b);
                for ctx in [ExecCtx::serial(), ExecCtx::parallel()] {
                    drop(vec![f64::NAN; m * n]);
                    drop(vec![f64::NAN; m * n]);
                    let c = ctx.gemm_new(a.view(), b.view());
                    assert!(c.is_standard_layout());
                    let err = (&c - &want).iter().fold(0f64, |e, v| if v.is_nan() { f64::INFINITY } else { e.max(v.abs()) });
                    assert!(err < 1e-12, "m{m} k{k} n{n} a_cols {a_cols} b_cols {b_cols}: {err}");
                }
            }
        }
    }
}
