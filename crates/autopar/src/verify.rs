//! Parallel equals serial, checked: a run beside a stand-alone run of the same network on the
//! same data (what `autopar train --verify` prints).
//!
//! Losses are compared step by step, parameters tensor by tensor after the last step. The check
//! is each tensor's normwise relative difference `|run - reference| / |reference|` (Euclidean
//! norms); the reference's norm is taken as at least [`SCALE_FLOOR`] times the model's
//! root-mean-square parameter per element (a tensor whose values stay a thousand times smaller
//! than the model's, such as a batch norm's shift that the gradients barely move, holds little
//! but rounding, which its own norm would magnify) and never below [`FLOOR`]. The largest
//! difference of one element, relative to the tensor's largest value, is reported beside it. Float sums taken in another order drift
//! a little over a run, and Adam-type optimizers divide each gradient element by its own running
//! magnitude: an element whose gradient is at rounding level (near `eps`) gets a visibly
//! different update from a gradient that differs in its last bits. Such elements are few; a
//! parallel mistake moves the whole tensor, which the norm sees.

use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{TrainError, TrainReport, Trainer};
use autopar_runtime::ParamStore;

/// The relative tolerance autopar promises between a parallel run and stand-alone
/// (`train --verify` fails above it).
pub const RTOL: f64 = 1e-3;

/// The smallest scale a parameter's differences are measured against.
pub const FLOOR: f64 = 1e-6;

/// A tensor's norm counts as at least this many times the model's root-mean-square parameter
/// value per element.
pub const SCALE_FLOOR: f64 = 1e-3;

/// How far a run is from its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Largest absolute difference of the per-step losses.
    pub loss_diff: f64,
    /// Largest relative difference of the per-step losses.
    pub loss_rel: f64,
    /// Largest absolute difference of a parameter's elements.
    pub param_diff: f64,
    /// Largest difference of a parameter's elements relative to that tensor's largest value.
    pub param_rel: f64,
    /// The parameter with the largest relative difference of one element.
    pub param: String,
    /// Largest normwise relative difference of a parameter tensor (what [`Self::within`] checks).
    pub norm_rel: f64,
    /// The parameter with the largest normwise relative difference.
    pub norm_param: String,
}

impl Comparison {
    /// Whether losses (step by step) and parameters (tensor by tensor, normwise) agree within
    /// the relative tolerance `rtol`.
    pub fn within(&self, rtol: f64) -> bool {
        self.loss_rel <= rtol && self.norm_rel <= rtol
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "largest loss difference {:.3e} (relative {:.3e}), largest parameter difference {:.3e} normwise relative ({}), largest element difference {:.3e} (relative {:.3e} to the tensor's largest value, {})",
            self.loss_diff, self.loss_rel, self.norm_rel, self.norm_param, self.param_diff, self.param_rel, self.param
        )
    }
}

/// Why two runs could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The reference has a parameter the run lacks.
    #[error("parameter {name:?} of the reference run is missing from the run\nhint: compare runs of the same network")]
    MissingParameter {
        /// The parameter's name.
        name: String,
    },
    /// A parameter has another shape in the run than in the reference.
    #[error("parameter {name:?} has shape {run:?} in the run and {reference:?} in the reference\nhint: compare runs of the same network")]
    ShapeMismatch {
        /// The parameter's name.
        name: String,
        /// Its shape in the run.
        run: Vec<usize>,
        /// Its shape in the reference.
        reference: Vec<usize>,
    },
    /// The runs took different numbers of steps.
    #[error("the run took {run} steps and the reference {reference}\nhint: compare runs of the same length (--steps, --epochs)")]
    StepCount {
        /// Steps of the run.
        run: usize,
        /// Steps of the reference.
        reference: usize,
    },
    /// The stand-alone reference run failed.
    #[error("the stand_alone reference run failed: {0}")]
    Reference(#[source] Box<TrainError>),
    /// The run's full parameters could not be put together.
    #[error("the run's parameters could not be put together: {0}")]
    Params(#[source] Box<TrainError>),
}

/// Trains `trainer`'s network on the same data and configuration on one device (stand_alone,
/// no checkpoints, no resume), in this process even under `mpirun`. Micro-batches run one after the other, which for a pipeline or
/// gradient accumulation is the right reference (BatchNorm statistics are per micro-batch).
pub fn stand_alone(trainer: &Trainer) -> Result<TrainReport, VerifyError> {
    let micro_batches = trainer.micro_batches().map_err(|e| VerifyError::Reference(Box::new(e)))?;
    let mut alone = trainer.clone().in_process().without_eval();
    let cfg = alone.config_mut();
    cfg.micro_batches = Some(micro_batches);
    cfg.parallel = ParallelContext::default();
    cfg.pipeline_split.clear();
    cfg.checkpoint = None;
    cfg.resume = None;
    alone.fit(Vec::new()).map_err(|e| VerifyError::Reference(Box::new(e)))
}

/// A run's losses and parameters.
struct Values<'a> {
    losses: &'a [f64],
    params: &'a ParamStore,
}

