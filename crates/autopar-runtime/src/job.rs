//! The one job type: [`Job`], a planned job of any mode and shape (a job without pipeline
//! stages is a pipeline of one stage), assembled by `autopar-parallel`'s one entry point
//! ([`autopar_parallel::assemble_job`]). Nothing here decides how anything is split: the plan
//! says, the runtime executes.

use std::collections::BTreeSet;
use std::ops::Range;

use autopar_graph::{Graph, NodeId};
use autopar_parallel::{assemble_job, plan_hybrid, JobPlan, JobProgram, JobRequest, ParallelContext, ParallelMode, ParallelPlan};
use autopar_tensor::kernels::shape as sh;
use autopar_tensor::Tensor;

use crate::error::{Result, RuntimeError};

/// A planned job: every parallel decision, for every rank.
#[derive(Clone, Debug)]
pub struct Job {
    plan: JobPlan,
    /// Seconds assembling the plan took (0 for a plan made elsewhere).
    planning_seconds: f64,
}

impl Job {
    /// A training job for `graph` (forward only; `loss` its loss, summed if it has several
    /// elements) under `ctx`, with its default micro-batches (one, or one per pipeline stage).
    /// Assembled by [`assemble_job`]: the context's defaults applied, its strategy files read, an
    /// invalid strategy or an indivisible batch an error now.
    pub fn new(graph: &Graph, loss: NodeId, ctx: &ParallelContext) -> Result<Self> {
        Self::assemble(&JobRequest::new(graph, Some(loss), ctx))
    }

    /// Like [`Job::new`], with `micro_batches` micro-batches per step (`graph` is built for one
    /// of them): the stages of a pipeline run them in the order of its schedule; without stages
    /// their gradients are accumulated into one update.
    pub fn with_micro_batches(graph: &Graph, loss: NodeId, ctx: &ParallelContext, micro_batches: usize) -> Result<Self> {
        Self::assemble(&JobRequest { micro_batches: Some(micro_batches), ..JobRequest::new(graph, Some(loss), ctx) })
    }

    /// An inference job for `graph` (without a loss: its outputs are what it computes), with
    /// `micro_batches` micro-batches per call ([`crate::RankTrainer::predict`]); in a pipeline,
    /// `ctx.pipeline_result_broadcast` sends the outputs to every rank.
    pub fn inference(graph: &Graph, ctx: &ParallelContext, micro_batches: usize) -> Result<Self> {
        Self::assemble(&JobRequest { micro_batches: Some(micro_batches), ..JobRequest::new(graph, None, ctx) })
    }

    /// The job `req` asks for, from the one entry point that assembles jobs.
    pub fn assemble(req: &JobRequest<'_>) -> Result<Self> {
        let started = std::time::Instant::now();
        let plan = assemble_job(req)?;
        Ok(Self { plan, planning_seconds: started.elapsed().as_secs_f64() })
    }

    /// A hybrid_parallel job: rank `r` runs `graphs[r]` (its local shapes and the collectives
    /// the user placed, with world-rank groups). Parameters named in `layerwise` are the rank's
    /// own (MindSpore's `layerwise_parallel`); every other parameter is replicated and its
    /// gradient all-reduced over all ranks. With `gradients_mean` the job's loss is the mean
    /// of the ranks' losses (each backward starts from 1/N), without it their sum.
    pub fn hybrid(graphs: Vec<Graph>, loss_name: &str, ctx: &ParallelContext, layerwise: BTreeSet<String>) -> Result<Self> {
        let started = std::time::Instant::now();
        let plan = JobPlan::single(plan_hybrid(graphs, loss_name, ctx, &layerwise)?, 1)?;
        Ok(Self { plan, planning_seconds: started.elapsed().as_secs_f64() })
    }

    /// A job from a plan made elsewhere.
    pub fn from_plan(plan: JobPlan) -> Self {
        Self { plan, planning_seconds: 0.0 }
    }

    /// Seconds assembling the plan took, wall clock (0 for a plan made elsewhere).
    pub fn planning_seconds(&self) -> f64 {
        self.planning_seconds
    }

    /// Every parallel decision of the job.
    pub fn plan(&self) -> &JobPlan {
        &self.plan
    }

