//! BatchNorm (train and eval, running statistics), LayerNorm and RMSNorm, forward and backward.
//!
//! RMSNorm is LayerNorm with a zero mean and the mean square for the variance: its kernels are
//! LayerNorm's with those statistics, and its backward LayerNorm's without the mean's term.
//!
//! BatchNorm normalises over every axis except 1 (`[N, C]`, `[N, C, L]`, `[N, C, H, W]`).
//! Running statistics follow MindSpore's momentum convention:
//! `running = momentum * running + (1 - momentum) * batch` (default momentum 0.9), with the
//! unbiased batch variance (`M / (M - 1)`) in the running variance as MindSpore's GPU/Ascend
//! kernels (and cuDNN) do; normalisation itself uses the biased variance.

use ndarray::{ArrayD, IxDyn};

use super::{float_dispatch, same_dtype};
use crate::kernels::reduce::{in_lockstep_groups, lockstep_rows, lockstep_sums, lockstep_sums2, sum_axes, LOCKSTEP};
use crate::simd::{self, BinaryFn, UnaryFn};
use crate::tensor::normalize_axis;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// What normalisation's backward needs from its forward: per-group mean and 1/sqrt(var + eps).
#[derive(Debug, Clone)]
pub struct NormSaved {
    /// Mean per group (a channel for BatchNorm, a row for LayerNorm).
    pub mean: Tensor,
    /// `1 / sqrt(var + eps)` per group.
    pub inv_std: Tensor,
}

/// Result of [`batch_norm_train`].
#[derive(Debug, Clone)]
pub struct BatchNormOutput {
    /// Normalised, scaled and shifted output.
    pub y: Tensor,
    /// Batch mean and inverse std, for [`batch_norm_backward`].
    pub saved: NormSaved,
    /// Updated running mean.
    pub running_mean: Tensor,
    /// Updated running variance.
    pub running_var: Tensor,
}

fn bn_geo(op: &'static str, x: &Tensor, params: &[(&'static str, &Tensor)]) -> Result<(usize, usize, usize)> {
    if x.rank() < 2 {
        return Err(TensorError::BadShape { op, what: "input", shape: x.shape().to_vec(), expected: "rank >= 2 [N, C, ...]".into() });
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let s: usize = x.shape()[2..].iter().product();
    for (what, t) in params {
        same_dtype(op, what, x, t)?;
        if t.shape() != [c] {
            return Err(TensorError::BadShape {
                op,
                what,
                shape: t.shape().to_vec(),
                expected: format!("[{c}] (channels of input {:?})", x.shape()),
            });
        }
    }
    Ok((n, c, s))
}

fn vec_of<T: Float>(t: &Tensor) -> Vec<T> {
    t.to_vec::<T>().expect("dtype checked")
}

/// Adds to `acc[i]` the sum of `f(i, v)` over channel `c0 + i`'s plane of each image in turn
/// ([N, C, S] data): each plane summed from zero, the planes added in batch order, the channels
/// of `acc` side by side ([`lockstep_sums`]).
fn add_plane_sums<T: Float>(x: &[T], (n, c, s): (usize, usize, usize), c0: usize, acc: &mut [T], f: impl Fn(usize, T) -> T) {
    let w = acc.len();
    for b in 0..n {
        let rows = lockstep_rows(w, |i| &x[(b * c + c0 + i) * s..][..s]);
        let mut plane = [T::zero(); LOCKSTEP];
        lockstep_sums(&mut plane[..w], &rows[..w], &f);
        acc.iter_mut().zip(&plane).for_each(|(a, &p)| *a += p);
    }
}

/// Per-channel (mean, biased variance) over [N, C, S] data, in a fixed order ([`add_plane_sums`]).
fn channel_stats<T: Float>(ctx: &ExecCtx, x: &[T], n: usize, c: usize, s: usize) -> (Vec<T>, Vec<T>) {
    let m = T::c((n * s) as f64);
    let mut stats = vec![(T::zero(), T::zero()); c];
    in_lockstep_groups(ctx, x.len(), &mut stats, |c0, out: &mut [(T, T)]| {
        let w = out.len();
        let mut sum = vec![T::zero(); w];
        add_plane_sums(x, (n, c, s), c0, &mut sum, |_, v| v);
        let mu: Vec<T> = sum.iter().map(|&v| v / m).collect();
        let mut sq = vec![T::zero(); w];
        add_plane_sums(x, (n, c, s), c0, &mut sq, |i, v| (v - mu[i]) * (v - mu[i]));
        for (o, (&mu, &sq)) in out.iter_mut().zip(mu.iter().zip(&sq)) {
            *o = (mu, sq / m);
        }
    });
    stats.into_iter().unzip()
}

/// y = (x - mean[c]) * scale[c] + shift[c] over [N, C, S] data.
fn affine<T: Float>(ctx: &ExecCtx, x: &[T], c: usize, s: usize, mean: &[T], scale: &[T], shift: &[T]) -> Vec<T> {
    let mut y = vec![T::zero(); x.len()];
    ctx.for_chunks(&mut y, s.max(1), |p, out| {
        let ch = p % c;
        simd::map1(out, &x[p * s..][..s], Affine { mean: mean[ch], scale: scale[ch], shift: shift[ch] });
    });
    y
}

/// `(x - mean) * scale + shift`, one plane's constants, for [`simd::map1`].
#[derive(Clone, Copy)]
struct Affine<T> {
    mean: T,
    scale: T,
    shift: T,
}

impl<T: Float> UnaryFn<T> for Affine<T> {
    #[inline(always)]
    fn apply(self, v: T) -> T {
        (v - self.mean) * self.scale + self.shift
    }
}

/// BatchNorm in training mode: normalises with the batch statistics and updates the running ones.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_train(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    momentum: f64,
    eps: f64,
) -> Result<BatchNormOutput> {
    let stats = batch_stats(ctx, x)?;
    batch_norm_train_with(ctx, x, gamma, beta, running_mean, running_var, &stats, momentum, eps)
}

