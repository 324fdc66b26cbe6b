//! Conv2D (NCHW input, OIHW weight; stride, padding, dilation, groups) on GEMMs, and its input
//! and weight gradients.
//!
//! 3x3 stride-1 undilated convolutions with at least 16 channels per group (most of a ResNet)
//! run by Winograd's F(2x2, 3x3) (`conv/winograd.rs`): 16 GEMMs on transformed tiles, 2.25x fewer
//! flops; so do their input gradients (a forward convolution here) and, when a block of images
//! has enough tiles, their weight gradients (F(3x3, 2x2)). The rest, below:
//!
//! The forward pass, the weight gradient and the col2im input gradient of small output planes
//! (fewer than 256 pixels) are computed for blocks of images at once: the im2col matrices of
//! the block side by side (`[C/g*kH*kW, B*Ho*Wo]`, about 512 columns), so that the GEMMs of
//! deep layers are not starved of columns (the stride-1 input gradient, a forward convolution,
//! gets it too).
//! Larger planes work per image.
//! Stride-1 convolutions with at least 32 channels per group use shifted
//! GEMMs (one per kernel tap over zero-padded planes, no im2col) for the forward pass and the
//! weight gradient; otherwise im2col of one image
//! (a `[C/g*kH*kW, Ho*Wo]` matrix that stays in cache) and one GEMM per group writing straight
//! into the image's output planes; 1x1 stride-1 convolutions skip im2col (the input planes
//! already are the matrix). Images run in parallel with single-threaded GEMMs (a batch of one
//! uses the parallel GEMM instead). The weight
//! gradient sums per-image products inside fixed groups of images and then the group partials
//! in order; the grouping depends only on the batch size, so serial and parallel results are
//! identical.

use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

mod winograd;

use super::{float_dispatch, same_dtype};
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Conv2D attributes. `padding` is `[top, bottom, left, right]` (MindSpore's `pad` list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Stride along height and width.
    pub stride: [usize; 2],
    /// Zero padding, `[top, bottom, left, right]`.
    pub padding: [usize; 4],
    /// Dilation along height and width.
    pub dilation: [usize; 2],
    /// Groups the input and output channels are split into (1: a dense convolution).
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams { stride: [1, 1], padding: [0; 4], dilation: [1, 1], groups: 1 }
    }
}

impl Conv2dParams {
    /// Stride `s`, symmetric padding `p`, no dilation, one group.
    pub fn new(stride: usize, pad: usize) -> Self {
        Conv2dParams { stride: [stride, stride], padding: [pad; 4], ..Default::default() }
    }

    /// MindSpore/TensorFlow `pad_mode="same"` padding for an input of `h x w` and kernel
    /// `kh x kw` (the extra odd pixel goes to the bottom/right).
    pub fn same_padding(h: usize, w: usize, kh: usize, kw: usize, stride: [usize; 2], dilation: [usize; 2]) -> [usize; 4] {
        let pad = |n: usize, k: usize, s: usize, d: usize| {
            let out = n.div_ceil(s);
            let need = ((out.saturating_sub(1)) * s + (k - 1) * d + 1).saturating_sub(n);
            (need / 2, need - need / 2)
        };
        let (t, b) = pad(h, kh, stride[0], dilation[0]);
        let (l, r) = pad(w, kw, stride[1], dilation[1]);
        [t, b, l, r]
    }
}

#[derive(Debug, Clone, Copy)]
struct Geo {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    ho: usize,
    wo: usize,
    g: usize,
    cg: usize,
    og: usize,
    kg: usize,
    sh: usize,
    sw: usize,
    pt: usize,
    pl: usize,
    dh: usize,
    dw: usize,
}

/// Output spatial size of a convolution or pooling window, or `None` if the window does not fit.
pub fn conv_out_size(input: usize, kernel: usize, stride: usize, pad_lo: usize, pad_hi: usize, dilation: usize) -> Option<usize> {
    let span = dilation * (kernel.checked_sub(1)?) + 1;
    let padded = input + pad_lo + pad_hi;
    if stride == 0 || padded < span {
        return None;
    }
    Some((padded - span) / stride + 1)
}

fn geometry(op: &'static str, x: &[usize], w: &[usize], p: &Conv2dParams) -> Result<Geo> {
    if x.len() != 4 {
        return Err(TensorError::BadShape { op, what: "input", shape: x.to_vec(), expected: "rank 4 [N, C, H, W]".into() });
    }
    if w.len() != 4 {
        return Err(TensorError::BadShape { op, what: "weight", shape: w.to_vec(), expected: "rank 4 [O, C/groups, kH, kW]".into() });
    }
    let bad = |name: &'static str, value: String, expected: &'static str| TensorError::InvalidArgument { op, name, value, expected };
    if p.groups == 0 || !x[1].is_multiple_of(p.groups) || !w[0].is_multiple_of(p.groups) {
        return Err(bad(
            "groups",
            format!("{} for {} input and {} output channels", p.groups, x[1], w[0]),
            "a divisor of both channel counts",
        ));
    }
    if p.stride.contains(&0) {
        return Err(bad("stride", format!("{:?}", p.stride), "positive strides"));
    }
    if p.dilation.contains(&0) {
        return Err(bad("dilation", format!("{:?}", p.dilation), "positive dilations"));
    }
    let cg = x[1] / p.groups;
    if w[1] != cg {
        return Err(TensorError::IncompatibleShapes {
            op,
            lhs: x.to_vec(),
            rhs: w.to_vec(),
            reason: "weight dim 1 must equal input channels / groups",
        });
    }
    let ho = conv_out_size(x[2], w[2], p.stride[0], p.padding[0], p.padding[1], p.dilation[0]);
    let wo = conv_out_size(x[3], w[3], p.stride[1], p.padding[2], p.padding[3], p.dilation[1]);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(TensorError::IncompatibleShapes {
            op,
            lhs: x.to_vec(),
            rhs: w.to_vec(),
            reason: "the (dilated) kernel is larger than the padded input",
        });
    };
    Ok(Geo {
        n: x[0],
        c: x[1],
        h: x[2],
        w: x[3],
        o: w[0],
        kh: w[2],
        kw: w[3],
        ho,
        wo,
        g: p.groups,
        cg,
        og: w[0] / p.groups,
        kg: cg * w[2] * w[3],
        sh: p.stride[0],
        sw: p.stride[1],
        pt: p.padding[0],
        pl: p.padding[2],
        dh: p.dilation[0],
        dw: p.dilation[1],
    })
}

/// Output shape `[N, O, Ho, Wo]` of a convolution.
pub fn conv2d_output_shape(input: &[usize], weight: &[usize], p: &Conv2dParams) -> Result<Vec<usize>> {
    let g = geometry("conv2d", input, weight, p)?;
    Ok(vec![g.n, g.o, g.ho, g.wo])
}

