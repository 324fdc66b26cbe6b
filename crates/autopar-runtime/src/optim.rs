//! Optimizers and learning-rate schedules.
//!
//! Update rules (`g` the gradient, `lr` the step's learning rate, `wd` the weight decay, applied
//! to the parameters the decay filter selects):
//! * [`Sgd`]: `p -= lr * (g + wd * p)`.
//! * [`Momentum`] (MindSpore `nn.Momentum` / `ApplyMomentum`): `g' = g + wd * p`;
//!   `moments = momentum * moments + g'`; `p -= lr * moments`, or with Nesterov
//!   `p -= lr * (g' + momentum * moments)`. State `moments.<name>`.
//! * [`AdamW`] (decoupled weight decay): `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
//!   `p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)` with `m_hat = m / (1 - b1^t)` and
//!   `v_hat = v / (1 - b2^t)`; without bias correction `m_hat = m`, `v_hat = v` (MindSpore's
//!   `AdamWeightDecay`). State `adam_m.<name>`, `adam_v.<name>`.
//!
//! Arithmetic is done in the parameter's dtype (f32 or f64), one fused pass per parameter.

use autopar_tensor::{Float, Tensor};

use crate::error::{Result, RuntimeError};
use crate::executor::{graph_dtype, ParamStore};

/// The names of the optimizers' state tensors: the prefix, then the parameter's name
/// (MindSpore's `moments.<param>`; Adam's first and second moments), as checkpoints name them.
pub use autopar_checkpoint::strategy::{ADAM_M, ADAM_V, MOMENTS};

/// Learning rate as a function of the step (counted from 0).
#[derive(Clone, Debug, PartialEq)]
pub enum LrSchedule {
    /// The same learning rate at every step.
    Constant(f64),
    /// Linear warm-up from `base_lr / warmup_steps` to `base_lr` over `warmup_steps`, then cosine
    /// decay to `min_lr` at `total_steps` (and `min_lr` after).
    WarmupCosine {
        /// The learning rate at the end of warm-up.
        base_lr: f64,
        /// The learning rate at and after `total_steps`.
        min_lr: f64,
        /// Steps of linear warm-up.
        warmup_steps: u64,
        /// The step at which the cosine decay reaches `min_lr`.
        total_steps: u64,
    },
    /// A learning rate per step (MindSpore's dynamic learning rate, a list); the last one after
    /// the list ends.
    PerStep(std::sync::Arc<[f64]>),
}

