//! SoftmaxCrossEntropy: sparse integer labels (mean over the batch) and dense targets.

use super::{float_dispatch, same_dtype};
use crate::kernels::reduce::log_softmax;
use crate::{DType, ExecCtx, Float, Result, Tensor, TensorError};

fn labels_vec(op: &'static str, labels: &Tensor, n: usize, c: usize) -> Result<Vec<usize>> {
    if labels.shape() != [n] {
        return Err(TensorError::BadShape {
            op,
            what: "labels",
            shape: labels.shape().to_vec(),
            expected: format!("[{n}] (one label per logits row)"),
        });
    }
    let raw: Vec<i64> = match labels.dtype() {
        DType::I32 => labels.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => labels.to_vec::<i64>()?,
        d => return Err(TensorError::UnsupportedDType { op, dtype: d, expected: "i32 or i64 labels" }),
    };
    raw.iter()
        .enumerate()
        .map(|(position, &v)| {
            if v < 0 || v as usize >= c {
                Err(TensorError::IndexOutOfRange { op, what: "label", index: v, position, bound: c })
            } else {
                Ok(v as usize)
            }
        })
        .collect()
}

fn logits_dims(op: &'static str, logits: &Tensor) -> Result<(usize, usize)> {
    if logits.rank() != 2 || logits.shape()[0] == 0 {
        return Err(TensorError::BadShape {
            op,
            what: "logits",
            shape: logits.shape().to_vec(),
            expected: "rank 2 [N, C] with N > 0".into(),
        });
    }
    Ok((logits.shape()[0], logits.shape()[1]))
}

/// Sparse softmax cross-entropy, mean over the batch: `logits [N, C]`, `labels [N]` (i32/i64 in
/// `[0, C)`). Returns the scalar loss (shape `[]`) and the softmax probabilities for the backward.
pub fn softmax_cross_entropy_sparse(ctx: &ExecCtx, logits: &Tensor, labels: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = "softmax_cross_entropy";
    let (n, c) = logits_dims(op, logits)?;
    let lab = labels_vec(op, labels, n, c)?;
    let lsm = log_softmax(ctx, logits, -1)?;
    float_dispatch!(op, logits.dtype(), T => {
        let l = lsm.to_vec::<T>()?;
        let loss = lab.iter().enumerate().fold(T::zero(), |a, (i, &y)| a - l[i * c + y]) / T::c(n as f64);
        Ok((Tensor::scalar(loss), crate::kernels::elementwise::exp(ctx, &lsm)?))
    })
}

/// Backward of [`softmax_cross_entropy_sparse`]: `(probs - onehot(labels)) * dloss / N`.
pub fn softmax_cross_entropy_sparse_backward(ctx: &ExecCtx, probs: &Tensor, labels: &Tensor, dloss: &Tensor) -> Result<Tensor> {
    let op = "softmax_cross_entropy_backward";
    let (n, c) = logits_dims(op, probs)?;
    let lab = labels_vec(op, labels, n, c)?;
    same_dtype(op, "loss gradient", probs, dloss)?;
    let d = dloss.item()?;
    float_dispatch!(op, probs.dtype(), T => {
        let s = T::c(d / n as f64);
        let mut g = probs.to_vec::<T>()?;
        ctx.for_chunks(&mut g, c.max(1), |i, row| {
            row[lab[i]] -= T::one();
            row.iter_mut().for_each(|v| *v *= s);
        });
        Tensor::from_vec(&[n, c], g)
    })
}