/// The statistics [`batch_norm_train`] saves for its backward (the batch's mean and
/// `1/sqrt(var + eps)` per channel), without normalising: what a backward pass recomputes.
pub fn batch_norm_saved(ctx: &ExecCtx, x: &Tensor, eps: f64) -> Result<NormSaved> {
    let stats = batch_stats(ctx, x)?;
    float_dispatch!("batch_norm", x.dtype(), T => {
        let e = T::c(eps);
        let inv_std: Vec<T> = vec_of::<T>(&stats.var).iter().map(|&v| T::one() / (v + e).sqrt()).collect();
        Ok(NormSaved { inv_std: Tensor::from_vec(stats.var.shape(), inv_std)?, mean: stats.mean })
    })
}

/// The per-channel mean and biased variance of `x` `[N, C, ...]`, in a fixed order.
fn batch_stats(ctx: &ExecCtx, x: &Tensor) -> Result<BatchStats> {
    let op = "batch_norm";
    let (n, c, s) = bn_geo(op, x, &[])?;
    if n * s == 0 {
        return Err(TensorError::BadShape {
            op,
            what: "input",
            shape: x.shape().to_vec(),
            expected: "at least one element per channel".into(),
        });
    }
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, var) = channel_stats(ctx, xs, n, c, s);
        Ok(BatchStats { mean: Tensor::from_vec(&[c], mean)?, var: Tensor::from_vec(&[c], var)?, count: n * s })
    })
}

/// BatchNorm in inference mode: normalises with the running statistics.
pub fn batch_norm_eval(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let op = "batch_norm";
    let (_, c, s) = bn_geo(op, x, &[("gamma", gamma), ("beta", beta), ("running_mean", running_mean), ("running_var", running_var)])?;
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let e = T::c(eps);
        let scale: Vec<T> = vec_of::<T>(running_var).iter().zip(vec_of::<T>(gamma)).map(|(&v, g)| g / (v + e).sqrt()).collect();
        let y = affine(ctx, xs, c, s, &vec_of::<T>(running_mean), &scale, &vec_of::<T>(beta));
        Tensor::from_vec(x.shape(), y)
    })
}

/// Backward of [`batch_norm_train`]: `(dx, dgamma, dbeta)`.
pub fn batch_norm_backward(ctx: &ExecCtx, x: &Tensor, gamma: &Tensor, saved: &NormSaved, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    bn_backward(ctx, x, gamma, saved, dy, true)
}

/// Backward of [`batch_norm_eval`] (statistics are constants): `(dx, dgamma, dbeta)`. `saved`
/// holds the running mean and `1/sqrt(running_var + eps)`.
pub fn batch_norm_eval_backward(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    bn_backward(ctx, x, gamma, saved, dy, false)
}

fn bn_backward(ctx: &ExecCtx, x: &Tensor, gamma: &Tensor, saved: &NormSaved, dy: &Tensor, train: bool) -> Result<(Tensor, Tensor, Tensor)> {
    if train {
        bn_backward_parts(ctx, x, gamma, saved, dy, None)
    } else {
        bn_backward_eval(ctx, x, gamma, saved, dy)
    }
}

/// Training backward: `(dx, dgamma, dbeta)` with the sums of this batch, or with `global`
/// sums `(Σ dy, Σ dy·x̂, count)` over a larger batch for `dx` (dgamma and dbeta stay local).
fn bn_backward_parts(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    global: Option<(&Tensor, &Tensor, usize)>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "batch_norm_backward";
    let (n, c, s) = bn_geo(op, x, &[("gamma", gamma), ("saved mean", &saved.mean), ("saved inv_std", &saved.inv_std)])?;
    same_dtype(op, "output gradient", x, dy)?;
    super::same_shape(op, x.shape(), dy.shape(), "output gradient must have the input's shape")?;
    float_dispatch!(op, x.dtype(), T => {
        let (xc, dc) = (x.contiguous(), dy.contiguous());
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, inv, g) = (vec_of::<T>(&saved.mean), vec_of::<T>(&saved.inv_std), vec_of::<T>(gamma));
        let (dbeta, dgamma) = dy_sums(ctx, xs, ds, &mean, &inv, (n, c, s));
        let (sum_dy, sum_dyx, m) = match global {
            Some((a, b, count)) => (vec_of::<T>(a), vec_of::<T>(b), T::c(count as f64)),
            None => (dbeta.clone(), dgamma.clone(), T::c((n * s) as f64)),
        };
        let mut dx = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut dx, s.max(1), |p, out| {
            let ch = p % c;
            let (x, dy) = (&xs[p * s..][..s], &ds[p * s..][..s]);
            let (mean, inv, sum_dy, sum_dyx) = (mean[ch], inv[ch], sum_dy[ch], sum_dyx[ch]);
            simd::map2(out, x, dy, BnInputGrad { k: g[ch] * inv, mean, inv, sum_dy, sum_dyx, m });
        });
        Ok((Tensor::from_vec(x.shape(), dx)?, Tensor::from_vec(&[c], dgamma)?, Tensor::from_vec(&[c], dbeta)?))
    })
}

/// One plane's BatchNorm input gradient `k (dy - Σdy/m - x̂ Σdy·x̂/m)` with `x̂ = (x - mean) inv`,
/// of `(x, dy)`, for [`simd::map2`].
#[derive(Clone, Copy)]
struct BnInputGrad<T> {
    k: T,
    mean: T,
    inv: T,
    sum_dy: T,
    sum_dyx: T,
    m: T,
}

impl<T: Float> BinaryFn<T> for BnInputGrad<T> {
    #[inline(always)]
    fn apply(self, xv: T, dv: T) -> T {
        let BnInputGrad { k, mean, inv, sum_dy, sum_dyx, m } = self;
        let xh = (xv - mean) * inv;
        k * (dv - sum_dy / m - xh * sum_dyx / m)
    }
}

/// Per-channel `(Σ dy, Σ dy·x̂)` over [N, C, S] data, in a fixed order: one running sum per
/// channel over the planes in batch order (channels side by side, [`lockstep_sums`]).
fn dy_sums<T: Float>(ctx: &ExecCtx, xs: &[T], ds: &[T], mean: &[T], inv: &[T], (n, c, s): (usize, usize, usize)) -> (Vec<T>, Vec<T>) {
    let mut sums = vec![(T::zero(), T::zero()); c];
    let group = |c0: usize, out: &mut [(T, T)]| {
        let w = out.len();
        let (mut sd, mut sdx) = (vec![T::zero(); w], vec![T::zero(); w]);
        for b in 0..n {
            let at = |i: usize| (b * c + c0 + i) * s;
            let dys = lockstep_rows(w, |i| &ds[at(i)..][..s]);
            let xrows = lockstep_rows(w, |i| &xs[at(i)..][..s]);
            lockstep_sums(&mut sd, &dys[..w], |_, v| v);
            // Σ dy·x̂ walks dy and x together.
            lockstep_sums2(&mut sdx, &dys[..w], &xrows[..w], |i, dv, xv| dv * (xv - mean[c0 + i]) * inv[c0 + i]);
        }
        for (o, (&a, &b)) in out.iter_mut().zip(sd.iter().zip(&sdx)) {
            *o = (a, b);
        }
    };
    in_lockstep_groups(ctx, xs.len(), &mut sums, group);
    sums.into_iter().unzip()
}