impl LrSchedule {
    /// The learning rate of `step` (counted from 0).
    pub fn lr(&self, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant(lr) => lr,
            LrSchedule::PerStep(ref lrs) => lrs.get(step as usize).or(lrs.last()).copied().unwrap_or(0.0),
            LrSchedule::WarmupCosine { base_lr, min_lr, warmup_steps, total_steps } => {
                if step < warmup_steps {
                    return base_lr * (step + 1) as f64 / warmup_steps as f64;
                }
                let span = total_steps.saturating_sub(warmup_steps).max(1);
                let progress = ((step - warmup_steps) as f64 / span as f64).min(1.0);
                min_lr + 0.5 * (base_lr - min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let bad = |what, value, expected| Err(RuntimeError::BadHyperparameter { what, value, expected });
        match *self {
            LrSchedule::Constant(lr) if !(lr >= 0.0 && lr.is_finite()) => bad("learning rate", lr, "a finite value >= 0"),
            LrSchedule::WarmupCosine { base_lr, .. } if !(base_lr >= 0.0 && base_lr.is_finite()) => {
                bad("learning rate", base_lr, "a finite value >= 0")
            }
            LrSchedule::WarmupCosine { base_lr, min_lr, .. } if !(0.0..=base_lr).contains(&min_lr) => {
                bad("minimum learning rate (`min_lr`)", min_lr, "0 <= min_lr <= the learning rate (`lr`)")
            }
            LrSchedule::PerStep(ref lrs) => match lrs.iter().find(|lr| !(**lr >= 0.0 && lr.is_finite())) {
                Some(&lr) => bad("learning rate", lr, "a finite value >= 0 at every step"),
                None if lrs.is_empty() => bad("learning rate", f64::NAN, "a list of at least one value"),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// Which parameters weight decay applies to (all by default).
pub type DecayFilter = fn(&str) -> bool;

fn decay_all(_: &str) -> bool {
    true
}

/// MindSpore's default decay filter: no weight decay on normalisation parameters (names
/// containing `gamma` or `beta`).
pub fn decay_except_norm(name: &str) -> bool {
    !name.contains("gamma") && !name.contains("beta")
}

/// Parameters with their own learning rate or weight decay (MindSpore's parameter groups): a
/// parameter of a group takes the group's learning rate (else the optimizer's) and the group's
/// weight decay (else the optimizer's, with no decay filter, as MindSpore's groups do);
/// parameters of no group keep the optimizer's settings.
#[derive(Clone, Debug, Default)]
pub struct ParamGroups {
    groups: Vec<(Option<LrSchedule>, Option<f64>)>,
    by_name: std::collections::BTreeMap<String, usize>,
}

impl ParamGroups {
    /// Adds a group of `names`; errors on an invalid schedule or weight decay, or a parameter
    /// already in a group.
    pub fn add(&mut self, names: impl IntoIterator<Item = String>, schedule: Option<LrSchedule>, weight_decay: Option<f64>) -> Result<()> {
        if let Some(s) = &schedule {
            s.check()?;
        }
        if let Some(wd) = weight_decay {
            check_non_negative("weight_decay", wd)?;
        }
        let k = self.groups.len();
        for name in names {
            if self.by_name.insert(name.clone(), k).is_some() {
                return Err(RuntimeError::BadParamGroup { name, problem: "it is in two parameter groups".into() });
            }
        }
        self.groups.push((schedule, weight_decay));
        Ok(())
    }

    /// The learning rate and weight decay of `name` at `step`, the optimizer's being
    /// `schedule` and `wd` (where `filter` keeps the parameter).
    fn of(&self, name: &str, step: u64, schedule: &LrSchedule, wd: f64, filter: DecayFilter) -> (f64, f64) {
        match self.by_name.get(name).map(|&k| &self.groups[k]) {
            Some((lr, group_wd)) => (lr.as_ref().unwrap_or(schedule).lr(step), group_wd.unwrap_or(wd)),
            None => (schedule.lr(step), if filter(name) { wd } else { 0.0 }),
        }
    }
}

/// Scales `grads` in place so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping (MindSpore's `ClipByGlobalNorm`). One device's form of
/// [`clip_gradients`].
pub fn clip_by_global_norm(grads: &mut [(String, Tensor)], max_norm: f64) -> Result<f64> {
    clip_gradients(grads, max_norm, |_| true, Ok)
}

/// Gradient clipping by global norm over pieces held by many ranks: the squares of the
/// gradients `counted` selects (each distinct piece counted on exactly one rank) are summed in
/// f64, `total` turns this rank's sum into the job's (an all-reduce over every rank; the
/// identity on one device), and when the norm exceeds `max_norm` every gradient is scaled by
/// `max_norm / norm`. Returns the norm before clipping.
pub fn clip_gradients(
    grads: &mut [(String, Tensor)],
    max_norm: f64,
    counted: impl Fn(&str) -> bool,
    total: impl FnOnce(f64) -> Result<f64>,
) -> Result<f64> {
    check_max_norm(max_norm)?;
    let local = grads.iter().filter(|(n, _)| counted(n)).map(|(_, g)| g.to_f64_vec().iter().map(|v| v * v).sum::<f64>()).sum::<f64>();
    let norm = total(local)?.sqrt();
    if norm > max_norm {
        let scale = max_norm / norm;
        for (name, g) in grads.iter_mut() {
            *g = autopar_tensor::kernels::elementwise::scale(&autopar_tensor::ExecCtx::serial(), g, scale)
                .map_err(|e| RuntimeError::Kernel { kind: "ClipByGlobalNorm", name: name.clone(), source: Box::new(e) })?;
        }
    }
    Ok(norm)
}

/// A clipping norm must be finite and positive.
pub fn check_max_norm(max_norm: f64) -> Result<()> {
    if max_norm > 0.0 && max_norm.is_finite() {
        Ok(())
    } else {
        Err(RuntimeError::BadHyperparameter { what: "max_norm", value: max_norm, expected: "a finite value > 0 (`clip_grad_norm`)" })
    }
}

/// Updates parameters from their gradients.
pub trait Optimizer {
    /// Applies one update to every parameter named in `grads` and advances the step.
    fn step(&mut self, params: &mut ParamStore, grads: &[(String, Tensor)]) -> Result<()>;
    /// The optimizer's state tensors, under MindSpore's names.
    fn state(&self) -> &ParamStore;
    /// Mutable state, for restoring from a checkpoint.
    fn state_mut(&mut self) -> &mut ParamStore;
    /// The prefixes of the state entries it keeps for each parameter (`moments.`, ...).
    fn state_prefixes(&self) -> &'static [&'static str];
    /// The state entries this optimizer keeps for parameter `param` (created as zeros shaped
    /// like the parameter at its first update), under MindSpore's names.
    fn state_keys(&self, param: &str) -> Vec<String> {
        self.state_prefixes().iter().map(|p| format!("{p}{param}")).collect()
    }
    /// Updates applied so far.
    fn steps(&self) -> u64;
    /// Sets the updates applied so far (a resumed optimizer: its learning-rate schedule and
    /// bias correction continue from there).
    fn set_steps(&mut self, steps: u64);
    /// The learning rate the next update uses.
    fn current_lr(&self) -> f64;
}

fn check_grad<'a>(params: &'a mut ParamStore, name: &str, g: &Tensor) -> Result<&'a mut Tensor> {
    let p = params.require_mut(name)?;
    if p.shape() != g.shape() {
        return Err(RuntimeError::GradientMismatch { name: name.to_string(), shape: p.shape().to_vec(), got: g.shape().to_vec() });
    }
    if !p.dtype().is_float() {
        return Err(RuntimeError::NotFloat { what: "a trained parameter", name: name.to_string(), dtype: graph_dtype(p.dtype()) });
    }
    Ok(p)
}

/// Element-wise fused update of `p` and its `S` state tensors from the gradient `g`, in place:
/// `p[i] = f(g[i], [state[k][i]], p[i])`, the closure writing the new state values into its
/// array. Nothing is allocated when the tensors are contiguous, unshared and of `p`'s dtype (a
/// gradient of another dtype is cast first; state of another dtype is converted to `p`'s).
/// f16/bf16 parameters are updated in f32 and stored back in their dtype, with their state.
fn fused<const S: usize>(
    name: &str,
    p: &mut Tensor,
    g: &Tensor,
    mut state: [&mut Tensor; S],
    f32_fn: impl Fn(f32, &mut [f32; S], f32) -> f32,
    f64_fn: impl Fn(f64, &mut [f64; S], f64) -> f64,
) -> Result<()> {
    fn run<T: Float, const S: usize>(
        p: &mut Tensor,
        g: &Tensor,
        state: &mut [&mut Tensor; S],
        f: impl Fn(T, &mut [T; S], T) -> T,
    ) -> autopar_tensor::Result<()> {
        let dtype = p.dtype();
        let cast;
        let g = if g.dtype() == dtype && g.is_contiguous() {
            g
        } else {
            cast = g.cast(dtype).contiguous();
            &cast
        };
        for t in state.iter_mut() {
            if t.dtype() != dtype {
                **t = t.cast(dtype);
            }
        }
        let gs = g.as_slice::<T>().expect("a contiguous gradient of the parameter's dtype");
        let ps = p.as_mut_slice::<T>()?;
        let len = ps.len();
        let mut outs: Vec<&mut [T]> = Vec::with_capacity(S);
        for t in state.iter_mut() {
            let shape = t.shape().to_vec();
            let o = t.as_mut_slice::<T>()?;
            if o.len() != len {
                return Err(autopar_tensor::TensorError::ElementCount { op: "optimizer state", shape, expected: len, len: o.len() });
            }
            outs.push(o);
        }
        let gs = &gs[..len];
        // One zipped loop per state count, so that it compiles to vector code.
        match &mut outs[..] {
            [] => {
                for (p, &g) in ps.iter_mut().zip(gs) {
                    *p = f(g, &mut [T::zero(); S], *p);
                }
            }
            [a] => {
                for ((p, &g), a) in ps.iter_mut().zip(gs).zip(a.iter_mut()) {
                    let mut buf = [*a; S];
                    *p = f(g, &mut buf, *p);
                    *a = buf.into_iter().next().unwrap_or(*a);
                }
            }
            [a, b] => {
                for (((p, &g), a), b) in ps.iter_mut().zip(gs).zip(a.iter_mut()).zip(b.iter_mut()) {
                    let mut buf: [T; S] = std::array::from_fn(|k| if k == 0 { *a } else { *b });
                    *p = f(g, &mut buf, *p);
                    let mut it = buf.into_iter();
                    *a = it.next().unwrap_or(*a);
                    *b = it.next().unwrap_or(*b);
                }
            }
            _ => {
                for i in 0..len {
                    let mut buf: [T; S] = std::array::from_fn(|k| outs[k][i]);
                    ps[i] = f(gs[i], &mut buf, ps[i]);
                    for (o, v) in outs.iter_mut().zip(buf) {
                        o[i] = v;
                    }
                }
            }
        }
        Ok(())
    }
    let err = |e| RuntimeError::Kernel { kind: "Optimizer", name: name.to_string(), source: Box::new(e) };
    match p.dtype() {
        autopar_tensor::DType::F64 => run::<f64, S>(p, g, &mut state, f64_fn).map_err(err),
        autopar_tensor::DType::F32 => run::<f32, S>(p, g, &mut state, f32_fn).map_err(err),
        own => {
            let f32 = autopar_tensor::DType::F32;
            let mut wide = p.cast(f32);
            let mut wide_state: [Tensor; S] = std::array::from_fn(|k| state[k].cast(f32));
            {
                let mut refs: [&mut Tensor; S] = wide_state.each_mut();
                run::<f32, S>(&mut wide, g, &mut refs, f32_fn).map_err(err)?;
            }
            *p = wide.cast(own);
            for (t, w) in state.iter_mut().zip(wide_state) {
                **t = w.cast(own);
            }
            Ok(())
        }
    }
}

/// Stochastic gradient descent with optional weight decay.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// The learning rate by step.
    pub schedule: LrSchedule,
    /// Weight decay added to the gradient (`wd`).
    pub weight_decay: f64,
    /// Which parameters weight decay applies to.
    pub decay_filter: DecayFilter,
    /// Parameter groups with their own learning rate or weight decay.
    pub groups: ParamGroups,
    step: u64,
    state: ParamStore,
}

impl Sgd {
    /// No state.
    pub const STATE: &'static [&'static str] = &[];

    /// SGD without weight decay; errors when the schedule is invalid.
    pub fn new(schedule: LrSchedule) -> Result<Self> {
        schedule.check()?;
        Ok(Self { schedule, weight_decay: 0.0, decay_filter: decay_all, groups: ParamGroups::default(), step: 0, state: ParamStore::new() })
    }

    /// Sets the weight decay and the parameters it applies to (`None`: all); errors unless `wd` is finite and >= 0.
    pub fn with_weight_decay(mut self, wd: f64, filter: Option<DecayFilter>) -> Result<Self> {
        check_non_negative("weight_decay", wd)?;
        self.weight_decay = wd;
        self.decay_filter = filter.unwrap_or(decay_all);
        Ok(self)
    }

    /// Gives the parameters of `groups` their group's learning rate and weight decay.
    pub fn with_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }
}