impl Geo {
    fn hwo(&self) -> usize {
        self.ho * self.wo
    }
    /// 1x1 kernel, stride 1, no padding: the input planes are already the im2col matrix.
    fn pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.sh == 1
            && self.sw == 1
            && self.pt == 0
            && self.pl == 0
            && self.ho == self.h
            && self.wo == self.w
    }
    /// Range of output columns `ow` whose input column `ow*sw + off` lies inside the image.
    fn ow_range(&self, off: isize) -> (usize, usize) {
        let (w, sw) = (self.w as isize, self.sw as isize);
        let hi = if w - off <= 0 { 0 } else { ((w - off + sw - 1) / sw) as usize }.min(self.wo);
        let lo = if off >= 0 { 0 } else { ((-off + sw - 1) / sw) as usize }.min(hi);
        (lo, hi)
    }
}

/// Images per partial weight gradient: fixed by the batch size alone, so the summation order
/// (and the result) does not depend on the thread count.
fn weight_group(n: usize) -> usize {
    4.max(n.div_ceil(16))
}

/// Images per GEMM: 1 for planes of 256 pixels or more, else enough images for ~512 columns.
/// Depends on the shapes alone, so results do not depend on the thread count.
fn image_block(g: &Geo) -> usize {
    let hwo = g.hwo().max(1);
    if hwo >= 256 {
        1
    } else {
        (512 / hwo).clamp(1, g.n.max(1))
    }
}

/// Fills the `[kg, hwo]` im2col matrix of image `b` and group `grp` into `col`, whose rows are
/// `ld` apart (`hwo` for one image; `B*hwo` when a block of images sits side by side).
fn im2col<T: Float>(x: &[T], g: &Geo, b: usize, grp: usize, col: &mut [T], ld: usize) {
    for r in 0..g.kg {
        im2col_row(x, g, b, grp, r, &mut col[r * ld..][..g.hwo()]);
    }
}

/// The im2col matrix of `count` images from `first`, side by side (`[kg, count*hwo]`), rows
/// filled in parallel when `par` and the context says the size is worth it.
#[allow(clippy::too_many_arguments)]
fn im2col_block<T: Float>(ctx: &ExecCtx, par: bool, x: &[T], g: &Geo, first: usize, count: usize, grp: usize, col: &mut [T]) {
    let (hwo, ch) = (g.hwo(), count * g.hwo());
    chunks_on(ctx, par, &mut col[..g.kg * ch], ch, |r, row| {
        for k in 0..count {
            im2col_row(x, g, first + k, grp, r, &mut row[k * hwo..][..hwo]);
        }
    });
}

/// Row `r` (one kernel tap of one channel) of image `b`'s im2col matrix, `hwo` values.
fn im2col_row<T: Float>(x: &[T], g: &Geo, b: usize, grp: usize, r: usize, row: &mut [T]) {
    let c = r / (g.kh * g.kw);
    let i = (r / g.kw) % g.kh;
    let j = r % g.kw;
    let plane = &x[(b * g.c + grp * g.cg + c) * g.h * g.w..][..g.h * g.w];
    let off = (j * g.dw) as isize - g.pl as isize;
    let (lo, hi) = g.ow_range(off);
    for oh in 0..g.ho {
        let dst = &mut row[oh * g.wo..][..g.wo];
        let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
        if ih < 0 || ih >= g.h as isize || lo == hi {
            dst.fill(T::zero());
            continue;
        }
        let src = &plane[ih as usize * g.w..][..g.w];
        dst[..lo].fill(T::zero());
        dst[hi..].fill(T::zero());
        if g.sw == 1 {
            let s0 = (lo as isize + off) as usize;
            dst[lo..hi].copy_from_slice(&src[s0..s0 + hi - lo]);
        } else {
            // Every `sw`-th value from `s0`, read in whole strides (which vectorises).
            let s0 = (lo as isize * g.sw as isize + off) as usize;
            let n = hi - lo;
            let span = &src[s0..s0 + (n - 1) * g.sw + 1];
            match g.sw {
                2 => every_nth::<T, 2>(&mut dst[lo..hi], span),
                _ => {
                    for (d, s) in dst[lo..hi].iter_mut().zip(span.iter().step_by(g.sw)) {
                        *d = *s;
                    }
                }
            }
        }
    }
}

/// `dst[k] = span[k * S]` for every `k`, `span` ending at the last value read: whole strides
/// of a stride known at compile time vectorise.
fn every_nth<T: Float, const S: usize>(dst: &mut [T], span: &[T]) {
    let (body, last) = dst.split_at_mut(dst.len() - 1);
    for (d, s) in body.iter_mut().zip(span.chunks_exact(S)) {
        *d = s[0];
    }
    last[0] = span[span.len() - 1];
}

/// [`ExecCtx::for_chunks`] when `par` (the caller may use threads), else on this thread.
fn chunks_on<T: Float>(ctx: &ExecCtx, par: bool, out: &mut [T], per: usize, f: impl Fn(usize, &mut [T]) + Send + Sync) {
    if par {
        ctx.for_chunks(out, per, f)
    } else {
        ExecCtx::serial().for_chunks(out, per, f)
    }
}

/// Adds `col` ([kg, hwo] with rows `ld` apart, group `grp`) into the input-gradient planes
/// `dx` of one image.
fn col2im<T: Float>(col: &[T], g: &Geo, grp: usize, dx: &mut [T], ld: usize) {
    let hwo = g.hwo();
    for r in 0..g.kg {
        let row = &col[r * ld..][..hwo];
        let c = r / (g.kh * g.kw);
        let i = (r / g.kw) % g.kh;
        let j = r % g.kw;
        let plane = &mut dx[(grp * g.cg + c) * g.h * g.w..][..g.h * g.w];
        let off = (j * g.dw) as isize - g.pl as isize;
        let (lo, hi) = g.ow_range(off);
        if lo == hi {
            continue;
        }
        for oh in 0..g.ho {
            let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
            if ih < 0 || ih >= g.h as isize {
                continue;
            }
            let dst = &mut plane[ih as usize * g.w..][..g.w];
            let src = &row[oh * g.wo..][..g.wo];
            if g.sw == 1 {
                let s0 = (lo as isize + off) as usize;
                for (d, &v) in dst[s0..s0 + hi - lo].iter_mut().zip(&src[lo..hi]) {
                    *d += v;
                }
            } else {
                for (ow, &v) in src[lo..hi].iter().enumerate() {
                    dst[((lo + ow) as isize * g.sw as isize + off) as usize] += v;
                }
            }
        }
    }
}

fn mat<T>(data: &[T], rows: usize, cols: usize) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), data).expect("buffer sized")
}

fn mat_mut<T>(data: &mut [T], rows: usize, cols: usize) -> ArrayViewMut2<'_, T> {
    ArrayViewMut2::from_shape((rows, cols).strides((cols, 1)), data).expect("buffer sized")
}