/// Evaluation backward (statistics are constants): `(dx, dgamma, dbeta)`.
fn bn_backward_eval(ctx: &ExecCtx, x: &Tensor, gamma: &Tensor, saved: &NormSaved, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "batch_norm_backward";
    let (n, c, s) = bn_geo(op, x, &[("gamma", gamma), ("saved mean", &saved.mean), ("saved inv_std", &saved.inv_std)])?;
    same_dtype(op, "output gradient", x, dy)?;
    super::same_shape(op, x.shape(), dy.shape(), "output gradient must have the input's shape")?;
    float_dispatch!(op, x.dtype(), T => {
        let (xc, dc) = (x.contiguous(), dy.contiguous());
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, inv, g) = (vec_of::<T>(&saved.mean), vec_of::<T>(&saved.inv_std), vec_of::<T>(gamma));
        let (dbeta, dgamma) = dy_sums(ctx, xs, ds, &mean, &inv, (n, c, s));
        let mut dx = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut dx, s.max(1), |p, out| {
            let k = g[p % c] * inv[p % c];
            for (o, &dv) in out.iter_mut().zip(&ds[p * s..][..s]) {
                *o = k * dv;
            }
        });
        Ok((Tensor::from_vec(x.shape(), dx)?, Tensor::from_vec(&[c], dgamma)?, Tensor::from_vec(&[c], dbeta)?))
    })
}

/// Per-channel statistics of a batch split across ranks, gathered by the caller (synchronised
/// BatchNorm): `count` elements per channel in the whole batch, their mean and biased variance.
#[derive(Debug, Clone)]
pub struct BatchStats {
    /// Mean per channel over the whole batch, `[C]`.
    pub mean: Tensor,
    /// Biased variance per channel over the whole batch, `[C]`.
    pub var: Tensor,
    /// Elements per channel in the whole batch.
    pub count: usize,
}

/// Per-channel sums over every axis but 1 of this rank's part of the batch, in a fixed order:
/// `Σ x` (with `mean` None) or `Σ (x - mean[c])²`. Synchronised BatchNorm sums these over the
/// ranks: the first gives the mean, the second (around that mean) the variance.
pub fn channel_sums(ctx: &ExecCtx, x: &Tensor, mean: Option<&Tensor>) -> Result<Tensor> {
    let op = "batch_norm";
    let (n, c, s) = match mean {
        Some(m) => bn_geo(op, x, &[("mean", m)])?,
        None => bn_geo(op, x, &[])?,
    };
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let mu: Option<Vec<T>> = mean.map(vec_of::<T>);
        let mut sums = vec![T::zero(); c];
        in_lockstep_groups(ctx, xs.len(), &mut sums, |c0, acc: &mut [T]| match &mu {
            None => add_plane_sums(xs, (n, c, s), c0, acc, |_, v| v),
            Some(mu) => add_plane_sums(xs, (n, c, s), c0, acc, |i, v| (v - mu[c0 + i]) * (v - mu[c0 + i])),
        });
        Tensor::from_vec(&[c], sums)
    })
}

/// BatchNorm in training mode with statistics taken over a larger batch than `x` (see
/// [`BatchStats`]): normalises with them and updates the running statistics with them.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_train_with(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    stats: &BatchStats,
    momentum: f64,
    eps: f64,
) -> Result<BatchNormOutput> {
    let op = "batch_norm";
    let (_, c, s) = bn_geo(
        op,
        x,
        &[
            ("gamma", gamma),
            ("beta", beta),
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("batch mean", &stats.mean),
            ("batch variance", &stats.var),
        ],
    )?;
    if stats.count == 0 {
        return Err(TensorError::InvalidArgument { op, name: "count", value: "0".into(), expected: "at least one element per channel" });
    }
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, var) = (vec_of::<T>(&stats.mean), vec_of::<T>(&stats.var));
        let e = T::c(eps);
        let inv_std: Vec<T> = var.iter().map(|&v| T::one() / (v + e).sqrt()).collect();
        let scale: Vec<T> = inv_std.iter().zip(vec_of::<T>(gamma)).map(|(&i, g)| i * g).collect();
        let y = affine(ctx, xs, c, s, &mean, &scale, &vec_of::<T>(beta));
        let mo = T::c(momentum);
        let m = stats.count;
        let unbias = if m > 1 { T::c(m as f64 / (m - 1) as f64) } else { T::one() };
        let rm: Vec<T> = vec_of::<T>(running_mean).iter().zip(&mean).map(|(&r, &b)| mo * r + (T::one() - mo) * b).collect();
        let rv: Vec<T> = vec_of::<T>(running_var).iter().zip(&var).map(|(&r, &b)| mo * r + (T::one() - mo) * b * unbias).collect();
        Ok(BatchNormOutput {
            y: Tensor::from_vec(x.shape(), y)?,
            saved: NormSaved { mean: stats.mean.clone(), inv_std: Tensor::from_vec(&[c], inv_std)? },
            running_mean: Tensor::from_vec(&[c], rm)?,
            running_var: Tensor::from_vec(&[c], rv)?,
        })
    })
}

/// Per-channel `(Σ dy, Σ dy·x̂)` over this rank's part of the batch (`x̂` normalised with
/// `saved`): the gradients of beta and gamma from this part, and, summed over the ranks, what
/// [`batch_norm_backward_input`] needs.
pub fn batch_norm_grad_sums(ctx: &ExecCtx, x: &Tensor, saved: &NormSaved, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let ones = Tensor::ones(saved.mean.shape(), saved.mean.dtype());
    let (_, dgamma, dbeta) = bn_backward_parts(ctx, x, &ones, saved, dy, None)?;
    Ok((dbeta, dgamma))
}

