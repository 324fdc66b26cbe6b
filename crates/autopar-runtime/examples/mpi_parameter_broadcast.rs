//! Run under `mpirun -n N` (N even): `parameter_broadcast` over `MpiComm`. Every process starts
//! its rank of a semi_auto_parallel MLP from parameters of its own (so replicas differ), calls
//! `parameter_broadcast` with the job's `parameter_layout_dict` and trains 3 steps. Checked on
//! every rank, over MPI: the replicated parameters differed between the ranks before and are
//! equal after. Rank 0 also runs the same ranks in-process over `LocalComm` and checks that the
//! broadcast and the training give the same bits. Prints `mpi-parameter-broadcast: OK ...` on
//! rank 0.
//!
//! With `bad` as an argument, rank 1 passes a wrong `cur_rank`: every rank must fail with that
//! error (exit 2) and none may hang.

use autopar_comm::{Communicator, LocalComm, MpiComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::{parameter_layout_dict, ParallelContext};
use autopar_runtime::ParamSource;
use autopar_runtime::{gather_full_params, Job, RankTrainer};
use autopar_runtime::{parameter_broadcast, LayoutSource, LrSchedule, Momentum, Optimizer, ParamStore};
use autopar_tensor::Tensor;

const STEPS: usize = 3;

/// An MLP whose first MatMul is split over 2 devices (the rest of each group holds replicas).
fn mlp(batch: usize) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(11);
    let x = b.input("x", &[batch, 16], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[16, 32], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[32], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let m1 = b.matmul("fc1.mm", x, w1).unwrap();
    b.shard(m1, "((1,1),(1,2))".parse().unwrap()).unwrap();
    let h = b.add("fc1.add", m1, b1).unwrap();
    let h = b.relu("act", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[32, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batches(batch: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut rng = autopar_data::Rng::new(0x5eed);
    let mut next = move || rng.next_u64();
    (0..STEPS)
        .map(|_| {
            let x: Vec<f32> = (0..batch * 16).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let y: Vec<i64> = (0..batch).map(|_| (next() % 8) as i64).collect();
            vec![("x".to_string(), Tensor::from_vec(&[batch, 16], x).unwrap()), ("y".to_string(), Tensor::from_vec(&[batch], y).unwrap())]
        })
        .collect()
}

/// The full parameters as rank `rank` initialises them: the job's, shifted by the rank.
fn seeded(full: &ParamStore, rank: usize) -> ParamStore {
    let mut out = ParamStore::new();
    for (name, t) in full.iter() {
        let v: Vec<f32> =
            t.to_f64_vec().iter().enumerate().map(|(i, x)| *x as f32 + (rank as f32 + 1.0) * 0.01 * ((i % 5) as f32 - 2.0)).collect();
        out.insert(name, Tensor::from_vec(t.shape(), v).unwrap());
    }
    out
}

/// One rank: start from its own values, broadcast, train. Returns its slices before and after
/// the broadcast, its losses and its trained slices.
fn rank_run(
    job: &Job,
    comm: &dyn Communicator,
    full: &ParamStore,
    cur_rank: usize,
) -> Result<(ParamStore, ParamStore, Vec<f64>, ParamStore), String> {
    let rank = comm.rank();
    let mut t = RankTrainer::new(job, comm, ParamSource::Full(&seeded(full, rank))).map_err(|e| e.to_string())?;
    let before = t.params().clone();
    let layout = LayoutSource::Dict(parameter_layout_dict(job.network(), rank, &|_| Vec::new()));
    parameter_broadcast(&mut t, None, comm, &layout, cur_rank, 0).map_err(|e| e.to_string())?;
    let after = t.params().clone();
    let mut opt: Box<dyn Optimizer> = Box::new(Momentum::new(LrSchedule::Constant(0.05), 0.9).map_err(|e| e.to_string())?);
    let mut losses = Vec::new();
    for batch in batches(job_batch(job)) {
        losses.push(t.step(opt.as_mut(), &batch).map_err(|e| e.to_string())?);
    }
    Ok((before, after, losses, t.params().clone()))
}

fn job_batch(job: &Job) -> usize {
    job.graph().nodes().iter().find(|n| n.name == "x").map_or(0, |n| n.ty.shape[0])
}

fn bits(s: &ParamStore) -> Vec<(String, Vec<u64>)> {
    s.iter().map(|(n, t)| (n.to_string(), t.to_f64_vec().iter().map(|x| x.to_bits()).collect())).collect()
}

fn main() {
    let bad = std::env::args().any(|a| a == "bad");
    let result = MpiComm::run(|comm| -> Result<(), String> {
        let n = comm.size();
        let (graph, loss) = mlp(16);
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &serde_json::json!(n)).map_err(|e| e.to_string())?;
        ctx.set("parallel_mode", &serde_json::json!("semi_auto_parallel")).map_err(|e| e.to_string())?;
        let job = Job::new(&graph, loss, &ctx).map_err(|e| e.to_string())?;
        let full = ParamStore::init(job.graph()).map_err(|e| e.to_string())?;
        let cur_rank = if bad && comm.rank() == 1 { 0 } else { comm.rank() };
        let (before, after, losses, trained) = rank_run(&job, &comm, &full, cur_rank)?;
        // Every rank sees every rank's replicated parameters, before and after the broadcast.
        for name in ["fc1.bias", "fc2.weight"] {
            let every = |store: &ParamStore| -> Result<Vec<Vec<u64>>, String> {
                let mine = store.require(name).map_err(|e| e.to_string())?.to_f64_vec();
                let mut all = vec![0.0f64; mine.len() * n];
                comm.all_gather((&mine).into(), (&mut all).into()).map_err(|e| e.to_string())?;
                Ok(all.chunks(mine.len()).map(|c| c.iter().map(|x| x.to_bits()).collect()).collect())
            };
            let (was, now) = (every(&before)?, every(&after)?);
            if was.windows(2).all(|w| w[0] == w[1]) {
                return Err(format!("{name}: the ranks started equal, so the check would prove nothing"));
            }
            if !now.windows(2).all(|w| w[0] == w[1]) {
                return Err(format!("rank {}: {name} differs between the ranks after the broadcast", comm.rank()));
            }
        }
        // Every rank's trained slices (each process holds its own).
        let Some(mpi_trained) = gather_full_params(&job, &comm, &trained).map_err(|e| e.to_string())? else { return Ok(()) };
        // The same ranks in process: the broadcast and the training give the same bits.
        let local = LocalComm::run(n, |c| rank_run(&job, &c, &full, c.rank())).map_err(|e| e.to_string())?;
        if bits(&before) != bits(&local[0].0) || bits(&after) != bits(&local[0].1) {
            return Err("rank 0's parameters after the MPI broadcast differ from the in-process broadcast".into());
        }
        if losses.iter().map(|x| x.to_bits()).ne(local[0].2.iter().map(|x| x.to_bits())) {
            return Err(format!("losses: MPI {losses:?}, in process {:?}", local[0].2));
        }
        let local_trained: Vec<ParamStore> = local.iter().map(|r| r.3.clone()).collect();
        let local_full = autopar_runtime::assemble_params(&job, &local_trained).map_err(|e| e.to_string())?;
        if bits(&mpi_trained) != bits(&local_full) {
            return Err("the trained parameters under MPI differ from the in-process run".into());
        }
        println!("mpi-parameter-broadcast: OK on {n} ranks: replicas differed before, equal after; {STEPS} steps bit-identical to LocalComm, losses {losses:?}");
        Ok(())
    });
    if let Err(e) = result {
        eprintln!("mpi-parameter-broadcast: {e}");
        std::process::exit(2);
    }
}
