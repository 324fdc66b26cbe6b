//! The Python front end's graph and its running job: `autopar.nn.Cell.construct` is traced
//! into a [`Network`] (one node per op a script calls, by MindSpore's primitive names), which a
//! [`Session`] plans under the parallel context and runs on its simulated devices, one global
//! batch per call, so that `Model.train`'s callbacks run between steps.

use std::collections::BTreeMap;
use std::sync::Arc;

use autopar::graph::{ConvAttrs, DType, GraphBuilder, Initializer, NodeId, ParamSpec, PoolAttrs};
use autopar::layout::{NamedLayout, Strategy};
use autopar::parallel::ParallelContext;
use autopar::runtime::{AdamW, Job, LocalRanks, LrSchedule, MakeOptimizer, Momentum, Optimizer, ParamGroups, ParamStore, Sgd};
use autopar::tensor::Tensor;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A tensor crossing the boundary: `(name, dtype, shape, little-endian bytes)`, dtype by numpy's
/// name (`float32`, `float64`, `int32`, `int64`).
pub type Wire = (String, String, Vec<usize>, Vec<u8>);

fn dtype(name: &str) -> PyResult<DType> {
    Ok(match name {
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        "int32" => DType::I32,
        "int64" => DType::I64,
        other => {
            return Err(PyTypeError::new_err(format!(
                "dtype {other:?} is not one autopar computes in; use float32, float64, int32 or int64"
            )))
        }
    })
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I32 => "int32",
        DType::I64 => "int64",
    }
}

/// A tensor from its wire form.
fn tensor((name, dt, shape, bytes): &Wire) -> PyResult<Tensor> {
    fn read<T: autopar::tensor::Element, const N: usize>(b: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N).map(|c| f(c.try_into().expect("chunks of N bytes"))).collect()
    }
    let t = match dt.as_str() {
        "float32" => Tensor::from_vec(shape, read(bytes, f32::from_le_bytes)),
        "float64" => Tensor::from_vec(shape, read(bytes, f64::from_le_bytes)),
        "int32" => Tensor::from_vec(shape, read(bytes, i32::from_le_bytes)),
        "int64" => Tensor::from_vec(shape, read(bytes, i64::from_le_bytes)),
        other => {
            return Err(PyTypeError::new_err(format!(
                "{name}: dtype {other:?} cannot be passed to autopar; use float32, float64, int32 or int64"
            )))
        }
    };
    t.map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

/// A tensor's wire form.
fn wire(name: &str, t: &Tensor) -> PyResult<Wire> {
    fn bytes<T: autopar::tensor::Element, const N: usize>(t: &Tensor, f: fn(T) -> [u8; N]) -> Vec<u8> {
        t.to_vec::<T>().expect("the tensor's own type").into_iter().flat_map(f).collect()
    }
    use autopar::tensor::DType as T;
    let (dt, b) = match t.dtype() {
        T::F32 => ("float32", bytes(t, f32::to_le_bytes)),
        T::F64 => ("float64", bytes(t, f64::to_le_bytes)),
        T::I32 => ("int32", bytes(t, i32::to_le_bytes)),
        T::I64 => ("int64", bytes(t, i64::to_le_bytes)),
        T::F16 | T::BF16 => ("float32", bytes(&t.cast(T::F32), f32::to_le_bytes)),
    };
    Ok((name.to_string(), dt.to_string(), t.shape().to_vec(), b))
}

