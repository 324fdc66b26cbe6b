//! Evaluation in parallel: the evaluation network (built for the evaluation batch size, without
//! dropout, BatchNorm on its moving statistics) planned as an inference job under the run's
//! parallel context, every rank running its part on its own parameter pieces: the pieces it
//! trained (moved to the inference job's layouts where its plan splits them otherwise), pieces
//! read from a checkpoint's files, or slices of full tensors a caller holds. No rank builds a
//! full tensor of a split parameter.
//!
//! Every rank reads each whole evaluation batch and the plan cuts its rows. A batch whose rows
//! the plan cannot split over the devices (the short last one, say 7 rows on 8 devices) runs
//! repeated until it can (`lcm(rows, devices)` rows): the mean loss of the repeated batch is the
//! batch's own, and only its first rows are scored.

use std::path::{Path, PathBuf};

use autopar_checkpoint::DType as CkDType;
use autopar_comm::Communicator;
use autopar_data::{DataLoader, LoaderConfig};
use autopar_tensor::Tensor;

use super::{DataSource, EvalResult, Io, PieceSource, TrainError, TrainResult, Trainer};
use crate::error::{CommPhase, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;
use crate::rank::{ParamSource, RankTrainer};
use crate::relayout::relayout_params;

/// Where the ranks of an evaluation take their parameters from.
pub(super) enum EvalParams<'a> {
    /// The pieces the rank stores under `job` (a training job of the same network).
    Trained {
        /// The job the pieces were stored under.
        job: &'a Job,
        /// The rank's pieces.
        store: &'a ParamStore,
        /// The bytes the training job's plan gave the rank, already checked against the
        /// machine: an evaluation job planned within them needs no further check.
        budget: u64,
    },
    /// Slices of full tensors.
    Full(&'a ParamStore),
    /// Pieces read from a checkpoint's files.
    Pieces(&'a PieceSource),
}

/// An inference job for evaluation batches of `rows` rows, planned for `rows * repeat`.
pub(super) struct EvalJob {
    rows: usize,
    repeat: usize,
    pub(super) job: Job,
    io: Io,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `feeds` with their rows repeated `times` times.
fn repeat_rows(feeds: Vec<(String, Tensor)>, times: usize) -> TrainResult<Vec<(String, Tensor)>> {
    if times == 1 {
        return Ok(feeds);
    }
    feeds
        .into_iter()
        .map(|(name, t)| {
            let copies: Vec<&Tensor> = std::iter::repeat_n(&t, times).collect();
            let joined = autopar_tensor::kernels::shape::concat(&copies, 0).map_err(|e| RuntimeError::Kernel {
                kind: "Concat",
                name: name.clone(),
                source: Box::new(e),
            })?;
            Ok((name, joined))
        })
        .collect()
}

impl Trainer {
    /// The inference job evaluating batches of `rows` rows on `devices` devices: planned for
    /// `rows`, else for the fewest repeats of them that the plan can split.
    pub(super) fn eval_job(&self, rows: usize, devices: usize) -> TrainResult<EvalJob> {
        let plan = |r: usize| -> TrainResult<(Job, Io)> {
            let mut net = self.network(r, false)?;
            net.graph.outputs = vec![net.loss, net.logits];
            let io = Io::of(&net.graph, &net);
            let job = Job::assemble(&autopar_parallel::JobRequest {
                graph: &net.graph,
                loss: None,
                context: &self.cfg.parallel,
                micro_batches: Some(1),
                pipeline_split: &self.cfg.pipeline_split,
                profile: self.cfg.profile.as_ref(),
                recompute: &autopar_graph::RecomputeChoice::AsBuilt,
                precision: self.cfg.precision,
            })?;
            Ok((job, io))
        };
        match plan(rows) {
            Ok((job, io)) => Ok(EvalJob { rows, repeat: 1, job, io }),
            Err(first) => {
                let repeat = devices / gcd(rows, devices).max(1);
                // Repeated rows would count as tokens of an expert's capacity: the batch's
                // choices would differ from its own.
                let capacity = |net: &autopar_graph::Graph| {
                    net.nodes().iter().any(|n| matches!(&n.op, autopar_graph::OpKind::RouterTopK(r) if r.capacity.is_some()))
                };
                if repeat <= 1 || self.network(rows, false).is_ok_and(|net| capacity(&net.graph)) {
                    return Err(first);
                }
                plan(rows * repeat).map(|(job, io)| EvalJob { rows, repeat, job, io }).map_err(|_| first)
            }
        }
    }

    /// This rank's part of evaluating `data` (every sample once, in order) with its
    /// parameters from `params`. Collective over `comm`, the job's ranks; every rank returns
    /// the whole result. With `output`, the rank reporting the outputs (the last stage's
    /// first) writes every sample's (or token position's) logits and predicted class to
    /// that file, batch by batch.
    pub(super) fn evaluate_rank(
        &self,
        comm: &dyn Communicator,
        params: EvalParams<'_>,
        data: &DataSource,
        output: Option<Predictions<'_>>,
    ) -> TrainResult<EvalResult> {
        let bs = self.cfg.eval_batch_size.max(1);
        let loader = DataLoader::new(
            data.dataset.clone(),
            data.transforms.clone(),
            LoaderConfig { prefetch: self.cfg.prefetch, ..LoaderConfig::eval(bs, 1, 0) },
        )?;
        let mut current: Option<(EvalJob, RankTrainer)> = None;
        // correct, scored, loss x samples, samples: summed on the rank reporting the outputs
        let mut tally = [0.0f64; 4];
        let mut written: Option<PredictionWriter> = None;
        for batch in loader.epoch(0) {
            let batch = batch?;
            let b = batch.len();
            if current.as_ref().map(|(j, _)| j.rows) != Some(b) {
                let next = self.eval_job(b, comm.size())?;
                // An evaluation job needing more than the training plan the run was checked
                // for must fit what the machine leaves beside what is held now.
                let memory = crate::budget::on_backend(&next.job.program(comm.rank())?, next.job.plan(), 0, comm)?;
                // The trained pieces stay held beside the evaluation job's.
                let (budgeted, held) = match &params {
                    EvalParams::Trained { budget, store, .. } => (*budget, store.iter().map(|(_, t)| t.nbytes() as u64).sum()),
                    _ => (0, 0),
                };
                let capacity = self.device_capacity();
                // Every rank decides alike (the check gathers every simulated rank's plan).
                let mut over = [(memory.total() as u64 + held).saturating_sub(budgeted) as f64];
                comm.all_reduce((&mut over[..]).into(), autopar_comm::ReduceOp::Max)
                    .map_err(|e| TrainError::from(RuntimeError::comm(CommPhase::MemoryCheck)(e)))?;
                if over[0] > 0.0 {
                    crate::budget::check_plan_fits(comm, &memory, capacity)?;
                }
                let rank = match (current.take(), &params) {
                    (Some((old, rank)), _) => {
                        let store = relayout_params(&old.job, &next.job, comm, rank.params())?;
                        drop(rank);
                        RankTrainer::new(&next.job, comm, ParamSource::Local(store))?
                    }
                    (None, EvalParams::Trained { job, store, .. }) => {
                        let store = relayout_params(job, &next.job, comm, store)?;
                        RankTrainer::new(&next.job, comm, ParamSource::Local(store))?
                    }
                    (None, EvalParams::Full(full)) => RankTrainer::new(&next.job, comm, ParamSource::Full(full))?,
                    (None, EvalParams::Pieces(source)) => {
                        let mut rank = RankTrainer::new(&next.job, comm, ParamSource::Init)?;
                        self.read_pieces(&mut rank, None, source, comm.rank())?;
                        rank.sync_shared_parameters()?;
                        rank
                    }
                };
                current = Some((next, rank));
            }
            let (job, rank) = current.as_mut().expect("made above");
            let named = job.io.feeds(batch, &self.name)?;
            let labels = named[1].1.to_f64_vec();
            let out = rank.predict(&repeat_rows(named, job.repeat)?)?;
            let (stages, stage_devices) = rank.pipeline_shape();
            // The last stage's first rank reports (every rank holds the outputs without stages).
            let Some(out) = out.filter(|_| comm.rank() == (stages - 1) * stage_devices) else { continue };
            let loss = out[0].to_f64_vec().iter().sum::<f64>();
            let logits = &out[1];
            let c = (*logits.shape().last().unwrap_or(&1)).max(1);
            let vals = logits.to_f64_vec();
            // Labels per row (or per token position): the first rows of a repeated batch.
            let classes: Vec<usize> = vals.chunks(c).zip(&labels).map(|(row, _)| predicted_class(row)).collect();
            if let Some(to) = &output {
                let file = match written.as_mut() {
                    Some(file) => file,
                    None => {
                        // Rows per sample: a sample's token positions (a gpt's), else one.
                        let per_sample = (vals.len() / c / (b * job.repeat).max(1)).min(labels.len() / b.max(1));
                        written.insert(PredictionWriter::create(to, data.dataset.len() * per_sample, c)?)
                    }
                };
                file.push(&vals[..classes.len() * c], &classes)?;
            }
            for (&class, &label) in classes.iter().zip(&labels) {
                tally[0] += f64::from(u8::from(class as f64 == label));
                tally[1] += 1.0;
            }
            tally[2] += loss * b as f64;
            tally[3] += b as f64;
        }
        // The file is in place before any rank returns (a failure to finish it fails the job
        // in the collective below).
        if let Some(file) = written {
            file.finish()?;
        }
        comm.all_reduce((&mut tally[..]).into(), autopar_comm::ReduceOp::Sum)
            .map_err(|e| TrainError::from(RuntimeError::comm(CommPhase::Run)(e)))?;
        let [correct, scored, loss_sum, samples] = tally;
        Ok(EvalResult {
            accuracy: if scored > 0.0 { correct / scored } else { 0.0 },
            loss: if samples > 0.0 { loss_sum / samples } else { 0.0 },
            predictions: scored as usize,
            samples: samples as usize,
            made_from_init: Vec::new(),
        })
    }
}

/// Where [`Trainer::evaluate_rank`] writes the outputs, and the checkpoint they come from
/// (named in the file's metadata).
#[derive(Clone, Copy)]
pub(super) struct Predictions<'a> {
    pub(super) output: &'a Path,
    pub(super) checkpoint: &'a Path,
}

/// The predictions file, written batch by batch as the outputs come: `logits`
/// `[predictions, classes]` (f32) and `predicted_class` `[predictions]` (i64, the first
/// largest logit of each row), safetensors, renamed into place when complete. Only the
/// predicted classes are held until the end.
struct PredictionWriter {
    path: PathBuf,
    file: autopar_checkpoint::SafetensorsWriter,
    classes: Vec<i64>,
}

impl PredictionWriter {
    fn create(to: &Predictions<'_>, rows: usize, columns: usize) -> TrainResult<Self> {
        let path = to.output;
        let metadata = [("checkpoint".to_string(), to.checkpoint.display().to_string())].into_iter().collect();
        let list =
            [("logits".to_string(), CkDType::Float32, vec![rows, columns]), ("predicted_class".to_string(), CkDType::Int64, vec![rows])];
        let file = autopar_checkpoint::SafetensorsWriter::create(path, &metadata, &list).map_err(|e| Self::err(path, e))?;
        Ok(Self { path: path.to_path_buf(), file, classes: Vec::with_capacity(rows) })
    }

    fn err(path: &Path, e: autopar_checkpoint::CheckpointError) -> TrainError {
        TrainError::Predictions { path: path.to_path_buf(), error: Box::new(e) }
    }

    /// The logits of the next rows, row-major, and the class each row predicts.
    fn push(&mut self, logits: &[f64], classes: &[usize]) -> TrainResult<()> {
        let bytes: Vec<u8> = logits.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect();
        self.file.write_part("logits", &bytes).map_err(|e| Self::err(&self.path, e))?;
        self.classes.extend(classes.iter().map(|&k| k as i64));
        Ok(())
    }

    fn finish(mut self) -> TrainResult<()> {
        let bytes: Vec<u8> = self.classes.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.file.write_tensor("predicted_class", &bytes).map_err(|e| Self::err(&self.path, e))?;
        self.file.finish().map_err(|e| Self::err(&self.path, e))
    }
}

/// The class a row of logits predicts: the position of its largest value, the first of equal
/// ones; a NaN never wins (a row of NaN predicts class 0).
pub fn predicted_class<T: PartialOrd + Copy>(row: &[T]) -> usize {
    let mut best: Option<(usize, T)> = None;
    for (i, &v) in row.iter().enumerate() {
        // `v == v` is false only for NaN.
        #[allow(clippy::eq_op)]
        let number = v == v;
        if number && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::predicted_class;

    #[test]
    fn the_predicted_class_is_the_first_largest_value_and_never_a_nan() {
        assert_eq!(predicted_class(&[0.1f32, 0.7, 0.2]), 1);
        assert_eq!(predicted_class(&[0.5f64, 0.9, 0.9]), 1);
        assert_eq!(predicted_class(&[f32::NAN, -1.0, -3.0]), 1);
        assert_eq!(predicted_class(&[2.0f64, f64::NAN, 3.0]), 2);
        assert_eq!(predicted_class(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(predicted_class::<f32>(&[]), 0);
    }
}
