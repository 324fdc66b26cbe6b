//! [`Tensor`]: a dynamically typed, reference-counted n-d array, and [`Shape`].
//!
//! Storage is an `ndarray::ArcArray` per dtype. Cloning a tensor, slicing it, transposing it or
//! reshaping a contiguous one never copies: views share the buffer and carry their own offset
//! and strides. Kernels read any strides; they write fresh standard-layout (row-major) arrays.

use std::fmt;

use half::{bf16, f16};
use ndarray::{ArcArray, ArrayD, ArrayViewD, IxDyn};

use crate::{DType, Element, Result, TensorError};

#[derive(Clone)]
pub(crate) enum Storage {
    F32(ArcArray<f32, IxDyn>),
    F64(ArcArray<f64, IxDyn>),
    F16(ArcArray<f16, IxDyn>),
    BF16(ArcArray<bf16, IxDyn>),
    I32(ArcArray<i32, IxDyn>),
    I64(ArcArray<i64, IxDyn>),
}

/// Applies `$body` with `$a` bound to the typed `ArcArray` of any dtype.
macro_rules! with_storage {
    ($s:expr, $a:ident => $body:expr) => {
        match $s {
            Storage::F32($a) => $body,
            Storage::F64($a) => $body,
            Storage::F16($a) => $body,
            Storage::BF16($a) => $body,
            Storage::I32($a) => $body,
            Storage::I64($a) => $body,
        }
    };
}

/// Rebuilds a storage of the same dtype from a typed expression.
macro_rules! map_storage {
    ($s:expr, $a:ident => $body:expr) => {
        match $s {
            Storage::F32($a) => Storage::F32($body),
            Storage::F64($a) => Storage::F64($body),
            Storage::F16($a) => Storage::F16($body),
            Storage::BF16($a) => Storage::BF16($body),
            Storage::I32($a) => Storage::I32($body),
            Storage::I64($a) => Storage::I64($body),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use {map_storage, with_storage};

/// A dense n-d tensor of one [`DType`]. Cheap to clone (shared storage).
#[derive(Clone)]
pub struct Tensor {
    pub(crate) s: Storage,
}

/// A tensor shape: one size per dimension, row-major.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// NumPy broadcasting of two shapes, or `None` if they are incompatible.
    pub fn broadcast(&self, other: &Shape) -> Option<Shape> {
        broadcast_shapes(&self.0, &other.0).map(Shape)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}
impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(v.to_vec())
    }
}
impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}
impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Shape{:?}", self.0)
    }
}

