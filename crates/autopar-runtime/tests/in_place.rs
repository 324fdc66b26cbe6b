//! A training step allocates its state once: on 2 data-parallel ranks the optimizer updates the
//! parameters and its state where they lie, and a bucket's gradients are reduced where the
//! backward pass left them (no bucket buffer is packed; `train::tests` checks the addresses).

use autopar_comm::LocalComm;
use autopar_models::{Mlp, MlpConfig, Mode, Model};
use autopar_runtime::ParamSource;
use autopar_runtime::{Job, RankTrainer};
use autopar_runtime::{LrSchedule, Momentum, Optimizer, ParamStore};
use autopar_tensor::Tensor;
use serde_json::json;

fn addresses(store: &ParamStore) -> Vec<(String, usize)> {
    store.iter().map(|(k, t)| (k.clone(), t.as_slice::<f32>().expect("contiguous f32").as_ptr() as usize)).collect()
}

#[test]
fn buckets_parameters_and_optimizer_state_keep_their_buffers_from_step_to_step() {
    let m = Mlp::new(MlpConfig { input_shape: vec![12], hidden: vec![16, 16], num_classes: 4 }).unwrap();
    let (graph, io) = m.build_graph(8, Mode::Train, 3).unwrap();
    let x = Tensor::from_vec(&[8, 12], (0..96).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect::<Vec<f32>>()).unwrap();
    let y = Tensor::from_vec(&[8], (0..8).map(|i| i % 4).collect::<Vec<i64>>()).unwrap();
    let batch = vec![(graph.node(io.x).name.clone(), x), (graph.node(io.labels).name.clone(), y)];
    let mut ctx = autopar_parallel::ParallelContext::default();
    ctx.set("device_num", &json!(2)).unwrap();
    ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
    let job = Job::new(&graph, io.loss, &ctx).unwrap();
    let full = ParamStore::init(job.graph()).unwrap();
    LocalComm::run(2, |comm| -> autopar_runtime::Result<()> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        assert_eq!(t.program().program.buckets.len(), 1, "one bucket for the small MLP");
        let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9)?;
        t.step(&mut opt, &batch)?;
        let (params, state) = (addresses(t.params()), addresses(opt.state()));
        for _ in 0..3 {
            let out = t.gradients(&batch)?;
            opt.step(t.params_mut(), &out.grads)?;
        }
        assert_eq!(addresses(t.params()), params, "parameters are updated in place");
        assert_eq!(addresses(opt.state()), state, "optimizer state is updated in place");
        Ok(())
    })
    .unwrap();
}
