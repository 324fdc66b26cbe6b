//! Run under `mpirun -n 4`: pipeline inference over `MpiComm`, 2 stages of 2 ranks, 2 chunks
//! per stage (interleaved), 3 micro-batches. With `pipeline_result_broadcast` every rank gets
//! the network's outputs, equal to the stand-alone forward on the whole batch (relative 1e-5);
//! without it only the last stage's ranks do. Prints `mpi-pipeline-predict: OK ...` on rank 0
//! and exits 0 on success.

use autopar_comm::{Communicator, MpiComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::ParallelContext;
use autopar_runtime::ParamSource;
use autopar_runtime::{Executor, ParamStore};
use autopar_runtime::{Job, RankTrainer};
use autopar_tensor::Tensor;
use serde_json::json;

/// Four dense blocks on stages 0, 1, 0, 1 (two chunks per stage); the output is the logits.
fn network(batch: usize, staged: bool) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[batch, 8], DType::F32).unwrap();
    let mut h = x;
    for i in 0..4 {
        b.set_pipeline_stage(staged.then_some(i % 2));
        h = b.dense(&format!("block{i}"), h, 8, Initializer::HeUniform).unwrap();
        h = b.relu(&format!("block{i}.relu"), h).unwrap();
    }
    b.output(h).unwrap();
    (b.finish(), h)
}

fn main() {
    let result = MpiComm::run(|comm| -> Result<String, String> {
        let (n, micro) = (comm.size(), 3usize);
        let batch = micro * 4;
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let x: Vec<f32> = (0..batch * 8).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let x = Tensor::from_vec(&[batch, 8], x).map_err(|x| e(&x))?;
        let (g1, out1) = network(batch, false);
        let mut alone = ParamStore::init(&g1).map_err(|x| e(&x))?;
        let want = Executor::new(g1.clone(), &[out1])
            .map_err(|x| e(&x))?
            .run(&mut alone, &[(g1.find("x").unwrap(), x.clone())], 0)
            .map_err(|x| e(&x))?
            .values
            .remove(0);
        let (g, _) = network(batch / micro, true);
        let mut got_any = Vec::new();
        for broadcast in [true, false] {
            let mut ctx = ParallelContext::default();
            for (k, v) in [
                ("device_num", json!(n)),
                ("parallel_mode", json!("semi_auto_parallel")),
                ("pipeline_stages", json!(2)),
                ("pipeline_config", json!({"pipeline_interleave": true})),
                ("pipeline_result_broadcast", json!(broadcast)),
            ] {
                ctx.set(k, &v).map_err(|x| e(&x))?;
            }
            let job = Job::inference(&g, &ctx, micro).map_err(|x| e(&x))?;
            let full = ParamStore::init(&job.plan().plan.graph).map_err(|x| e(&x))?;
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full)).map_err(|x| e(&x))?;
            let out = t.predict(&[("x".to_string(), x.clone())]).map_err(|x| e(&x))?;
            let last_stage = comm.rank() >= n / 2;
            match out {
                Some(o) if broadcast || last_stage => {
                    if !o[0].allclose(&want, 1e-5, 1e-6) {
                        return Err(format!("rank {}: outputs differ from stand-alone by {:?}", comm.rank(), o[0].max_abs_diff(&want)));
                    }
                    got_any.push(broadcast);
                }
                None if !broadcast && !last_stage => {}
                other => return Err(format!("rank {} (broadcast {broadcast}): got {:?}", comm.rank(), other.map(|o| o.len()))),
            }
        }
        Ok(format!("rank {} of {n}: outputs with broadcast {:?}", comm.rank(), got_any))
    });
    match result {
        Ok(line) if line.starts_with("rank 0 ") => println!("mpi-pipeline-predict: OK {line}"),
        Ok(_) => {}
        Err(err) => {
            eprintln!("mpi-pipeline-predict: {err}");
            std::process::exit(2);
        }
    }
}
