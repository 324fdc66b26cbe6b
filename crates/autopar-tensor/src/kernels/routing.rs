//! A mixture of experts' router: of each row of expert probabilities `[.., E]`, the `k` largest
//! kept (renormalised to sum to one, as Mixtral's router does, when asked) and the rest zero:
//! the weights with which each token's expert outputs are combined. Under a capacity, each
//! expert takes at most that many rows, granted as MindSpore's MoE router grants them (see
//! [`granted`]); a row's refused choices are dropped.

use super::float_dispatch;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

fn check(op: &'static str, p: &Tensor, k: usize) -> Result<usize> {
    let e = p.shape().last().copied().unwrap_or(0);
    if p.rank() == 0 || k == 0 || k > e {
        return Err(TensorError::InvalidArgument { op, name: "k", value: format!("{k} of {e} experts"), expected: "1 <= k <= experts" });
    }
    Ok(e)
}

/// The indices of the `k` largest of `row`, ties to the lower index.
fn top<T: Float>(row: &[T], k: usize, chosen: &mut Vec<usize>) {
    chosen.clear();
    for _ in 0..k {
        let mut best: Option<usize> = None;
        for (i, &v) in row.iter().enumerate() {
            if !chosen.contains(&i) && best.is_none_or(|b| v > row[b]) {
                best = Some(i);
            }
        }
        chosen.extend(best);
    }
}

