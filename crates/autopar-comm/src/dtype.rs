//! Element types, reduction operations and the type-tagged buffers the [`crate::Communicator`]
//! trait takes (so that it stays usable as `dyn Communicator`).
//!
//! Reduction semantics, the same in every backend:
//! * `Sum`, `Prod`: floating point in the element's own type except f16/bf16, which are widened
//!   to f32, combined, and rounded once at the end; integers wrap on overflow (as MPI does).
//! * `Mean`: the sum divided by the group size (integers: truncated toward zero).
//! * `Max`, `Min`: a NaN anywhere gives NaN.

use std::fmt;

use half::{bf16, f16};

/// The element types collectives move and reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision (`f16`).
    F16,
    /// Brain floating point (`bf16`).
    BF16,
    /// IEEE single precision (`f32`).
    F32,
    /// IEEE double precision (`f64`).
    F64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every element type, for tests and tables.
    pub const ALL: [DType; 6] = [DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// The lower-case name (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum (MindSpore's `ReduceOp.SUM`).
    Sum,
    /// The sum divided by the group size.
    Mean,
    /// The largest value (MindSpore's `ReduceOp.MAX`).
    Max,
    /// The smallest value (MindSpore's `ReduceOp.MIN`).
    Min,
    /// The product (MindSpore's `ReduceOp.PROD`).
    Prod,
}