/// [`per_image`] over blocks of `block` images, each `per` values of `out`:
/// `f(first image, images, out_chunk, scratch, parallel_gemm)` (the last block may be short).
fn per_block<T: Float, F>(ctx: &ExecCtx, out: &mut [T], block: usize, per: usize, scratch: usize, f: F)
where
    F: Fn(usize, usize, &mut [T], &mut Vec<T>, bool) + Send + Sync,
{
    per_image(ctx, out, block * per, scratch, |bi, ob, buf, par| f(bi * block, ob.len() / per.max(1), ob, buf, par));
}

/// Runs `f(image, out_chunk, scratch, parallel_gemm)` for every image: images in parallel with
/// serial GEMMs when there are several, otherwise one image at a time with the context's GEMM.
fn per_image<T: Float, F>(ctx: &ExecCtx, out: &mut [T], per: usize, scratch: usize, f: F)
where
    F: Fn(usize, &mut [T], &mut Vec<T>, bool) + Send + Sync,
{
    let n = out.len() / per.max(1);
    if per == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    if ctx.is_parallel() && n > 1 && threads > 1 {
        use rayon::prelude::*;
        // One contiguous run of images per thread, each with one scratch buffer.
        let per_task = n.div_ceil(threads);
        out.par_chunks_mut(per * per_task).enumerate().for_each(|(t, run)| {
            let mut buf = vec![T::zero(); scratch];
            for (k, o) in run.chunks_mut(per).enumerate() {
                f(t * per_task + k, o, &mut buf, false);
            }
        });
    } else {
        let mut buf = vec![T::zero(); scratch];
        for (b, o) in out.chunks_mut(per).enumerate() {
            f(b, o, &mut buf, ctx.is_parallel());
        }
    }
}

fn gemm_on<T: Float>(ctx: &ExecCtx, par: bool, a: ArrayView2<'_, T>, b: ArrayView2<'_, T>, c: ArrayViewMut2<'_, T>, acc: bool) {
    if par {
        ctx.gemm(a, b, c, acc)
    } else {
        ctx.gemm_serial(a, b, c, acc)
    }
}

/// Stride 1 with enough input channels per group: the "shifted GEMM" form. The image is
/// copied once into zero-padded planes; each kernel tap (i, j) is then a plain strided view of
/// those planes shifted by `i*dh*Wp + j*dw`, and the output is the sum over taps of
/// `W_ij [og, cg] x view [cg, Ho*Wp]`, computed on the padded width and cropped. No im2col.
fn shifted_gemm_ok(g: &Geo) -> bool {
    g.sh == 1 && g.sw == 1 && g.kh * g.kw > 1 && g.cg >= 32
}

fn conv_fwd<T: Float>(ctx: &ExecCtx, x: &[T], w: &[T], g: &Geo) -> Vec<T> {
    if winograd::applies(g) {
        return winograd::conv_fwd(ctx, x, winograd::Filters::Given(w), g);
    }
    conv_fwd_blocks(ctx, x, w, g, image_block(g))
}