/// The gradient of `x` in training BatchNorm when the batch (`count` elements per channel) is
/// split across ranks: `sum_dy`, `sum_dy_xhat` are the sums of [`batch_norm_grad_sums`] over
/// every rank.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward_input(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    sum_dy: &Tensor,
    sum_dy_xhat: &Tensor,
    count: usize,
) -> Result<Tensor> {
    bn_geo("batch_norm_backward", x, &[("sum of dy", sum_dy), ("sum of dy * x_hat", sum_dy_xhat)])?;
    Ok(bn_backward_parts(ctx, x, gamma, saved, dy, Some((sum_dy, sum_dy_xhat, count)))?.0)
}

fn ln_geo(op: &'static str, x: &Tensor, axis: isize, params: &[(&'static str, &Tensor)]) -> Result<(usize, usize, usize)> {
    let ax = normalize_axis(op, axis, x.rank())?;
    let rows: usize = x.shape()[..ax].iter().product();
    let d: usize = x.shape()[ax..].iter().product();
    for (what, t) in params {
        same_dtype(op, what, x, t)?;
        if t.shape() != &x.shape()[ax..] {
            return Err(TensorError::BadShape {
                op,
                what,
                shape: t.shape().to_vec(),
                expected: format!("{:?} (input dims from axis {ax})", &x.shape()[ax..]),
            });
        }
    }
    Ok((ax, rows, d))
}

/// LayerNorm over the dims from `begin_norm_axis` on; `gamma`, `beta` have those dims' shape.
/// Returns `y` and the per-row statistics (shape `x.shape[..axis]`).
pub fn layer_norm(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    begin_norm_axis: isize,
    eps: f64,
) -> Result<(Tensor, NormSaved)> {
    let op = "layer_norm";
    let (_, _, d) = ln_geo(op, x, begin_norm_axis, &[("gamma", gamma), ("beta", beta)])?;
    if d == 0 {
        return Err(TensorError::BadShape { op, what: "input", shape: x.shape().to_vec(), expected: "non-empty normalised dims".into() });
    }
    let mean = per_element(&row_sums(ctx, x, begin_norm_axis, None)?, d)?;
    let var = per_element(&row_sums(ctx, x, begin_norm_axis, Some(&mean))?, d)?;
    layer_norm_with(ctx, x, gamma, beta, begin_norm_axis, &mean, &var, eps)
}

/// The row statistics [`layer_norm`] saves for its backward (mean and `1/sqrt(var + eps)` per
/// row), without normalising: what a backward pass recomputes.
pub fn layer_norm_saved(ctx: &ExecCtx, x: &Tensor, begin_norm_axis: isize, eps: f64) -> Result<NormSaved> {
    let op = "layer_norm";
    let (_, _, d) = ln_geo(op, x, begin_norm_axis, &[])?;
    if d == 0 {
        return Err(TensorError::BadShape { op, what: "input", shape: x.shape().to_vec(), expected: "non-empty normalised dims".into() });
    }
    let mean = per_element(&row_sums(ctx, x, begin_norm_axis, None)?, d)?;
    let var = per_element(&row_sums(ctx, x, begin_norm_axis, Some(&mean))?, d)?;
    float_dispatch!(op, x.dtype(), T => {
        let e = T::c(eps);
        let inv: Vec<T> = vec_of::<T>(&var).iter().map(|&v| T::one() / (v + e).sqrt()).collect();
        Ok(NormSaved { inv_std: Tensor::from_vec(mean.shape(), inv)?, mean })
    })
}

/// `sums / count`, element-wise, in the sums' type.
fn per_element(sums: &Tensor, count: usize) -> Result<Tensor> {
    float_dispatch!("layer_norm", sums.dtype(), T => {
        let n = T::c(count as f64);
        Tensor::from_vec(sums.shape(), vec_of::<T>(sums).into_iter().map(|v| v / n).collect())
    })
}

/// Backward of [`layer_norm`]: `(dx, dgamma, dbeta)`.
pub fn layer_norm_backward(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, _, d) = ln_geo("layer_norm_backward", x, begin_norm_axis, &[("gamma", gamma)])?;
    let (s1, s2) = layer_norm_grad_sums(ctx, x, gamma, saved, dy, begin_norm_axis)?;
    layer_norm_backward_with(ctx, x, gamma, saved, dy, begin_norm_axis, &s1, &s2, d)
}

/// Check that every `(name, tensor)` holds one value per row of `x` (shape `x.shape[..ax]`) in
/// `x`'s dtype.
fn row_stats_check(op: &'static str, x: &Tensor, ax: usize, stats: &[(&'static str, &Tensor)]) -> Result<()> {
    for (what, t) in stats {
        same_dtype(op, what, x, t)?;
        super::same_shape(op, &x.shape()[..ax], t.shape(), "one statistic per row")?;
    }
    Ok(())
}

/// Per-row sums over the dimensions from `begin_norm_axis` of this rank's part of them, in a
/// fixed order: `Σ x` (with `mean` None) or `Σ (x - mean[row])²`; shape `x.shape[..axis]`.
/// LayerNorm with its normalised dimensions split across ranks sums these over the ranks.
pub fn row_sums(ctx: &ExecCtx, x: &Tensor, begin_norm_axis: isize, mean: Option<&Tensor>) -> Result<Tensor> {
    let op = "layer_norm";
    let (ax, rows, d) = ln_geo(op, x, begin_norm_axis, &[])?;
    if let Some(m) = mean {
        row_stats_check(op, x, ax, &[("mean", m)])?;
    }
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let mu: Option<Vec<T>> = mean.map(vec_of::<T>);
        let sum = |r: usize| {
            let row = &xs[r * d..][..d];
            match &mu {
                None => crate::simd::sum(row),
                Some(mu) => crate::simd::sum_map(row, |v| (v - mu[r]) * (v - mu[r])),
            }
        };
        let sums: Vec<T> = if ctx.par(xs.len()) {
            use rayon::prelude::*;
            (0..rows).into_par_iter().map(sum).collect()
        } else {
            (0..rows).map(sum).collect()
        };
        Tensor::from_vec(&x.shape()[..ax], sums)
    })
}