fn graph_err(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// An attribute of an op, or its default.
fn attr<'py, T: FromPyObjectOwned<'py, Error = PyErr>>(attrs: &Bound<'py, PyDict>, key: &str, default: T) -> PyResult<T> {
    match attrs.get_item(key)? {
        Some(v) if !v.is_none() => v.extract().map_err(|e: PyErr| PyTypeError::new_err(format!("attribute {key:?}: {e}"))),
        _ => Ok(default),
    }
}

/// A graph traced from Python: inputs, parameters and ops by MindSpore's primitive names.
#[pyclass(module = "autopar._native")]
pub struct Network {
    b: Option<GraphBuilder>,
}

impl Network {
    fn builder(&mut self) -> PyResult<&mut GraphBuilder> {
        self.b.as_mut().ok_or_else(|| PyRuntimeError::new_err("this network was already handed to a job"))
    }
}

#[pymethods]
impl Network {
    #[new]
    #[pyo3(signature = (seed=0))]
    fn new(seed: u64) -> Self {
        Self { b: Some(GraphBuilder::new(seed)) }
    }

    /// An input of the network (data or labels).
    fn input(&mut self, name: &str, shape: Vec<usize>, dt: &str) -> PyResult<usize> {
        let d = dtype(dt)?;
        Ok(self.builder()?.input(name, &shape, d).map_err(graph_err)?.0)
    }

    /// A parameter (its values come with the job); frozen unless `requires_grad`.
    fn parameter(&mut self, name: &str, shape: Vec<usize>, dt: &str, requires_grad: bool) -> PyResult<usize> {
        let mut spec = ParamSpec::new(&shape, Initializer::Zeros).dtype(dtype(dt)?);
        if !requires_grad {
            spec = spec.frozen();
        }
        Ok(self.builder()?.parameter_with(name, spec).map_err(graph_err)?.0)
    }

    /// Ops after this belong to pipeline stage `stage` (None: no stage of their own).
    fn set_pipeline_stage(&mut self, stage: Option<usize>) -> PyResult<()> {
        self.builder()?.set_pipeline_stage(stage);
        Ok(())
    }

    /// Gives the op that made `node` MindSpore's strategy (`((2, 4), (4, 1))`) or its inputs'
    /// `Layout`s (`Layout((2, 4), ("dp", "mp"))(("dp", "None"), ("None", "mp"))`).
    fn shard(&mut self, node: usize, strategy: &str) -> PyResult<()> {
        if strategy.trim_start().starts_with("Layout") {
            let l: NamedLayout = strategy.parse().map_err(graph_err)?;
            self.builder()?.shard_layout(NodeId(node), l).map_err(graph_err)?;
        } else {
            let s: Strategy = strategy.parse().map_err(graph_err)?;
            self.builder()?.shard(NodeId(node), s).map_err(graph_err)?;
        }
        Ok(())
    }

    /// Marks the op that made `node` for recomputation in the backward pass.
    fn recompute(&mut self, node: usize) -> PyResult<()> {
        self.builder()?.recompute(NodeId(node)).map_err(graph_err)?;
        Ok(())
    }

    /// The shape and dtype of `node`.
    fn describe(&mut self, node: usize) -> PyResult<(Vec<usize>, &'static str)> {
        let n = self.builder()?.graph().get(NodeId(node)).map_err(graph_err)?;
        Ok((n.ty.shape.to_vec(), dtype_name(n.ty.dtype)))
    }

    /// Adds op `kind` (MindSpore's primitive name) named `name` over `inputs`, with `attrs`.
    #[pyo3(signature = (kind, name, inputs, attrs))]
    fn op(&mut self, kind: &str, name: &str, inputs: Vec<usize>, attrs: &Bound<'_, PyDict>) -> PyResult<usize> {
        let x: Vec<NodeId> = inputs.iter().copied().map(NodeId).collect();
        let arity = |k: usize| -> PyResult<()> {
            if x.len() == k {
                Ok(())
            } else {
                Err(PyTypeError::new_err(format!("{kind} ({name}) takes {k} input(s), but got {}", x.len())))
            }
        };
        let b = self.b.as_mut().ok_or_else(|| PyRuntimeError::new_err("this network was already handed to a job"))?;
        let unary = ["ReLU", "GeLU", "SiLU", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Neg", "Flatten"];
        let binary = ["Add", "Sub", "Mul", "RealDiv", "Div", "BiasAdd"];
        if unary.contains(&kind) {
            arity(1)?;
        } else if binary.contains(&kind) {
            arity(2)?;
        }
        let id = match kind {
            "MatMul" => {
                arity(2)?;
                b.matmul_t(name, x[0], x[1], attr(attrs, "transpose_a", false)?, attr(attrs, "transpose_b", false)?)
            }
            "BatchMatMul" => {
                arity(2)?;
                b.batch_matmul(name, x[0], x[1], attr(attrs, "transpose_a", false)?, attr(attrs, "transpose_b", false)?)
            }
            "Add" => b.add(name, x[0], x[1]),
            "Sub" => b.sub(name, x[0], x[1]),
            "Mul" => b.mul(name, x[0], x[1]),
            "RealDiv" | "Div" => b.div(name, x[0], x[1]),
            "BiasAdd" => b.bias_add(name, x[0], x[1]),
            "ReLU" => b.relu(name, x[0]),
            "GeLU" => b.gelu(name, x[0]),
            "SiLU" => b.silu(name, x[0]),
            "Tanh" => b.tanh(name, x[0]),
            "Sigmoid" => b.sigmoid(name, x[0]),
            "Exp" => b.exp(name, x[0]),
            "Log" => b.log(name, x[0]),
            "Sqrt" => b.sqrt(name, x[0]),
            "Neg" => b.neg(name, x[0]),
            "Flatten" => b.flatten(name, x[0]),
            "Scale" => {
                arity(1)?;
                b.scale(name, x[0], attr(attrs, "factor", 1.0)?)
            }
            "Softmax" | "LogSoftmax" => {
                arity(1)?;
                let axis = attr(attrs, "axis", -1i64)?;
                if kind == "Softmax" {
                    b.softmax(name, x[0], axis)
                } else {
                    b.log_softmax(name, x[0], axis)
                }
            }
            "ReduceSum" | "ReduceMean" | "ReduceMax" => {
                arity(1)?;
                let axes: Vec<i64> = attr(attrs, "axis", Vec::new())?;
                let keep = attr(attrs, "keep_dims", false)?;
                let axes =
                    if axes.is_empty() { (0..b.graph().get(x[0]).map_err(graph_err)?.ty.shape.len() as i64).collect() } else { axes };
                match kind {
                    "ReduceSum" => b.reduce_sum(name, x[0], &axes, keep),
                    "ReduceMean" => b.reduce_mean(name, x[0], &axes, keep),
                    _ => b.reduce_max(name, x[0], &axes, keep),
                }
            }
            "Reshape" => {
                arity(1)?;
                b.reshape(name, x[0], &attr::<Vec<i64>>(attrs, "shape", Vec::new())?)
            }
            "Transpose" => {
                arity(1)?;
                b.transpose(name, x[0], &attr::<Vec<usize>>(attrs, "perm", Vec::new())?)
            }
            "Gather" => {
                arity(2)?;
                b.gather(name, x[0], x[1], attr(attrs, "axis", 0i64)?)
            }
            "OneHot" => {
                arity(1)?;
                let d = dtype(&attr(attrs, "dtype", "float32".to_string())?)?;
                b.one_hot(name, x[0], attr(attrs, "depth", 0usize)?, d)
            }
            "Concat" => b.concat(name, &x, attr(attrs, "axis", 0i64)?),
            "Cast" => {
                arity(1)?;
                let d = dtype(&attr(attrs, "dtype", "float32".to_string())?)?;
                b.op(name, autopar::graph::ops::Cast::to(d), &x)
            }
            "Conv2D" => {
                arity(2)?;
                let conv = ConvAttrs {
                    stride: attr(attrs, "stride", [1, 1])?,
                    padding: attr(attrs, "pad", [0; 4])?,
                    dilation: attr(attrs, "dilation", [1, 1])?,
                    groups: attr(attrs, "group", 1)?,
                };
                b.conv2d(name, x[0], x[1], conv)
            }
            "MaxPool" | "AvgPool" => {
                arity(1)?;
                let pool = PoolAttrs {
                    kernel: attr(attrs, "kernel_size", [1, 1])?,
                    stride: attr(attrs, "strides", [1, 1])?,
                    padding: attr(attrs, "pad", [0; 4])?,
                };
                if kind == "MaxPool" {
                    b.max_pool(name, x[0], pool)
                } else {
                    b.avg_pool(name, x[0], pool)
                }
            }
            "BatchNorm" => {
                arity(5)?;
                let (eps, momentum) = (attr(attrs, "epsilon", 1e-5)?, attr(attrs, "momentum", 0.1)?);
                b.batch_norm(name, [x[0], x[1], x[2], x[3], x[4]], attr(attrs, "is_training", true)?, eps, momentum)
            }
            "LayerNorm" => {
                arity(3)?;
                b.layer_norm(name, x[0], x[1], x[2], attr(attrs, "begin_norm_axis", -1i64)?, attr(attrs, "epsilon", 1e-7)?)
            }
            "Dropout" => {
                arity(1)?;
                b.dropout(name, x[0], 1.0 - attr(attrs, "keep_prob", 0.5)?, attr(attrs, "seed", 0u64)?)
            }
            "SoftmaxCrossEntropyWithLogits" => {
                arity(2)?;
                b.softmax_cross_entropy(name, x[0], x[1])
            }
            "Fill" => {
                arity(0)?;
                let d = dtype(&attr(attrs, "dtype", "float32".to_string())?)?;
                b.fill(name, &attr::<Vec<usize>>(attrs, "shape", Vec::new())?, d, attr(attrs, "value", 0.0)?)
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "{other} ({name}) is not an op autopar can run; see the list of ops in autopar.ops"
                )))
            }
        };
        Ok(id.map_err(graph_err)?.0)
    }
}

