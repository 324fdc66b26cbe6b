//! One training step: forward, backward, optimizer update.

use autopar_graph::{backward, Graph, NodeId};
use autopar_tensor::{ExecCtx, Tensor};

use crate::error::{Result, RuntimeError};
use crate::executor::{Collectives, Executor, ParamStore, RunOutput};
use crate::optim::Optimizer;

/// What [`TrainStep::gradients`] returns.
#[derive(Clone, Debug)]
pub struct StepOutput {
    pub loss: Tensor,
    /// Gradients by parameter name.
    pub grads: Vec<(String, Tensor)>,
    /// The run's statistics (timings when profiling, peak live memory).
    pub run: RunOutput,
}

/// A forward graph differentiated with respect to its trainable parameters and planned to fetch
/// the loss and every gradient.
#[derive(Clone, Debug)]
pub struct TrainStep {
    executor: Executor,
    /// `(parameter name, gradient node)`.
    grads: Vec<(String, NodeId)>,
    step: u64,
}

impl TrainStep {
    /// Differentiates `loss` (any shape: the gradient of the sum of its elements) with respect
    /// to every trainable parameter of `graph`.
    pub fn new(mut graph: Graph, loss: NodeId) -> Result<Self> {
        let g = backward(&mut graph, loss)?;
        let grads: Vec<(String, NodeId)> = g.grads.iter().map(|&(p, d)| (graph.node(p).name.clone(), d)).collect();
        let mut fetch = vec![loss];
        fetch.extend(grads.iter().map(|(_, d)| *d));
        Ok(Self { executor: Executor::new(graph, &fetch)?, grads, step: 0 })
    }

    pub fn with_ctx(mut self, ctx: ExecCtx) -> Self {
        self.executor = self.executor.with_ctx(ctx);
        self
    }

    pub fn with_profiling(mut self, on: bool) -> Self {
        self.executor = self.executor.with_profiling(on);
        self
    }

    /// The forward+backward graph.
    pub fn graph(&self) -> &Graph {
        self.executor.graph()
    }

    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Runs forward and backward; returns the loss, the gradients by parameter name, and the
    /// run's statistics.
    pub fn gradients(&mut self, params: &mut ParamStore, feeds: &[(NodeId, Tensor)]) -> Result<StepOutput> {
        self.gradients_with(params, feeds, None)
    }

    /// As [`TrainStep::gradients`], with communication ops run by `collectives`.
    pub fn gradients_with(
        &mut self,
        params: &mut ParamStore,
        feeds: &[(NodeId, Tensor)],
        collectives: Option<&dyn Collectives>,
    ) -> Result<StepOutput> {
        let out = self.executor.run_with(params, feeds, self.step, collectives)?;
        self.step += 1;
        let mut values = out.values.iter().cloned();
        let loss = values.next().expect("the loss is fetched first");
        let grads = self.grads.iter().map(|(n, _)| n.clone()).zip(values).collect();
        Ok(StepOutput { loss, grads, run: out })
    }

    /// Steps run so far (the dropout step counter).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// One step: forward, backward, `opt.step`. Returns the loss (summed if not a scalar).
    pub fn run(&mut self, params: &mut ParamStore, opt: &mut dyn Optimizer, feeds: &[(NodeId, Tensor)]) -> Result<f64> {
        let StepOutput { loss, grads, .. } = self.gradients(params, feeds)?;
        opt.step(params, &grads)?;
        finite_loss(loss.to_f64_vec().iter().sum::<f64>())
    }
}

/// `loss`, or an error when training has diverged (a NaN or infinite loss).
pub(crate) fn finite_loss(loss: f64) -> Result<f64> {
    if !loss.is_finite() {
        return Err(RuntimeError::BadHyperparameter { what: "loss", value: loss, expected: "a finite loss (lower the learning rate?)" });
    }
    Ok(loss)
}