/// LayerNorm with row statistics (`mean`, biased `var`, shape `x.shape[..axis]`) taken over
/// normalised dimensions larger than `x`'s (split across ranks).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_with(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    begin_norm_axis: isize,
    mean: &Tensor,
    var: &Tensor,
    eps: f64,
) -> Result<(Tensor, NormSaved)> {
    let op = "layer_norm";
    let (ax, _, d) = ln_geo(op, x, begin_norm_axis, &[("gamma", gamma), ("beta", beta)])?;
    row_stats_check(op, x, ax, &[("mean", mean), ("variance", var)])?;
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let (g, b) = (vec_of::<T>(gamma), vec_of::<T>(beta));
        let mu = vec_of::<T>(mean);
        let e = T::c(eps);
        let inv: Vec<T> = vec_of::<T>(var).iter().map(|&v| T::one() / (v + e).sqrt()).collect();
        let mut y = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut y, d.max(1), |r, out| {
            let (m, iv) = (mu[r], inv[r]);
            for (((o, &v), &gv), &bv) in out.iter_mut().zip(&xs[r * d..][..d]).zip(&g[..d]).zip(&b[..d]) {
                *o = (v - m) * iv * gv + bv;
            }
        });
        let sshape = &x.shape()[..ax];
        Ok((Tensor::from_vec(x.shape(), y)?, NormSaved { mean: mean.clone(), inv_std: Tensor::from_vec(sshape, inv)? }))
    })
}

/// Per-row `(Σ dy·γ, Σ dy·γ·x̂)` over this rank's part of the normalised dimensions; summed over
/// the ranks they are what [`layer_norm_backward_with`] needs.
pub fn layer_norm_grad_sums(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
) -> Result<(Tensor, Tensor)> {
    let op = "layer_norm_backward";
    let (ax, rows, d) = ln_geo(op, x, begin_norm_axis, &[("gamma", gamma)])?;
    same_dtype(op, "output gradient", x, dy)?;
    super::same_shape(op, x.shape(), dy.shape(), "output gradient must have the input's shape")?;
    row_stats_check(op, x, ax, &[("saved mean", &saved.mean), ("saved inv_std", &saved.inv_std)])?;
    float_dispatch!(op, x.dtype(), T => {
        let (xc, dc) = (x.contiguous(), dy.contiguous());
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, inv, g) = (vec_of::<T>(&saved.mean), vec_of::<T>(&saved.inv_std), vec_of::<T>(gamma));
        let sums = |r: usize| {
            let (x, dy) = (&xs[r * d..][..d], &ds[r * d..][..d]);
            let s1 = crate::simd::dot(dy, &g);
            let (mu, iv) = (mean[r], inv[r]);
            let s2 = crate::simd::sum_map3(dy, &g, x, |dv, gv, xv| dv * gv * (xv - mu) * iv);
            (s1, s2)
        };
        let per: Vec<(T, T)> = if ctx.par(xs.len()) {
            use rayon::prelude::*;
            (0..rows).into_par_iter().map(sums).collect()
        } else {
            (0..rows).map(sums).collect()
        };
        let (s1, s2): (Vec<T>, Vec<T>) = per.into_iter().unzip();
        let sshape = &x.shape()[..ax];
        Ok((Tensor::from_vec(sshape, s1)?, Tensor::from_vec(sshape, s2)?))
    })
}

/// Backward of LayerNorm over normalised dimensions split across ranks: `sum_dyg`,
/// `sum_dyg_xhat` are the row sums of [`layer_norm_grad_sums`] over every rank and `count` the
/// whole normalised size. Returns `(dx, dgamma, dbeta)`, the last two of this rank's part.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_with(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
    sum_dyg: &Tensor,
    sum_dyg_xhat: &Tensor,
    count: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "layer_norm_backward";
    let (ax, rows, d) = ln_geo(op, x, begin_norm_axis, &[("gamma", gamma)])?;
    same_dtype(op, "output gradient", x, dy)?;
    super::same_shape(op, x.shape(), dy.shape(), "output gradient must have the input's shape")?;
    row_stats_check(
        op,
        x,
        ax,
        &[
            ("saved mean", &saved.mean),
            ("saved inv_std", &saved.inv_std),
            ("sum of dy * gamma", sum_dyg),
            ("sum of dy * gamma * x_hat", sum_dyg_xhat),
        ],
    )?;
    float_dispatch!(op, x.dtype(), T => {
        let (xc, dc) = (x.contiguous(), dy.contiguous());
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let ds = dc.shared::<T>()?.as_slice().expect("contiguous");
        let (mean, inv, g) = (vec_of::<T>(&saved.mean), vec_of::<T>(&saved.inv_std), vec_of::<T>(gamma));
        let (s1, s2) = (vec_of::<T>(sum_dyg), vec_of::<T>(sum_dyg_xhat));
        let dn = T::c(count as f64);
        let mut dx = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut dx, d.max(1), |r, out| {
            let (x, dy) = (&xs[r * d..][..d], &ds[r * d..][..d]);
            let (mu, iv, a, b) = (mean[r], inv[r], s1[r], s2[r]);
            let k = iv / dn;
            for (((o, &xv), &dv), &gv) in out.iter_mut().zip(x).zip(dy).zip(&g[..d]) {
                let xh = (xv - mu) * iv;
                *o = k * (dn * dv * gv - a - xh * b);
            }
        });
        let mut pg = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut pg, d.max(1), |r, out| {
            let (x, dy) = (&xs[r * d..][..d], &ds[r * d..][..d]);
            let (mu, iv) = (mean[r], inv[r]);
            for ((o, &xv), &dv) in out.iter_mut().zip(x).zip(dy) {
                *o = dv * (xv - mu) * iv;
            }
        });
        let pg = ArrayD::from_shape_vec(IxDyn(&[rows, d]), pg).expect("count");
        let dgamma = sum_axes(ctx, pg.view(), &[0]);
        let dbeta = sum_axes(ctx, ndarray::ArrayViewD::from_shape(IxDyn(&[rows, d]), ds).expect("count"), &[0]);
        let pshape = &x.shape()[ax..];
        Ok((
            Tensor::from_vec(x.shape(), dx)?,
            Tensor::from_vec(pshape, dgamma.into_raw_vec_and_offset().0)?,
            Tensor::from_vec(pshape, dbeta.into_raw_vec_and_offset().0)?,
        ))
    })
}

