//! The in-process runner: every rank of a job as a thread over [`LocalComm`], the same rank
//! trainer and step as under MPI.

use autopar_comm::{Communicator, LocalComm};
use autopar_tensor::Tensor;

use crate::assemble::assemble_params;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;
use crate::loss_scale::{LossScale, ScaledStep};
use crate::optim::Optimizer;
use crate::rank::{ParamSource, RankTrainer, StepOutput};

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

/// What a rank of [`LocalRanks`] is asked to do.
enum Command {
    Step(std::sync::Arc<Vec<(String, Tensor)>>),
    Gradients(std::sync::Arc<Vec<(String, Tensor)>>),
    Grads,
    Update(Option<std::sync::Arc<ParamStore>>),
    SetOptimizer(MakeOptimizer),
    OptimizerState,
    LoadOptimizerState(std::sync::Arc<(ParamStore, Option<u64>)>),
    Predict(std::sync::Arc<Vec<(String, Tensor)>>),
    Load(std::sync::Arc<ParamStore>),
    LossScale(LossScale),
    Params,
    Stop,
}

/// What a rank of [`LocalRanks`] answers.
enum Answer {
    Loss(f64, Option<ScaledStep>),
    Outputs(Option<Vec<Tensor>>),
    Loaded,
    Params(Box<ParamStore>),
    State(Box<RankState>),
}

/// A rank's optimizer state, its parameters (standing in for state it lacks), its state
/// prefixes and its updates.
type RankState = (ParamStore, ParamStore, Vec<String>, u64);

/// The ranks of a job kept running as threads of this process between calls, stepped one
/// global batch at a time by a driver that decides each batch as it goes (the Python front
/// end's `Model.train`, whose callbacks run between steps). Each rank is a [`RankTrainer`] over
/// [`LocalComm`], as in [`run_local`]; dropping it stops the ranks.
pub struct LocalRanks {
    n: usize,
    job: std::sync::Arc<Job>,
    commands: Vec<std::sync::mpsc::Sender<Command>>,
    answers: std::sync::mpsc::Receiver<(usize, Result<Answer>)>,
    thread: Option<std::thread::JoinHandle<()>>,
    last_scale: Option<ScaledStep>,
}

impl std::fmt::Debug for LocalRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalRanks").field("devices", &self.n).finish()
    }
}

/// `f`'s result, or a panic in it as rank `rank`'s error.
fn caught<T>(rank: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let text = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
        Err(RuntimeError::RankStopped { rank, problem: format!("it panicked: {}", text.unwrap_or_else(|| "no message".into())) })
    })
}

/// Makes one optimizer per rank.
pub type MakeOptimizer = std::sync::Arc<dyn Fn() -> Result<Box<dyn Optimizer>> + Send + Sync>;

