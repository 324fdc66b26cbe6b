//! Pipeline schedules as data: what each stage runs, in order.
//!
//! The model is cut into `stages * chunks` pieces; piece `k` lives on stage `k % stages` as its
//! chunk `k / stages` (one chunk per stage without interleaving, `chunks` virtual stages with it).
//! A micro-batch's forward runs the pieces in order and its backward in reverse; between pieces
//! on different stages the forward sends activations and the backward sends their gradients.
//!
//! [`build`] first fixes each stage's compute order (the scheduler's rule: GPipe runs every
//! forward, then every backward; 1F1B warms up with a few forwards, then alternates), then lays
//! all stages' work out on one global timeline, emitting each transfer as a send on the producer
//! and the matching receive on the consumer next to each other. Every stage's actions are its
//! projection of that one global order, so they cannot deadlock even when every send blocks
//! until its receive is posted (MPI past its eager limit): each send meets its receive in the
//! order both ranks reach them. [`simulate`] checks exactly that under blocking sends, and
//! measures the step's length, each stage's idle share (the bubble) and the micro-batches each
//! stage holds activations for.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use crate::context::PipelineScheduler;

/// The size of a pipeline: stages, micro-batches per step, chunks (virtual stages) per stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PipelineShape {
    /// Pipeline stages.
    pub stages: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Chunks per stage: 1 without interleaving, the virtual stages with it.
    pub chunks: usize,
}

impl PipelineShape {
    /// The shape of `stages` stages, `micro_batches` micro-batches and `chunks` chunks per stage.
    pub fn new(stages: usize, micro_batches: usize, chunks: usize) -> Self {
        Self { stages, micro_batches, chunks }
    }

    /// Pieces of the model: `stages * chunks`.
    pub fn pieces(&self) -> usize {
        self.stages * self.chunks
    }

    /// The stage that holds piece `k`, and its chunk there.
    pub fn place(&self, piece: usize) -> (usize, usize) {
        (piece % self.stages, piece / self.stages)
    }

    /// The piece that is chunk `chunk` of stage `stage`.
    pub fn piece(&self, stage: usize, chunk: usize) -> usize {
        chunk * self.stages + stage
    }

    fn check(&self) -> Result<(), ScheduleError> {
        if self.stages == 0 || self.micro_batches == 0 || self.chunks == 0 {
            return Err(ScheduleError::Empty { shape: *self });
        }
        Ok(())
    }
}

/// Forward or backward pass of one piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// The forward pass.
    Forward,
    /// The backward pass.
    Backward,
}

/// One pass of one chunk of a stage over one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Work {
    /// Forward or backward.
    pub pass: Pass,
    /// The chunk of the stage, counted from 0.
    pub chunk: usize,
    /// The micro-batch, counted from 0.
    pub micro: usize,
}

impl Work {
    /// The forward of chunk `chunk` over micro-batch `micro`.
    pub fn forward(chunk: usize, micro: usize) -> Self {
        Self { pass: Pass::Forward, chunk, micro }
    }

    /// The backward of chunk `chunk` over micro-batch `micro`.
    pub fn backward(chunk: usize, micro: usize) -> Self {
        Self { pass: Pass::Backward, chunk, micro }
    }
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = if self.pass == Pass::Forward { 'F' } else { 'B' };
        write!(f, "{p}{}", self.micro)?;
        if self.chunk > 0 {
            write!(f, ".{}", self.chunk)?;
        }
        Ok(())
    }
}

/// One step of a stage's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Run a pass.
    Compute(Work),
    /// Send what `work` produced (activations of a forward, input gradients of a backward) to
    /// stage `peer`.
    Send {
        /// The pass whose result is sent.
        work: Work,
        /// The receiving stage.
        peer: usize,
    },
    /// Receive from stage `peer` what `work` needs before it runs.
    Recv {
        /// The pass that needs what is received.
        work: Work,
        /// The sending stage.
        peer: usize,
    },
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Compute(w) => write!(f, "{w}"),
            Action::Send { work, peer } => write!(f, "send {work} to stage {peer}"),
            Action::Recv { work, peer } => write!(f, "recv for {work} from stage {peer}"),
        }
    }
}