/// MindSpore's MoE router under a capacity (`TopkRouter`): `k` rounds; in each, every row in
/// order picks its largest probability among the experts it has not been granted (ties to the
/// lower index), granted while that expert holds fewer than `capacity` rows. A refused pick is
/// dropped, and the expert, not granted, is picked again and refused in the later rounds: a row
/// refused its first choice loses all of them. Per row, the granted experts in round order.
pub fn granted<T: Float>(ps: &[T], e: usize, k: usize, capacity: usize) -> Vec<Vec<usize>> {
    let rows = ps.len() / e.max(1);
    let mut kept = vec![Vec::with_capacity(k); rows];
    let mut count = vec![0usize; e];
    for _ in 0..k {
        for (r, kept) in kept.iter_mut().enumerate() {
            let row = &ps[r * e..][..e];
            let mut best: Option<usize> = None;
            for (i, &v) in row.iter().enumerate() {
                if !kept.contains(&i) && best.is_none_or(|b| v > row[b]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best.filter(|&b| count[b] < capacity) {
                count[b] += 1;
                kept.push(b);
            }
        }
    }
    kept
}

/// Row `r`'s choices: granted under a capacity, else its `k` largest.
fn choices<T: Float>(row: &[T], r: usize, k: usize, granted: &Option<Vec<Vec<usize>>>) -> Vec<usize> {
    match granted {
        Some(g) => g[r].clone(),
        None => {
            let mut chosen = Vec::with_capacity(k);
            top(row, k, &mut chosen);
            chosen
        }
    }
}

/// Each row's `k` largest probabilities (under `capacity`, those granted), the rest zero;
/// renormalised over the kept when `renormalize`.
pub fn top_k_weights(ctx: &ExecCtx, p: &Tensor, k: usize, renormalize: bool, capacity: Option<usize>) -> Result<Tensor> {
    let op = "router_top_k";
    let e = check(op, p, k)?;
    float_dispatch!(op, p.dtype(), T => {
        let pc = p.contiguous();
        let ps = pc.shared::<T>()?.as_slice().expect("contiguous");
        let granted = capacity.map(|c| granted(ps, e, k, c));
        let mut out = vec![T::zero(); ps.len()];
        ctx.for_chunks(&mut out, e.max(1), |r, o| {
            let row = &ps[r * e..][..e];
            let chosen = choices(row, r, k, &granted);
            let sum: T = chosen.iter().map(|&i| row[i]).fold(T::zero(), |a, b| a + b);
            for &i in &chosen {
                o[i] = if renormalize { row[i] / sum } else { row[i] };
            }
        });
        Tensor::from_vec(p.shape(), out)
    })
}

/// Each row's assignments: 1 for its `k` largest probabilities, 0 for the rest.
pub fn top_k_mask(ctx: &ExecCtx, p: &Tensor, k: usize) -> Result<Tensor> {
    let op = "router_top_k_mask";
    let e = check(op, p, k)?;
    float_dispatch!(op, p.dtype(), T => {
        let pc = p.contiguous();
        let ps = pc.shared::<T>()?.as_slice().expect("contiguous");
        let mut out = vec![T::zero(); ps.len()];
        ctx.for_chunks(&mut out, e.max(1), |r, o| {
            let mut chosen = Vec::with_capacity(k);
            top(&ps[r * e..][..e], k, &mut chosen);
            for &i in &chosen {
                o[i] = T::c(1.0);
            }
        });
        Tensor::from_vec(p.shape(), out)
    })
}

/// Backward of [`top_k_weights`] from `dy` and the forward's input `p`: zero for the experts a
/// row did not choose; for the chosen, `dy` (or, renormalised by their sum `S`,
/// `(dy_j − Σ_i dy_i w_i) / S`).
pub fn top_k_weights_backward(
    ctx: &ExecCtx,
    p: &Tensor,
    dy: &Tensor,
    k: usize,
    renormalize: bool,
    capacity: Option<usize>,
) -> Result<Tensor> {
    let op = "router_top_k_backward";
    let e = check(op, p, k)?;
    super::same_dtype(op, "output gradient", p, dy)?;
    super::same_shape(op, p.shape(), dy.shape(), "the output gradient has the probabilities' shape")?;
    float_dispatch!(op, p.dtype(), T => {
        let (pc, dc) = (p.contiguous(), dy.contiguous());
        let (ps, ds) = (pc.shared::<T>()?, dc.shared::<T>()?);
        let (ps, ds) = (ps.as_slice().expect("contiguous"), ds.as_slice().expect("contiguous"));
        let granted = capacity.map(|c| granted(ps, e, k, c));
        let mut out = vec![T::zero(); ps.len()];
        ctx.for_chunks(&mut out, e.max(1), |r, o| {
            let (row, d) = (&ps[r * e..][..e], &ds[r * e..][..e]);
            let chosen = choices(row, r, k, &granted);
            if !renormalize {
                for &i in &chosen {
                    o[i] = d[i];
                }
                return;
            }
            let sum: T = chosen.iter().map(|&i| row[i]).fold(T::zero(), |a, b| a + b);
            let dot: T = chosen.iter().map(|&i| d[i] * row[i] / sum).fold(T::zero(), |a, b| a + b);
            for &i in &chosen {
                o[i] = (d[i] - dot) / sum;
            }
        });
        Tensor::from_vec(p.shape(), out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn the_k_largest_are_kept_and_renormalised() {
        let p = Tensor::from_vec(&[2, 4], vec![0.1f64, 0.4, 0.2, 0.3, 0.5, 0.1, 0.3, 0.1]).unwrap();
        let ctx = ExecCtx::serial();
        let w = top_k_weights(&ctx, &p, 2, true, None).unwrap().to_f64_vec();
        let want = [0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7, 0.5 / 0.8, 0.0, 0.3 / 0.8, 0.0];
        assert!(w.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{w:?}");
        let raw = top_k_weights(&ctx, &p, 1, false, None).unwrap().to_f64_vec();
        assert_eq!(raw, vec![0.0, 0.4, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0]);
        assert!(top_k_weights(&ctx, &p, 5, true, None).is_err());
    }

    #[test]
    fn under_a_capacity_first_choices_are_granted_in_row_order_before_second_ones() {
        let ctx = ExecCtx::serial();
        let p = Tensor::from_vec(&[3, 2], vec![0.6f64, 0.4, 0.7, 0.3, 0.2, 0.8]).unwrap();
        // One slot each, one choice: row 1's expert 0 is full.
        let w = top_k_weights(&ctx, &p, 1, false, Some(1)).unwrap().to_f64_vec();
        assert_eq!(w, vec![0.6, 0.0, 0.0, 0.0, 0.0, 0.8]);
        // Two slots, two choices: every first choice (0, 0, 1) first, then row 0's second (1);
        // row 1's second (1) and row 2's (0) find their experts full.
        let w = top_k_weights(&ctx, &p, 2, true, Some(2)).unwrap().to_f64_vec();
        assert_eq!(w, vec![0.6, 0.4, 1.0, 0.0, 0.0, 1.0]);
        // A row refused its first choice loses all: row 1 asks expert 0 twice (were it to move on,
        // expert 2 had room for it).
        let p = Tensor::from_vec(&[2, 3], vec![0.5f64, 0.3, 0.2, 0.6, 0.1, 0.3]).unwrap();
        let w = top_k_weights(&ctx, &p, 2, false, Some(1)).unwrap().to_f64_vec();
        assert_eq!(w, vec![0.5, 0.3, 0.0, 0.0, 0.0, 0.0]);
        // With room for every row, the k largest.
        assert_eq!(
            top_k_weights(&ctx, &p, 2, true, Some(2)).unwrap().to_f64_vec(),
            top_k_weights(&ctx, &p, 2, true, None).unwrap().to_f64_vec()
        );
    }

    #[test]
    fn the_backward_matches_finite_differences() {
        let ctx = ExecCtx::serial();
        let p = crate::random::uniform(&[3, 5], 0.1, 1.0, 3, DType::F64);
        let dy = crate::random::uniform(&[3, 5], -1.0, 1.0, 4, DType::F64);
        for (renormalize, capacity) in [(true, None), (false, None), (true, Some(1)), (false, Some(1)), (true, Some(2))] {
            let g = top_k_weights_backward(&ctx, &p, &dy, 2, renormalize, capacity).unwrap().to_f64_vec();
            let f = |q: &Tensor| -> f64 {
                top_k_weights(&ctx, q, 2, renormalize, capacity).unwrap().to_f64_vec().iter().zip(dy.to_f64_vec()).map(|(a, b)| a * b).sum()
            };
            let vals = p.to_f64_vec();
            for i in 0..vals.len() {
                let bump = |h: f64| {
                    let mut v = vals.clone();
                    v[i] += h;
                    f(&Tensor::from_vec(&[3, 5], v).unwrap())
                };
                let fd = (bump(1e-6) - bump(-1e-6)) / 2e-6;
                assert!((fd - g[i]).abs() < 1e-6, "renormalize {renormalize}, capacity {capacity:?} [{i}]: {} vs {fd}", g[i]);
            }
        }
    }
}