fn check_non_negative(what: &'static str, v: f64) -> Result<()> {
    if v >= 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(RuntimeError::BadHyperparameter { what, value: v, expected: "a finite value >= 0" })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, params: &mut ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        for (name, g) in grads {
            let p = check_grad(params, name, g)?;
            let (lr, wd) = self.groups.of(name, self.step, &self.schedule, self.weight_decay, self.decay_filter);
            let (lr32, wd32) = (lr as f32, wd as f32);
            fused(name, p, g, [], |g, _, p| p - lr32 * (g + wd32 * p), |g, _, p| p - lr * (g + wd * p))?;
        }
        self.step += 1;
        Ok(())
    }
    fn state(&self) -> &ParamStore {
        &self.state
    }
    fn state_mut(&mut self) -> &mut ParamStore {
        &mut self.state
    }
    fn state_prefixes(&self) -> &'static [&'static str] {
        Self::STATE
    }
    fn steps(&self) -> u64 {
        self.step
    }
    fn set_steps(&mut self, steps: u64) {
        self.step = steps;
    }
    fn current_lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }
}

/// MindSpore's Momentum optimizer.
#[derive(Clone, Debug)]
pub struct Momentum {
    /// The learning rate by step.
    pub schedule: LrSchedule,
    /// The momentum coefficient.
    pub momentum: f64,
    /// Whether the update uses Nesterov momentum.
    pub nesterov: bool,
    /// Weight decay added to the gradient (`wd`).
    pub weight_decay: f64,
    /// Which parameters weight decay applies to.
    pub decay_filter: DecayFilter,
    /// Parameter groups with their own learning rate or weight decay.
    pub groups: ParamGroups,
    step: u64,
    state: ParamStore,
}