/// NumPy broadcasting: align from the right, sizes must be equal or 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Row-major copy of any strided view. The innermost output axis is copied as a slice when it
/// is contiguous in the source; a transposed pair of trailing axes is copied in 8x8 tiles; other
/// layouts gather element by element. (Much faster than generic n-d iteration.)
pub(crate) fn to_standard<T: Copy>(v: &ArrayViewD<'_, T>) -> ArrayD<T> {
    if v.is_standard_layout() {
        return v.to_owned();
    }
    let shape = v.shape().to_vec();
    let strides = v.strides().to_vec();
    let n = shape.len();
    let total: usize = shape.iter().product();
    let mut out: Vec<T> = Vec::with_capacity(total);
    if total > 0 {
        let base = v.as_ptr();
        let last = shape[n - 1];
        let sl = strides[n - 1];
        // Transposed trailing pair: source strides (1, s) on the last two axes.
        let tiled = n >= 2 && sl != 1 && strides[n - 2] == 1;
        let outer_dims = if tiled { n - 2 } else { n - 1 };
        let outer: usize = shape[..outer_dims].iter().product();
        let mut idx = vec![0usize; outer_dims];
        // SAFETY: every offset below addresses an element of the view (indices within `shape`).
        unsafe {
            let dst = out.as_mut_ptr();
            let mut w = 0usize;
            for _ in 0..outer {
                let off: isize = idx.iter().zip(&strides).map(|(&i, &s)| i as isize * s).sum();
                let p = base.offset(off);
                if tiled {
                    let (rows, s_row) = (shape[n - 2], strides[n - 2]);
                    debug_assert_eq!(s_row, 1);
                    for r0 in (0..rows).step_by(8) {
                        for c0 in (0..last).step_by(8) {
                            for r in r0..(r0 + 8).min(rows) {
                                for c in c0..(c0 + 8).min(last) {
                                    *dst.add(w + r * last + c) = *p.offset(r as isize + c as isize * sl);
                                }
                            }
                        }
                    }
                    w += rows * last;
                } else if sl == 1 {
                    std::ptr::copy_nonoverlapping(p, dst.add(w), last);
                    w += last;
                } else {
                    for c in 0..last {
                        *dst.add(w + c) = *p.offset(c as isize * sl);
                    }
                    w += last;
                }
                for d in (0..outer_dims).rev() {
                    idx[d] += 1;
                    if idx[d] < shape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
            debug_assert_eq!(w, total);
            out.set_len(total);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&shape), out).expect("count")
}

/// Normalises a possibly negative axis against `rank`.
pub fn normalize_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    if axis < -r || axis >= r {
        return Err(TensorError::AxisOutOfRange { op, axis, rank });
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

impl Tensor {
    /// Wraps an owned array (no copy).
    pub fn from_array<T: Element>(a: ArrayD<T>) -> Tensor {
        T::wrap(a.into_shared())
    }

    /// Wraps a shared array (no copy).
    pub fn from_shared<T: Element>(a: ArcArray<T, IxDyn>) -> Tensor {
        T::wrap(a)
    }

    /// Builds a row-major tensor; fails if `data.len()` differs from the shape's element count.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Tensor> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(TensorError::ElementCount { op: "from_vec", shape: shape.to_vec(), expected, len: data.len() });
        }
        let a = ArrayD::from_shape_vec(IxDyn(shape), data).expect("element count checked");
        Ok(Tensor::from_array(a))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_array(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// A tensor filled with `value` (converted to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Tensor {
        fn mk<T: Element>(shape: &[usize], v: f64) -> Tensor {
            Tensor::from_array(ArrayD::from_elem(IxDyn(shape), T::from_f64(v)))
        }
        match dtype {
            DType::F32 => mk::<f32>(shape, value),
            DType::F64 => mk::<f64>(shape, value),
            DType::F16 => mk::<f16>(shape, value),
            DType::BF16 => mk::<bf16>(shape, value),
            DType::I32 => mk::<i32>(shape, value),
            DType::I64 => mk::<i64>(shape, value),
        }
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, 0.0, dtype)
    }

    /// Ones.
    pub fn ones(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, 1.0, dtype)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.s {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        with_storage!(&self.s, a => a.shape())
    }

    /// The element strides of this view (row-major arrays have decreasing strides).
    pub fn strides(&self) -> &[isize] {
        with_storage!(&self.s, a => a.strides())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// Bytes of the elements this view covers.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype().size_of()
    }

    /// True if this tensor's storage is shared with no other tensor (an update in place through
    /// [`Tensor::as_mut_slice`] then copies nothing).
    pub fn is_unique(&self) -> bool {
        with_storage!(&self.s, a => a.is_unique())
    }

    /// True if the view is row-major contiguous.
    pub fn is_contiguous(&self) -> bool {
        with_storage!(&self.s, a => a.is_standard_layout())
    }

    /// A row-major contiguous tensor with the same values (no copy if already contiguous).
    pub fn contiguous(&self) -> Tensor {
        if self.is_contiguous() {
            return self.clone();
        }
        Tensor { s: map_storage!(&self.s, a => to_standard(&a.view()).into_shared()) }
    }

    /// True if the memory this view covers overlaps `other`'s (a zero-copy slice overlaps its
    /// source). Used to verify that views do not copy.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        let (a0, a1) = self.byte_range();
        let (b0, b1) = other.byte_range();
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }

    fn byte_range(&self) -> (usize, usize) {
        let size = self.dtype().size_of() as isize;
        let base = with_storage!(&self.s, a => a.as_ptr() as isize);
        if self.numel() == 0 {
            return (base as usize, base as usize);
        }
        let (mut lo, mut hi) = (base, base);
        for (d, s) in self.shape().iter().zip(self.strides()) {
            let span = (*d as isize - 1) * *s * size;
            if span < 0 {
                lo += span;
            } else {
                hi += span;
            }
        }
        (lo as usize, (hi + size) as usize)
    }

    /// A typed read-only view; fails if the dtype differs.
    pub fn array<T: Element>(&self) -> Result<ArrayViewD<'_, T>> {
        self.shared::<T>().map(|a| a.view())
    }

    /// The typed shared array; fails if the dtype differs.
    pub fn shared<T: Element>(&self) -> Result<&ArcArray<T, IxDyn>> {
        T::unwrap(self).ok_or(TensorError::DTypeMismatch { op: "array", what: "tensor", expected: T::DTYPE, got: self.dtype() })
    }

    /// Typed view with an op name for the error.
    pub(crate) fn typed<T: Element>(&self, op: &'static str, what: &'static str) -> Result<ArrayViewD<'_, T>> {
        T::unwrap(self).map(|a| a.view()).ok_or(TensorError::DTypeMismatch { op, what, expected: T::DTYPE, got: self.dtype() })
    }

    /// The elements in row-major order; fails if the dtype differs.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let a = self.shared::<T>()?;
        Ok(match a.as_slice() {
            Some(s) => s.to_vec(),
            None => to_standard(&a.view()).into_raw_vec_and_offset().0,
        })
    }

    /// The elements as a row-major slice, when the view is row-major contiguous (no copy);
    /// `None` for another dtype or a strided view.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::unwrap(self).and_then(|a| a.as_slice())
    }

    /// Copies the elements in row-major order into `out` (a memcpy when the view is contiguous);
    /// fails if the dtype or the element count differs.
    pub fn copy_to_slice<T: Element>(&self, out: &mut [T]) -> Result<()> {
        let a = self.shared::<T>()?;
        if out.len() != a.len() {
            return Err(TensorError::ElementCount { op: "copy_to_slice", shape: self.shape().to_vec(), expected: a.len(), len: out.len() });
        }
        match a.as_slice() {
            Some(s) => out.copy_from_slice(s),
            None => out.copy_from_slice(to_standard(&a.view()).as_slice().expect("standard layout")),
        }
        Ok(())
    }

    /// The elements as a mutable row-major slice, for updates in place. The storage is copied
    /// first only when another tensor shares it or the view is not row-major contiguous, so an
    /// update never changes another tensor; otherwise no allocation happens.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        let dtype = self.dtype();
        if T::DTYPE != dtype {
            return Err(TensorError::DTypeMismatch { op: "as_mut_slice", what: "tensor", expected: T::DTYPE, got: dtype });
        }
        if !self.is_contiguous() {
            *self = self.contiguous();
        }
        let a = T::unwrap_mut(self).expect("dtype checked");
        Ok(a.as_slice_mut().expect("a unique row-major array is a slice"))
    }

    /// The elements in row-major order converted to f64 (any dtype).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_storage!(&self.s, a => a.iter().map(|x| x.to_f64()).collect())
    }

    /// Whether every element is finite (no infinity, no NaN; integers always are).
    pub fn all_finite(&self) -> bool {
        match &self.s {
            Storage::F32(a) => a.iter().all(|x| x.is_finite()),
            Storage::F64(a) => a.iter().all(|x| x.is_finite()),
            Storage::F16(a) => a.iter().all(|x| x.is_finite()),
            Storage::BF16(a) => a.iter().all(|x| x.is_finite()),
            Storage::I32(_) | Storage::I64(_) => true,
        }
    }

    /// The single element of a one-element tensor, as f64.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(TensorError::BadShape { op: "item", what: "tensor", shape: self.shape().to_vec(), expected: "one element".into() });
        }
        Ok(self.to_f64_vec()[0])
    }

    /// Converts to another dtype (a copy; returns a clone if the dtype is the same).
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        fn conv<S: Element, T: Element>(a: &ArcArray<S, IxDyn>) -> Tensor {
            Tensor::from_array(a.map(|x| T::from_f64(x.to_f64())))
        }
        fn to<T: Element>(s: &Storage) -> Tensor {
            with_storage!(s, a => conv::<_, T>(a))
        }
        match dtype {
            DType::F32 => to::<f32>(&self.s),
            DType::F64 => to::<f64>(&self.s),
            DType::F16 => to::<f16>(&self.s),
            DType::BF16 => to::<bf16>(&self.s),
            DType::I32 => to::<i32>(&self.s),
            DType::I64 => to::<i64>(&self.s),
        }
    }

    /// Largest absolute element-wise difference, or `None` if shapes differ.
    pub fn max_abs_diff(&self, other: &Tensor) -> Option<f64> {
        if self.shape() != other.shape() {
            return None;
        }
        let a = self.to_f64_vec();
        let b = other.to_f64_vec();
        Some(a.iter().zip(&b).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() }).fold(0.0, f64::max))
    }

    /// `|a - b| <= atol + rtol*|b|` everywhere (shapes must match; NaNs compare unequal).
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64) -> bool {
        self.shape() == other.shape()
            && self.to_f64_vec().iter().zip(other.to_f64_vec()).all(|(a, b)| a == &b || (a - b).abs() <= atol + rtol * b.abs())
    }

    /// True if shapes, dtypes and every element are identical (bitwise for floats, NaN == NaN).
    pub fn bit_eq(&self, other: &Tensor) -> bool {
        self.dtype() == other.dtype()
            && self.shape() == other.shape()
            && self.to_f64_vec().iter().zip(other.to_f64_vec()).all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        with_storage!(&self.s, a => write!(f, "Tensor<{}>{:?} {:?}", self.dtype(), a.shape(), a.view()))
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype(), self.shape())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_checks_the_element_count() {
        assert!(Tensor::from_vec(&[2, 3], vec![0f32; 6]).is_ok());
        let e = Tensor::from_vec(&[2, 3], vec![0f32; 5]).unwrap_err();
        assert_eq!(e, TensorError::ElementCount { op: "from_vec", shape: vec![2, 3], expected: 6, len: 5 });
    }

    #[test]
    fn casts_round_trip_through_half_precision_storage() {
        let x = Tensor::from_vec(&[3], vec![1.5f32, -2.0, 0.25]).unwrap();
        for d in [DType::F16, DType::BF16, DType::F64] {
            let y = x.cast(d);
            assert_eq!((y.dtype(), y.nbytes()), (d, 3 * d.size_of()));
            assert!(y.cast(DType::F32).bit_eq(&x), "{d}");
        }
        assert_eq!(x.cast(DType::I32).to_vec::<i32>().unwrap(), vec![1, -2, 0]);
    }

    #[test]
    fn typed_access_rejects_the_wrong_dtype() {
        let x = Tensor::zeros(&[2], DType::I64);
        assert!(matches!(x.to_vec::<f32>(), Err(TensorError::DTypeMismatch { expected: DType::F32, got: DType::I64, .. })));
        assert_eq!(x.to_vec::<i64>().unwrap(), vec![0, 0]);
    }

    #[test]
    fn shapes_broadcast_numpy_style() {
        assert_eq!(broadcast_shapes(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_shapes(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shapes(&[2], &[3]), None);
        assert_eq!(Shape::from([2, 3]).numel(), 6);
        assert_eq!(Shape::from([2, 3]).to_string(), "[2, 3]");
    }

    #[test]
    fn dtype_names_parse_back() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("float32"), Some(DType::F32));
        assert_eq!(DType::parse("u8"), None);
    }

    #[test]
    fn item_and_display_describe_the_tensor() {
        let s = Tensor::scalar(2.5f64);
        assert_eq!(s.item().unwrap(), 2.5);
        assert!(Tensor::zeros(&[2], DType::F32).item().is_err());
        assert_eq!(Tensor::zeros(&[2, 3], DType::BF16).to_string(), "bf16[2, 3]");
        assert!(normalize_axis("t", -3, 2).is_err());
        assert_eq!(normalize_axis("t", -1, 2).unwrap(), 1);
    }

    #[test]
    fn strided_views_copy_to_row_major_in_every_layout() {
        let x = Tensor::from_vec(&[3, 4, 5, 6], (0..360).map(|i| i as f64).collect()).unwrap();
        let xa = x.array::<f64>().unwrap();
        let perms: [&[usize]; 5] = [&[0, 2, 1, 3], &[3, 2, 1, 0], &[0, 1, 3, 2], &[1, 3, 0, 2], &[2, 0, 3, 1]];
        for perm in perms {
            let v = xa.view().permuted_axes(IxDyn(perm));
            assert_eq!(to_standard(&v), v.as_standard_layout().into_owned(), "perm {perm:?}");
        }
        let sliced = xa.slice(ndarray::s![1.., ..;2, 1..4, ..]).into_dyn();
        assert_eq!(to_standard(&sliced), sliced.to_owned());
        let empty = ArrayD::<f64>::zeros(IxDyn(&[2, 0, 3]));
        assert_eq!(to_standard(&empty.view().permuted_axes(IxDyn(&[2, 1, 0]))).shape(), &[3, 0, 2]);
    }

    #[test]
    fn updates_in_place_copy_only_shared_or_strided_storage() {
        let mut a = Tensor::from_vec(&[2, 3], (0..6).map(|i| i as f32).collect()).unwrap();
        let ptr = a.as_slice::<f32>().unwrap().as_ptr();
        a.as_mut_slice::<f32>().unwrap()[0] = 10.0;
        assert_eq!(a.as_slice::<f32>().unwrap().as_ptr(), ptr, "a unique tensor is updated where it lies");
        let held = a.clone();
        assert!(!a.is_unique());
        a.as_mut_slice::<f32>().unwrap()[1] = 20.0;
        assert_eq!(held.to_vec::<f32>().unwrap(), vec![10.0, 1.0, 2.0, 3.0, 4.0, 5.0], "a shared tensor is copied first");
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![10.0, 20.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(a.as_mut_slice::<f64>().is_err());
        let mut t = crate::kernels::shape::transpose(&held, &[1, 0]).unwrap();
        assert!(t.as_slice::<f32>().is_none());
        assert_eq!(t.as_mut_slice::<f32>().unwrap(), &[10.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let mut out = [0f32; 6];
        crate::kernels::shape::transpose(&held, &[1, 0]).unwrap().copy_to_slice(&mut out).unwrap();
        assert_eq!(out, [10.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(held.copy_to_slice(&mut [0f32; 5]).is_err());
        assert_eq!(crate::kernels::shape::transpose(&held, &[1, 0]).unwrap().to_vec::<f32>().unwrap(), out.to_vec());
    }

    #[test]
    fn clones_share_storage_and_fresh_tensors_do_not() {
        let a = Tensor::zeros(&[4], DType::F32);
        assert!(a.clone().overlaps(&a));
        assert!(!Tensor::zeros(&[4], DType::F32).overlaps(&a));
    }
}
