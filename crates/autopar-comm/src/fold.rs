//! The one reduction kernel of every backend: sources combined in rank order,
//! `((x0 + x1) + x2) + ...`, in the element type's accumulator ([`Element::Acc`]: f32 for
//! f16/bf16), then rounded once. `LocalComm` folds each rank's chunk of the shared buffers with
//! it; `MpiComm` moves every rank's copy of a chunk to the chunk's owner and folds it there.
//! So a reduction gives the same bits on either backend, for any input and any chunking.

use std::ops::Range;

use half::{bf16, f16};

use crate::dtype::{DType, Element, ReduceOp};

/// Elements reduced per step: every source's values for them are loaded into registers, combined
/// in rank order and stored into every destination (64 bytes of f32: one cache line).
const LANES: usize = 16;

/// Reduce `srcs[..]` (all of one element type, rank order) over `range` and write the result
/// into every buffer of `dsts`.
///
/// # Safety
/// Every pointer must be valid for `range` of type `T`; no one else reads or writes those
/// ranges of `srcs` or `dsts` meanwhile (a `dst` may equal a `src`: each piece is read from all
/// sources before it is written).
#[inline(always)]
unsafe fn reduce_typed<T: Element>(srcs: &[*const u8], dsts: &[*mut u8], range: Range<usize>, op: ReduceOp) {
    match op {
        ReduceOp::Sum => reduce_with::<T, _>(srcs, dsts, range, false, T::add),
        ReduceOp::Mean => reduce_with::<T, _>(srcs, dsts, range, true, T::add),
        ReduceOp::Prod => reduce_with::<T, _>(srcs, dsts, range, false, T::mul),
        ReduceOp::Max => reduce_with::<T, _>(srcs, dsts, range, false, T::max),
        ReduceOp::Min => reduce_with::<T, _>(srcs, dsts, range, false, T::min),
    }
}

/// Load `LANES` elements at `ptr[at..]`, widened to the accumulator type.
#[inline(always)]
unsafe fn load<T: Element>(ptr: *const u8, at: usize) -> [T::Acc; LANES] {
    std::ptr::read_unaligned((ptr as *const T).add(at) as *const [T; LANES]).map(T::widen)
}

/// Reduce `LANES` elements at `at` of every source, in rank order, and store them into every
/// destination. All loads happen before the first store, so a destination may be a source.
#[inline(always)]
unsafe fn reduce_lanes<T: Element, F: Fn(T::Acc, T::Acc) -> T::Acc>(srcs: &[*const u8], dsts: &[*mut u8], at: usize, mean: bool, f: &F) {
    let mut acc = load::<T>(srcs[0], at);
    for &s in &srcs[1..] {
        let x = load::<T>(s, at);
        for (a, x) in acc.iter_mut().zip(x) {
            *a = f(*a, x);
        }
    }
    if mean {
        for a in acc.iter_mut() {
            *a = T::div(*a, srcs.len());
        }
    }
    let out = acc.map(T::narrow);
    for &d in dsts {
        std::ptr::write_unaligned((d as *mut T).add(at) as *mut [T; LANES], out);
    }
}

/// The scalar form of [`reduce_lanes`], for the tail of a range.
#[inline(always)]
unsafe fn reduce_one<T: Element, F: Fn(T::Acc, T::Acc) -> T::Acc>(srcs: &[*const u8], dsts: &[*mut u8], at: usize, mean: bool, f: &F) {
    let get = |s: *const u8| (s as *const T).add(at).read_unaligned().widen();
    let mut acc = get(srcs[0]);
    for &s in &srcs[1..] {
        acc = f(acc, get(s));
    }
    if mean {
        acc = T::div(acc, srcs.len());
    }
    for &d in dsts {
        (d as *mut T).add(at).write_unaligned(T::narrow(acc));
    }
}

#[inline(always)]
unsafe fn reduce_with<T: Element, F: Fn(T::Acc, T::Acc) -> T::Acc>(
    srcs: &[*const u8],
    dsts: &[*mut u8],
    range: Range<usize>,
    mean: bool,
    f: F,
) {
    let mut at = range.start;
    while at + LANES <= range.end {
        reduce_lanes::<T, F>(srcs, dsts, at, mean, &f);
        at += LANES;
    }
    for at in at..range.end {
        reduce_one::<T, F>(srcs, dsts, at, mean, &f);
    }
}

#[inline(always)]
unsafe fn reduce_any(dtype: DType, srcs: &[*const u8], dsts: &[*mut u8], range: Range<usize>, op: ReduceOp) {
    match dtype {
        DType::F16 => reduce_typed::<f16>(srcs, dsts, range, op),
        DType::BF16 => reduce_typed::<bf16>(srcs, dsts, range, op),
        DType::F32 => reduce_typed::<f32>(srcs, dsts, range, op),
        DType::F64 => reduce_typed::<f64>(srcs, dsts, range, op),
        DType::I32 => reduce_typed::<i32>(srcs, dsts, range, op),
        DType::I64 => reduce_typed::<i64>(srcs, dsts, range, op),
    }
}

/// [`reduce_any`] compiled for 256-bit vectors. Lane-wise operations give the same bits at any
/// vector width, so this changes speed only.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn reduce_any_avx2(dtype: DType, srcs: &[*const u8], dsts: &[*mut u8], range: Range<usize>, op: ReduceOp) {
    reduce_any(dtype, srcs, dsts, range, op)
}

/// Reduce `srcs` (one pointer per rank, in rank order) over `range` of `dtype` elements with
/// `op`, and write the result into every buffer of `dsts`, with the widest vectors this CPU has
/// (see [`reduce_typed`] for the contract).
///
/// # Safety
/// As [`reduce_typed`].
pub(crate) unsafe fn fold(dtype: DType, srcs: &[*const u8], dsts: &[*mut u8], range: Range<usize>, op: ReduceOp) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        return reduce_any_avx2(dtype, srcs, dsts, range, op);
    }
    reduce_any(dtype, srcs, dsts, range, op)
}