/// Each stage's actions, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The pipeline's size.
    pub shape: PipelineShape,
    /// The scheduler that ordered the passes.
    pub scheduler: PipelineScheduler,
    /// Each stage's actions, indexed by stage.
    pub stages: Vec<Vec<Action>>,
}

/// Why a pipeline schedule cannot be built, or does not run under blocking sends.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A shape with no stage, no micro-batch or no chunk.
    #[error("a pipeline needs at least one stage, micro-batch and chunk, got {} stages, {} micro-batches, {} chunks\nhint: pass `micro_batches=M` with M >= 1", shape.stages, shape.micro_batches, shape.chunks)]
    Empty {
        /// The shape given.
        shape: PipelineShape,
    },
    /// A schedule in which some stage waits forever when every send blocks until its receive is posted.
    #[error("the pipeline schedule deadlocks with blocking sends\n  {}\nhint: this is a bug in autopar's schedules; please report it with `pipeline_stages` and `micro_batches`", blocked.join("\n  "))]
    Deadlock {
        /// Each blocked stage and what it waits at, in words.
        blocked: Vec<String>,
    },
    /// A schedule [`simulate`] finds wrong (a pass out of the pipeline, run twice, missing or too early; a mismatched send).
    #[error("the pipeline schedule of stage {stage} is wrong: {problem}\nhint: this is a bug in autopar's schedules; please report it")]
    Invalid {
        /// The stage whose actions are wrong, counted from 0 (the number of stage lists when that number is wrong).
        stage: usize,
        /// What is wrong, in words.
        problem: String,
    },
}

/// Every stage's forwards and backwards in the order it takes them: micro-batches go through
/// the chunks in rounds of `stages` (the last round may be short), forwards chunk by chunk,
/// backwards from the last chunk down.
fn pass_orders(shape: PipelineShape) -> (Vec<Work>, Vec<Work>) {
    let PipelineShape { stages, micro_batches: m, chunks } = shape;
    let round = stages.min(m);
    let rounds: Vec<std::ops::Range<usize>> = (0..m).step_by(round).map(|r| r..(r + round).min(m)).collect();
    let forwards = rounds.iter().flat_map(|r| (0..chunks).flat_map(move |c| r.clone().map(move |mi| Work::forward(c, mi)))).collect();
    let backwards =
        rounds.iter().flat_map(|r| (0..chunks).rev().flat_map(move |c| r.clone().map(move |mi| Work::backward(c, mi)))).collect();
    (forwards, backwards)
}

/// The most forwards stage `stage` runs ahead of their backwards: 1F1B warms up with
/// `stages - 1 - stage` forwards (`(chunks-1)*stages + 2*(stages-1-stage)` interleaved, as
/// Megatron's and MindSpore's interleaved 1F1B) and then alternates; GPipe runs them all.
pub fn in_flight_limit(shape: PipelineShape, scheduler: PipelineScheduler, stage: usize) -> usize {
    let PipelineShape { stages, micro_batches: m, chunks } = shape;
    let warmup = match scheduler {
        PipelineScheduler::GPipe => return chunks * m,
        PipelineScheduler::OneFOneB if chunks == 1 => stages - 1 - stage,
        PipelineScheduler::OneFOneB => (chunks - 1) * stages.min(m) + 2 * (stages - 1 - stage),
    };
    (warmup + 1).min(chunks * m)
}

/// The work whose result `w` (on `stage`) needs from a neighbouring piece, and its stage.
fn remote_input(shape: PipelineShape, stage: usize, w: Work) -> Option<(usize, Work)> {
    let k = shape.piece(stage, w.chunk);
    let src = match w.pass {
        Pass::Forward if k > 0 => k - 1,
        Pass::Backward if k + 1 < shape.pieces() => k + 1,
        _ => return None,
    };
    let (s, c) = shape.place(src);
    Some((s, Work { chunk: c, ..w }))
}

/// Where the result of `w` (on `stage`) goes: the stage and the work that consumes it.
fn remote_output(shape: PipelineShape, stage: usize, w: Work) -> Option<(usize, Work)> {
    let k = shape.piece(stage, w.chunk);
    let dst = match w.pass {
        Pass::Forward if k + 1 < shape.pieces() => k + 1,
        Pass::Backward if k > 0 => k - 1,
        _ => return None,
    };
    let (s, c) = shape.place(dst);
    Some((s, Work { chunk: c, ..w }))
}