    /// The plan of the network on one stage's devices (the whole job's without a pipeline).
    pub fn network(&self) -> &ParallelPlan {
        &self.plan.plan
    }

    /// The parallel mode (MindSpore's `parallel_mode`).
    pub fn mode(&self) -> ParallelMode {
        self.plan.plan.mode
    }

    /// Ranks of the job, every stage's together (1 for stand_alone).
    pub fn device_num(&self) -> usize {
        self.plan.device_num
    }

    /// The network the job was planned from, built for one micro-batch (hybrid_parallel: rank
    /// 0's graph), with the loss as its first output.
    pub fn graph(&self) -> &Graph {
        &self.plan.plan.graph
    }

    /// The loss node of [`Job::graph`] (None: an inference job).
    pub fn loss(&self) -> Option<NodeId> {
        self.plan.plan.loss
    }

    /// The parallel context the job was planned under (one stage's, in a pipeline).
    pub fn context(&self) -> &ParallelContext {
        &self.plan.plan.context
    }

    /// hybrid_parallel: the graph of every rank (empty in the other modes).
    pub fn rank_graphs(&self) -> &[Graph] {
        &self.plan.plan.rank_graphs
    }

    /// What global rank `rank` runs every step.
    pub fn program(&self, rank: usize) -> Result<JobProgram> {
        Ok(self.plan.program(rank)?)
    }
}

/// Split global batches (by input name) along dimension 0 into `n` equal parts, part `r` of
/// batch `s` at `s * n + r`: the per-rank batches of hand-split (hybrid_parallel) graphs. An
/// input whose first dimension `n` does not divide is an error naming it.
pub fn rank_batches(batches: &[Vec<(String, Tensor)>], n: usize) -> Result<Vec<Vec<(String, Tensor)>>> {
    let mut out = Vec::with_capacity(batches.len() * n);
    for batch in batches {
        for (name, t) in batch {
            let rows = t.shape().first().copied().unwrap_or(0);
            if n == 0 || t.shape().is_empty() || !rows.is_multiple_of(n) {
                return Err(RuntimeError::BatchSplit { name: name.clone(), shape: t.shape().to_vec(), parts: n });
            }
        }
        for r in 0..n {
            let part = batch
                .iter()
                .map(|(name, t)| {
                    let per = t.shape()[0] / n;
                    let mut ranges: Vec<Range<usize>> = t.shape().iter().map(|&d| 0..d).collect();
                    ranges[0] = r * per..(r + 1) * per;
                    Ok((name.clone(), slice_tensor(t, &ranges)?))
                })
                .collect::<Result<Vec<_>>>()?;
            out.push(part);
        }
    }
    Ok(out)
}

/// The piece `ranges` of `t`.
pub fn slice_tensor(t: &Tensor, ranges: &[Range<usize>]) -> Result<Tensor> {
    if ranges.iter().zip(t.shape()).all(|(r, &d)| r.start == 0 && r.end == d) {
        return Ok(t.clone());
    }
    let begin: Vec<usize> = ranges.iter().map(|r| r.start).collect();
    let size: Vec<isize> = ranges.iter().map(|r| (r.end - r.start) as isize).collect();
    sh::slice(t, &begin, &size).map(|s| s.contiguous()).map_err(|e| RuntimeError::Kernel {
        kind: "Slice",
        name: "parameter slice".into(),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_batches_splits_dimension_0_in_run_local_order_and_names_what_cannot_split() {
        let x = Tensor::from_vec(&[4, 2], (0..8).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
        let parts = rank_batches(&[vec![("x".to_string(), x.clone())]], 2).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1][0].1.to_f64_vec(), vec![4.0, 5.0, 6.0, 7.0]);
        let e = rank_batches(&[vec![("x".to_string(), x.clone())]], 3).unwrap_err().to_string();
        assert!(e.contains("\"x\"") && e.contains("3 equal parts"), "{e}");
        let scalar = Tensor::from_vec(&[], vec![1.0f32]).unwrap();
        let e = rank_batches(&[vec![("s".to_string(), scalar)]], 2).unwrap_err().to_string();
        assert!(e.contains("\"s\""), "{e}");
        assert!(rank_batches(&[vec![("x".to_string(), x)]], 0).unwrap_err().to_string().contains("0 equal parts"));
    }
}