/// A parameter group from Python: its parameters' names, its learning rate (one value, or one
/// per step) and its weight decay, each None for the optimizer's.
type Group = (Vec<String>, Option<Vec<f64>>, Option<f64>);

/// A learning rate: one value, or one per step (MindSpore's dynamic learning rate).
fn schedule(lrs: &[f64]) -> LrSchedule {
    match lrs {
        [lr] => LrSchedule::Constant(*lr),
        many => LrSchedule::PerStep(many.into()),
    }
}

/// The optimizer of a session, as `autopar.nn`'s optimizers describe it: its kind, learning
/// rate, hyper-parameters and parameter groups.
fn optimizer(name: &str, lr: &[f64], spec: &BTreeMap<String, f64>, groups: &[Group]) -> PyResult<MakeOptimizer> {
    let get = |k: &str, d: f64| spec.get(k).copied().unwrap_or(d);
    let lr = schedule(lr);
    let wd = get("weight_decay", 0.0);
    let filter = Some(autopar::runtime::decay_except_norm as fn(&str) -> bool);
    let (momentum, nesterov) = (get("momentum", 0.0), get("nesterov", 0.0) != 0.0);
    let (b1, b2, eps) = (get("beta1", 0.9), get("beta2", 0.999), get("eps", 1e-8));
    let mut param_groups = ParamGroups::default();
    for (names, group_lr, group_wd) in groups {
        param_groups.add(names.iter().cloned(), group_lr.as_deref().map(schedule), *group_wd).map_err(graph_err)?;
    }
    let kind = name.to_string();
    let make = move || -> autopar::runtime::Result<Box<dyn Optimizer>> {
        let g = param_groups.clone();
        Ok(match kind.as_str() {
            "SGD" if momentum == 0.0 => Box::new(Sgd::new(lr.clone())?.with_weight_decay(wd, filter)?.with_groups(g)),
            "SGD" | "Momentum" => {
                Box::new(Momentum::new(lr.clone(), momentum)?.with_nesterov(nesterov).with_weight_decay(wd, filter)?.with_groups(g))
            }
            // MindSpore's Adam corrects the moments' bias; AdamWeightDecay does not.
            "Adam" | "AdamWeightDecay" => Box::new(
                AdamW::new(lr.clone())?
                    .with_betas(b1, b2)?
                    .with_eps(eps)?
                    .with_weight_decay(wd, filter)?
                    .with_bias_correction(kind == "Adam")
                    .with_eps_hat(kind == "Adam")
                    .with_groups(g),
            ),
            _ => unreachable!("checked below"),
        })
    };
    if !["SGD", "Momentum", "Adam", "AdamWeightDecay"].contains(&name) {
        return Err(PyTypeError::new_err(format!("optimizer {name} is not one autopar runs; use SGD, Momentum, Adam or AdamWeightDecay")));
    }
    make().map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(Arc::new(make))
}