/// Every stage's actions. The stages' work is laid out on one timeline (a chunk's forward
/// costs 1, its backward 2): whenever a stage is free it takes, of its next forward and next
/// backward whose inputs have arrived, the forward while it holds fewer than
/// [`in_flight_limit`] forwards (GPipe: until every forward ran), the backward otherwise. Each
/// finished pass's result is then sent to the stage that needs it, the send and its receive
/// adjacent in the global order.
pub fn build(shape: PipelineShape, scheduler: PipelineScheduler) -> Result<Schedule, ScheduleError> {
    shape.check()?;
    let p = shape.stages;
    let (forwards, backwards) = pass_orders(shape);
    let cost = |w: Work| if w.pass == Pass::Forward { 1u64 } else { 2 };
    let limits: Vec<usize> = (0..p).map(|s| in_flight_limit(shape, scheduler, s)).collect();
    let (mut next_f, mut next_b) = (vec![0usize; p], vec![0usize; p]);
    let mut clock = vec![0u64; p];
    // When each stage's own passes finished, and when what it received arrived.
    let mut finished: Vec<HashMap<Work, u64>> = vec![HashMap::new(); p];
    let mut arrived: Vec<HashMap<Work, u64>> = vec![HashMap::new(); p];
    // Finished passes whose result is still to be sent: (time, stage, work).
    let mut outbox: BTreeSet<(u64, usize, Work)> = BTreeSet::new();
    let mut stages: Vec<Vec<Action>> = vec![Vec::new(); p];
    let total = forwards.len() + backwards.len();
    // When `w` could start on stage `s` (None: an input is missing).
    let available = |s: usize, w: Work, finished: &[HashMap<Work, u64>], arrived: &[HashMap<Work, u64>]| -> Option<u64> {
        let mut t = 0u64;
        if let Some((src, dep)) = remote_input(shape, s, w) {
            t = t.max(if src == s { *finished[s].get(&dep)? } else { *arrived[s].get(&w)? });
        }
        if w.pass == Pass::Backward {
            t = t.max(*finished[s].get(&Work::forward(w.chunk, w.micro))?);
        }
        Some(t)
    };
    loop {
        // Each stage's pick and its start time, under the in-flight limit; if no stage can
        // start anything, the lowest stage may exceed its limit (a short last round of an
        // interleaved pipeline needs it).
        let mut pick: Option<(u64, usize, Work)> = None;
        for relax in [false, true] {
            for s in 0..p {
                let in_flight = next_f[s] - next_b[s];
                let f = forwards.get(next_f[s]).copied();
                let b = backwards.get(next_b[s]).copied();
                let f_ok = |w: Work| match scheduler {
                    PipelineScheduler::GPipe => Some(w),
                    PipelineScheduler::OneFOneB => (relax || in_flight < limits[s]).then_some(w),
                };
                let fa = f.and_then(f_ok).and_then(|w| available(s, w, &finished, &arrived).map(|t| (t.max(clock[s]), w)));
                let ba = b.filter(|_| scheduler != PipelineScheduler::GPipe || f.is_none());
                let ba = ba.and_then(|w| available(s, w, &finished, &arrived).map(|t| (t.max(clock[s]), w)));
                // The earlier start; at the same time, the forward below the limit, else the backward.
                let choice = match (fa, ba) {
                    (Some(x), Some(y)) => Some(if x.0 < y.0 || (x.0 == y.0 && in_flight < limits[s]) { x } else { y }),
                    (x, y) => x.or(y),
                };
                if let Some((t, w)) = choice {
                    if pick.is_none_or(|(pt, _, _)| t < pt) {
                        pick = Some((t, s, w));
                    }
                }
            }
            if pick.is_some() || !outbox.is_empty() {
                break;
            }
        }
        // Transfers finished by then go first.
        if let Some(&(t, s, w)) = outbox.first() {
            if pick.is_none_or(|(pt, _, _)| t <= pt) {
                outbox.pop_first();
                let (dst, consumer) = remote_output(shape, s, w).expect("only passes with a remote output are queued");
                stages[s].push(Action::Send { work: w, peer: dst });
                stages[dst].push(Action::Recv { work: consumer, peer: s });
                arrived[dst].insert(consumer, t);
                continue;
            }
        }
        let Some((t, s, w)) = pick else { break };
        if w.pass == Pass::Forward {
            next_f[s] += 1;
        } else {
            next_b[s] += 1;
        }
        clock[s] = t + cost(w);
        finished[s].insert(w, clock[s]);
        stages[s].push(Action::Compute(w));
        if let Some((dst, _)) = remote_output(shape, s, w) {
            if dst != s {
                outbox.insert((clock[s], s, w));
            }
        }
    }
    let blocked: Vec<String> = (0..p)
        .filter(|&s| next_f[s] + next_b[s] < total)
        .map(|s| {
            let w = forwards.get(next_f[s]).or(backwards.get(next_b[s])).expect("work is left");
            format!("stage {s} waits to run {w}")
        })
        .collect();
    if !blocked.is_empty() {
        return Err(ScheduleError::Deadlock { blocked });
    }
    Ok(Schedule { shape, scheduler, stages })
}