impl LocalRanks {
    /// Starts every rank of `job`, each cutting its pieces from `full` (None: generated from the
    /// initialisers, as [`ParamSource::Init`]) and, for a training job, holding an optimizer
    /// from `make_opt` (None for an inference job, [`Job::inference`]). Returns once every rank
    /// is ready, or with the first rank's error.
    pub fn start(job: Job, full: Option<ParamStore>, make_opt: Option<MakeOptimizer>) -> Result<Self> {
        use std::sync::{mpsc, Arc, Mutex};
        let n = job.device_num();
        let job = Arc::new(job);
        let (answer_tx, answers) = mpsc::channel();
        let mut commands = Vec::with_capacity(n);
        let mut inboxes = Vec::with_capacity(n);
        for _ in 0..n {
            let (tx, rx) = mpsc::channel();
            commands.push(tx);
            inboxes.push(Mutex::new(Some(rx)));
        }
        let run_job = job.clone();
        let thread = std::thread::spawn(move || {
            let job = run_job;
            let answer = Mutex::new(answer_tx);
            let send = |rank: usize, a: Result<Answer>| {
                let _ = answer.lock().unwrap_or_else(|p| p.into_inner()).send((rank, a));
            };
            let outcome = LocalComm::run(n, |comm| -> Result<()> {
                let r = comm.rank();
                let inbox = inboxes[r].lock().unwrap_or_else(|p| p.into_inner()).take().expect("each rank takes its inbox once");
                let source = match &full {
                    Some(full) => ParamSource::Full(full),
                    None => ParamSource::Init,
                };
                let made =
                    caught(r, || RankTrainer::new(&job, &comm, source).and_then(|t| Ok((t, make_opt.as_ref().map(|m| m()).transpose()?))));
                // The gradients of the last `Gradients`, until `Update` applies them.
                let mut pending: Option<StepOutput> = None;
                let (mut t, mut opt) = match made {
                    Ok(ready) => {
                        send(r, Ok(Answer::Loaded));
                        ready
                    }
                    Err(e) => {
                        let text = e.to_string();
                        send(r, Err(e));
                        return Err(RuntimeError::RankStopped { rank: r, problem: text });
                    }
                };
                while let Ok(command) = autopar_comm::local::lend_core_while(|| inbox.recv()) {
                    if let Command::Stop = command {
                        break;
                    }
                    // A panic is this rank's error: answered, so that the caller never waits for it.
                    let answer = caught(r, || match command {
                        Command::Step(batch) => match opt.as_mut() {
                            Some(opt) => t.step(opt.as_mut(), &batch).map(|l| Answer::Loss(l, t.last_loss_scale())),
                            None => Err(RuntimeError::JobKind { inference: true }),
                        },
                        Command::Gradients(batch) => {
                            let out = t.gradients(&batch)?;
                            let loss = out.loss;
                            pending = Some(out);
                            Ok(Answer::Loss(loss, None))
                        }
                        Command::Grads => {
                            let out = pending.as_ref().ok_or(RuntimeError::NoGradients)?;
                            // Frozen parameters' pieces stand in for their gradients, so that
                            // every parameter assembles; the caller keeps the trained ones.
                            let mut store = t.params().clone();
                            for (name, g) in &out.grads {
                                store.insert(name, g.clone());
                            }
                            Ok(Answer::Params(Box::new(store)))
                        }
                        Command::Update(given) => {
                            let opt = opt.as_mut().ok_or(RuntimeError::NoOptimizer)?;
                            let out = pending.take().ok_or(RuntimeError::NoGradients)?;
                            match given {
                                Some(full) => {
                                    let grads = t.gradient_pieces(&full)?;
                                    t.update(opt.as_mut(), &grads, false)
                                }
                                None => t.update(opt.as_mut(), &out.grads, out.overflow),
                            }
                            .map(|()| Answer::Loaded)
                        }
                        Command::OptimizerState => {
                            let opt = opt.as_ref().ok_or(RuntimeError::NoOptimizer)?;
                            let prefixes = opt.state_prefixes().iter().map(|p| p.to_string()).collect();
                            Ok(Answer::State(Box::new((opt.state().clone(), t.params().clone(), prefixes, opt.steps()))))
                        }
                        Command::LoadOptimizerState(given) => {
                            let opt = opt.as_mut().ok_or(RuntimeError::NoOptimizer)?;
                            t.load_optimizer_state(opt.as_mut(), &given.0, given.1).map(|()| Answer::Loaded)
                        }
                        Command::SetOptimizer(make) => {
                            opt = Some(make()?);
                            Ok(Answer::Loaded)
                        }
                        Command::Predict(batch) => t.predict(&batch).map(Answer::Outputs),
                        Command::Load(full) => t.load_full(&full).map(|()| Answer::Loaded),
                        Command::LossScale(s) => t.set_loss_scale(s).map(|()| Answer::Loaded),
                        Command::Params => Ok(Answer::Params(Box::new(t.params().clone()))),
                        Command::Stop => unreachable!("handled above"),
                    });
                    let failed = answer.as_ref().err().map(|e| e.to_string());
                    send(r, answer);
                    if let Some(problem) = failed {
                        return Err(RuntimeError::RankStopped { rank: r, problem });
                    }
                }
                Ok(())
            });
            if let Err(e) = outcome {
                // Ranks that never answered learn it here (their errors were sent already).
                tracing::debug!(error = %e, "the in-process ranks stopped");
            }
        });
        let mut ranks = Self { n, job, commands, answers, thread: Some(thread), last_scale: None };
        ranks.collect(|_| Ok(()))?;
        Ok(ranks)
    }