/// A network planned under a parallel context and running on its devices (threads of this
/// process), stepped one global batch at a time.
#[pyclass(module = "autopar._native", unsendable)]
pub struct Session {
    ranks: LocalRanks,
    layouts: Vec<(String, autopar::layout::ParameterLayout)>,
    /// The prefixes of the engine's optimizer state entries (`moments.`), in its order.
    state_prefixes: Vec<String>,
}

/// The state prefixes of the optimizers `make` makes.
fn state_prefixes_of(make: &MakeOptimizer) -> PyResult<Vec<String>> {
    Ok(make().map_err(|e| PyValueError::new_err(e.to_string()))?.state_prefixes().iter().map(|p| p.to_string()).collect())
}

#[pymethods]
impl Session {
    /// Plans `network` (its loss `loss`) under the `set_auto_parallel_context` options `context`
    /// (a JSON object), and starts its ranks from the full parameters `params`, each with the
    /// optimizer `optimizer_kind`: its learning rate (one value or one per step), its other
    /// hyper-parameters, and its parameter groups.
    /// `state_prefixes` name the optimizer's state of each trainable parameter as MindSpore
    /// names it (`moments.`), for `parameter_layout_dict` and the strategy files.
    #[new]
    #[pyo3(signature = (network, loss, context, params, optimizer_kind, learning_rate, hyper, groups, state_prefixes, micro_batches=None, loss_scale=None, amp_level=None, amp_dtype=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        network: &mut Network,
        loss: usize,
        context: &str,
        params: Vec<Wire>,
        optimizer_kind: &str,
        learning_rate: Vec<f64>,
        hyper: BTreeMap<String, f64>,
        groups: Vec<Group>,
        state_prefixes: Vec<String>,
        micro_batches: Option<usize>,
        loss_scale: Option<&str>,
        amp_level: Option<&str>,
        amp_dtype: Option<&str>,
    ) -> PyResult<Self> {
        let precision = precision(amp_level, amp_dtype)?;
        let make_opt = optimizer(optimizer_kind, &learning_rate, &hyper, &groups)?;
        let scale: autopar::runtime::LossScale = match loss_scale {
            Some(s) => s.parse().map_err(|e: autopar::runtime::loss_scale::BadLossScale| PyValueError::new_err(e.to_string()))?,
            None => autopar::runtime::LossScale::None,
        };
        let mut session = Self::start(py, network, &[loss], context, params, Ok((make_opt, micro_batches, state_prefixes, precision)))?;
        if scale.is_on() {
            let ranks = &mut session.ranks;
            py.detach(|| ranks.set_loss_scale(scale)).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        }
        Ok(session)
    }

    /// The last step's loss scale, whether its gradients overflowed, and the next step's scale
    /// (None without loss scaling).
    fn loss_scale(&self) -> Option<(f64, bool, f64)> {
        self.ranks.last_loss_scale().map(|s| (s.scale, s.overflow, s.next))
    }

    /// An inference job: `network` with its outputs `outputs`, planned under `context` and
    /// started from `params` (one micro-batch per pipeline stage).
    #[staticmethod]
    #[pyo3(signature = (network, outputs, context, params, amp_level=None, amp_dtype=None))]
    fn inference(
        py: Python<'_>,
        network: &mut Network,
        outputs: Vec<usize>,
        context: &str,
        params: Vec<Wire>,
        amp_level: Option<&str>,
        amp_dtype: Option<&str>,
    ) -> PyResult<Self> {
        Self::start(py, network, &outputs, context, params, Err(precision(amp_level, amp_dtype)?))
    }

    /// The network's outputs on the global batch `batch`, whole (an inference job).
    fn predict(&mut self, py: Python<'_>, batch: Vec<Wire>) -> PyResult<Vec<Wire>> {
        let batch = batch.iter().map(|w| Ok((w.0.clone(), tensor(w)?))).collect::<PyResult<Vec<_>>>()?;
        let ranks = &mut self.ranks;
        let out = py.detach(|| ranks.predict(batch)).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        out.iter().enumerate().map(|(k, t)| wire(&format!("output{k}"), t)).collect()
    }

    /// One train step on the global batch `batch`; returns the loss.
    fn step(&mut self, py: Python<'_>, batch: Vec<Wire>) -> PyResult<f64> {
        let batch = batch.iter().map(|w| Ok((w.0.clone(), tensor(w)?))).collect::<PyResult<Vec<_>>>()?;
        let ranks = &mut self.ranks;
        py.detach(|| ranks.step(batch)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The first half of a train step on the global batch `batch` (functional training): the
    /// forward and backward passes, the gradients kept by the ranks; returns the loss.
    fn gradients(&mut self, py: Python<'_>, batch: Vec<Wire>) -> PyResult<f64> {
        let batch = batch.iter().map(|w| Ok((w.0.clone(), tensor(w)?))).collect::<PyResult<Vec<_>>>()?;
        let ranks = &mut self.ranks;
        py.detach(|| ranks.gradients(batch)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The gradients of the last `gradients`, whole, by trainable parameter name.
    fn grads(&mut self, py: Python<'_>) -> PyResult<Vec<Wire>> {
        let ranks = &mut self.ranks;
        let store = py.detach(|| ranks.grads()).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        store.iter().map(|(name, t)| wire(name, t)).collect()
    }

    /// The second half of the step: the optimizer applied to the kept gradients, or to `given`
    /// (whole, by trainable parameter name).
    #[pyo3(signature = (given=None))]
    fn update(&mut self, py: Python<'_>, given: Option<Vec<Wire>>) -> PyResult<()> {
        let given = match given {
            Some(wires) => {
                let mut store = ParamStore::new();
                for w in &wires {
                    store.insert(&w.0, tensor(w)?);
                }
                Some(store)
            }
            None => None,
        };
        let ranks = &mut self.ranks;
        py.detach(|| ranks.update(given)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Gives the ranks the optimizer `kind` (learning rate, hyper-parameters, groups), its
    /// state afresh.
    fn set_optimizer(
        &mut self,
        py: Python<'_>,
        kind: &str,
        learning_rate: Vec<f64>,
        hyper: BTreeMap<String, f64>,
        groups: Vec<Group>,
    ) -> PyResult<()> {
        let make = optimizer(kind, &learning_rate, &hyper, &groups)?;
        self.state_prefixes = state_prefixes_of(&make)?;
        let ranks = &mut self.ranks;
        py.detach(|| ranks.set_optimizer(make)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The prefixes of the engine's optimizer state entries, in its order (`["moments."]`).
    fn optimizer_prefixes(&self) -> Vec<String> {
        self.state_prefixes.clone()
    }

    /// The optimizer's state, whole, by the engine's keys (`moments.w`), and its updates.
    fn optimizer_state(&mut self, py: Python<'_>) -> PyResult<(Vec<Wire>, u64)> {
        let ranks = &mut self.ranks;
        let (state, steps) = py.detach(|| ranks.optimizer_state()).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok((state.iter().map(|(k, t)| wire(k, t)).collect::<PyResult<_>>()?, steps))
    }

    /// Resumes the optimizer: its state from whole values (by the engine's keys) and `steps`
    /// updates taken (None: its own count kept).
    #[pyo3(signature = (state, steps=None))]
    fn load_optimizer_state(&mut self, py: Python<'_>, state: Vec<Wire>, steps: Option<u64>) -> PyResult<()> {
        let mut store = ParamStore::new();
        for w in &state {
            store.insert(&w.0, tensor(w)?);
        }
        let ranks = &mut self.ranks;
        py.detach(|| ranks.load_optimizer_state(store, steps)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The full parameters, assembled from the ranks' pieces.
    fn params(&mut self, py: Python<'_>) -> PyResult<Vec<Wire>> {
        let ranks = &mut self.ranks;
        let store = py.detach(|| ranks.params()).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        store.iter().map(|(name, t)| wire(name, t)).collect()
    }

    /// Replaces the parameters by `params` (every one the ranks hold).
    fn load(&mut self, py: Python<'_>, params: Vec<Wire>) -> PyResult<()> {
        let mut store = self.params_store(py)?;
        set_values(&mut store, &params)?;
        let ranks = &mut self.ranks;
        py.detach(|| ranks.load(store)).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// MindSpore's `parameter_layout_dict` of rank 0: name -> the 12 fields.
    fn layouts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, l) in &self.layouts {
            let fields = (
                l.dev_matrix.clone(),
                l.tensor_map.clone(),
                l.slice_shape.clone(),
                l.field_size,
                l.uniform_split,
                l.opt_shard_group.clone(),
                l.full_shape.clone(),
                l.after_reshape_slice_shape.clone(),
                l.pipeline_shared,
                l.is_send,
                l.peer_rank,
                l.sr_tag,
            );
            d.set_item(name, fields)?;
        }
        Ok(d)
    }
}

impl Session {
    /// Plans the network with `outputs` (a training job's loss when `train` gives its optimizer,
    /// micro-batches, state names and precision; an inference job's outputs in the precision
    /// `Err` gives) and starts its ranks from `params`.
    fn start(
        py: Python<'_>,
        network: &mut Network,
        outputs: &[usize],
        context: &str,
        params: Vec<Wire>,
        train: std::result::Result<Training, autopar::graph::Precision>,
    ) -> PyResult<Self> {
        let mut b = network.b.take().ok_or_else(|| PyRuntimeError::new_err("this network was already handed to a job"))?;
        for &o in outputs {
            b.output(NodeId(o)).map_err(graph_err)?;
        }
        let graph = b.finish();
        let ctx = parallel_context(context)?;
        let mut full = ParamStore::init(&graph).map_err(graph_err)?;
        set_values(&mut full, &params)?;
        let (job, make_opt, prefixes) = match train {
            Ok((make_opt, micro_batches, prefixes, precision)) => {
                let loss = NodeId(outputs[0]);
                let job = Job::assemble(&autopar::parallel::JobRequest {
                    micro_batches,
                    precision,
                    ..autopar::parallel::JobRequest::new(&graph, Some(loss), &ctx)
                });
                (job, Some(make_opt), prefixes)
            }
            Err(precision) => {
                let micro_batches = Some(autopar::parallel::default_micro_batches(&ctx));
                let job = Job::assemble(&autopar::parallel::JobRequest {
                    micro_batches,
                    precision,
                    ..autopar::parallel::JobRequest::new(&graph, None, &ctx)
                });
                (job, None, Vec::new())
            }
        };
        let job = job.map_err(graph_err)?;
        let plan = job.plan();
        let keys = |name: &str| prefixes.iter().map(|p| format!("{p}{name}")).collect::<Vec<_>>();
        let layouts = if plan.is_pipeline() {
            autopar::parallel::report::pipeline_layout_dict(plan, 0)
        } else {
            autopar::parallel::parameter_layout_dict(&plan.plan, 0, &keys)
        };
        // The files the context asks for (strategy_ckpt_config's save_file, the operator
        // strategies, the group information), as a MindSpore job writes them at compile.
        let ranks: Vec<usize> = (0..job.device_num()).collect();
        let files = autopar::parallel::strategy_files::job_strategy_files(plan, job.context(), &ranks, &keys).map_err(graph_err)?;
        for (path, file) in files {
            file.save(&path).map_err(|e| PyOSError::new_err(format!("{}: {e}", path.display())))?;
        }
        let state_prefixes = match &make_opt {
            Some(make) => state_prefixes_of(make)?,
            None => Vec::new(),
        };
        let ranks = py.detach(|| LocalRanks::start(job, Some(full), make_opt)).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(Self { ranks, layouts, state_prefixes })
    }

    fn params_store(&mut self, py: Python<'_>) -> PyResult<ParamStore> {
        let ranks = &mut self.ranks;
        py.detach(|| ranks.params()).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

/// What a training session is started with: the optimizer, micro-batches, the optimizer
/// state's names and the precision.
type Training = (MakeOptimizer, Option<usize>, Vec<String>, autopar::graph::Precision);

/// The precision policy of `amp_level` (O0 when None) and `amp_dtype` (f16 when None).
fn precision(amp_level: Option<&str>, amp_dtype: Option<&str>) -> PyResult<autopar::graph::Precision> {
    let bad = |e: autopar::graph::GraphError| PyValueError::new_err(e.to_string());
    let level: autopar::graph::AmpLevel = amp_level.unwrap_or("O0").parse().map_err(bad)?;
    Ok(match level {
        autopar::graph::AmpLevel::O0 => autopar::graph::Precision::default(),
        level => {
            let dtype = autopar::graph::precision::half_dtype(amp_dtype.unwrap_or("f16")).map_err(bad)?;
            autopar::graph::Precision::new(level, dtype).map_err(bad)?
        }
    })
}

/// `values` set into `store` (each a parameter it holds, of its shape), cast to the parameter's
/// dtype.
fn set_values(store: &mut ParamStore, values: &[Wire]) -> PyResult<()> {
    for p in values {
        let t = tensor(p)?;
        let Some(old) = store.get(&p.0) else {
            return Err(PyValueError::new_err(format!("parameter {}: the network does not use it", p.0)));
        };
        if old.shape() != t.shape() {
            return Err(PyValueError::new_err(format!(
                "parameter {}: its value has shape {:?}, the network's is {:?}",
                p.0,
                t.shape(),
                old.shape()
            )));
        }
        let t = t.cast(old.dtype());
        store.insert(&p.0, t);
    }
    Ok(())
}

/// The parallel context of the `set_auto_parallel_context` options `context` (a JSON object).
fn parallel_context(context: &str) -> PyResult<ParallelContext> {
    let values: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(context).map_err(|e| PyValueError::new_err(format!("the parallel context: {e}")))?;
    let mut ctx = ParallelContext::new();
    for (k, v) in &values {
        ctx.set(k, v).map_err(graph_err)?;
    }
    Ok(ctx)
}

/// Checks the `set_auto_parallel_context` options `context` (a JSON object): a `ValueError`
/// naming the first unknown option or bad value.
#[pyfunction]
pub fn check_parallel_context(context: &str) -> PyResult<()> {
    parallel_context(context)?.resolved().map_err(graph_err)?;
    Ok(())
}
