//! File plumbing shared by every writer and reader: region copies between row-major byte
//! arrays, and the workspace's atomic writer (`autopar-files`, re-exported here).

use std::ops::Range;

pub use autopar_files::{remove_stale_temps, write_atomic, AtomicFile, WRITEBACK_STEP};

use crate::error::Result;

/// Row-major element strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Copy a box of `extent` elements per dimension, starting at `src_start` in a row-major source
/// array of shape `src_shape`, to `dst_start` in the row-major destination `dst` of shape
/// `dst_shape`. `read(byte_offset, out)` fills `out` from the source. Trailing dimensions that are
/// whole on both sides are merged into one contiguous run, so a copy is one call per run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_box(
    read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    src_shape: &[usize],
    src_start: &[usize],
    dst: &mut [u8],
    dst_shape: &[usize],
    dst_start: &[usize],
    extent: &[usize],
    esz: usize,
) -> Result<()> {
    let nd = extent.len();
    if extent.contains(&0) {
        return Ok(());
    }
    if nd == 0 {
        return read(0, &mut dst[..esz]);
    }
    let ss = strides(src_shape);
    let ds = strides(dst_shape);
    // innermost dimension k such that every dimension after it is whole on both sides
    let mut k = nd - 1;
    while k > 0 && extent[k] == src_shape[k] && extent[k] == dst_shape[k] {
        k -= 1;
    }
    let run = extent[k] * ss[k] * esz;
    debug_assert_eq!(extent[k] * ss[k], extent[k] * ds[k]);
    let mut idx = vec![0usize; k];
    loop {
        let mut so = src_start[k] * ss[k];
        let mut doff = dst_start[k] * ds[k];
        for d in 0..k {
            so += (src_start[d] + idx[d]) * ss[d];
            doff += (dst_start[d] + idx[d]) * ds[d];
        }
        read((so * esz) as u64, &mut dst[doff * esz..doff * esz + run])?;
        let mut d = k;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Intersection of two boxes, `None` when empty.
pub(crate) fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<Range<usize>>> {
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.iter().zip(b) {
        let lo = x.start.max(y.start);
        let hi = x.end.min(y.end);
        if lo >= hi {
            return None;
        }
        out.push(lo..hi);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_box_moves_a_sub_block_between_arrays() {
        // src 4x6 of u8 values r*10+c; copy rows 1..3, cols 2..5 into dst 3x4 at (1,1)
        let src: Vec<u8> = (0..4).flat_map(|r| (0..6).map(move |c| (r * 10 + c) as u8)).collect();
        let mut dst = vec![0u8; 12];
        let mut read = |off: u64, out: &mut [u8]| {
            out.copy_from_slice(&src[off as usize..off as usize + out.len()]);
            Ok(())
        };
        copy_box(&mut read, &[4, 6], &[1, 2], &mut dst, &[3, 4], &[1, 1], &[2, 3], 1).unwrap();
        assert_eq!(dst, vec![0, 0, 0, 0, 0, 12, 13, 14, 0, 22, 23, 24]);
    }
}