impl Momentum {
    /// The accumulated velocity, `moments.<name>`.
    pub const STATE: &'static [&'static str] = &[MOMENTS];

    /// Momentum without Nesterov or weight decay; errors when the schedule or `momentum` is invalid.
    pub fn new(schedule: LrSchedule, momentum: f64) -> Result<Self> {
        schedule.check()?;
        check_non_negative("momentum", momentum)?;
        Ok(Self {
            schedule,
            momentum,
            nesterov: false,
            weight_decay: 0.0,
            decay_filter: decay_all,
            groups: ParamGroups::default(),
            step: 0,
            state: ParamStore::new(),
        })
    }

    /// Turns Nesterov momentum on or off.
    pub fn with_nesterov(mut self, on: bool) -> Self {
        self.nesterov = on;
        self
    }

    /// Sets the weight decay and the parameters it applies to (`None`: all); errors unless `wd` is finite and >= 0.
    pub fn with_weight_decay(mut self, wd: f64, filter: Option<DecayFilter>) -> Result<Self> {
        check_non_negative("weight_decay", wd)?;
        self.weight_decay = wd;
        self.decay_filter = filter.unwrap_or(decay_all);
        Ok(self)
    }

    /// Gives the parameters of `groups` their group's learning rate and weight decay.
    pub fn with_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }
}

/// The state tensor `key`, created as zeros like `like` at the first step.
fn state_or_zeros<'a>(state: &'a mut ParamStore, key: &str, like: &Tensor) -> &'a mut Tensor {
    if state.get(key).is_none() {
        state.insert(key, Tensor::zeros(like.shape(), like.dtype()));
    }
    state.get_mut(key).expect("inserted above")
}

