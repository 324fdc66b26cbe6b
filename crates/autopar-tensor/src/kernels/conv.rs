//! Conv2D (NCHW input, OIHW weight; stride, padding, dilation, groups) by im2col + GEMM, and its
//! input and weight gradients (GEMM + col2im).
//!
//! Images are processed in chunks whose im2col matrix stays under [`COL_BUDGET`] elements; each
//! chunk is one GEMM per group, so the GEMMs are large enough to use every core. The chunking
//! does not depend on the thread count, and col2im accumulates each input plane on one thread,
//! so serial and parallel results are identical.

use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

use super::{float_dispatch, same_dtype};
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Elements of the im2col buffer per chunk of images (16 MiB of f32).
pub const COL_BUDGET: usize = 1 << 22;

/// Conv2D attributes. `padding` is `[top, bottom, left, right]` (MindSpore's `pad` list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 4],
    pub dilation: [usize; 2],
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
    /// im2col elements per chunk of images.
    budget: usize,
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
        budget: COL_BUDGET,
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
    fn chunk(&self) -> usize {
        (self.budget / (self.kg * self.hwo()).max(1)).clamp(1, self.n.max(1))
    }
}

/// Fills `col` ([kg, nb*hwo]) for images n0..n0+nb and group `grp`.
fn im2col<T: Float>(ctx: &ExecCtx, x: &[T], g: &Geo, n0: usize, nb: usize, grp: usize, col: &mut [T]) {
    let hwo = g.hwo();
    let row_len = nb * hwo;
    ctx.for_chunks(col, row_len, |r, row| {
        let c = r / (g.kh * g.kw);
        let i = (r / g.kw) % g.kh;
        let j = r % g.kw;
        let ch = grp * g.cg + c;
        for b in 0..nb {
            let plane = &x[((n0 + b) * g.c + ch) * g.h * g.w..][..g.h * g.w];
            for oh in 0..g.ho {
                let dst = &mut row[b * hwo + oh * g.wo..][..g.wo];
                let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
                if ih < 0 || ih >= g.h as isize {
                    dst.fill(T::zero());
                    continue;
                }
                let src = &plane[ih as usize * g.w..][..g.w];
                for (ow, d) in dst.iter_mut().enumerate() {
                    let iw = (ow * g.sw + j * g.dw) as isize - g.pl as isize;
                    *d = if iw >= 0 && iw < g.w as isize { src[iw as usize] } else { T::zero() };
                }
            }
        }
    });
}

fn mat<T>(data: &[T], rows: usize, cols: usize) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), data).expect("buffer sized")
}

fn mat_mut<T>(data: &mut [T], rows: usize, cols: usize) -> ArrayViewMut2<'_, T> {
    ArrayViewMut2::from_shape((rows, cols).strides((cols, 1)), data).expect("buffer sized")
}