/// The forward pass with `block` images per GEMM.
fn conv_fwd_blocks<T: Float>(ctx: &ExecCtx, x: &[T], w: &[T], g: &Geo, block: usize) -> Vec<T> {
    let hwo = g.hwo();
    let mut y = vec![T::zero(); g.n * g.o * hwo];
    if block > 1 {
        let cols = block * hwo;
        per_block(ctx, &mut y, block, g.o * hwo, (g.kg + g.og) * cols, |first, count, yb, buf, par| {
            let (col, tmp) = buf.split_at_mut(g.kg * cols);
            let ch = count * hwo;
            for grp in 0..g.g {
                im2col_block(ctx, par, x, g, first, count, grp, col);
                let wg = mat(&w[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
                gemm_on(ctx, par, wg, mat(&col[..g.kg * ch], g.kg, ch), mat_mut(&mut tmp[..g.og * ch], g.og, ch), false);
                let tmp = &tmp[..g.og * ch];
                chunks_on(ctx, par, yb, g.o * hwo, |k, yk| {
                    for o in 0..g.og {
                        yk[(grp * g.og + o) * hwo..][..hwo].copy_from_slice(&tmp[o * ch + k * hwo..][..hwo]);
                    }
                });
            }
        });
        return y;
    }
    if shifted_gemm_ok(g) {
        conv_fwd_shifted(ctx, x, w, g, &mut y);
        return y;
    }
    let scratch = if g.pointwise() { 0 } else { g.kg * hwo };
    per_image(ctx, &mut y, g.o * hwo, scratch, |b, yb, col, par| {
        for grp in 0..g.g {
            let wg = mat(&w[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
            let out = mat_mut(&mut yb[grp * g.og * hwo..][..g.og * hwo], g.og, hwo);
            if g.pointwise() {
                gemm_on(ctx, par, wg, mat(&x[(b * g.c + grp * g.cg) * hwo..][..g.kg * hwo], g.kg, hwo), out, false);
            } else {
                im2col(x, g, b, grp, col, hwo);
                gemm_on(ctx, par, wg, mat(col, g.kg, hwo), out, false);
            }
        }
    });
    y
}

/// Padded plane size `(Hp, Wp)` of the shifted-GEMM form (stride 1).
fn padded(g: &Geo) -> (usize, usize) {
    (g.ho + g.dh * (g.kh - 1), g.wo + g.dw * (g.kw - 1))
}

/// Copies image `b` into zero-padded planes `[C, Hp, Wp]` (plus trailing slack).
fn pad_planes<T: Float>(x: &[T], g: &Geo, b: usize, hp: usize, wp: usize, xp: &mut [T]) {
    xp.fill(T::zero());
    let plane = hp * wp;
    let ws = g.w.min(wp.saturating_sub(g.pl));
    for c in 0..g.c {
        for r in 0..g.h {
            let hr = r + g.pt;
            if hr < hp && ws > 0 {
                xp[c * plane + hr * wp + g.pl..][..ws].copy_from_slice(&x[((b * g.c + c) * g.h + r) * g.w..][..ws]);
            }
        }
    }
}

fn conv_fwd_shifted<T: Float>(ctx: &ExecCtx, x: &[T], w: &[T], g: &Geo, y: &mut [T]) {
    let hwo = g.hwo();
    let (hp, wp) = padded(g);
    let taps = g.kh * g.kw;
    // Per-tap weights: taps_w[grp][t] is [og, cg] row-major.
    let mut taps_w = vec![T::zero(); g.g * taps * g.og * g.cg];
    for grp in 0..g.g {
        for o in 0..g.og {
            for c in 0..g.cg {
                for t in 0..taps {
                    taps_w[((grp * taps + t) * g.og + o) * g.cg + c] = w[((grp * g.og + o) * g.cg + c) * taps + t];
                }
            }
        }
    }
    let plane = hp * wp;
    // The last tap's view of the last channel runs (kw-1)*dw past its plane (into cropped columns).
    let xp_len = g.c * plane + g.dw * (g.kw - 1);
    let acc_len = g.og * g.ho * wp;
    per_image(ctx, y, g.o * hwo, xp_len + acc_len, |b, yb, buf, par| {
        let (xp, acc) = buf.split_at_mut(xp_len);
        pad_planes(x, g, b, hp, wp, xp);
        let cols = g.ho * wp;
        for grp in 0..g.g {
            for t in 0..taps {
                let (i, j) = (t / g.kw, t % g.kw);
                let off = grp * g.cg * plane + i * g.dh * wp + j * g.dw;
                let xm = ArrayView2::from_shape((g.cg, cols).strides((plane, 1)), &xp[off..]).expect("view inside the padded planes");
                let wm = mat(&taps_w[(grp * taps + t) * g.og * g.cg..][..g.og * g.cg], g.og, g.cg);
                gemm_on(ctx, par, wm, xm, mat_mut(&mut acc[..], g.og, cols), t > 0);
            }
            for o in 0..g.og {
                for r in 0..g.ho {
                    yb[(grp * g.og + o) * hwo + r * g.wo..][..g.wo].copy_from_slice(&acc[o * cols + r * wp..][..g.wo]);
                }
            }
        }
    });
}

/// For stride 1, the input gradient is a forward convolution of `dy` with the kernel flipped
/// and its channel axes swapped, padded by `dilation*(k-1) - pad` on each side: no col2im
/// scatter. Returns `None` when a side's padding exceeds the dilated kernel (then col2im is used).
fn bwd_input_as_conv<T: Float>(ctx: &ExecCtx, dy: &[T], w: &[T], g: &Geo, p: &Conv2dParams) -> Option<Vec<T>> {
    if g.sh != 1 || g.sw != 1 {
        return None;
    }
    let (eh, ew) = (g.dh * (g.kh - 1), g.dw * (g.kw - 1));
    let pad = [eh.checked_sub(p.padding[0])?, eh.checked_sub(p.padding[1])?, ew.checked_sub(p.padding[2])?, ew.checked_sub(p.padding[3])?];
    let q = Conv2dParams { stride: [1, 1], padding: pad, dilation: p.dilation, groups: g.g };
    let gq = geometry("conv2d_backward_input", &[g.n, g.o, g.ho, g.wo], &[g.c, g.og, g.kh, g.kw], &q).ok()?;
    debug_assert_eq!((gq.ho, gq.wo), (g.h, g.w));
    if winograd::applies(&gq) {
        // Winograd's filter transform reads the flipped filters in place.
        return Some(winograd::conv_fwd(ctx, dy, winograd::Filters::Flipped(w), &gq));
    }
    // w' [C, O/g, kh, kw]: w'[grp*cg + c, o, i, j] = w[grp*og + o, c, kh-1-i, kw-1-j].
    let taps = g.kh * g.kw;
    let mut wf = vec![T::zero(); w.len()];
    // One input channel's filters (all og of its group, contiguous in w') per chunk.
    ctx.for_chunks(&mut wf, g.og * taps, |gc, out| {
        let (grp, c) = (gc / g.cg, gc % g.cg);
        for (o, dst) in out.chunks_exact_mut(taps).enumerate() {
            let src = &w[((grp * g.og + o) * g.cg + c) * taps..][..taps];
            // Tap (i, j) of w' is tap (kh-1-i, kw-1-j) of w: the taps reversed.
            for (d, &v) in dst.iter_mut().zip(src.iter().rev()) {
                *d = v;
            }
        }
    });
    Some(conv_fwd(ctx, dy, &wf, &gq))
}

/// `W^T` per group, row-major (the GEMM's fast layout): `[g][kg, og]`.
fn transposed_weight<T: Float>(ctx: &ExecCtx, w: &[T], g: &Geo) -> Vec<T> {
    transpose_groups(ctx, w, g.g, g.og, g.kg)
}

/// Each of the `groups` row-major `[rows, cols]` matrices laid end to end in `src`, transposed
/// (`[cols, rows]`), tiles of rows in parallel.
fn transpose_groups<T: Float>(ctx: &ExecCtx, src: &[T], groups: usize, rows: usize, cols: usize) -> Vec<T> {
    const TILE: usize = 32;
    let per_group = rows * cols;
    let mut out = vec![T::zero(); groups * per_group];
    for (grp, og) in out.chunks_mut(per_group.max(1)).enumerate() {
        let src = &src[grp * per_group..][..per_group];
        ctx.for_chunks(og, TILE * rows, |t, dst| transpose_into(src, cols, t * TILE, dst, rows));
    }
    out
}

/// The input gradient by col2im: one image at a time where an image's output plane gives the
/// GEMM enough columns (256 pixels), else blocks of images side by side, as the forward pass
/// ([`image_block`]; a GEMM of a deep layer's weight by a few columns per image re-reads the
/// whole weight for each image).
fn conv_bwd_input<T: Float>(ctx: &ExecCtx, dy: &[T], w: &[T], g: &Geo) -> Vec<T> {
    conv_bwd_input_blocks(ctx, dy, w, g, image_block(g))
}

/// The input gradient with `block` images per GEMM (1: one image at a time).
fn conv_bwd_input_blocks<T: Float>(ctx: &ExecCtx, dy: &[T], w: &[T], g: &Geo, block: usize) -> Vec<T> {
    let hwo = g.hwo();
    let plane = g.h * g.w;
    let mut dx = vec![T::zero(); g.n * g.c * plane];
    let wt_all = transposed_weight(ctx, w, g);
    if block > 1 && !g.pointwise() {
        let cols = block * hwo;
        per_block(ctx, &mut dx, block, g.c * plane, (g.kg + g.og) * cols, |first, count, dxb, buf, par| {
            let (col, dyb) = buf.split_at_mut(g.kg * cols);
            let ch = count * hwo;
            for grp in 0..g.g {
                // The block's output gradients side by side: `[og, count * hwo]`.
                for o in 0..g.og {
                    for k in 0..count {
                        let src = &dy[((first + k) * g.o + grp * g.og + o) * hwo..][..hwo];
                        dyb[o * ch + k * hwo..][..hwo].copy_from_slice(src);
                    }
                }
                let wt = mat(&wt_all[grp * g.og * g.kg..][..g.og * g.kg], g.kg, g.og);
                gemm_on(ctx, par, wt, mat(&dyb[..g.og * ch], g.og, ch), mat_mut(&mut col[..g.kg * ch], g.kg, ch), false);
                let col = &col[..g.kg * ch];
                chunks_on(ctx, par, dxb, g.c * plane, |k, dxk| col2im(&col[k * hwo..], g, grp, dxk, ch));
            }
        });
        return dx;
    }
    let scratch = if g.pointwise() { 0 } else { g.kg * hwo };
    per_image(ctx, &mut dx, g.c * plane, scratch, |b, dxb, col, par| {
        for grp in 0..g.g {
            let wt = mat(&wt_all[grp * g.og * g.kg..][..g.og * g.kg], g.kg, g.og);
            let dyg = mat(&dy[(b * g.o + grp * g.og) * hwo..][..g.og * hwo], g.og, hwo);
            if g.pointwise() {
                gemm_on(ctx, par, wt, dyg, mat_mut(&mut dxb[grp * g.cg * plane..][..g.kg * plane], g.kg, plane), false);
            } else {
                gemm_on(ctx, par, wt, dyg, mat_mut(col, g.kg, hwo), false);
                col2im(col, g, grp, dxb, hwo);
            }
        }
    });
    dx
}

/// Weight gradient in the shifted-GEMM form: per tap, `dW_ij^T [cg, og] += view_ij [cg, Ho*Wp]
/// x dY^T [Ho*Wp, og]`, with dY laid on the padded width (zeros in the cropped columns, so
/// the views' extra columns contribute nothing).
fn conv_bwd_weight_shifted<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo) -> Vec<T> {
    let hwo = g.hwo();
    let (hp, wp) = padded(g);
    let plane = hp * wp;
    let taps = g.kh * g.kw;
    let cols = g.ho * wp;
    let wlen = g.o * g.kg;
    let group = weight_group(g.n);
    let parts = g.n.div_ceil(group).max(1);
    let xp_len = g.c * plane + g.dw * (g.kw - 1);
    // Partials laid out [grp][tap][cg][og].
    let mut partial = vec![T::zero(); parts * wlen];
    per_image(ctx, &mut partial, wlen, xp_len + cols * g.og, |pi, dwt, buf, par| {
        let (xp, dyt) = buf.split_at_mut(xp_len);
        for (k, b) in (pi * group..((pi + 1) * group).min(g.n)).enumerate() {
            pad_planes(x, g, b, hp, wp, xp);
            for grp in 0..g.g {
                dyt.fill(T::zero());
                for o in 0..g.og {
                    let src = &dy[(b * g.o + grp * g.og + o) * hwo..][..hwo];
                    for r in 0..g.ho {
                        for c in 0..g.wo {
                            dyt[(r * wp + c) * g.og + o] = src[r * g.wo + c];
                        }
                    }
                }
                for t in 0..taps {
                    let (i, j) = (t / g.kw, t % g.kw);
                    let off = grp * g.cg * plane + i * g.dh * wp + j * g.dw;
                    let xm = ArrayView2::from_shape((g.cg, cols).strides((plane, 1)), &xp[off..]).expect("view inside the padded planes");
                    let out = mat_mut(&mut dwt[(grp * taps + t) * g.cg * g.og..][..g.cg * g.og], g.cg, g.og);
                    gemm_on(ctx, par, xm, mat(dyt, cols, g.og), out, k > 0);
                }
            }
        }
    });
    let mut sum = partial[..wlen].to_vec();
    for p in partial[wlen..].chunks(wlen) {
        sum.iter_mut().zip(p).for_each(|(a, &b)| *a += b);
    }
    let mut dw = vec![T::zero(); wlen];
    for grp in 0..g.g {
        for t in 0..taps {
            for c in 0..g.cg {
                for o in 0..g.og {
                    dw[((grp * g.og + o) * g.cg + c) * taps + t] = sum[((grp * taps + t) * g.cg + c) * g.og + o];
                }
            }
        }
    }
    dw
}

fn conv_bwd_weight<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo) -> Vec<T> {
    if winograd::applies_to_weight_gradient(g) {
        return winograd::conv_bwd_weight(ctx, dy, x, g);
    }
    let block = image_block(g);
    if block > 1 {
        return conv_bwd_weight_blocks(ctx, dy, x, g, block);
    }
    if shifted_gemm_ok(g) {
        return conv_bwd_weight_shifted(ctx, dy, x, g);
    }
    conv_bwd_weight_im2col(ctx, dy, x, g)
}

/// The weight gradient with one GEMM per block of `block` images and group: `dW^T [kg, og] =
/// im2col [kg, B*hwo] x dY^T [B*hwo, og]`; the blocks' partials are summed in order.
fn conv_bwd_weight_blocks<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo, block: usize) -> Vec<T> {
    let hwo = g.hwo();
    let wlen = g.o * g.kg;
    let parts = g.n.div_ceil(block).max(1);
    let cols = block * hwo;
    let mut partial = vec![T::zero(); parts * wlen];
    per_image(ctx, &mut partial, wlen, (g.kg + g.og) * cols, |pi, dwt, buf, par| {
        let (col, dyt) = buf.split_at_mut(g.kg * cols);
        let first = pi * block;
        let count = block.min(g.n.saturating_sub(first));
        let ch = count * hwo;
        for grp in 0..g.g {
            im2col_block(ctx, par, x, g, first, count, grp, col);
            chunks_on(ctx, par, &mut dyt[..ch * g.og], hwo * g.og, |k, dk| {
                let dyg = &dy[((first + k) * g.o + grp * g.og) * hwo..][..g.og * hwo];
                transpose_into(dyg, hwo, 0, dk, g.og);
            });
            let out = mat_mut(&mut dwt[grp * g.og * g.kg..][..g.og * g.kg], g.kg, g.og);
            gemm_on(ctx, par, mat(&col[..g.kg * ch], g.kg, ch), mat(&dyt[..ch * g.og], ch, g.og), out, false);
        }
    });
    sum_transposed_partials(ctx, &partial, wlen, g)
}

/// Columns `first..` of the row-major `src` (rows `src_cols` long) as the rows of `dst` (rows
/// `dst_cols` long, one per column of `src`; `dst_cols` is the number of rows of `src` read), in
/// 8x8 tiles so that neither side walks the cache at a large stride for long.
fn transpose_into<T: Copy>(src: &[T], src_cols: usize, first: usize, dst: &mut [T], dst_cols: usize) {
    const TILE: usize = 8;
    if dst_cols == 0 {
        return;
    }
    let n = dst.len() / dst_cols;
    for i0 in (0..dst_cols).step_by(TILE) {
        let i1 = (i0 + TILE).min(dst_cols);
        for j0 in (0..n).step_by(TILE) {
            for j in j0..(j0 + TILE).min(n) {
                let row = &mut dst[j * dst_cols..][i0..i1];
                for (i, d) in (i0..i1).zip(row) {
                    *d = src[i * src_cols + first + j];
                }
            }
        }
    }
}

/// The sum of the `len`-long partials laid end to end in `partial`, added in order. Pieces of
/// the sum run in parallel; every value is summed over the partials in order, as a serial loop
/// would.
fn sum_partials<T: Float>(ctx: &ExecCtx, partial: &[T], len: usize) -> Vec<T> {
    const PIECE: usize = 1 << 14;
    let mut sum = partial[..len].to_vec();
    ctx.for_chunks(&mut sum, PIECE, |k, piece| {
        for p in partial[len..].chunks(len) {
            piece.iter_mut().zip(&p[k * PIECE..]).for_each(|(a, &b)| *a += b);
        }
    });
    sum
}

/// The sum of per-group-of-images partials of `dW^T` (`[kg, og]` per group), in order, as
/// `dW`. Pieces of the sum and tiles of the transpose run in parallel; every value is summed
/// over the partials in order, as a serial loop would.
fn sum_transposed_partials<T: Float>(ctx: &ExecCtx, partial: &[T], wlen: usize, g: &Geo) -> Vec<T> {
    transpose_groups(ctx, &sum_partials(ctx, partial, wlen), g.g, g.kg, g.og)
}

fn conv_bwd_weight_im2col<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo) -> Vec<T> {
    let hwo = g.hwo();
    let wlen = g.o * g.kg;
    let group = weight_group(g.n);
    let parts = g.n.div_ceil(group).max(1);
    let col_len = if g.pointwise() { 0 } else { g.kg * hwo };
    // One partial of dW^T ([kg, og] per group, so both GEMM operands are row-major: im2col
    // [kg, hwo] times dY^T [hwo, og]) per fixed group of images, then summed in group order.
    let mut partial = vec![T::zero(); parts * wlen];
    per_image(ctx, &mut partial, wlen, col_len + hwo * g.og, |pi, dwt, buf, par| {
        let (col, dyt) = buf.split_at_mut(col_len);
        for (k, b) in (pi * group..((pi + 1) * group).min(g.n)).enumerate() {
            for grp in 0..g.g {
                transpose_into(&dy[(b * g.o + grp * g.og) * hwo..][..g.og * hwo], hwo, 0, dyt, g.og);
                let out = mat_mut(&mut dwt[grp * g.og * g.kg..][..g.og * g.kg], g.kg, g.og);
                if g.pointwise() {
                    let xg = mat(&x[(b * g.c + grp * g.cg) * hwo..][..g.kg * hwo], g.kg, hwo);
                    gemm_on(ctx, par, xg, mat(dyt, hwo, g.og), out, k > 0);
                } else {
                    im2col(x, g, b, grp, col, hwo);
                    gemm_on(ctx, par, mat(col, g.kg, hwo), mat(dyt, hwo, g.og), out, k > 0);
                }
            }
        }
    });
    sum_transposed_partials(ctx, &partial, wlen, g)
}