    /// The job the ranks run.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// One train step on the global batch `batch` (by input name); returns the job's loss.
    pub fn step(&mut self, batch: Vec<(String, Tensor)>) -> Result<f64> {
        let batch = std::sync::Arc::new(batch);
        self.send(|| Command::Step(batch.clone()))?;
        let mut loss = 0.0;
        let mut scale = None;
        self.collect(|(rank, a)| {
            if let (0, Answer::Loss(l, s)) = (rank, a) {
                (loss, scale) = (l, s);
            }
            Ok(())
        })?;
        self.last_scale = scale;
        Ok(loss)
    }

    /// The first half of a train step on the global batch `batch`: every rank's forward and
    /// backward passes and the gradients' synchronisation, the gradients kept by the ranks
    /// until [`LocalRanks::update`]; returns the job's loss (MindSpore's functional training,
    /// `value_and_grad`).
    pub fn gradients(&mut self, batch: Vec<(String, Tensor)>) -> Result<f64> {
        let batch = std::sync::Arc::new(batch);
        self.send(|| Command::Gradients(batch.clone()))?;
        let mut loss = 0.0;
        self.collect(|(rank, a)| {
            if let (0, Answer::Loss(l, _)) = (rank, a) {
                loss = l;
            }
            Ok(())
        })?;
        Ok(loss)
    }

    /// The gradients of the last [`LocalRanks::gradients`], whole, by trainable parameter name
    /// (assembled from the ranks' pieces).
    pub fn grads(&mut self) -> Result<ParamStore> {
        let whole = self.assembled(|| Command::Grads)?;
        let mut grads = ParamStore::new();
        for p in self.job.network().params.iter().filter(|p| p.trainable) {
            if let Some(t) = whole.get(&p.name) {
                grads.insert(&p.name, t.clone());
            }
        }
        Ok(grads)
    }

    /// The second half of a train step: every rank's optimizer applied to the gradients of the
    /// last [`LocalRanks::gradients`], or to `given` (whole, by trainable parameter name: the
    /// caller's own values, e.g. clipped), each rank taking its pieces.
    pub fn update(&mut self, given: Option<ParamStore>) -> Result<()> {
        let given = given.map(std::sync::Arc::new);
        self.send(|| Command::Update(given.clone()))?;
        self.collect(|_| Ok(()))
    }

    /// The optimizer's state, whole (by state key: `moments.w`, assembled from the ranks'
    /// pieces; empty before the first update), and the updates it has taken.
    pub fn optimizer_state(&mut self) -> Result<(ParamStore, u64)> {
        self.send(|| Command::OptimizerState)?;
        let mut answers: Vec<Option<RankState>> = (0..self.n).map(|_| None).collect();
        self.collect(|(rank, a)| {
            if let Answer::State(s) = a {
                answers[rank] = Some(*s);
            }
            Ok(())
        })?;
        let answers: Vec<RankState> = answers.into_iter().flatten().collect();
        let Some((_, _, prefixes, steps)) = answers.first().cloned() else { return Ok((ParamStore::new(), 0)) };
        let mut whole = ParamStore::new();
        for prefix in &prefixes {
            // Each state entry has its parameter's layout: assembled as the parameters are.
            let stores: Vec<ParamStore> = answers
                .iter()
                .map(|(state, params, _, _)| {
                    let mut s = params.clone();
                    for (key, t) in state.iter() {
                        if let Some(name) = key.strip_prefix(prefix.as_str()) {
                            s.insert(name, t.clone());
                        }
                    }
                    s
                })
                .collect();
            let held: std::collections::BTreeSet<&str> =
                answers.iter().flat_map(|(state, ..)| state.iter().filter_map(|(k, _)| k.strip_prefix(prefix.as_str()))).collect();
            let assembled = assemble_params(&self.job, &stores)?;
            for name in held {
                if let Some(t) = assembled.get(name) {
                    whole.insert(&format!("{prefix}{name}"), t.clone());
                }
            }
        }
        Ok((whole, steps))
    }

    /// Every rank's optimizer state from whole tensors (by state key; each rank takes its
    /// pieces of those it keeps), with `steps` its count of updates (None: kept): a resumed one.
    pub fn load_optimizer_state(&mut self, state: ParamStore, steps: Option<u64>) -> Result<()> {
        let given = std::sync::Arc::new((state, steps));
        self.send(|| Command::LoadOptimizerState(given.clone()))?;
        self.collect(|_| Ok(()))
    }