/// Compares `run` with `reference`: every step's loss and every parameter of the reference.
pub fn compare(run: &TrainReport, reference: &TrainReport) -> Result<Comparison, VerifyError> {
    let trainable = |name: &str| reference.trainable.iter().any(|t| t == name);
    let params = |r: &TrainReport| r.params().map_err(|e| VerifyError::Params(Box::new(e)));
    compare_values((&run.losses, &params(run)?), (&reference.losses, &params(reference)?), &trainable)
}

/// [`compare`] of (per-step losses, final parameters); the model's scale is taken over the
/// parameters `trainable` names (a frozen constant such as a causal mask's -1e9 would drown
/// every difference).
fn compare_values(
    run: (&[f64], &ParamStore),
    reference: (&[f64], &ParamStore),
    trainable: &dyn Fn(&str) -> bool,
) -> Result<Comparison, VerifyError> {
    let (run, reference) = (Values { losses: run.0, params: run.1 }, Values { losses: reference.0, params: reference.1 });
    if run.losses.len() != reference.losses.len() {
        return Err(VerifyError::StepCount { run: run.losses.len(), reference: reference.losses.len() });
    }
    let (loss_diff, loss_rel) = run.losses.iter().zip(reference.losses).fold((0.0f64, 0.0f64), |(d, r), (a, b)| {
        let diff = (a - b).abs();
        (d.max(diff), r.max(diff / b.abs().max(FLOOR)))
    });
    let mut worst =
        Comparison { loss_diff, loss_rel, param_diff: 0.0, param_rel: 0.0, param: String::new(), norm_rel: 0.0, norm_param: String::new() };
    // The reference's values, converted once; the model's root-mean-square parameter value.
    let wanted: Vec<(&String, &autopar_tensor::Tensor, Vec<f64>)> =
        reference.params.iter().map(|(name, t)| (name, t, t.to_f64_vec())).collect();
    let (sum, count) = wanted
        .iter()
        .filter(|(name, _, _)| trainable(name))
        .fold((0.0f64, 0usize), |(s, n), (_, _, v)| (s + v.iter().map(|x| x * x).sum::<f64>(), n + v.len()));
    let rms = if count == 0 { 0.0 } else { (sum / count as f64).sqrt() };
    for (name, want_tensor, want) in wanted {
        let got = run.params.get(name).ok_or_else(|| VerifyError::MissingParameter { name: name.clone() })?;
        if got.shape() != want_tensor.shape() {
            return Err(VerifyError::ShapeMismatch {
                name: name.clone(),
                run: got.shape().to_vec(),
                reference: want_tensor.shape().to_vec(),
            });
        }
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(FLOOR);
        let got = got.to_f64_vec();
        let d = got.iter().zip(&want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let r = d / scale;
        if r > worst.param_rel || (r == worst.param_rel && d > worst.param_diff) || worst.param.is_empty() {
            (worst.param_diff, worst.param_rel, worst.param) = (d, r, name.clone());
        }
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let floor = (SCALE_FLOOR * rms * (want.len() as f64).sqrt()).max(FLOOR);
        let n = norm(&mut got.iter().zip(&want).map(|(a, b)| a - b)) / norm(&mut want.iter().copied()).max(floor);
        if n > worst.norm_rel || worst.norm_param.is_empty() {
            (worst.norm_rel, worst.norm_param) = (n, name.clone());
        }
    }
    Ok(worst)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_tensor::Tensor;

    fn report(losses: Vec<f64>, w: Vec<f32>) -> (Vec<f64>, ParamStore) {
        let mut params = ParamStore::new();
        params.insert("w", Tensor::from_vec(&[w.len()], w).unwrap());
        (losses, params)
    }

    fn compare(run: (Vec<f64>, ParamStore), reference: &(Vec<f64>, ParamStore)) -> Result<Comparison, VerifyError> {
        compare_values((&run.0, &run.1), (&reference.0, &reference.1), &|name| name != "mask")
    }

    #[test]
    fn a_few_rounding_sensitive_elements_pass_and_a_shifted_tensor_fails() {
        let reference = report(vec![2.0, 1.5], (0..1000).map(|i| 0.05 * ((i % 17) as f32 - 8.0)).collect());
        // One element of a thousand off by 1% of the largest value (Adam near eps): the element
        // measure sees it, the normwise check passes.
        let mut w = reference.1.get("w").unwrap().to_f64_vec().iter().map(|&x| x as f32).collect::<Vec<_>>();
        w[3] += 0.004;
        let c = compare(report(vec![2.0, 1.5], w.clone()), &reference).unwrap();
        assert!(c.param_rel > 5e-3 && c.norm_rel < 1e-3 && c.within(RTOL), "{c}");
        // Every element off by 0.5%: a mistake in the parallel run, not rounding.
        let shifted: Vec<f32> = w.iter().map(|x| x * 1.005).collect();
        let c = compare(report(vec![2.0, 1.5], shifted), &reference).unwrap();
        assert!(c.norm_rel > RTOL && !c.within(RTOL), "{c}");
        // A loss off by 1%.
        let c = compare(report(vec![2.0, 1.515], w), &reference).unwrap();
        assert!(!c.within(RTOL), "{c}");
    }

    #[test]
    fn a_tensor_far_smaller_than_the_model_is_measured_against_the_models_scale() {
        // Weights about 0.05 and a shift of 1e-6 per element that the run has 1% off (rounding).
        let tensors = |shift: f32| {
            let mut params = ParamStore::new();
            params.insert("w", Tensor::from_vec(&[1000], (0..1000).map(|i| 0.05 * ((i % 7) as f32 - 3.0)).collect()).unwrap());
            params.insert("beta", Tensor::from_vec(&[64], vec![shift; 64]).unwrap());
            (vec![2.0, 1.5], params)
        };
        let reference = tensors(1e-6);
        let c = compare(tensors(1.01e-6), &reference).unwrap();
        assert!(c.within(RTOL), "{c}");
        // Off by as much as its values are: a mistake, still seen.
        let c = compare(tensors(1e-4), &reference).unwrap();
        assert!(!c.within(RTOL) && c.norm_param == "beta", "{c}");
    }

    #[test]
    fn a_frozen_constant_of_huge_values_does_not_hide_a_wrong_weight() {
        // The GPT's causal mask holds -1e9; the model's scale is taken over what trains.
        let tensors = |w_scale: f32| {
            let mut params = ParamStore::new();
            params.insert("w", Tensor::from_vec(&[1000], (0..1000).map(|i| w_scale * 0.05 * ((i % 7) as f32 - 3.0)).collect()).unwrap());
            params.insert("mask", Tensor::from_vec(&[4096], vec![-1e9; 4096]).unwrap());
            (vec![2.0, 1.5], params)
        };
        let reference = tensors(1.0);
        let c = compare(tensors(1.75), &reference).unwrap();
        assert!(!c.within(RTOL) && c.norm_param == "w", "{c}");
        assert!(compare(tensors(1.0), &reference).unwrap().within(RTOL));
    }
}