impl ReduceOp {
    /// Every reduction operation, for tests and tables.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type collectives support: f16, bf16, f32, f64, i32, i64.
///
/// `Acc` is the type values are combined in (f32 for the 16-bit floats). The combining functions
/// are the single definition of the reduction semantics; backends and tests use them.
pub trait Element: sealed::Sealed + Copy + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The type's [`DType`] tag.
    const DTYPE: DType;
    /// The type values are combined in.
    type Acc: Copy + Send + Sync + Default + fmt::Debug;
    /// The value in the accumulator type.
    fn widen(self) -> Self::Acc;
    /// An accumulated value back in this type (rounded for the 16-bit floats).
    fn narrow(acc: Self::Acc) -> Self;
    /// `a + b`; integers wrap on overflow.
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a * b`; integers wrap on overflow.
    fn mul(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The larger of `a` and `b`; for floats, NaN when either is NaN.
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The smaller of `a` and `b`; for floats, NaN when either is NaN.
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `sum / n` for a mean over `n` ranks.
    fn div(a: Self::Acc, n: usize) -> Self::Acc;
    /// Wrap a slice in the type-tagged buffer.
    fn buf(s: &[Self]) -> Buf<'_>;
    /// Wrap a mutable slice in the type-tagged buffer.
    fn buf_mut(s: &mut [Self]) -> BufMut<'_>;
    /// The slice inside `buf` when it holds this type.
    fn from_buf<'a>(buf: &Buf<'a>) -> Option<&'a [Self]>;
}

/// Combine `values` (one per rank, in rank order) the way every backend does.
pub fn reduce_serial<T: Element>(values: &[T], op: ReduceOp) -> T {
    let mut acc = values[0].widen();
    for v in &values[1..] {
        acc = combine::<T>(op, acc, v.widen());
    }
    if op == ReduceOp::Mean {
        acc = T::div(acc, values.len());
    }
    T::narrow(acc)
}

#[inline(always)]
pub(crate) fn combine<T: Element>(op: ReduceOp, a: T::Acc, b: T::Acc) -> T::Acc {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => T::add(a, b),
        ReduceOp::Prod => T::mul(a, b),
        ReduceOp::Max => T::max(a, b),
        ReduceOp::Min => T::min(a, b),
    }
}

macro_rules! float_minmax {
    () => {
        #[inline(always)]
        fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc {
            if a >= b || a.is_nan() {
                a
            } else {
                b
            }
        }
        #[inline(always)]
        fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc {
            if a <= b || a.is_nan() {
                a
            } else {
                b
            }
        }
    };
}

macro_rules! buf_fns {
    ($variant:ident) => {
        fn buf(s: &[Self]) -> Buf<'_> {
            Buf::$variant(s)
        }
        fn buf_mut(s: &mut [Self]) -> BufMut<'_> {
            BufMut::$variant(s)
        }
        fn from_buf<'a>(buf: &Buf<'a>) -> Option<&'a [Self]> {
            match buf {
                Buf::$variant(s) => Some(*s),
                _ => None,
            }
        }
    };
}

macro_rules! native_float {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(acc: $t) -> $t {
                acc
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
            float_minmax!();
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                a / n as $t
            }
            buf_fns!($variant);
        }
    };
}

macro_rules! half_float {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            type Acc = f32;
            #[inline(always)]
            fn widen(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn narrow(acc: f32) -> $t {
                <$t>::from_f32(acc)
            }
            #[inline(always)]
            fn add(a: f32, b: f32) -> f32 {
                a + b
            }
            #[inline(always)]
            fn mul(a: f32, b: f32) -> f32 {
                a * b
            }
            float_minmax!();
            #[inline(always)]
            fn div(a: f32, n: usize) -> f32 {
                a / n as f32
            }
            buf_fns!($variant);
        }
    };
}

macro_rules! integer {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            type Acc = $t;
            #[inline(always)]
            fn widen(self) -> $t {
                self
            }
            #[inline(always)]
            fn narrow(acc: $t) -> $t {
                acc
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                a / n as $t
            }
            buf_fns!($variant);
        }
    };
}

native_float!(f32, F32);
native_float!(f64, F64);
half_float!(f16, F16);
half_float!(bf16, BF16);
integer!(i32, I32);
integer!(i64, I64);

/// A read-only buffer of one of the supported element types.
#[derive(Clone, Copy, Debug)]
pub enum Buf<'a> {
    /// Half-precision values.
    F16(&'a [f16]),
    /// Bfloat16 values.
    BF16(&'a [bf16]),
    /// Single-precision values.
    F32(&'a [f32]),
    /// Double-precision values.
    F64(&'a [f64]),
    /// 32-bit integers.
    I32(&'a [i32]),
    /// 64-bit integers.
    I64(&'a [i64]),
}

/// A writable buffer of one of the supported element types.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// Half-precision values.
    F16(&'a mut [f16]),
    /// Bfloat16 values.
    BF16(&'a mut [bf16]),
    /// Single-precision values.
    F32(&'a mut [f32]),
    /// Double-precision values.
    F64(&'a mut [f64]),
    /// 32-bit integers.
    I32(&'a mut [i32]),
    /// 64-bit integers.
    I64(&'a mut [i64]),
}

macro_rules! each_buf {
    ($e:expr, $enum:ident, $s:ident => $body:expr) => {
        match $e {
            $enum::F16($s) => $body,
            $enum::BF16($s) => $body,
            $enum::F32($s) => $body,
            $enum::F64($s) => $body,
            $enum::I32($s) => $body,
            $enum::I64($s) => $body,
        }
    };
}

impl<'a> Buf<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buf::F16(_) => DType::F16,
            Buf::BF16(_) => DType::BF16,
            Buf::F32(_) => DType::F32,
            Buf::F64(_) => DType::F64,
            Buf::I32(_) => DType::I32,
            Buf::I64(_) => DType::I64,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        each_buf!(self, Buf, s => s.len())
    }
    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.dtype().size()
    }
    /// Address of the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        each_buf!(self, Buf, s => s.as_ptr() as *const u8)
    }
    /// The raw bytes (all element types are plain old data).
    pub fn as_bytes(&self) -> &'a [u8] {
        // SAFETY: every element type is plain data without padding; the bytes live for 'a.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.byte_len()) }
    }
}

impl<'a> BufMut<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.as_buf().dtype()
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_buf().len()
    }
    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.as_buf().byte_len()
    }
    /// A read-only view of the same elements.
    pub fn as_buf(&self) -> Buf<'_> {
        match self {
            BufMut::F16(s) => Buf::F16(s),
            BufMut::BF16(s) => Buf::BF16(s),
            BufMut::F32(s) => Buf::F32(s),
            BufMut::F64(s) => Buf::F64(s),
            BufMut::I32(s) => Buf::I32(s),
            BufMut::I64(s) => Buf::I64(s),
        }
    }
    /// Address of the first byte.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        each_buf!(self, BufMut, s => s.as_mut_ptr() as *mut u8)
    }
    /// The raw bytes, writable (every bit pattern is a valid value of every element type).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let n = self.byte_len();
        // SAFETY: plain data; any bit pattern is a valid f16/bf16/f32/f64/i32/i64.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), n) }
    }
    /// Reborrow for a shorter lifetime.
    pub fn reborrow(&mut self) -> BufMut<'_> {
        match self {
            BufMut::F16(s) => BufMut::F16(s),
            BufMut::BF16(s) => BufMut::BF16(s),
            BufMut::F32(s) => BufMut::F32(s),
            BufMut::F64(s) => BufMut::F64(s),
            BufMut::I32(s) => BufMut::I32(s),
            BufMut::I64(s) => BufMut::I64(s),
        }
    }
}

impl<'a, T: Element> From<&'a [T]> for Buf<'a> {
    fn from(s: &'a [T]) -> Self {
        T::buf(s)
    }
}
impl<'a, T: Element> From<&'a Vec<T>> for Buf<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        T::buf(s)
    }
}
impl<'a, T: Element> From<&'a mut [T]> for BufMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        T::buf_mut(s)
    }
}
impl<'a, T: Element> From<&'a mut Vec<T>> for BufMut<'a> {
    fn from(s: &'a mut Vec<T>) -> Self {
        T::buf_mut(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats_reduce_in_f32_and_round_once() {
        // 2048 + 1 + 1 in f16 step by step stays 2048; widened it is 2050, exactly representable.
        let v = [f16::from_f32(2048.0), f16::from_f32(1.0), f16::from_f32(1.0)];
        assert_eq!(reduce_serial(&v, ReduceOp::Sum).to_f32(), 2050.0);
    }

    #[test]
    fn integer_sums_wrap_like_mpi() {
        assert_eq!(reduce_serial(&[i32::MAX, 1], ReduceOp::Sum), i32::MIN);
        assert_eq!(reduce_serial(&[7i64, 2, 0], ReduceOp::Mean), 3);
    }

    #[test]
    fn max_and_min_propagate_nan() {
        assert!(reduce_serial(&[1.0f32, f32::NAN, 3.0], ReduceOp::Max).is_nan());
        assert!(reduce_serial(&[f64::NAN, 1.0], ReduceOp::Min).is_nan());
        assert_eq!(reduce_serial(&[1.0f32, -2.0, 3.0], ReduceOp::Min), -2.0);
    }

    #[test]
    fn buffers_report_type_length_and_bytes() {
        let mut v = vec![1.0f64; 5];
        let b = BufMut::from(&mut v);
        assert_eq!((b.dtype(), b.len(), b.byte_len()), (DType::F64, 5, 40));
        let w = vec![bf16::ONE; 3];
        let b = Buf::from(&w);
        assert_eq!(b.as_bytes().len(), 6);
        assert_eq!(bf16::from_buf(&b).unwrap().len(), 3);
        assert!(f32::from_buf(&b).is_none());
    }
}