/// Zero row statistics for `x` normalised from `begin_norm_axis` on: RMSNorm's mean.
fn zero_rows(x: &Tensor, ax: usize) -> Tensor {
    Tensor::zeros(&x.shape()[..ax], x.dtype())
}

/// Per-row `Σ x²` over this rank's part of the dimensions from `begin_norm_axis` (RMSNorm's
/// statistic; summed over the ranks when those dimensions are split). Shape `x.shape[..axis]`.
pub fn row_square_sums(ctx: &ExecCtx, x: &Tensor, begin_norm_axis: isize) -> Result<Tensor> {
    let (ax, _, _) = ln_geo("rms_norm", x, begin_norm_axis, &[])?;
    row_sums(ctx, x, begin_norm_axis, Some(&zero_rows(x, ax)))
}

/// RMSNorm over the dims from `begin_norm_axis` on with per-row mean squares `mean_square`
/// (taken over normalised dimensions possibly larger than `x`'s, split across ranks):
/// `y = x / sqrt(mean_square + eps) * gamma`. Returns `y` and the saved statistics (a zero mean
/// and `1/sqrt(mean_square + eps)`).
pub fn rms_norm_with(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    begin_norm_axis: isize,
    mean_square: &Tensor,
    eps: f64,
) -> Result<(Tensor, NormSaved)> {
    let (ax, _, _) = ln_geo("rms_norm", x, begin_norm_axis, &[("gamma", gamma)])?;
    let zeros = zero_rows(x, ax);
    layer_norm_with(ctx, x, gamma, &Tensor::zeros(gamma.shape(), gamma.dtype()), begin_norm_axis, &zeros, mean_square, eps)
}

/// RMSNorm over the dims from `begin_norm_axis` on; `gamma` has those dims' shape. Returns `y`
/// and the per-row statistics its backward needs.
pub fn rms_norm(ctx: &ExecCtx, x: &Tensor, gamma: &Tensor, begin_norm_axis: isize, eps: f64) -> Result<(Tensor, NormSaved)> {
    ln_geo("rms_norm", x, begin_norm_axis, &[("gamma", gamma)])?;
    let ms = mean_squares(ctx, x, begin_norm_axis)?;
    rms_norm_with(ctx, x, gamma, begin_norm_axis, &ms, eps)
}

/// Each row's mean square over the (non-empty) dims from `begin_norm_axis`.
fn mean_squares(ctx: &ExecCtx, x: &Tensor, begin_norm_axis: isize) -> Result<Tensor> {
    let (_, _, d) = ln_geo("rms_norm", x, begin_norm_axis, &[])?;
    if d == 0 {
        return Err(TensorError::BadShape {
            op: "rms_norm",
            what: "input",
            shape: x.shape().to_vec(),
            expected: "non-empty normalised dims".into(),
        });
    }
    per_element(&row_square_sums(ctx, x, begin_norm_axis)?, d)
}

/// The row statistics [`rms_norm`] saves for its backward, without normalising.
pub fn rms_norm_saved(ctx: &ExecCtx, x: &Tensor, begin_norm_axis: isize, eps: f64) -> Result<NormSaved> {
    let (ax, _, _) = ln_geo("rms_norm", x, begin_norm_axis, &[])?;
    let ms = mean_squares(ctx, x, begin_norm_axis)?;
    float_dispatch!("rms_norm", x.dtype(), T => {
        let e = T::c(eps);
        let inv: Vec<T> = vec_of::<T>(&ms).iter().map(|&v| T::one() / (v + e).sqrt()).collect();
        Ok(NormSaved { inv_std: Tensor::from_vec(ms.shape(), inv)?, mean: zero_rows(x, ax) })
    })
}

/// Per-row `Σ dy·γ·x̂` over this rank's part of the normalised dimensions: summed over the
/// ranks, what [`rms_norm_backward_with`] needs.
pub fn rms_norm_grad_sums(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
) -> Result<Tensor> {
    Ok(layer_norm_grad_sums(ctx, x, gamma, saved, dy, begin_norm_axis)?.1)
}

/// Backward of RMSNorm over normalised dimensions of `count` elements in all (split across
/// ranks when larger than `x`'s): `sum_dyg_xhat` the row sums of [`rms_norm_grad_sums`] over
/// every rank. Returns `(dx, dgamma)`, `dgamma` of this rank's part:
/// `dx = inv · (dy·γ − x̂ · Σ dy·γ·x̂ / count)`.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward_with(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
    sum_dyg_xhat: &Tensor,
    count: usize,
) -> Result<(Tensor, Tensor)> {
    let (ax, _, _) = ln_geo("rms_norm_backward", x, begin_norm_axis, &[("gamma", gamma)])?;
    let zeros = zero_rows(x, ax);
    let (dx, dgamma, _) = layer_norm_backward_with(ctx, x, gamma, saved, dy, begin_norm_axis, &zeros, sum_dyg_xhat, count)?;
    Ok((dx, dgamma))
}

