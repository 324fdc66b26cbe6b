//! Parallel equals serial, checked: a run beside a stand-alone run of the same network on the
//! same data (what `autopar train --verify` prints).
//!
//! Losses are compared step by step, parameters element by element after the last step. A
//! parameter's differences are measured relative to its largest value (not below [`FLOOR`]):
//! float sums taken in another order drift a little over a run, and a tensor whose gradient is
//! zero in exact arithmetic holds rounding noise whose relative differences say nothing.

use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{TrainError, TrainReport, Trainer};

/// The relative tolerance autopar promises between a parallel run and stand-alone
/// (`train --verify` fails above it).
pub const RTOL: f64 = 1e-3;

/// The smallest scale a parameter's differences are measured against.
pub const FLOOR: f64 = 1e-6;

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
    /// The parameter with the largest relative difference.
    pub param: String,
}

impl Comparison {
    /// Whether losses and parameters agree within the relative tolerance `rtol`.
    pub fn within(&self, rtol: f64) -> bool {
        self.loss_rel <= rtol && self.param_rel <= rtol
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "largest loss difference {:.3e} (relative {:.3e}), largest parameter difference {:.3e} (relative {:.3e} to the tensor's largest value, {})",
            self.loss_diff, self.loss_rel, self.param_diff, self.param_rel, self.param
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
}

/// Trains `trainer`'s network on the same data and configuration on one device (stand_alone,
/// no checkpoints, no resume), in this process even under `mpirun`. Micro-batches run one after the other, which for a pipeline or
/// gradient accumulation is the right reference (BatchNorm statistics are per micro-batch).
pub fn stand_alone(trainer: &Trainer) -> Result<TrainReport, VerifyError> {
    let mut alone = trainer.clone().in_process();
    let cfg = alone.config_mut();
    cfg.parallel = ParallelContext::default();
    cfg.pipeline_split.clear();
    cfg.checkpoint = None;
    cfg.resume = None;
    alone.fit(Vec::new()).map_err(|e| VerifyError::Reference(Box::new(e)))
}

/// Compares `run` with `reference`: every step's loss and every parameter of the reference.
pub fn compare(run: &TrainReport, reference: &TrainReport) -> Result<Comparison, VerifyError> {
    if run.losses.len() != reference.losses.len() {
        return Err(VerifyError::StepCount { run: run.losses.len(), reference: reference.losses.len() });
    }
    let (loss_diff, loss_rel) = run.losses.iter().zip(&reference.losses).fold((0.0f64, 0.0f64), |(d, r), (a, b)| {
        let diff = (a - b).abs();
        (d.max(diff), r.max(diff / b.abs().max(FLOOR)))
    });
    let mut worst = Comparison { loss_diff, loss_rel, param_diff: 0.0, param_rel: 0.0, param: String::new() };
    for (name, want) in reference.params.iter() {
        let got = run.params.get(name).ok_or_else(|| VerifyError::MissingParameter { name: name.clone() })?;
        if got.shape() != want.shape() {
            return Err(VerifyError::ShapeMismatch { name: name.clone(), run: got.shape().to_vec(), reference: want.shape().to_vec() });
        }
        let want = want.to_f64_vec();
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(FLOOR);
        let d = got.to_f64_vec().iter().zip(&want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        let r = d / scale;
        if r > worst.param_rel || (r == worst.param_rel && d > worst.param_diff) || worst.param.is_empty() {
            (worst.param_diff, worst.param_rel, worst.param) = (d, r, name.clone());
        }
    }
    Ok(worst)
}