/// Dense softmax cross-entropy (MindSpore `SoftmaxCrossEntropyWithLogits`, `sparse=False`,
/// `reduction="mean"`): `targets [N, C]` are probabilities. Returns the loss and probabilities.
pub fn softmax_cross_entropy(ctx: &ExecCtx, logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = "softmax_cross_entropy";
    let (n, _) = logits_dims(op, logits)?;
    same_dtype(op, "targets", logits, targets)?;
    super::same_shape(op, logits.shape(), targets.shape(), "targets must have the logits' shape")?;
    let lsm = log_softmax(ctx, logits, -1)?;
    float_dispatch!(op, logits.dtype(), T => {
        let l = lsm.to_vec::<T>()?;
        let t = targets.to_vec::<T>()?;
        let loss = l.iter().zip(&t).fold(T::zero(), |a, (&lv, &tv)| a - lv * tv) / T::c(n as f64);
        Ok((Tensor::scalar(loss), crate::kernels::elementwise::exp(ctx, &lsm)?))
    })
}

/// Backward of [`softmax_cross_entropy`] w.r.t. the logits: `(probs * sum(targets) - targets) * dloss / N`.
pub fn softmax_cross_entropy_backward(ctx: &ExecCtx, probs: &Tensor, targets: &Tensor, dloss: &Tensor) -> Result<Tensor> {
    let op = "softmax_cross_entropy_backward";
    let (n, c) = logits_dims(op, probs)?;
    same_dtype(op, "targets", probs, targets)?;
    super::same_shape(op, probs.shape(), targets.shape(), "targets must have the logits' shape")?;
    let d = dloss.item()?;
    float_dispatch!(op, probs.dtype(), T => {
        let s = T::c(d / n as f64);
        let t = targets.to_vec::<T>()?;
        let mut g = probs.to_vec::<T>()?;
        ctx.for_chunks(&mut g, c.max(1), |i, row| {
            let tr = &t[i * c..][..c];
            let st = tr.iter().fold(T::zero(), |a, &b| a + b);
            for (v, &tv) in row.iter_mut().zip(tr) {
                *v = (*v * st - tv) * s;
            }
        });
        Tensor::from_vec(&[n, c], g)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_log_c_and_a_probs_minus_onehot_gradient() {
        let cx = ExecCtx::serial();
        let logits = Tensor::zeros(&[2, 2], DType::F64);
        let labels = Tensor::from_vec(&[2], vec![0i32, 1]).unwrap();
        let (l, p) = softmax_cross_entropy_sparse(&cx, &logits, &labels).unwrap();
        assert!((l.item().unwrap() - 2f64.ln()).abs() < 1e-12);
        assert_eq!(l.shape(), &[] as &[usize]);
        let g = softmax_cross_entropy_sparse_backward(&cx, &p, &labels, &Tensor::scalar(1.0f64)).unwrap();
        assert_eq!(g.to_vec::<f64>().unwrap(), vec![-0.25, 0.25, 0.25, -0.25]);
        let dense = Tensor::from_vec(&[2, 2], vec![1f64, 0., 0., 1.]).unwrap();
        let (ld, _) = softmax_cross_entropy(&cx, &logits, &dense).unwrap();
        assert!((ld.item().unwrap() - 2f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn labels_out_of_range_name_the_position() {
        let cx = ExecCtx::serial();
        let logits = Tensor::zeros(&[3, 4], DType::F32);
        let labels = Tensor::from_vec(&[3], vec![0i64, 4, 1]).unwrap();
        let e = softmax_cross_entropy_sparse(&cx, &logits, &labels).unwrap_err();
        assert_eq!(e, TensorError::IndexOutOfRange { op: "softmax_cross_entropy", what: "label", index: 4, position: 1, bound: 4 });
        assert!(e.to_string().contains("position 1"));
        let short = Tensor::from_vec(&[2], vec![0i64, 1]).unwrap();
        assert!(matches!(softmax_cross_entropy_sparse(&cx, &logits, &short), Err(TensorError::BadShape { what: "labels", .. })));
        assert!(matches!(
            softmax_cross_entropy_sparse(&cx, &logits, &Tensor::zeros(&[3], DType::F32)),
            Err(TensorError::UnsupportedDType { .. })
        ));
    }
}