/// Costs of the simulated actions, in any unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimCosts {
    /// One chunk's forward over one micro-batch.
    pub forward: f64,
    /// One chunk's backward over one micro-batch.
    pub backward: f64,
    /// One transfer (the receiver waits for it).
    pub transfer: f64,
}

impl SimCosts {
    /// A whole stage's forward costs 1 and its backward 2; chunks share them; transfers are free.
    pub fn unit(shape: PipelineShape) -> Self {
        let c = shape.chunks as f64;
        Self { forward: 1.0 / c, backward: 2.0 / c, transfer: 0.0 }
    }
}

/// What [`simulate`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    /// When the last stage finished.
    pub makespan: f64,
    /// Each stage's busy time (compute only).
    pub busy: Vec<f64>,
    /// Each stage's most (chunk, micro-batch) forwards whose backward had not run yet.
    pub peak_in_flight: Vec<usize>,
    /// Each stage's passes in the order they ran: the work, its start and its end.
    pub spans: Vec<Vec<(Work, f64, f64)>>,
}

impl Simulation {
    /// The pipeline's idle share: the stages' mean of idle time over the makespan.
    pub fn bubble(&self) -> f64 {
        if self.makespan <= 0.0 {
            return 0.0;
        }
        let p = self.busy.len() as f64;
        self.busy.iter().map(|b| 1.0 - b / self.makespan).sum::<f64>() / p
    }
}

/// The ideal bubble of a schedule of this shape: `(P-1)/(v*M+P-1)`.
pub fn ideal_bubble(shape: PipelineShape) -> f64 {
    let p = shape.stages as f64;
    (p - 1.0) / ((shape.chunks * shape.micro_batches) as f64 + p - 1.0)
}

