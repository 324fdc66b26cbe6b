//! MaxPool, AvgPool and global average pooling over NCHW, forward and backward. Each output
//! plane is computed on one thread; backward accumulates per input plane, so results do not
//! depend on threading.

use super::conv::conv_out_size;
use super::float_dispatch;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Pooling attributes. `padding` is `[top, bottom, left, right]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Stride along height and width.
    pub stride: [usize; 2],
    /// Padding, `[top, bottom, left, right]`.
    pub padding: [usize; 4],
    /// AvgPool only: divide by the full window size (true) or by the count of real pixels.
    pub count_include_pad: bool,
}

impl Pool2dParams {
    /// Square window `k`, stride `s`, no padding.
    pub fn new(k: usize, s: usize) -> Self {
        Pool2dParams { kernel: [k, k], stride: [s, s], padding: [0; 4], count_include_pad: false }
    }
}

#[derive(Clone, Copy)]
struct PGeo {
    planes: usize,
    h: usize,
    w: usize,
    ho: usize,
    wo: usize,
    p: Pool2dParams,
}

fn geo(op: &'static str, shape: &[usize], p: &Pool2dParams) -> Result<PGeo> {
    if shape.len() != 4 {
        return Err(TensorError::BadShape { op, what: "input", shape: shape.to_vec(), expected: "rank 4 [N, C, H, W]".into() });
    }
    if p.kernel.contains(&0) || p.stride.contains(&0) {
        return Err(TensorError::InvalidArgument {
            op,
            name: "kernel/stride",
            value: format!("{:?}/{:?}", p.kernel, p.stride),
            expected: "positive sizes",
        });
    }
    if p.padding[0] >= p.kernel[0] || p.padding[1] >= p.kernel[0] || p.padding[2] >= p.kernel[1] || p.padding[3] >= p.kernel[1] {
        return Err(TensorError::InvalidArgument {
            op,
            name: "padding",
            value: format!("{:?}", p.padding),
            expected: "padding smaller than the window",
        });
    }
    let ho = conv_out_size(shape[2], p.kernel[0], p.stride[0], p.padding[0], p.padding[1], 1);
    let wo = conv_out_size(shape[3], p.kernel[1], p.stride[1], p.padding[2], p.padding[3], 1);
    let (Some(ho), Some(wo)) = (ho, wo) else {
        return Err(TensorError::BadShape {
            op,
            what: "input",
            shape: shape.to_vec(),
            expected: format!("spatial size at least the window {:?}", p.kernel),
        });
    };
    Ok(PGeo { planes: shape[0] * shape[1], h: shape[2], w: shape[3], ho, wo, p: *p })
}

impl PGeo {
    /// Valid input rows/cols of the window at (oh, ow).
    fn window(&self, oh: usize, ow: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let h0 = (oh * self.p.stride[0]) as isize - self.p.padding[0] as isize;
        let w0 = (ow * self.p.stride[1]) as isize - self.p.padding[2] as isize;
        let clip = |a: isize, k: usize, n: usize| (a.max(0) as usize)..((a + k as isize).min(n as isize).max(0) as usize);
        (clip(h0, self.p.kernel[0], self.h), clip(w0, self.p.kernel[1], self.w))
    }
    fn out_shape(&self, n: usize, c: usize) -> Vec<usize> {
        vec![n, c, self.ho, self.wo]
    }
}

/// MaxPool forward: `(y, argmax)` where `argmax` (i64, shape of `y`) holds the flat index
/// `ih * W + iw` of each maximum within its input plane (first maximum on ties).
pub fn max_pool2d(ctx: &ExecCtx, x: &Tensor, p: &Pool2dParams) -> Result<(Tensor, Tensor)> {
    let op = "max_pool2d";
    let g = geo(op, x.shape(), p)?;
    let oshape = g.out_shape(x.shape()[0], x.shape()[1]);
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let (hw, ohw) = (g.h * g.w, g.ho * g.wo);
        let mut out: Vec<(T, i64)> = vec![(T::zero(), 0); g.planes * ohw];
        ctx.for_chunks(&mut out, ohw.max(1), |pl, o| {
            let src = &xs[pl * hw..][..hw];
            for oh in 0..g.ho {
                for ow in 0..g.wo {
                    let (rh, rw) = g.window(oh, ow);
                    let mut best = (T::neg_infinity(), -1i64);
                    for ih in rh {
                        for iw in rw.clone() {
                            let v = src[ih * g.w + iw];
                            if best.1 < 0 || v > best.0 || (v.is_nan() && !best.0.is_nan()) {
                                best = (v, (ih * g.w + iw) as i64);
                            }
                        }
                    }
                    o[oh * g.wo + ow] = best;
                }
            }
        });
        Ok((Tensor::from_vec(&oshape, out.iter().map(|p| p.0).collect())?, Tensor::from_vec(&oshape, out.iter().map(|p| p.1).collect())?))
    })
}

/// MaxPool backward: routes each `dy` element to its argmax position in a zero tensor of
/// `input_shape` (overlapping windows accumulate).
pub fn max_pool2d_backward(ctx: &ExecCtx, dy: &Tensor, argmax: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
    let op = "max_pool2d_backward";
    if input_shape.len() != 4 || dy.rank() != 4 || dy.shape()[..2] != input_shape[..2] || argmax.shape() != dy.shape() {
        return Err(TensorError::BadShape {
            op,
            what: "output gradient / argmax",
            shape: dy.shape().to_vec(),
            expected: format!(
                "[{}, {}, Ho, Wo] matching argmax {:?}",
                input_shape.first().unwrap_or(&0),
                input_shape.get(1).unwrap_or(&0),
                argmax.shape()
            ),
        });
    }
    let am = argmax.typed::<i64>(op, "argmax")?.iter().copied().collect::<Vec<i64>>();
    let hw = input_shape[2] * input_shape[3];
    let ohw = dy.shape()[2] * dy.shape()[3];
    if let Some((position, &index)) = am.iter().enumerate().find(|(_, &v)| v >= hw as i64) {
        return Err(TensorError::IndexOutOfRange { op, what: "argmax", index, position, bound: hw });
    }
    float_dispatch!(op, dy.dtype(), T => {
        let dc = dy.contiguous();
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let planes = input_shape[0] * input_shape[1];
        let mut dx = vec![T::zero(); planes * hw];
        ctx.for_chunks(&mut dx, hw.max(1), |pl, o| {
            for k in 0..ohw {
                let a = am[pl * ohw + k];
                if a >= 0 {
                    o[a as usize] += ds[pl * ohw + k];
                }
            }
        });
        Tensor::from_vec(input_shape, dx)
    })
}

fn avg_count(g: &PGeo, rh: &std::ops::Range<usize>, rw: &std::ops::Range<usize>) -> usize {
    if g.p.count_include_pad {
        g.p.kernel[0] * g.p.kernel[1]
    } else {
        rh.len() * rw.len()
    }
}

/// AvgPool forward.
pub fn avg_pool2d(ctx: &ExecCtx, x: &Tensor, p: &Pool2dParams) -> Result<Tensor> {
    let op = "avg_pool2d";
    let g = geo(op, x.shape(), p)?;
    let oshape = g.out_shape(x.shape()[0], x.shape()[1]);
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let (hw, ohw) = (g.h * g.w, g.ho * g.wo);
        let mut out = vec![T::zero(); g.planes * ohw];
        ctx.for_chunks(&mut out, ohw.max(1), |pl, o| {
            let src = &xs[pl * hw..][..hw];
            for oh in 0..g.ho {
                for ow in 0..g.wo {
                    let (rh, rw) = g.window(oh, ow);
                    let cnt = avg_count(&g, &rh, &rw);
                    let mut s = T::zero();
                    for ih in rh {
                        for iw in rw.clone() {
                            s += src[ih * g.w + iw];
                        }
                    }
                    o[oh * g.wo + ow] = s / T::c(cnt.max(1) as f64);
                }
            }
        });
        Tensor::from_vec(&oshape, out)
    })
}

/// AvgPool backward: spreads each `dy` element evenly over its window.
pub fn avg_pool2d_backward(ctx: &ExecCtx, dy: &Tensor, input_shape: &[usize], p: &Pool2dParams) -> Result<Tensor> {
    let op = "avg_pool2d_backward";
    let g = geo(op, input_shape, p)?;
    let oshape = g.out_shape(input_shape[0], input_shape[1]);
    super::same_shape(op, &oshape, dy.shape(), "output gradient must have the pooled shape")?;
    float_dispatch!(op, dy.dtype(), T => {
        let dc = dy.contiguous();
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let (hw, ohw) = (g.h * g.w, g.ho * g.wo);
        let mut dx = vec![T::zero(); g.planes * hw];
        ctx.for_chunks(&mut dx, hw.max(1), |pl, o| {
            for oh in 0..g.ho {
                for ow in 0..g.wo {
                    let (rh, rw) = g.window(oh, ow);
                    let v = ds[pl * ohw + oh * g.wo + ow] / T::c(avg_count(&g, &rh, &rw).max(1) as f64);
                    for ih in rh {
                        for iw in rw.clone() {
                            o[ih * g.w + iw] += v;
                        }
                    }
                }
            }
        });
        Tensor::from_vec(input_shape, dx)
    })
}

/// Global average pooling: `[N, C, H, W] -> [N, C, 1, 1]` (`keep_dims`) or `[N, C]`.
pub fn global_avg_pool(ctx: &ExecCtx, x: &Tensor, keep_dims: bool) -> Result<Tensor> {
    let op = "global_avg_pool";
    if x.rank() != 4 || x.shape()[2] * x.shape()[3] == 0 {
        return Err(TensorError::BadShape {
            op,
            what: "input",
            shape: x.shape().to_vec(),
            expected: "rank 4 [N, C, H, W] with H*W > 0".into(),
        });
    }
    super::reduce::reduce_mean(ctx, x, &[2, 3], keep_dims)
}

/// Backward of [`global_avg_pool`]: `dy / (H*W)` broadcast over each plane.
pub fn global_avg_pool_backward(ctx: &ExecCtx, dy: &Tensor, input_shape: &[usize]) -> Result<Tensor> {
    if input_shape.len() != 4 {
        return Err(TensorError::BadShape {
            op: "global_avg_pool_backward",
            what: "input shape",
            shape: input_shape.to_vec(),
            expected: "rank 4".into(),
        });
    }
    super::reduce::reduce_backward(ctx, super::reduce::ReduceOp::Mean, dy, input_shape, &[2, 3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn x16() -> Tensor {
        Tensor::from_vec(&[1, 1, 4, 4], (1..=16).map(|i| i as f32).collect()).unwrap()
    }
    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    #[test]
    fn max_pool_takes_window_maxima_and_records_their_positions() {
        let (y, am) = max_pool2d(&cx(), &x16(), &Pool2dParams::new(2, 2)).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![6., 8., 14., 16.]);
        assert_eq!(am.to_vec::<i64>().unwrap(), vec![5, 7, 13, 15]);
        let dx = max_pool2d_backward(&cx(), &y, &am, &[1, 1, 4, 4]).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(dx.iter().filter(|&&v| v != 0.).count(), 4);
        assert_eq!(dx[15], 16.);
    }

    #[test]
    fn avg_pool_averages_windows_with_and_without_padding_in_the_count() {
        let y = avg_pool2d(&cx(), &x16(), &Pool2dParams::new(2, 2)).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.5, 5.5, 11.5, 13.5]);
        let x = Tensor::from_vec(&[1, 1, 2, 2], vec![1f32, 2., 3., 4.]).unwrap();
        let mut p = Pool2dParams { kernel: [3, 3], stride: [1, 1], padding: [1; 4], count_include_pad: false };
        assert_eq!(avg_pool2d(&cx(), &x, &p).unwrap().to_vec::<f32>().unwrap(), vec![2.5; 4]);
        p.count_include_pad = true;
        assert_eq!(avg_pool2d(&cx(), &x, &p).unwrap().to_vec::<f32>().unwrap(), vec![10. / 9.; 4]);
    }

    #[test]
    fn global_avg_pool_averages_each_plane() {
        let y = global_avg_pool(&cx(), &x16(), true).unwrap();
        assert_eq!((y.shape(), y.to_vec::<f32>().unwrap()), (&[1usize, 1, 1, 1][..], vec![8.5]));
        let dx = global_avg_pool_backward(&cx(), &Tensor::ones(&[1, 1], DType::F32), &[1, 1, 4, 4]).unwrap();
        assert_eq!(dx.to_vec::<f32>().unwrap(), vec![1. / 16.; 16]);
    }

    #[test]
    fn pooling_rejects_windows_larger_than_the_input_and_oversized_padding() {
        assert!(max_pool2d(&cx(), &x16(), &Pool2dParams::new(5, 1)).is_err());
        let p = Pool2dParams { kernel: [2, 2], stride: [1, 1], padding: [2, 0, 0, 0], count_include_pad: false };
        assert!(matches!(avg_pool2d(&cx(), &x16(), &p), Err(TensorError::InvalidArgument { name: "padding", .. })));
        assert!(max_pool2d(&cx(), &Tensor::zeros(&[4, 4], DType::F32), &Pool2dParams::new(2, 2)).is_err());
    }
}