impl Optimizer for Momentum {
    fn step(&mut self, params: &mut ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        let mu = self.momentum;
        for (name, g) in grads {
            let p = check_grad(params, name, g)?;
            let acc = state_or_zeros(&mut self.state, &format!("{MOMENTS}{name}"), p);
            let (lr, wd) = self.groups.of(name, self.step, &self.schedule, self.weight_decay, self.decay_filter);
            let nesterov = self.nesterov;
            let (lr32, mu32, wd32) = (lr as f32, mu as f32, wd as f32);
            fused(
                name,
                p,
                g,
                [acc],
                |g, s, p| {
                    let g = g + wd32 * p;
                    s[0] = mu32 * s[0] + g;
                    if nesterov {
                        p - lr32 * (g + mu32 * s[0])
                    } else {
                        p - lr32 * s[0]
                    }
                },
                |g, s, p| {
                    let g = g + wd * p;
                    s[0] = mu * s[0] + g;
                    if nesterov {
                        p - lr * (g + mu * s[0])
                    } else {
                        p - lr * s[0]
                    }
                },
            )?;
        }
        self.step += 1;
        Ok(())
    }
    fn state(&self) -> &ParamStore {
        &self.state
    }
    fn state_mut(&mut self) -> &mut ParamStore {
        &mut self.state
    }
    fn state_prefixes(&self) -> &'static [&'static str] {
        Self::STATE
    }
    fn steps(&self) -> u64 {
        self.step
    }
    fn set_steps(&mut self, steps: u64) {
        self.step = steps;
    }
    fn current_lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }
}

/// Adam with decoupled weight decay.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// The learning rate by step.
    pub schedule: LrSchedule,
    /// Decay rate of the first moment (`b1`).
    pub beta1: f64,
    /// Decay rate of the second moment (`b2`).
    pub beta2: f64,
    /// Term added to the denominator for numerical stability.
    pub eps: f64,
    /// Decoupled weight decay (`wd`).
    pub weight_decay: f64,
    /// Whether the moments are bias-corrected (off: MindSpore's `AdamWeightDecay`).
    pub bias_correction: bool,
    /// Whether `eps` is added to the uncorrected `sqrt(v)`, as in MindSpore's `Adam`
    /// (`lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)`), rather than to the corrected
    /// one, as PyTorch's AdamW does.
    pub eps_hat: bool,
    /// Which parameters weight decay applies to.
    pub decay_filter: DecayFilter,
    /// Parameter groups with their own learning rate or weight decay.
    pub groups: ParamGroups,
    step: u64,
    state: ParamStore,
}

impl AdamW {
    /// The first and second moments, `adam_m.<name>` and `adam_v.<name>`.
    pub const STATE: &'static [&'static str] = &[ADAM_M, ADAM_V];

    /// Defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01, bias correction on.
    pub fn new(schedule: LrSchedule) -> Result<Self> {
        schedule.check()?;
        Ok(Self {
            schedule,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            bias_correction: true,
            eps_hat: false,
            decay_filter: decay_all,
            groups: ParamGroups::default(),
            step: 0,
            state: ParamStore::new(),
        })
    }

    /// Sets the decay rates of the first and second moments; errors unless both are in [0, 1).
    pub fn with_betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        for (what, b) in [("beta1", beta1), ("beta2", beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(RuntimeError::BadHyperparameter { what, value: b, expected: "a value in [0, 1)" });
            }
        }
        self.beta1 = beta1;
        self.beta2 = beta2;
        Ok(self)
    }

    /// Sets epsilon, the term added to the denominator; errors unless it is finite and > 0.
    pub fn with_eps(mut self, eps: f64) -> Result<Self> {
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(RuntimeError::BadHyperparameter { what: "eps", value: eps, expected: "a finite value > 0" });
        }
        self.eps = eps;
        Ok(self)
    }

    /// Sets the weight decay and the parameters it applies to (`None`: all); errors unless `wd` is finite and >= 0.
    pub fn with_weight_decay(mut self, wd: f64, filter: Option<DecayFilter>) -> Result<Self> {
        check_non_negative("weight_decay", wd)?;
        self.weight_decay = wd;
        self.decay_filter = filter.unwrap_or(decay_all);
        Ok(self)
    }

    /// Gives the parameters of `groups` their group's learning rate and weight decay.
    pub fn with_groups(mut self, groups: ParamGroups) -> Self {
        self.groups = groups;
        self
    }

    /// Without bias correction the update is MindSpore's `AdamWeightDecay`.
    pub fn with_bias_correction(mut self, on: bool) -> Self {
        self.bias_correction = on;
        self
    }

    /// With `on`, `eps` is added to the uncorrected `sqrt(v)` ([`AdamW::eps_hat`]: MindSpore's `Adam`).
    pub fn with_eps_hat(mut self, on: bool) -> Self {
        self.eps_hat = on;
        self
    }
}