/// Runs the schedule with blocking sends (a send completes only when its receive is reached;
/// in time, the receiver then has the data `transfer` after the send started) and checks it: every forward and backward of every chunk
/// and micro-batch runs exactly once on its stage, after the values it needs arrived (the
/// previous piece's activations, the next piece's gradients, its own forward), every send meets
/// the receive it is meant for, and nothing deadlocks.
pub fn simulate(schedule: &Schedule, costs: SimCosts) -> Result<Simulation, ScheduleError> {
    let shape = schedule.shape;
    shape.check()?;
    let p = shape.stages;
    if schedule.stages.len() != p {
        return Err(ScheduleError::Invalid {
            stage: schedule.stages.len(),
            problem: format!("{} stage lists for {p} stages", schedule.stages.len()),
        });
    }
    let invalid = |stage: usize, problem: String| ScheduleError::Invalid { stage, problem };
    let mut pc = vec![0usize; p];
    let mut clock = vec![0.0f64; p];
    let mut busy = vec![0.0f64; p];
    let mut ran: Vec<BTreeSet<Work>> = vec![BTreeSet::new(); p];
    let mut received: Vec<BTreeSet<Work>> = vec![BTreeSet::new(); p];
    let mut in_flight = vec![0usize; p];
    let mut peak = vec![0usize; p];
    let mut spans: Vec<Vec<(Work, f64, f64)>> = vec![Vec::new(); p];
    loop {
        let mut progressed = false;
        for s in 0..p {
            while let Some(&a) = schedule.stages[s].get(pc[s]) {
                match a {
                    Action::Compute(w) => {
                        if w.chunk >= shape.chunks || w.micro >= shape.micro_batches {
                            return Err(invalid(s, format!("{w} is outside the pipeline")));
                        }
                        if let Some((src, _)) = remote_input(shape, s, w) {
                            let have =
                                if src == s { ran[s].contains(&remote_input(shape, s, w).unwrap().1) } else { received[s].contains(&w) };
                            if !have {
                                return Err(invalid(s, format!("{w} runs before what it needs from stage {src} arrived")));
                            }
                        }
                        if w.pass == Pass::Backward {
                            if !ran[s].contains(&Work::forward(w.chunk, w.micro)) {
                                return Err(invalid(s, format!("{w} runs before its forward")));
                            }
                            in_flight[s] -= 1;
                        } else {
                            in_flight[s] += 1;
                            peak[s] = peak[s].max(in_flight[s]);
                        }
                        if !ran[s].insert(w) {
                            return Err(invalid(s, format!("{w} runs twice")));
                        }
                        let dt = if w.pass == Pass::Forward { costs.forward } else { costs.backward };
                        spans[s].push((w, clock[s], clock[s] + dt));
                        clock[s] += dt;
                        busy[s] += dt;
                        pc[s] += 1;
                        progressed = true;
                    }
                    Action::Send { work, peer } => {
                        if peer >= p {
                            return Err(invalid(s, format!("it sends to stage {peer}")));
                        }
                        if !ran[s].contains(&work) {
                            return Err(invalid(s, format!("it sends the result of {work} before running it")));
                        }
                        // The peer must be receiving from this stage; a receive from another
                        // stage keeps this send waiting.
                        let Some(Action::Recv { work: got, peer: from }) = schedule.stages[peer].get(pc[peer]).copied() else { break };
                        if from != s {
                            break;
                        }
                        if remote_output(shape, s, work) != Some((peer, got)) {
                            return Err(invalid(s, format!("its send of {work} meets stage {peer}'s receive for {got} from stage {from}")));
                        }
                        // Blocking for progress; in time the sender goes on (as an eager or
                        // non-blocking send does) and the receiver has the data after the transfer.
                        clock[peer] = clock[peer].max(clock[s] + costs.transfer);
                        received[peer].insert(got);
                        pc[s] += 1;
                        pc[peer] += 1;
                        progressed = true;
                    }
                    // A receive waits for its sender to reach the matching send.
                    Action::Recv { .. } => break,
                }
            }
        }
        if pc.iter().zip(&schedule.stages).all(|(&i, a)| i == a.len()) {
            break;
        }
        if !progressed {
            let blocked = (0..p)
                .filter(|&s| pc[s] < schedule.stages[s].len())
                .map(|s| format!("stage {s} is blocked at: {}", schedule.stages[s][pc[s]]))
                .collect();
            return Err(ScheduleError::Deadlock { blocked });
        }
    }
    for (s, ran) in ran.iter().enumerate() {
        let want = 2 * shape.chunks * shape.micro_batches;
        if ran.len() != want {
            return Err(invalid(
                s,
                format!("it runs {} passes, expected {want} (every chunk's forward and backward of every micro-batch)", ran.len()),
            ));
        }
    }
    let makespan = clock.iter().copied().fold(0.0, f64::max);
    Ok(Simulation { makespan, busy, peak_in_flight: peak, spans })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn both() -> [PipelineScheduler; 2] {
        [PipelineScheduler::GPipe, PipelineScheduler::OneFOneB]
    }

    #[test]
    fn every_schedule_up_to_eight_stages_runs_each_pass_once_without_deadlock() {
        for p in 1..=8 {
            for v in 1..=4 {
                for m in 1..=16 {
                    for sched in both() {
                        let shape = PipelineShape::new(p, m, v);
                        let s = build(shape, sched).unwrap_or_else(|e| panic!("{shape:?} {sched:?}: {e}"));
                        simulate(&s, SimCosts::unit(shape)).unwrap_or_else(|e| panic!("{shape:?} {sched:?}: {e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_holds_at_most_p_minus_s_micro_batches_and_gpipe_all() {
        for p in 1..=8 {
            for m in 1..=16 {
                let shape = PipelineShape::new(p, m, 1);
                let one = simulate(&build(shape, PipelineScheduler::OneFOneB).unwrap(), SimCosts::unit(shape)).unwrap();
                let g = simulate(&build(shape, PipelineScheduler::GPipe).unwrap(), SimCosts::unit(shape)).unwrap();
                for s in 0..p {
                    assert!(one.peak_in_flight[s] <= p - s, "{shape:?} stage {s}: {}", one.peak_in_flight[s]);
                    assert_eq!(one.peak_in_flight[s], (p - s).min(m));
                    assert_eq!(g.peak_in_flight[s], m);
                }
            }
        }
    }

    #[test]
    fn bubbles_are_the_textbook_fractions() {
        for p in 1..=8 {
            for m in [p, 2 * p, 2 * p + 1, 16] {
                for v in 1..=4 {
                    let shape = PipelineShape::new(p, m, v);
                    for sched in both() {
                        if v > 1 && (sched == PipelineScheduler::GPipe || m % p != 0) {
                            continue;
                        }
                        let sim = simulate(&build(shape, sched).unwrap(), SimCosts::unit(shape)).unwrap();
                        let want = ideal_bubble(shape);
                        assert!((sim.bubble() - want).abs() < 1e-9, "{shape:?} {sched:?}: bubble {} vs {want}", sim.bubble());
                    }
                }
            }
        }
    }

    #[test]
    fn a_schedule_with_a_send_before_its_compute_is_refused() {
        let shape = PipelineShape::new(2, 1, 1);
        let mut s = build(shape, PipelineScheduler::GPipe).unwrap();
        s.stages[0].swap(0, 1);
        assert!(matches!(simulate(&s, SimCosts::unit(shape)), Err(ScheduleError::Invalid { stage: 0, .. })));
    }

    #[test]
    fn crossed_blocking_sends_are_found_as_a_deadlock() {
        // Both stages send first, then receive: with blocking sends neither gets past its send.
        let shape = PipelineShape::new(2, 2, 1);
        let f = |m| Work::forward(0, m);
        let b = |m| Work::backward(0, m);
        let s0 = vec![
            Action::Compute(f(0)),
            Action::Send { work: f(0), peer: 1 },
            Action::Compute(f(1)),
            Action::Send { work: f(1), peer: 1 },
            Action::Recv { work: b(0), peer: 1 },
            Action::Compute(b(0)),
            Action::Recv { work: b(1), peer: 1 },
            Action::Compute(b(1)),
        ];
        let s1 = vec![
            Action::Recv { work: f(0), peer: 0 },
            Action::Compute(f(0)),
            Action::Compute(b(0)),
            Action::Send { work: b(0), peer: 0 },
            Action::Recv { work: f(1), peer: 0 },
            Action::Compute(f(1)),
            Action::Compute(b(1)),
            Action::Send { work: b(1), peer: 0 },
        ];
        let sched = Schedule { shape, scheduler: PipelineScheduler::OneFOneB, stages: vec![s0, s1] };
        assert!(matches!(simulate(&sched, SimCosts::unit(shape)), Err(ScheduleError::Deadlock { .. })));
    }

    #[test]
    fn empty_shapes_are_refused() {
        assert!(matches!(build(PipelineShape::new(2, 0, 1), PipelineScheduler::GPipe), Err(ScheduleError::Empty { .. })));
    }

    proptest! {
        #[test]
        fn schedules_stay_valid_under_any_costs(p in 1usize..6, m in 1usize..10, v in 1usize..4, f in 0.1f64..3.0, b in 0.1f64..3.0, t in 0.0f64..1.0, gpipe in any::<bool>()) {
            let sched = if gpipe { PipelineScheduler::GPipe } else { PipelineScheduler::OneFOneB };
            let shape = PipelineShape::new(p, m, v);
            let s = build(shape, sched).unwrap();
            let sim = simulate(&s, SimCosts { forward: f, backward: b, transfer: t }).unwrap();
            // No stage can finish before doing its own work.
            for busy in &sim.busy {
                prop_assert!(sim.makespan + 1e-9 >= *busy);
            }
        }
    }
}