/// Conv2D forward: `x [N, C, H, W]`, `w [O, C/groups, kH, kW]` -> `[N, O, Ho, Wo]` (no bias;
/// add one with `bias_add(.., axis = 1)`).
pub fn conv2d(ctx: &ExecCtx, x: &Tensor, w: &Tensor, p: &Conv2dParams) -> Result<Tensor> {
    let op = "conv2d";
    same_dtype(op, "weight", x, w)?;
    let g = geometry(op, x.shape(), w.shape(), p)?;
    float_dispatch!(op, x.dtype(), T => {
        let (xd, wd) = (x.contiguous(), w.contiguous());
        let xs = xd.shared::<T>()?.as_slice().expect("contiguous");
        let ws = wd.shared::<T>()?.as_slice().expect("contiguous");
        Tensor::from_vec(&[g.n, g.o, g.ho, g.wo], conv_fwd(ctx, xs, ws, &g))
    })
}

fn check_dy(op: &'static str, dy: &Tensor, g: &Geo) -> Result<()> {
    let want = [g.n, g.o, g.ho, g.wo];
    if dy.shape() != want {
        return Err(TensorError::BadShape { op, what: "output gradient", shape: dy.shape().to_vec(), expected: format!("{want:?}") });
    }
    Ok(())
}

