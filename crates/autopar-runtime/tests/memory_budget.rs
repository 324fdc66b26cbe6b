//! The plan is the memory budget: a run whose plan does not fit what the machine allows is
//! refused before any tensor is made, naming the plan's figure and the limit; one that fits
//! trains, and reports the plan's memory of its ranks.

mod common;

use autopar_layout::Strategy;
use autopar_models::ModelOptions;
use autopar_parallel::ParallelContext;
use autopar_runtime::budget::Limit;
use autopar_runtime::{RuntimeError, TrainConfig, TrainError, Trainer};
use common::{builder, clusters, context, source};

fn mlp(width: usize, ctx: ParallelContext, strategies: Vec<(&'static str, Strategy)>) -> Trainer {
    let opts = ModelOptions { input_shape: Some(vec![16]), width: Some(width), depth: Some(2), num_classes: Some(4), ..Default::default() };
    let cfg = TrainConfig { epochs: 1, max_steps: Some(1), batch_size: 16, prefetch: 0, parallel: ctx, ..Default::default() };
    Trainer::new("mlp", builder("mlp", opts, strategies), source(clusters(&[16], 4, 64)), cfg)
}

fn refusal(e: TrainError) -> (u64, Limit, autopar_runtime::budget::Demand) {
    match e {
        TrainError::Runtime(RuntimeError::DoesNotFit { need, limit, demand }) => (need, *limit, *demand),
        other => panic!("expected the memory check's refusal, got: {other}"),
    }
}

#[test]
fn a_rank_over_device_memory_capacity_is_refused_with_its_figures_and_one_under_it_trains() {
    // auto_parallel's search checks each op alone against the capacity; the run checks each
    // rank's whole plan.
    let with_capacity = |bytes: Option<u64>| {
        let mut ctx = context("auto_parallel", 4);
        if let Some(b) = bytes {
            ctx.set_str("device_memory_capacity", &b.to_string()).unwrap();
        }
        mlp(256, ctx, vec![]).fit(vec![])
    };
    let fits = with_capacity(None).unwrap();
    assert!(fits.plan_memory > 0);
    // Above any single op's memory here, below a rank's plan: the search finds a plan (its ops
    // fit one by one), the run refuses it whole, before any step.
    let capacity = 200 << 10;
    let err = with_capacity(Some(capacity)).unwrap_err();
    let text = err.to_string();
    let (need, limit, demand) = refusal(err);
    assert_eq!(limit, Limit::DeviceCapacity { bytes: capacity });
    assert_eq!(need, demand.largest.total() as u64);
    assert!(need > capacity && demand.ranks == 4 && need * 4 >= demand.plan, "{demand:?}");
    assert!(text.contains("device_memory_capacity") && text.contains("the largest rank's plan needs") && text.contains("hint:"), "{text}");

    // With room, the same job trains.
    assert!(with_capacity(Some(1 << 30)).unwrap().plan_memory > 0);
}

#[test]
fn a_model_larger_than_the_machine_is_refused_before_any_tensor_is_made() {
    // fc2 alone is 1e12 f32 elements (4 TB): making it would fail, so the run passing this
    // point at all shows the refusal came first.
    let err = mlp(1_000_000, ParallelContext::default(), vec![]).fit(vec![]).unwrap_err();
    let text = err.to_string();
    let (need, limit, demand) = refusal(err);
    assert!(need > 4_000_000_000_000, "{text}");
    assert!(matches!(limit, Limit::Available { .. } | Limit::Cgroup { .. } | Limit::AddressSpace { .. }), "{limit:?}");
    assert_eq!(demand.ranks, 1);
    assert!(text.contains("this process needs, by the plan,") && text.contains("parameters"), "{text}");

    // Split over 4 simulated ranks, the process still holds it all: refused alike.
    let split = vec![("fc2.matmul", Strategy(vec![vec![1, 4], vec![1, 4]]))];
    let (_, _, demand) = refusal(mlp(1_000_000, context("semi_auto_parallel", 4), split).fit(vec![]).unwrap_err());
    assert_eq!(demand.ranks, 4);
    assert!(demand.largest.total() as u64 * 4 >= demand.plan && demand.plan > 4_000_000_000_000, "{demand:?}");
}