impl Optimizer for AdamW {
    fn step(&mut self, params: &mut ParamStore, grads: &[(String, Tensor)]) -> Result<()> {
        let t = (self.step + 1) as i32;
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        // MindSpore keeps the betas' powers in f32: its corrections use the f32 betas, which
        // the f32 moments below use too (1 - 0.999 in f32 is 1.3e-5 below 0.001).
        let (p1, p2) = if self.eps_hat { (b1 as f32 as f64, b2 as f32 as f64) } else { (b1, b2) };
        let (c1, c2) = if self.bias_correction { (1.0 - p1.powi(t), 1.0 - p2.powi(t)) } else { (1.0, 1.0) };
        // eps on sqrt(v) is eps / sqrt(c2) on the corrected sqrt(v / c2).
        let eps = if self.eps_hat { eps / c2.sqrt() } else { eps };
        for (name, g) in grads {
            let p = check_grad(params, name, g)?;
            let (km, kv) = (format!("{ADAM_M}{name}"), format!("{ADAM_V}{name}"));
            // Both moments out of the store at once (put back below).
            let mut m = self.state.remove(&km).unwrap_or_else(|| Tensor::zeros(p.shape(), p.dtype()));
            let mut v = self.state.remove(&kv).unwrap_or_else(|| Tensor::zeros(p.shape(), p.dtype()));
            let (lr, wd) = self.groups.of(name, self.step, &self.schedule, self.weight_decay, self.decay_filter);
            let f = [lr, b1, b2, eps, wd, c1, c2].map(|x| x as f32);
            let done = fused(
                name,
                p,
                g,
                [&mut m, &mut v],
                |g, s, p| {
                    let [lr, b1, b2, eps, wd, c1, c2] = f;
                    s[0] = b1 * s[0] + (1.0 - b1) * g;
                    s[1] = b2 * s[1] + (1.0 - b2) * g * g;
                    p - lr * ((s[0] / c1) / ((s[1] / c2).sqrt() + eps) + wd * p)
                },
                |g, s, p| {
                    s[0] = b1 * s[0] + (1.0 - b1) * g;
                    s[1] = b2 * s[1] + (1.0 - b2) * g * g;
                    p - lr * ((s[0] / c1) / ((s[1] / c2).sqrt() + eps) + wd * p)
                },
            );
            self.state.insert(&km, m);
            self.state.insert(&kv, v);
            done?;
        }
        self.step += 1;
        Ok(())
    }
    fn state(&self) -> &ParamStore {
        &self.state
    }
    fn state_mut(&mut self) -> &mut ParamStore {
        &mut self.state
    }
    fn state_prefixes(&self) -> &'static [&'static str] {
        Self::STATE
    }
    fn steps(&self) -> u64 {
        self.step
    }
    fn set_steps(&mut self, steps: u64) {
        self.step = steps;
    }
    fn current_lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(vals: &[(&str, &[f64])]) -> ParamStore {
        let mut s = ParamStore::new();
        for (n, v) in vals {
            s.insert(n, Tensor::from_vec(&[v.len()], v.to_vec()).unwrap());
        }
        s
    }

    fn grads(vals: &[(&str, &[f64])]) -> Vec<(String, Tensor)> {
        vals.iter().map(|(n, v)| (n.to_string(), Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())).collect()
    }

    fn close(t: &Tensor, want: &[f64]) {
        let got = t.to_f64_vec();
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn sgd_applies_weight_decay_only_where_the_filter_says() {
        let mut p = store(&[("w", &[1.0, -2.0]), ("b", &[1.0])]);
        let mut opt = Sgd::new(LrSchedule::Constant(0.1)).unwrap().with_weight_decay(0.2, Some(|n| n != "b")).unwrap();
        opt.step(&mut p, &grads(&[("w", &[0.5, 0.0]), ("b", &[0.5])])).unwrap();
        close(p.get("w").unwrap(), &[1.0 - 0.1 * (0.5 + 0.2), -2.0 - 0.1 * (0.2 * -2.0)]);
        close(p.get("b").unwrap(), &[0.95]);
        assert!(opt.state().is_empty());
    }

    #[test]
    fn momentum_follows_mindspore_apply_momentum_and_names_its_state() {
        let mut p = store(&[("w", &[1.0])]);
        let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap();
        opt.step(&mut p, &grads(&[("w", &[0.5])])).unwrap();
        close(p.get("w").unwrap(), &[0.95]);
        close(opt.state().get("moments.w").unwrap(), &[0.5]);
        opt.step(&mut p, &grads(&[("w", &[0.5])])).unwrap();
        // accum = 0.9 * 0.5 + 0.5 = 0.95; p = 0.95 - 0.1 * 0.95
        close(opt.state().get("moments.w").unwrap(), &[0.95]);
        close(p.get("w").unwrap(), &[0.95 - 0.095]);
    }

    #[test]
    fn nesterov_momentum_looks_ahead() {
        let mut p = store(&[("w", &[1.0])]);
        let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap().with_nesterov(true).with_weight_decay(0.1, None).unwrap();
        opt.step(&mut p, &grads(&[("w", &[0.5])])).unwrap();
        // g' = 0.5 + 0.1 * 1 = 0.6; accum = 0.6; p = 1 - 0.1 * (0.6 + 0.9 * 0.6)
        close(p.get("w").unwrap(), &[1.0 - 0.1 * (0.6 + 0.54)]);
    }

    #[test]
    fn adamw_matches_the_hand_computed_update_with_and_without_bias_correction() {
        let (lr, b1, b2, eps, wd) = (0.1, 0.9, 0.999, 1e-8, 0.01);
        let mut p = store(&[("w", &[1.0])]);
        let mut opt = AdamW::new(LrSchedule::Constant(lr)).unwrap();
        opt.step(&mut p, &grads(&[("w", &[0.5])])).unwrap();
        let (m, v) = ((1.0 - b1) * 0.5, (1.0 - b2) * 0.25);
        let (mh, vh) = (m / (1.0 - b1), v / (1.0 - b2));
        close(p.get("w").unwrap(), &[1.0 - lr * (mh / (f64::sqrt(vh) + eps) + wd * 1.0)]);
        close(opt.state().get("adam_m.w").unwrap(), &[m]);
        close(opt.state().get("adam_v.w").unwrap(), &[v]);
        // Second step uses t = 2 in the corrections.
        let p1 = p.get("w").unwrap().to_f64_vec()[0];
        opt.step(&mut p, &grads(&[("w", &[-0.25])])).unwrap();
        let (m2, v2) = (b1 * m + (1.0 - b1) * -0.25, b2 * v + (1.0 - b2) * 0.0625);
        let want = p1 - lr * ((m2 / (1.0 - b1 * b1)) / (f64::sqrt(v2 / (1.0 - b2 * b2)) + eps) + wd * p1);
        close(p.get("w").unwrap(), &[want]);

        let mut p = store(&[("w", &[1.0])]);
        let mut opt = AdamW::new(LrSchedule::Constant(lr)).unwrap().with_bias_correction(false);
        opt.step(&mut p, &grads(&[("w", &[0.5])])).unwrap();
        close(p.get("w").unwrap(), &[1.0 - lr * (m / (f64::sqrt(v) + eps) + wd)]);
    }

    #[test]
    fn a_group_takes_its_own_learning_rate_and_weight_decay_and_a_list_gives_one_per_step() {
        let lrs = LrSchedule::PerStep(vec![0.1, 0.2].into());
        assert_eq!([lrs.lr(0), lrs.lr(1), lrs.lr(5)], [0.1, 0.2, 0.2]);
        let mut groups = ParamGroups::default();
        // "gamma" in a group is decayed: a group's weight decay has no filter.
        groups.add(["gamma".to_string()], Some(LrSchedule::Constant(1.0)), Some(0.5)).unwrap();
        let mut p = store(&[("w", &[1.0]), ("gamma", &[1.0]), ("beta", &[1.0])]);
        let mut opt = Sgd::new(lrs).unwrap().with_weight_decay(0.1, Some(decay_except_norm)).unwrap().with_groups(groups.clone());
        let g = grads(&[("w", &[1.0]), ("gamma", &[1.0]), ("beta", &[1.0])]);
        opt.step(&mut p, &g).unwrap();
        close(p.get("w").unwrap(), &[1.0 - 0.1 * (1.0 + 0.1)]);
        close(p.get("gamma").unwrap(), &[1.0 - 1.0 * (1.0 + 0.5)]);
        close(p.get("beta").unwrap(), &[1.0 - 0.1 * 1.0]); // the optimizer's filter keeps norms undecayed
        opt.step(&mut p, &g).unwrap();
        close(p.get("beta").unwrap(), &[0.9 - 0.2]);
        assert!(groups.add(["gamma".to_string()], None, None).is_err(), "a parameter in two groups");
        assert!(Sgd::new(LrSchedule::PerStep(vec![0.1, -1.0].into())).is_err());
    }

    #[test]
    fn mindspores_adam_adds_eps_to_the_uncorrected_root() {
        // MindSpore's Adam: lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps); a large eps
        // makes the placement visible.
        let (lr, b1, b2, eps) = (0.1, 0.9, 0.999, 0.1);
        for t in 1..=2 {
            let mut p = store(&[("w", &[1.0])]);
            let mut opt = AdamW::new(LrSchedule::Constant(lr)).unwrap().with_eps(eps).unwrap().with_weight_decay(0.0, None).unwrap();
            opt = opt.with_eps_hat(true);
            let (mut m, mut v, mut w) = (0.0, 0.0, 1.0);
            for k in 1..=t {
                let g = 0.5 / k as f64;
                opt.step(&mut p, &grads(&[("w", &[g])])).unwrap();
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                // The powers of the f32 betas, as MindSpore keeps them.
                let (p1, p2) = (b1 as f32 as f64, b2 as f32 as f64);
                let lr_t = lr * f64::sqrt(1.0 - p2.powi(k)) / (1.0 - p1.powi(k));
                w -= lr_t * m / (f64::sqrt(v) + eps);
            }
            close(p.get("w").unwrap(), &[w]);
        }
    }

    #[test]
    fn f32_parameters_stay_f32() {
        let mut p = ParamStore::new();
        p.insert("w", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap());
        let g = vec![("w".to_string(), Tensor::from_vec(&[2], vec![1.0f32, 1.0]).unwrap())];
        Sgd::new(LrSchedule::Constant(0.5)).unwrap().step(&mut p, &g).unwrap();
        assert_eq!(p.get("w").unwrap().to_vec::<f32>().unwrap(), vec![0.5, 1.5]);
    }

    #[test]
    fn updates_happen_in_place_and_never_change_a_tensor_held_elsewhere() {
        let optimizers: Vec<Box<dyn Optimizer>> = vec![
            Box::new(Sgd::new(LrSchedule::Constant(0.5)).unwrap()),
            Box::new(Momentum::new(LrSchedule::Constant(0.5), 0.9).unwrap()),
            Box::new(AdamW::new(LrSchedule::Constant(0.5)).unwrap()),
        ];
        for mut opt in optimizers {
            let mut p = ParamStore::new();
            p.insert("w", Tensor::from_vec(&[3], vec![1.0f32, 2.0, 3.0]).unwrap());
            let g = vec![("w".to_string(), Tensor::from_vec(&[3], vec![1.0f32, -1.0, 0.5]).unwrap())];
            opt.step(&mut p, &g).unwrap();
            let addr = |s: &ParamStore, k: &str| s.get(k).unwrap().as_slice::<f32>().unwrap().as_ptr();
            let (param, state): (_, Vec<_>) = (addr(&p, "w"), opt.state().iter().map(|(k, _)| addr(opt.state(), k)).collect());
            opt.step(&mut p, &g).unwrap();
            assert_eq!(addr(&p, "w"), param, "the parameter keeps its buffer");
            let now: Vec<_> = opt.state().iter().map(|(k, _)| addr(opt.state(), k)).collect();
            assert_eq!(now, state, "the state keeps its buffers");
            // A copy taken before a step (a checkpoint being written) keeps its values.
            let held = p.get("w").unwrap().clone();
            let before = held.to_vec::<f32>().unwrap();
            opt.step(&mut p, &g).unwrap();
            assert_eq!(held.to_vec::<f32>().unwrap(), before);
            assert_ne!(p.get("w").unwrap().to_vec::<f32>().unwrap(), before);
        }
    }

    #[test]
    fn half_precision_parameters_are_updated_in_f32_and_keep_their_dtype() {
        let mut p = ParamStore::new();
        p.insert("w", Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap().cast(autopar_tensor::DType::BF16));
        let g = vec![("w".to_string(), Tensor::from_vec(&[2], vec![1.0f32, 1.0]).unwrap().cast(autopar_tensor::DType::BF16))];
        let mut opt = Momentum::new(LrSchedule::Constant(0.5), 0.9).unwrap();
        opt.step(&mut p, &g).unwrap();
        assert_eq!(p.get("w").unwrap().dtype(), autopar_tensor::DType::BF16);
        assert_eq!(opt.state().get("moments.w").unwrap().dtype(), autopar_tensor::DType::BF16);
        close(p.get("w").unwrap(), &[0.5, 1.5]);
    }

    #[test]
    fn clipping_scales_all_gradients_to_the_global_norm() {
        let mut g = grads(&[("a", &[3.0]), ("b", &[0.0, 4.0])]);
        assert_eq!(clip_by_global_norm(&mut g, 10.0).unwrap(), 5.0);
        close(&g[1].1, &[0.0, 4.0]);
        assert_eq!(clip_by_global_norm(&mut g, 1.0).unwrap(), 5.0);
        close(&g[0].1, &[0.6]);
        close(&g[1].1, &[0.0, 0.8]);
        assert!(clip_by_global_norm(&mut g, 0.0).is_err());
        assert!(decay_except_norm("fc1.weight") && !decay_except_norm("bn1.gamma") && !decay_except_norm("ln.beta"));
    }

    #[test]
    fn warmup_cosine_rises_linearly_then_decays_to_the_minimum() {
        let s = LrSchedule::WarmupCosine { base_lr: 1.0, min_lr: 0.1, warmup_steps: 10, total_steps: 110 };
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(4) - 0.5).abs() < 1e-12);
        assert!((s.lr(9) - 1.0).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 0.1).abs() < 1e-12);
        assert!((s.lr(500) - 0.1).abs() < 1e-12);
        assert_eq!(LrSchedule::Constant(0.3).lr(1000), 0.3);
    }

    #[test]
    fn bad_hyperparameters_and_mismatched_gradients_are_rejected_by_name() {
        assert!(matches!(Sgd::new(LrSchedule::Constant(-1.0)), Err(RuntimeError::BadHyperparameter { what: "learning rate", .. })));
        assert!(matches!(
            AdamW::new(LrSchedule::Constant(0.1)).unwrap().with_betas(1.0, 0.9),
            Err(RuntimeError::BadHyperparameter { what: "beta1", .. })
        ));
        let mut p = store(&[("w", &[1.0, 2.0])]);
        let mut opt = Sgd::new(LrSchedule::Constant(0.1)).unwrap();
        let err = opt.step(&mut p, &grads(&[("w", &[1.0])])).unwrap_err();
        assert!(matches!(err, RuntimeError::GradientMismatch { ref name, .. } if name == "w"), "{err}");
        let err = opt.step(&mut p, &grads(&[("missing", &[1.0])])).unwrap_err();
        assert!(matches!(err, RuntimeError::MissingParameter { ref name } if name == "missing"), "{err}");
    }
}