/// Gradient of [`conv2d`] w.r.t. its input (shape `input_shape`).
pub fn conv2d_backward_input(ctx: &ExecCtx, dy: &Tensor, w: &Tensor, input_shape: &[usize], p: &Conv2dParams) -> Result<Tensor> {
    let op = "conv2d_backward_input";
    same_dtype(op, "weight", dy, w)?;
    let g = geometry(op, input_shape, w.shape(), p)?;
    check_dy(op, dy, &g)?;
    float_dispatch!(op, dy.dtype(), T => {
        let (dd, wd) = (dy.contiguous(), w.contiguous());
        let ds = dd.shared::<T>()?.as_slice().expect("contiguous");
        let ws = wd.shared::<T>()?.as_slice().expect("contiguous");
        let dx = match bwd_input_as_conv(ctx, ds, ws, &g, p) {
            Some(dx) => dx,
            None => conv_bwd_input(ctx, ds, ws, &g),
        };
        Tensor::from_vec(input_shape, dx)
    })
}

/// Gradient of [`conv2d`] w.r.t. its weight (shape `weight_shape`).
pub fn conv2d_backward_weight(ctx: &ExecCtx, dy: &Tensor, x: &Tensor, weight_shape: &[usize], p: &Conv2dParams) -> Result<Tensor> {
    let op = "conv2d_backward_weight";
    same_dtype(op, "input", dy, x)?;
    let g = geometry(op, x.shape(), weight_shape, p)?;
    check_dy(op, dy, &g)?;
    float_dispatch!(op, dy.dtype(), T => {
        let (dd, xd) = (dy.contiguous(), x.contiguous());
        let ds = dd.shared::<T>()?.as_slice().expect("contiguous");
        let xs = xd.shared::<T>()?.as_slice().expect("contiguous");
        Tensor::from_vec(weight_shape, conv_bwd_weight(ctx, ds, xs, &g))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    /// A tap whose weight gradient is exactly zero stays exactly zero: on a 2x2 output (one
    /// Winograd tile) tap (0, 0) meets input pixel (0, 0) alone, here zero in channel 5 of every
    /// image (as a ReLU leaves it), so im2col's sums of products by zero are zero, where
    /// Winograd's transforms would leave rounding from the neighbouring taps (which Adam turns
    /// into a step of a third of the learning rate). The 16 images x 32 channels once took
    /// Winograd, 8 images did not: the batch a device held changed the numbers.
    #[test]
    fn an_exactly_zero_weight_gradient_tap_stays_zero_whatever_the_batch() {
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        for n in [8usize, 16, 32] {
            let (c, o, h) = (32usize, 32usize, 2usize);
            let mut x: Vec<f32> = (0..n * c * h * h).map(|_| next()).collect();
            for img in 0..n {
                x[(img * c + 5) * h * h] = 0.0;
            }
            let dy: Vec<f32> = (0..n * o * h * h).map(|_| next()).collect();
            let g = geometry("t", &[n, c, h, h], &[o, c, 3, 3], &Conv2dParams::new(1, 1)).unwrap();
            let dw = conv_bwd_weight(&cx(), &dy, &x, &g);
            for out in 0..o {
                let tap = dw[(out * c + 5) * 9];
                assert_eq!(tap.to_bits(), 0.0f32.to_bits(), "batch {n}, output channel {out}: {tap:e}");
            }
            assert!(dw.iter().any(|&v| v != 0.0));
        }
    }
    fn nine() -> Tensor {
        Tensor::from_vec(&[1, 1, 3, 3], (1..=9).map(|i| i as f32).collect()).unwrap()
    }

    #[test]
    fn conv2d_with_a_ones_kernel_sums_windows() {
        let w = Tensor::ones(&[1, 1, 2, 2], DType::F32);
        let y = conv2d(&cx(), &nine(), &w, &Conv2dParams::default()).unwrap();
        assert_eq!(y.shape(), &[1, 1, 2, 2]);
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![12., 16., 24., 28.]);
    }

    #[test]
    fn conv2d_with_stride_and_padding_matches_hand_values() {
        let w = Tensor::ones(&[1, 1, 2, 2], DType::F32);
        let y = conv2d(&cx(), &nine(), &w, &Conv2dParams::new(2, 1)).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![1., 5., 11., 28.]);
    }

    #[test]
    fn conv2d_with_dilation_reads_spread_taps() {
        let w = Tensor::ones(&[1, 1, 2, 2], DType::F32);
        let p = Conv2dParams { dilation: [2, 2], ..Default::default() };
        assert_eq!(conv2d(&cx(), &nine(), &w, &p).unwrap().to_vec::<f32>().unwrap(), vec![20.]);
    }

    #[test]
    fn grouped_conv2d_keeps_channels_apart() {
        let x = Tensor::from_vec(&[1, 2, 1, 2], vec![1f32, 2., 3., 4.]).unwrap();
        let w = Tensor::from_vec(&[2, 1, 1, 1], vec![2f32, 3.]).unwrap();
        let p = Conv2dParams { groups: 2, ..Default::default() };
        assert_eq!(conv2d(&cx(), &x, &w, &p).unwrap().to_vec::<f32>().unwrap(), vec![2., 4., 9., 12.]);
    }

    /// Direct seven-loop convolution as the reference.
    fn direct(x: &Tensor, w: &Tensor, p: &Conv2dParams) -> Vec<f64> {
        let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
        let (xv, wv) = (x.to_vec::<f64>().unwrap(), w.to_vec::<f64>().unwrap());
        let os = conv2d_output_shape(&xs, &ws, p).unwrap();
        let (cg, og) = (xs[1] / p.groups, ws[0] / p.groups);
        let mut out = vec![0.0; os.iter().product()];
        for n in 0..os[0] {
            for o in 0..os[1] {
                let g = o / og;
                for oh in 0..os[2] {
                    for ow in 0..os[3] {
                        let mut s = 0.0;
                        for c in 0..cg {
                            for i in 0..ws[2] {
                                for j in 0..ws[3] {
                                    let ih = (oh * p.stride[0] + i * p.dilation[0]) as isize - p.padding[0] as isize;
                                    let iw = (ow * p.stride[1] + j * p.dilation[1]) as isize - p.padding[2] as isize;
                                    if ih >= 0 && iw >= 0 && (ih as usize) < xs[2] && (iw as usize) < xs[3] {
                                        let xi = ((n * xs[1] + g * cg + c) * xs[2] + ih as usize) * xs[3] + iw as usize;
                                        s += xv[xi] * wv[((o * cg + c) * ws[2] + i) * ws[3] + j];
                                    }
                                }
                            }
                        }
                        out[((n * os[1] + o) * os[2] + oh) * os[3] + ow] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn conv2d_matches_a_direct_convolution_across_attributes() {
        let cases = [
            ([2, 4, 7, 6], [6, 2, 3, 2], Conv2dParams { stride: [2, 1], padding: [1, 2, 0, 1], dilation: [1, 2], groups: 2 }),
            ([3, 3, 5, 5], [4, 3, 3, 3], Conv2dParams::new(1, 1)),
            ([1, 4, 8, 8], [4, 1, 3, 3], Conv2dParams { groups: 4, ..Conv2dParams::new(2, 1) }),
            ([2, 4, 3, 5], [6, 2, 1, 1], Conv2dParams { groups: 2, ..Default::default() }),
            ([2, 3, 7, 7], [2, 3, 2, 3], Conv2dParams { stride: [3, 2], padding: [2, 1, 2, 2], dilation: [2, 3], groups: 1 }),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let x = crate::random::uniform(&xs, -1., 1., k as u64, DType::F64);
            let w = crate::random::uniform(&ws, -1., 1., 10 + k as u64, DType::F64);
            let y = conv2d(&cx(), &x, &w, &p).unwrap().to_vec::<f64>().unwrap();
            let r = direct(&x, &w, &p);
            assert!(y.iter().zip(&r).all(|(a, b)| (a - b).abs() < 1e-12), "case {k}");
        }
    }

    #[test]
    fn stride_one_input_gradient_as_a_flipped_convolution_matches_col2im() {
        let cases = [
            ([2, 4, 6, 7], [6, 2, 3, 3], Conv2dParams { padding: [1, 1, 1, 1], groups: 2, ..Default::default() }),
            ([1, 3, 7, 6], [2, 3, 3, 2], Conv2dParams { padding: [2, 0, 1, 1], dilation: [2, 1], ..Default::default() }),
            ([2, 2, 5, 5], [3, 2, 1, 1], Conv2dParams::default()),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let g = geometry("t", &xs, &ws, &p).unwrap();
            let w = crate::random::uniform(&ws, -1., 1., k as u64, DType::F64).to_vec::<f64>().unwrap();
            let dy = crate::random::uniform(&[g.n, g.o, g.ho, g.wo], -1., 1., 9, DType::F64).to_vec::<f64>().unwrap();
            let fast = bwd_input_as_conv(&cx(), &dy, &w, &g, &p).expect("stride 1 with small padding");
            let slow = conv_bwd_input(&cx(), &dy, &w, &g);
            assert!(fast.iter().zip(&slow).all(|(a, b)| (a - b).abs() < 1e-12), "case {k}");
        }
        let g = geometry("t", &[1, 1, 4, 4], &[1, 1, 2, 2], &Conv2dParams::new(2, 0)).unwrap();
        assert!(bwd_input_as_conv(&cx(), &[0.0; 4], &[0.0; 4], &g, &Conv2dParams::new(2, 0)).is_none());
    }

    #[test]
    fn shifted_gemm_forward_matches_im2col_across_padding_dilation_and_groups() {
        let cases = [
            ([2, 32, 6, 7], [8, 32, 3, 3], Conv2dParams::new(1, 1)),
            ([1, 64, 5, 6], [6, 32, 3, 2], Conv2dParams { padding: [2, 0, 1, 3], dilation: [2, 1], groups: 2, ..Default::default() }),
            ([2, 32, 4, 4], [4, 32, 2, 2], Conv2dParams::default()),
            ([1, 32, 5, 5], [3, 32, 5, 5], Conv2dParams { padding: [2, 2, 2, 2], ..Default::default() }),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let g = geometry("t", &xs, &ws, &p).unwrap();
            assert!(shifted_gemm_ok(&g), "case {k}");
            let x = crate::random::uniform(&xs, -1., 1., k as u64, DType::F64).to_vec::<f64>().unwrap();
            let w = crate::random::uniform(&ws, -1., 1., 50 + k as u64, DType::F64).to_vec::<f64>().unwrap();
            let mut fast = vec![0.0; g.n * g.o * g.hwo()];
            conv_fwd_shifted(&cx(), &x, &w, &g, &mut fast);
            let mut slow = vec![0.0; fast.len()];
            per_image(&cx(), &mut slow, g.o * g.hwo(), g.kg * g.hwo(), |b, yb, col, _| {
                for grp in 0..g.g {
                    im2col(&x, &g, b, grp, col, g.hwo());
                    let wg = mat(&w[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
                    cx().gemm(
                        wg,
                        mat(col, g.kg, g.hwo()),
                        mat_mut(&mut yb[grp * g.og * g.hwo()..][..g.og * g.hwo()], g.og, g.hwo()),
                        false,
                    );
                }
            });
            assert!(fast.iter().zip(&slow).all(|(a, b)| (a - b).abs() < 1e-12), "case {k}");
            let dy = crate::random::uniform(&[g.n, g.o, g.ho, g.wo], -1., 1., 90 + k as u64, DType::F64).to_vec::<f64>().unwrap();
            let dw_fast = conv_bwd_weight_shifted(&cx(), &dy, &x, &g);
            let dw_slow = conv_bwd_weight_im2col(&cx(), &dy, &x, &g);
            assert!(dw_fast.iter().zip(&dw_slow).all(|(a, b)| (a - b).abs() < 1e-11), "weight gradient, case {k}");
        }
    }

    #[test]
    fn blocks_of_images_give_the_per_image_results() {
        let cases = [
            ([5, 4, 6, 7], [6, 2, 3, 3], Conv2dParams { padding: [1, 1, 1, 1], groups: 2, ..Default::default() }),
            ([7, 3, 7, 6], [2, 3, 3, 2], Conv2dParams { stride: [2, 1], padding: [2, 0, 1, 1], dilation: [2, 1], groups: 1 }),
            ([4, 2, 5, 5], [3, 2, 1, 1], Conv2dParams::default()),
            ([6, 4, 8, 8], [4, 4, 1, 1], Conv2dParams::new(2, 0)),
            ([3, 32, 6, 6], [8, 32, 3, 3], Conv2dParams::new(1, 1)),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let g = geometry("t", &xs, &ws, &p).unwrap();
            let x = crate::random::uniform(&xs, -1., 1., k as u64, DType::F64).to_vec::<f64>().unwrap();
            let w = crate::random::uniform(&ws, -1., 1., 20 + k as u64, DType::F64).to_vec::<f64>().unwrap();
            let dy = crate::random::uniform(&[g.n, g.o, g.ho, g.wo], -1., 1., 40 + k as u64, DType::F64).to_vec::<f64>().unwrap();
            let close = |a: &[f64], b: &[f64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-11);
            let y1 = conv_fwd_blocks(&cx(), &x, &w, &g, 1);
            let dx1 = conv_bwd_input_blocks(&cx(), &dy, &w, &g, 1);
            let dw1 =
                if shifted_gemm_ok(&g) { conv_bwd_weight_shifted(&cx(), &dy, &x, &g) } else { conv_bwd_weight_im2col(&cx(), &dy, &x, &g) };
            for block in [2, 3, g.n] {
                assert!(close(&conv_fwd_blocks(&cx(), &x, &w, &g, block), &y1), "forward, case {k}, block {block}");
                assert!(close(&conv_bwd_weight_blocks(&cx(), &dy, &x, &g, block), &dw1), "weight gradient, case {k}, block {block}");
                assert!(close(&conv_bwd_input_blocks(&cx(), &dy, &w, &g, block), &dx1), "input gradient, case {k}, block {block}");
            }
            assert!(image_block(&g) > 1, "case {k}: small planes go in blocks");
        }
    }

    #[test]
    fn transpose_into_copies_columns_as_rows_past_the_tile_edges() {
        let (rows, cols) = (11, 19);
        let src: Vec<usize> = (0..rows * cols).collect();
        for (first, n) in [(0, cols), (3, 9), (10, 9)] {
            let mut dst = vec![usize::MAX; n * rows];
            transpose_into(&src, cols, first, &mut dst, rows);
            for j in 0..n {
                for i in 0..rows {
                    assert_eq!(dst[j * rows + i], src[i * cols + first + j], "first {first}, ({j}, {i})");
                }
            }
        }
    }

    #[test]
    fn same_padding_keeps_the_spatial_size_at_stride_one() {
        let p = Conv2dParams::same_padding(32, 32, 3, 3, [1, 1], [1, 1]);
        assert_eq!(p, [1, 1, 1, 1]);
        assert_eq!(Conv2dParams::same_padding(32, 32, 2, 2, [2, 2], [1, 1]), [0, 0, 0, 0]);
        assert_eq!(Conv2dParams::same_padding(5, 5, 4, 4, [1, 1], [1, 1]), [1, 2, 1, 2]);
    }

    #[test]
    fn bad_convolution_shapes_are_errors() {
        let w = Tensor::ones(&[1, 2, 2, 2], DType::F32);
        assert!(matches!(conv2d(&cx(), &nine(), &w, &Conv2dParams::default()), Err(TensorError::IncompatibleShapes { .. })));
        let big = Tensor::ones(&[1, 1, 4, 4], DType::F32);
        assert!(conv2d(&cx(), &nine(), &big, &Conv2dParams::default()).is_err());
        let p = Conv2dParams { groups: 2, ..Default::default() };
        assert!(matches!(
            conv2d(&cx(), &nine(), &Tensor::ones(&[2, 1, 1, 1], DType::F32), &p),
            Err(TensorError::InvalidArgument { name: "groups", .. })
        ));
        let p = Conv2dParams { stride: [0, 1], ..Default::default() };
        assert!(conv2d(&cx(), &nine(), &Tensor::ones(&[1, 1, 1, 1], DType::F32), &p).is_err());
    }
}
