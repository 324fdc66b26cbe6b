//! The in-process runner: every rank of a job as a thread over [`LocalComm`], the same rank
//! trainer and step as under MPI.

use autopar_comm::{Communicator, LocalComm};
use autopar_tensor::Tensor;

use crate::assemble::assemble_params;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;
use crate::optim::Optimizer;
use crate::rank::{ParamSource, RankTrainer};

/// The result of an in-process run.
#[derive(Debug)]
pub struct LocalRun {
    /// The job's loss at every step (rank 0's; every rank sees the same in every mode but
    /// hybrid_parallel, where it is rank 0's own loss).
    pub losses: Vec<f64>,
    /// Every rank's losses.
    pub rank_losses: Vec<Vec<f64>>,
    /// Every rank's idle share of each step ([`RankTrainer::last_bubble`]).
    pub bubbles: Vec<Vec<f64>>,
    /// Final parameters, assembled from the ranks' pieces (a pipeline's shared parameter from
    /// its first stage; hybrid_parallel: rank 0's).
    pub params: ParamStore,
    /// Every rank's final stored parameters.
    pub rank_params: Vec<ParamStore>,
}

/// Run `job` on its devices as threads over [`LocalComm`]: every step feeds each rank
/// `batches[step]` (global batches by input name; under hybrid_parallel, where each rank has
/// its own graph and data, `batches[step * n + rank]`), with an optimizer from `make_opt` per
/// rank. Each rank generates its own parameter pieces from the initialisers (no full copy;
/// a piece several ranks hold is made by them together, each a part).
pub fn run_local<F>(job: &Job, batches: &[Vec<(String, Tensor)>], make_opt: F) -> Result<LocalRun>
where
    F: Fn() -> Result<Box<dyn Optimizer>> + Sync,
{
    let n = job.device_num();
    let hybrid = job.mode() == autopar_parallel::ParallelMode::HybridParallel;
    let steps = if hybrid { batches.len() / n } else { batches.len() };
    let results = LocalComm::run(n, |comm| -> Result<(Vec<f64>, Vec<f64>, ParamStore)> {
        let r = comm.rank();
        let mut t = RankTrainer::new(job, &comm, ParamSource::Init)?;
        let mut opt = make_opt()?;
        let (mut losses, mut bubbles) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
        for s in 0..steps {
            let batch = if hybrid { &batches[s * n + r] } else { &batches[s] };
            losses.push(t.step(opt.as_mut(), batch)?);
            bubbles.push(t.last_bubble());
        }
        Ok((losses, bubbles, t.params().clone()))
    })
    .map_err(RuntimeError::comm(CommPhase::Run))?;
    let mut rank_losses = Vec::with_capacity(n);
    let mut bubbles = Vec::with_capacity(n);
    let mut stores = Vec::with_capacity(n);
    for (l, b, p) in results {
        rank_losses.push(l);
        bubbles.push(b);
        stores.push(p);
    }
    let params = assemble_params(job, &stores)?;
    Ok(LocalRun { losses: rank_losses[0].clone(), rank_losses, bubbles, params, rank_params: stores })
}