    /// Gives every rank a new optimizer from `make_opt` (its state starts afresh).
    pub fn set_optimizer(&mut self, make_opt: MakeOptimizer) -> Result<()> {
        self.send(|| Command::SetOptimizer(make_opt.clone()))?;
        self.collect(|_| Ok(()))
    }

    /// Scales the loss of every following step as `scale` says ([`crate::loss_scale`]).
    pub fn set_loss_scale(&mut self, scale: LossScale) -> Result<()> {
        scale.check()?;
        self.send(|| Command::LossScale(scale))?;
        self.collect(|_| Ok(()))
    }

    /// What the last step did under loss scaling (None without it).
    pub fn last_loss_scale(&self) -> Option<ScaledStep> {
        self.last_scale
    }

    /// Inference on the global batch `batch` (by input name) with an inference job: the
    /// network's outputs, whole (those of the last stage's first rank in a pipeline).
    pub fn predict(&mut self, batch: Vec<(String, Tensor)>) -> Result<Vec<Tensor>> {
        let batch = std::sync::Arc::new(batch);
        self.send(|| Command::Predict(batch.clone()))?;
        let plan = self.job.plan();
        let reporter = (plan.stages - 1) * plan.stage_devices();
        let mut outputs = Vec::new();
        self.collect(|(rank, a)| {
            if let (true, Answer::Outputs(Some(o))) = (rank == reporter, a) {
                outputs = o;
            }
            Ok(())
        })?;
        Ok(outputs)
    }

    /// Replaces every rank's parameter pieces by its pieces of `full` (every parameter the
    /// ranks hold must be there); the optimizer state is kept.
    pub fn load(&mut self, full: ParamStore) -> Result<()> {
        let full = std::sync::Arc::new(full);
        self.send(|| Command::Load(full.clone()))?;
        self.collect(|_| Ok(()))
    }

    /// The full parameters, assembled from every rank's pieces.
    pub fn params(&mut self) -> Result<ParamStore> {
        self.assembled(|| Command::Params)
    }

    /// Every rank's answer to `command` (a store of its pieces), assembled whole.
    fn assembled(&mut self, command: impl Fn() -> Command) -> Result<ParamStore> {
        self.send(command)?;
        let mut stores: Vec<Option<ParamStore>> = (0..self.n).map(|_| None).collect();
        self.collect(|(rank, a)| {
            if let Answer::Params(p) = a {
                stores[rank] = Some(*p);
            }
            Ok(())
        })?;
        let stores: Vec<ParamStore> = stores.into_iter().map(Option::unwrap_or_default).collect();
        assemble_params(&self.job, &stores)
    }

    fn send(&self, command: impl Fn() -> Command) -> Result<()> {
        for (rank, tx) in self.commands.iter().enumerate() {
            tx.send(command()).map_err(|_| RuntimeError::RankStopped { rank, problem: "it stopped after an earlier error".into() })?;
        }
        Ok(())
    }

    /// One answer from every rank, each through `each`; the first error (a rank's own before a
    /// peer's failed exchange with it) once all have answered.
    fn collect(&mut self, mut each: impl FnMut((usize, Answer)) -> Result<()>) -> Result<()> {
        let mut first: Option<(bool, RuntimeError)> = None;
        for _ in 0..self.n {
            let Ok((rank, answer)) = self.answers.recv() else {
                return Err(first
                    .map(|(_, e)| e)
                    .unwrap_or(RuntimeError::RankStopped { rank: 0, problem: "every rank has stopped".into() }));
            };
            match answer.and_then(|a| each((rank, a))) {
                Ok(()) => {}
                Err(e) => {
                    let is_comm = matches!(e, RuntimeError::Comm { .. });
                    if first.as_ref().is_none_or(|(was_comm, _)| *was_comm && !is_comm) {
                        first = Some((is_comm, e));
                    }
                }
            }
        }
        first.map_or(Ok(()), |(_, e)| Err(e))
    }
}

impl Drop for LocalRanks {
    fn drop(&mut self) {
        for tx in &self.commands {
            let _ = tx.send(Command::Stop);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
