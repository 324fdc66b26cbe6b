//! What the trainer runs: a job of one program per rank ([`ParallelJob`]), or a pipeline of
//! stages ([`PipelineJob`], `pipeline_stages` > 1), and one rank of either. The training loop,
//! checkpoints and resume are the same for both.

use std::ops::Range;

use autopar_checkpoint::StrategyFile;
use autopar_comm::Communicator;
use autopar_graph::{Graph, NodeId};
use autopar_parallel::ParamSlot;
use autopar_tensor::Tensor;

use crate::error::Result;
use crate::executor::ParamStore;
use crate::optim::Optimizer;
use crate::parallel::{assemble_params, ParallelJob, RankTrainer};
use crate::pipeline::{assemble_pipeline_params, PipelineJob, StageTrainer};
use crate::strategy_io;

/// A planned training job.
pub(super) enum Job {
    Plain(ParallelJob),
    /// A pipeline of stages; its network is built for one micro-batch.
    Pipeline {
        job: PipelineJob,
        loss: NodeId,
    },
}

impl Job {
    /// The network the job was planned from (a pipeline's: for one micro-batch).
    pub(super) fn graph(&self) -> &Graph {
        match self {
            Job::Plain(j) => j.graph(),
            Job::Pipeline { job, .. } => &job.plan().plan.graph,
        }
    }

    pub(super) fn loss(&self) -> NodeId {
        match self {
            Job::Plain(j) => j.loss(),
            Job::Pipeline { loss, .. } => *loss,
        }
    }

    pub(super) fn device_num(&self) -> usize {
        match self {
            Job::Plain(j) => j.device_num(),
            Job::Pipeline { job, .. } => job.device_num(),
        }
    }

    /// The strategy file describing every rank's checkpoint (a pipeline's: the per-stage files
    /// merged, layout names `"<stage>-<name>"`).
    pub(super) fn strategy_file(&self, only_trainable: bool, keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
        match self {
            Job::Plain(j) => strategy_io::strategy_file(j.plan(), only_trainable, keys),
            Job::Pipeline { job, .. } => strategy_io::merged_pipeline_strategy_file(job.plan(), only_trainable, keys),
        }
    }

    /// Full parameters from every rank's slices.
    pub(super) fn assemble(&self, per_rank: &[ParamStore]) -> Result<ParamStore> {
        match self {
            Job::Plain(j) => assemble_params(j, per_rank),
            Job::Pipeline { job, .. } => assemble_pipeline_params(job, per_rank),
        }
    }

    /// Every rank's slices gathered into full parameters on every rank. Collective.
    #[cfg(feature = "mpi")]
    pub(super) fn gather(&self, comm: &dyn Communicator, local: &ParamStore) -> Result<ParamStore> {
        match self {
            Job::Plain(j) => crate::parallel::gather_full_params(j, comm, local),
            Job::Pipeline { job, .. } => crate::pipeline::gather_pipeline_params(job, comm, local),
        }
    }
}

/// One rank of a [`Job`].
pub(super) enum Worker {
    /// A rank of one program; with `micro_batches` > 1 each step accumulates the gradients of
    /// that many equal parts of the batch before its update.
    Plain {
        trainer: Box<RankTrainer>,
        micro_batches: usize,
    },
    Stage(Box<StageTrainer>),
}

impl Worker {
    /// Rank `comm.rank()`, its parameters cut from `full`. Collective.
    pub(super) fn new(job: &Job, comm: &dyn Communicator, full: &ParamStore, micro_batches: usize) -> Result<Self> {
        Ok(match job {
            Job::Plain(j) => Worker::Plain { trainer: Box::new(RankTrainer::new(j, comm, full)?), micro_batches },
            Job::Pipeline { job, .. } => Worker::Stage(Box::new(StageTrainer::new(job, comm, full)?)),
        })
    }

    /// Clip every step's gradients to this global norm over the whole job (None: none).
    pub(super) fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        match self {
            Worker::Plain { trainer, .. } => trainer.train_step().set_clip_grad_norm(max_norm),
            Worker::Stage(t) => t.set_clip_grad_norm(max_norm),
        }
    }

    /// The rows of each global batch of `batch_size` rows this rank reads (a rank that runs
    /// micro-batches reads every micro-batch's rows).
    pub(super) fn rows(&self, batch_size: usize) -> Range<usize> {
        match self {
            Worker::Plain { trainer, micro_batches: 1 } => trainer.rows(),
            Worker::Plain { .. } | Worker::Stage(_) => 0..batch_size,
        }
    }

    /// One step on `rows` (the rows [`Worker::rows`] gave, by input name, starting at global
    /// row `first_row`); returns the job's loss. Collective.
    pub(super) fn step(
        &mut self,
        comm: &dyn Communicator,
        opt: &mut dyn Optimizer,
        rows: &[(String, Tensor)],
        first_row: usize,
    ) -> Result<f64> {
        match self {
            Worker::Plain { trainer, micro_batches: 1 } => {
                let feeds = trainer.local_feeds_from(rows, first_row)?;
                trainer.step(opt, &feeds)
            }
            Worker::Plain { trainer, micro_batches } => {
                let m = *micro_batches;
                let micro_feeds = (0..m)
                    .map(|k| {
                        let part: Vec<(String, Tensor)> =
                            rows.iter().map(|(n, t)| Ok((n.clone(), micro_rows(t, k, m)?))).collect::<Result<_>>()?;
                        trainer.local_feeds_from(&part, 0)
                    })
                    .collect::<Result<Vec<_>>>()?;
                trainer.step_accumulated(opt, &micro_feeds)
            }
            Worker::Stage(t) => t.step(comm, opt, rows),
        }
    }

    pub(super) fn params(&self) -> &ParamStore {
        match self {
            Worker::Plain { trainer, .. } => trainer.params(),
            Worker::Stage(t) => t.params(),
        }
    }

    pub(super) fn params_mut(&mut self) -> &mut ParamStore {
        match self {
            Worker::Plain { trainer, .. } => trainer.params_mut(),
            Worker::Stage(t) => t.params_mut(),
        }
    }

    /// The slots of the parameters this rank holds.
    pub(super) fn param_slots(&self) -> Vec<&ParamSlot> {
        match self {
            Worker::Plain { trainer, .. } => trainer.program().params.iter().collect(),
            Worker::Stage(t) => t.param_slots(),
        }
    }

    /// Copies of shared parameters take their owner stage's value (pipelines). Collective.
    pub(super) fn sync_shared_parameters(&mut self) -> Result<()> {
        match self {
            Worker::Plain { .. } => Ok(()),
            Worker::Stage(t) => t.sync_shared_parameters(),
        }
    }

    /// Continue the step counter (the key of the dropout masks) at `step`.
    pub(super) fn set_steps(&mut self, step: u64) {
        match self {
            Worker::Plain { trainer, .. } => trainer.train_step().set_steps(step),
            Worker::Stage(t) => t.set_steps(step),
        }
    }
}

/// Micro-batch `k` of `m` equal parts of `t`'s rows (dimension 0).
fn micro_rows(t: &Tensor, k: usize, m: usize) -> Result<Tensor> {
    let rows = t.shape().first().copied().unwrap_or(1) / m;
    let mut ranges: Vec<Range<usize>> = t.shape().iter().map(|&d| 0..d).collect();
    if let Some(r) = ranges.first_mut() {
        *r = k * rows..(k + 1) * rows;
    }
    crate::parallel::slice_tensor(t, &ranges)
}