fn conv_fwd<T: Float>(ctx: &ExecCtx, x: &[T], w: &[T], g: &Geo) -> Vec<T> {
    let hwo = g.hwo();
    let mut y = vec![T::zero(); g.n * g.o * hwo];
    let chunk = g.chunk();
    let mut col = vec![T::zero(); g.kg * chunk * hwo];
    let mut outg = vec![T::zero(); g.og * chunk * hwo];
    let mut n0 = 0;
    while n0 < g.n {
        let nb = chunk.min(g.n - n0);
        let row_len = nb * hwo;
        for grp in 0..g.g {
            let col = &mut col[..g.kg * row_len];
            im2col(ctx, x, g, n0, nb, grp, col);
            let wg = mat(&w[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
            let out = &mut outg[..g.og * row_len];
            ctx.gemm(wg, mat(col, g.kg, row_len), mat_mut(out, g.og, row_len), false);
            for b in 0..nb {
                for o in 0..g.og {
                    let dst = ((n0 + b) * g.o + grp * g.og + o) * hwo;
                    y[dst..dst + hwo].copy_from_slice(&out[o * row_len + b * hwo..][..hwo]);
                }
            }
        }
        n0 += nb;
    }
    y
}

/// Gathers dy[n0..n0+nb, grp*og..(grp+1)*og, :] into [og, nb*hwo].
fn gather_dy<T: Float>(dy: &[T], g: &Geo, n0: usize, nb: usize, grp: usize, out: &mut [T]) {
    let hwo = g.hwo();
    let row_len = nb * hwo;
    for o in 0..g.og {
        for b in 0..nb {
            let src = ((n0 + b) * g.o + grp * g.og + o) * hwo;
            out[o * row_len + b * hwo..][..hwo].copy_from_slice(&dy[src..src + hwo]);
        }
    }
}

fn conv_bwd_weight<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo) -> Vec<T> {
    let hwo = g.hwo();
    let mut dw = vec![T::zero(); g.o * g.kg];
    let chunk = g.chunk();
    let mut col = vec![T::zero(); g.kg * chunk * hwo];
    let mut dyg = vec![T::zero(); g.og * chunk * hwo];
    let mut n0 = 0;
    while n0 < g.n {
        let nb = chunk.min(g.n - n0);
        let row_len = nb * hwo;
        for grp in 0..g.g {
            let col = &mut col[..g.kg * row_len];
            im2col(ctx, x, g, n0, nb, grp, col);
            let d = &mut dyg[..g.og * row_len];
            gather_dy(dy, g, n0, nb, grp, d);
            let dwg = mat_mut(&mut dw[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
            ctx.gemm(mat(d, g.og, row_len), mat(col, g.kg, row_len).reversed_axes(), dwg, n0 > 0);
        }
        n0 += nb;
    }
    dw
}

fn conv_bwd_input<T: Float>(ctx: &ExecCtx, dy: &[T], w: &[T], g: &Geo) -> Vec<T> {
    let hwo = g.hwo();
    let plane = g.h * g.w;
    let mut dx = vec![T::zero(); g.n * g.c * plane];
    let chunk = g.chunk();
    let mut cols = vec![T::zero(); g.g * g.kg * chunk * hwo];
    let mut dyg = vec![T::zero(); g.og * chunk * hwo];
    let mut n0 = 0;
    while n0 < g.n {
        let nb = chunk.min(g.n - n0);
        let row_len = nb * hwo;
        for grp in 0..g.g {
            let d = &mut dyg[..g.og * row_len];
            gather_dy(dy, g, n0, nb, grp, d);
            let wg = mat(&w[grp * g.og * g.kg..][..g.og * g.kg], g.og, g.kg);
            let cg = &mut cols[grp * g.kg * row_len..][..g.kg * row_len];
            ctx.gemm(wg.reversed_axes(), mat(d, g.og, row_len), mat_mut(cg, g.kg, row_len), false);
        }
        // col2im: each input plane (image, channel) gathers its contributions on one thread.
        let cols = &cols;
        let dxc = &mut dx[n0 * g.c * plane..(n0 + nb) * g.c * plane];
        ctx.for_chunks(dxc, plane, |pi, dst| {
            let (b, ch) = (pi / g.c, pi % g.c);
            let (grp, c) = (ch / g.cg, ch % g.cg);
            let base = &cols[grp * g.kg * row_len..][..g.kg * row_len];
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let r = (c * g.kh + i) * g.kw + j;
                    let src = &base[r * row_len + b * hwo..][..hwo];
                    for oh in 0..g.ho {
                        let ih = (oh * g.sh + i * g.dh) as isize - g.pt as isize;
                        if ih < 0 || ih >= g.h as isize {
                            continue;
                        }
                        let drow = &mut dst[ih as usize * g.w..][..g.w];
                        let srow = &src[oh * g.wo..][..g.wo];
                        for (ow, &v) in srow.iter().enumerate() {
                            let iw = (ow * g.sw + j * g.dw) as isize - g.pl as isize;
                            if iw >= 0 && iw < g.w as isize {
                                drow[iw as usize] += v;
                            }
                        }
                    }
                }
            }
        });
        n0 += nb;
    }
    dx
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
        Tensor::from_vec(input_shape, conv_bwd_input(ctx, ds, ws, &g))
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
    fn chunking_the_batch_does_not_change_any_result() {
        let p = Conv2dParams { stride: [1, 1], padding: [1; 4], dilation: [1, 1], groups: 2 };
        let x = crate::random::uniform(&[5, 4, 6, 6], -1., 1., 1, DType::F64);
        let w = crate::random::uniform(&[6, 2, 3, 3], -1., 1., 2, DType::F64);
        let dy = crate::random::uniform(&[5, 6, 6, 6], -1., 1., 3, DType::F64);
        let (xs, ws, ds) = (x.to_vec::<f64>().unwrap(), w.to_vec::<f64>().unwrap(), dy.to_vec::<f64>().unwrap());
        let whole = geometry("t", x.shape(), w.shape(), &p).unwrap();
        let mut small = whole;
        small.budget = whole.kg * whole.hwo() * 2; // two images per chunk: chunks of 2, 2, 1
        assert_eq!(small.chunk(), 2);
        let close = |a: Vec<f64>, b: Vec<f64>| a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-12);
        assert!(close(conv_fwd(&cx(), &xs, &ws, &whole), conv_fwd(&cx(), &xs, &ws, &small)));
        assert!(close(conv_bwd_input(&cx(), &ds, &ws, &whole), conv_bwd_input(&cx(), &ds, &ws, &small)));
        assert!(close(conv_bwd_weight(&cx(), &ds, &xs, &whole), conv_bwd_weight(&cx(), &ds, &xs, &small)));
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