/// Backward of [`rms_norm`]: `(dx, dgamma)`.
pub fn rms_norm_backward(
    ctx: &ExecCtx,
    x: &Tensor,
    gamma: &Tensor,
    saved: &NormSaved,
    dy: &Tensor,
    begin_norm_axis: isize,
) -> Result<(Tensor, Tensor)> {
    let (_, _, d) = ln_geo("rms_norm_backward", x, begin_norm_axis, &[("gamma", gamma)])?;
    let s2 = rms_norm_grad_sums(ctx, x, gamma, saved, dy, begin_norm_axis)?;
    rms_norm_backward_with(ctx, x, gamma, saved, dy, begin_norm_axis, &s2, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn the_saved_statistics_alone_are_those_the_forward_saves() {
        let x = crate::random::uniform(&[3, 4, 5, 6], -1., 2., 9, DType::F32);
        let (g, b) = (Tensor::ones(&[4], DType::F32), Tensor::zeros(&[4], DType::F32));
        let fwd = batch_norm_train(&ExecCtx::serial(), &x, &g, &b, &b, &g, 0.1, 1e-5).unwrap();
        let saved = batch_norm_saved(&ExecCtx::serial(), &x, 1e-5).unwrap();
        assert!(saved.mean.bit_eq(&fwd.saved.mean) && saved.inv_std.bit_eq(&fwd.saved.inv_std));
        let (g, b) = (Tensor::ones(&[5, 6], DType::F32), Tensor::zeros(&[5, 6], DType::F32));
        let (_, ln) = layer_norm(&ExecCtx::serial(), &x, &g, &b, 2, 1e-5).unwrap();
        let saved = layer_norm_saved(&ExecCtx::serial(), &x, 2, 1e-5).unwrap();
        assert!(saved.mean.bit_eq(&ln.mean) && saved.inv_std.bit_eq(&ln.inv_std));
    }

    fn t(shape: &[usize], v: &[f64]) -> Tensor {
        Tensor::from_vec(shape, v.to_vec()).unwrap()
    }
    fn v(t: &Tensor) -> Vec<f64> {
        t.to_vec::<f64>().unwrap()
    }
    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }
    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    /// Rows `r` of dimension 0 of `x`.
    fn rows(x: &Tensor, r: std::ops::Range<usize>) -> Tensor {
        let mut begin = vec![0; x.rank()];
        begin[0] = r.start;
        let mut size: Vec<isize> = x.shape().iter().map(|&d| d as isize).collect();
        size[0] = r.len() as isize;
        crate::kernels::shape::slice(x, &begin, &size).unwrap().contiguous()
    }

    #[test]
    fn layer_norm_backward_rejects_mis_shaped_or_mistyped_statistics() {
        let x = t(&[3, 4], &[0.5; 12]);
        let gamma = t(&[4], &[1.0; 4]);
        let (_, saved) = layer_norm(&cx(), &x, &gamma, &t(&[4], &[0.0; 4]), 1, 1e-5).unwrap();
        let short = NormSaved { mean: t(&[1], &[0.0]), inv_std: saved.inv_std.clone() };
        assert!(matches!(layer_norm_backward(&cx(), &x, &gamma, &short, &x, 1), Err(TensorError::IncompatibleShapes { .. })));
        let f32_sums = Tensor::from_vec(&[3], vec![0.0f32; 3]).unwrap();
        let err = layer_norm_backward_with(&cx(), &x, &gamma, &saved, &x, 1, &f32_sums, &f32_sums, 4);
        assert!(matches!(err, Err(TensorError::DTypeMismatch { .. })), "{err:?}");
    }

    #[test]
    fn layer_norm_over_split_normalised_dims_equals_the_whole() {
        // x [3, 4]: rows normalised over 4 columns, split into columns 0..1 and 1..4.
        let x = t(&[3, 4], &(0..12).map(|i| ((i * 7 % 11) as f64) / 3.0 - 1.0).collect::<Vec<_>>());
        let dy = t(&[3, 4], &(0..12).map(|i| ((i * 5 % 13) as f64) / 4.0 - 1.0).collect::<Vec<_>>());
        let (gamma, beta) = (t(&[4], &[1.0, 0.5, -1.5, 2.0]), t(&[4], &[0.1, 0.2, 0.3, 0.4]));
        let (y, saved) = layer_norm(&cx(), &x, &gamma, &beta, 1, 1e-5).unwrap();
        let (dx, dgamma, dbeta) = layer_norm_backward(&cx(), &x, &gamma, &saved, &dy, 1).unwrap();
        let cols = |a: &Tensor, r: std::ops::Range<usize>| {
            crate::kernels::shape::slice(a, &[0, r.start], &[a.shape()[0] as isize, r.len() as isize]).unwrap().contiguous()
        };
        let vec1 = |a: &Tensor, r: std::ops::Range<usize>| t(&[r.len()], &v(a)[r]);
        let parts = [0..1, 1..4];
        let add = |a: Vec<f64>, b: Tensor| a.iter().zip(v(&b)).map(|(p, q)| p + q).collect::<Vec<f64>>();
        let sums = parts.iter().fold(vec![0.0; 3], |acc, r| add(acc, row_sums(&cx(), &cols(&x, r.clone()), 1, None).unwrap()));
        let mean = t(&[3], &sums.iter().map(|s| s / 4.0).collect::<Vec<_>>());
        let sq = parts.iter().fold(vec![0.0; 3], |acc, r| add(acc, row_sums(&cx(), &cols(&x, r.clone()), 1, Some(&mean)).unwrap()));
        let var = t(&[3], &sq.iter().map(|s| s / 4.0).collect::<Vec<_>>());
        let mut s1 = vec![0.0; 3];
        let mut s2 = vec![0.0; 3];
        let mut saved_parts = Vec::new();
        for r in &parts {
            let (part_y, part_saved) =
                layer_norm_with(&cx(), &cols(&x, r.clone()), &vec1(&gamma, r.clone()), &vec1(&beta, r.clone()), 1, &mean, &var, 1e-5)
                    .unwrap();
            assert!(close(&v(&part_y), &v(&cols(&y, r.clone()))));
            let (a, b) =
                layer_norm_grad_sums(&cx(), &cols(&x, r.clone()), &vec1(&gamma, r.clone()), &part_saved, &cols(&dy, r.clone()), 1).unwrap();
            s1 = add(s1, a);
            s2 = add(s2, b);
            saved_parts.push(part_saved);
        }
        for (r, part_saved) in parts.iter().zip(&saved_parts) {
            let (pdx, pdg, pdb) = layer_norm_backward_with(
                &cx(),
                &cols(&x, r.clone()),
                &vec1(&gamma, r.clone()),
                part_saved,
                &cols(&dy, r.clone()),
                1,
                &t(&[3], &s1),
                &t(&[3], &s2),
                4,
            )
            .unwrap();
            assert!(close(&v(&pdx), &v(&cols(&dx, r.clone()))));
            assert!(close(&v(&pdg), &v(&dgamma)[r.clone()]) && close(&v(&pdb), &v(&dbeta)[r.clone()]));
        }
    }

    #[test]
    fn batch_norm_over_a_split_batch_equals_the_whole_batch() {
        let n = 4 * 3 * 5;
        let x = t(&[4, 3, 5], &(0..n).map(|i| ((i * 37 % 23) as f64) / 7.0 - 1.0).collect::<Vec<_>>());
        let dy = t(&[4, 3, 5], &(0..n).map(|i| ((i * 11 % 17) as f64) / 5.0 - 1.5).collect::<Vec<_>>());
        let (gamma, beta) = (t(&[3], &[1.5, 0.5, -1.0]), t(&[3], &[0.1, 0.2, 0.3]));
        let (rm, rv) = (t(&[3], &[0.0, 0.5, 1.0]), t(&[3], &[1.0, 2.0, 0.5]));
        let whole = batch_norm_train(&cx(), &x, &gamma, &beta, &rm, &rv, 0.9, 1e-5).unwrap();
        let (dx, dgamma, dbeta) = batch_norm_backward(&cx(), &x, &gamma, &whole.saved, &dy).unwrap();
        let parts = [0..1, 1..4];
        // The statistics: sums of the parts' sums.
        let add = |a: Vec<f64>, b: &Tensor| a.iter().zip(v(b)).map(|(p, q)| p + q).collect::<Vec<f64>>();
        let sums = parts.iter().fold(vec![0.0; 3], |acc, r| add(acc, &channel_sums(&cx(), &rows(&x, r.clone()), None).unwrap()));
        let mean = t(&[3], &sums.iter().map(|s| s / 20.0).collect::<Vec<_>>());
        let sq = parts.iter().fold(vec![0.0; 3], |acc, r| add(acc, &channel_sums(&cx(), &rows(&x, r.clone()), Some(&mean)).unwrap()));
        let stats = BatchStats { mean, var: t(&[3], &sq.iter().map(|s| s / 20.0).collect::<Vec<_>>()), count: 20 };
        let mut sum_dy = vec![0.0; 3];
        let mut sum_dyx = vec![0.0; 3];
        let mut outs = Vec::new();
        for r in &parts {
            let out = batch_norm_train_with(&cx(), &rows(&x, r.clone()), &gamma, &beta, &rm, &rv, &stats, 0.9, 1e-5).unwrap();
            assert!(close(&v(&out.running_mean), &v(&whole.running_mean)) && close(&v(&out.running_var), &v(&whole.running_var)));
            let (a, b) = batch_norm_grad_sums(&cx(), &rows(&x, r.clone()), &out.saved, &rows(&dy, r.clone())).unwrap();
            sum_dy = add(sum_dy, &a);
            sum_dyx = add(sum_dyx, &b);
            outs.push(out);
        }
        assert!(close(&sum_dy, &v(&dbeta)) && close(&sum_dyx, &v(&dgamma)));
        for (r, out) in parts.iter().zip(&outs) {
            assert!(close(&v(&out.y), &v(&rows(&whole.y, r.clone()))));
            let part_dx = batch_norm_backward_input(
                &cx(),
                &rows(&x, r.clone()),
                &gamma,
                &out.saved,
                &rows(&dy, r.clone()),
                &t(&[3], &sum_dy),
                &t(&[3], &sum_dyx),
                20,
            )
            .unwrap();
            assert!(close(&v(&part_dx), &v(&rows(&dx, r.clone()))));
        }
        let bad = BatchStats { count: 0, ..stats };
        assert!(matches!(
            batch_norm_train_with(&cx(), &x, &gamma, &beta, &rm, &rv, &bad, 0.9, 1e-5),
            Err(TensorError::InvalidArgument { name: "count", .. })
        ));
    }

    #[test]
    fn batch_norm_train_normalises_per_channel_and_updates_running_stats_mindspore_style() {
        // Two channels over a batch of 2 with 2 pixels: channel 0 = {1, 3, 5, 7}, channel 1 = {2, 2, 2, 2}.
        let x = t(&[2, 2, 2], &[1., 3., 2., 2., 5., 7., 2., 2.]);
        let out =
            batch_norm_train(&cx(), &x, &t(&[2], &[2., 1.]), &t(&[2], &[0.5, 0.]), &t(&[2], &[0., 1.]), &t(&[2], &[1., 1.]), 0.9, 1e-12)
                .unwrap();
        let inv = 1.0 / 5f64.sqrt(); // var of {1,3,5,7} is 5
        let y = v(&out.y);
        assert!(close(&[y[0], y[1], y[4], y[5]], &[2. * -3. * inv + 0.5, -2. * inv + 0.5, 2. * inv + 0.5, 2. * 3. * inv + 0.5]));
        assert_eq!(&y[2..4], &[0., 0.]);
        assert!(close(&v(&out.saved.mean), &[4., 2.]));
        // running = 0.9 * running + 0.1 * batch; the running variance uses the unbiased estimate 20/3.
        assert!(close(&v(&out.running_mean), &[0.4, 0.9 + 0.2]));
        assert!(close(&v(&out.running_var), &[0.9 + 0.1 * 20. / 3., 0.9]));
    }

    #[test]
    fn batch_norm_eval_uses_the_running_statistics() {
        let x = t(&[1, 2], &[3., 3.]);
        let y =
            batch_norm_eval(&cx(), &x, &t(&[2], &[1., 2.]), &t(&[2], &[0., 1.]), &t(&[2], &[1., 3.]), &t(&[2], &[4., 1.]), 0.0).unwrap();
        assert!(close(&v(&y), &[1.0, 1.0]));
    }

    #[test]
    fn batch_norm_rejects_parameters_of_the_wrong_length() {
        let x = Tensor::zeros(&[2, 3], DType::F64);
        let p = Tensor::zeros(&[3], DType::F64);
        let bad = Tensor::zeros(&[2], DType::F64);
        let e = batch_norm_train(&cx(), &x, &bad, &p, &p, &p, 0.9, 1e-5).unwrap_err();
        assert!(matches!(e, TensorError::BadShape { what: "gamma", .. }));
        assert!(batch_norm_train(&cx(), &Tensor::zeros(&[3], DType::F64), &p, &p, &p, &p, 0.9, 1e-5).is_err());
    }

    #[test]
    fn layer_norm_normalises_each_row() {
        let x = t(&[2, 3], &[1., 2., 3., 10., 10., 10.]);
        let (y, saved) = layer_norm(&cx(), &x, &t(&[3], &[1., 1., 1.]), &t(&[3], &[0., 0., 1.]), -1, 0.0).unwrap();
        let s = (1.5f64).sqrt();
        assert!(close(&v(&y)[..3], &[-s, 0., s + 1.]));
        assert!(v(&saved.mean) == vec![2., 10.]);
        assert!(layer_norm(&cx(), &x, &t(&[2], &[1., 1.]), &t(&[3], &[0.; 3]), -1, 0.0).is_err());
    }
}
