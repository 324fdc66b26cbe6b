//! Strategy files written for the fixture network equal MindSpore's, and load back.

use std::path::PathBuf;

use autopar_checkpoint::StrategyFile;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer};
use autopar_layout::Strategy;
use autopar_parallel::strategy_files::{load_strategy_items, save_strategy_file, strategy_file};
use autopar_parallel::{plan, plan_network, ParallelContext, PlanRequest, StrategySource};
use serde_json::json;

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

fn network(shard: bool) -> Graph {
    let s = |t: &str| -> Strategy { t.parse().unwrap() };
    let mut b = GraphBuilder::new(0);
    let x = b.input("inputs0", &[256, 64], DType::F32).unwrap();
    let mut h = x;
    for (name, din, dout, mm, add, relu) in
        [("l1", 64, 128, "((2,1),(1,4))", "((2,4),(4,))", "((2,4),)"), ("l2", 128, 32, "((2,4),(4,1))", "((2,1),(1,))", "((2,1),)")]
    {
        let w = b.parameter(&format!("{name}.w"), &[din, dout], Initializer::Constant(0.01)).unwrap();
        let bias = b.parameter(&format!("{name}.b"), &[dout], Initializer::Zeros).unwrap();
        let m = b.matmul(&format!("{name}.mm"), h, w).unwrap();
        let a = b.add(&format!("{name}.add"), m, bias).unwrap();
        let r = b.relu(&format!("{name}.relu"), a).unwrap();
        if shard {
            b.shard(m, s(mm)).unwrap();
            b.shard(a, s(add)).unwrap();
            b.shard(r, s(relu)).unwrap();
        }
        h = r;
    }
    let head = b.parameter("head.w", &[32, 16], Initializer::Constant(0.01)).unwrap();
    let m = b.matmul("head.mm", h, head).unwrap();
    if shard {
        b.shard(m, s("((8,1),(1,1))")).unwrap();
    }
    let loss = b.reduce_mean("loss", m, &[], false).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

fn ctx() -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(8)).unwrap();
    c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    c
}

fn sorted(mut f: StrategyFile) -> StrategyFile {
    f.strategy_items.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    f.layout_items.sort_by(|a, b| a.name.cmp(&b.name));
    f
}

#[test]
fn semi_all_strategy_file_matches_mindspores() {
    let g = network(true);
    let p = plan(&g, &ctx()).unwrap();
    let ours = sorted(strategy_file(&p, true, &|_| Vec::new()));
    let theirs = sorted(StrategyFile::load(fixtures().join("strategies/semi_json/strategy_rank0.json")).unwrap());
    assert_eq!(ours.strategy_items, theirs.strategy_items);
    assert_eq!(ours.layout_items.len(), theirs.layout_items.len());
    for (a, b) in ours.layout_items.iter().zip(&theirs.layout_items) {
        assert_eq!((&a.name, &a.dev_matrix, a.map(), &a.tensor_shape), (&b.name, &b.dev_matrix, b.map(), &b.tensor_shape));
    }
    // The protobuf fixture holds the same layouts.
    let pb = sorted(StrategyFile::load(fixtures().join("strategies/semi_all/strategy_rank0.ckpt")).unwrap());
    assert_eq!(ours.strategy_items, pb.strategy_items);
}

#[test]
fn a_saved_strategy_file_loads_back_onto_an_unannotated_network() {
    let dir = std::env::temp_dir().join(format!("autopar-strategy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = network(true);
    let p = plan(&g, &ctx()).unwrap();
    for name in ["s.json", "s.ckpt"] {
        let path = dir.join(name);
        save_strategy_file(&p, &path, true, &|_| Vec::new()).unwrap();
        let fresh = network(false);
        let items = load_strategy_items(&path).unwrap();
        assert_eq!(items.items.len(), 5);
        let c = ctx();
        let p2 = plan_network(&PlanRequest { graph: &fresh, loss: None, context: &c, strategy_file: Some(&items), profile: None }).unwrap();
        assert_eq!(p2.nodes.iter().filter(|n| n.source == Some(StrategySource::StrategyFile)).count(), 5);
        assert_eq!(p2.strategy_file.as_deref(), Some(path.as_path()));
        for (a, b) in p.parameter_layouts().iter().zip(p2.parameter_layouts()) {
            assert_eq!(a.0, b.0);
            assert_eq!(a.1, b.1, "{}", a.0);
        }
    }
    // A file for another network is refused, naming the item.
    let path = dir.join("s.json");
    let mut other = GraphBuilder::new(0);
    let x = other.input("x", &[8, 4], DType::F32).unwrap();
    let w = other.parameter("w", &[4, 4], Initializer::Zeros).unwrap();
    other.matmul("mm", x, w).unwrap();
    let other = other.finish();
    let (items, c) = (load_strategy_items(&path).unwrap(), ctx());
    let e = plan_network(&PlanRequest { graph: &other, loss: None, context: &c, strategy_file: Some(&items), profile: None })
        .unwrap_err()
        .to_string();
    assert!(e.contains("matches no operator") && e.contains("s.json"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The training fixtures (TrainOneStepCell with Momentum), with and without the parallel
/// optimizer: autopar's `parameter_layout_dict` and group-info file of each rank MindSpore
/// saved are MindSpore's byte for byte; its strategy file holds MindSpore's items (their order
/// in MindSpore's file is its hash map's).
#[test]
fn training_fixture_layouts_and_group_files_are_mindspores() {
    use autopar_checkpoint::GroupInfo;
    use autopar_parallel::rank_program;
    use autopar_parallel::strategy_files::group_info;
    let g = network(true);
    let loss = g.outputs[0];
    for (folder, shard, ranks) in [
        ("semi_train", None, &[0usize][..]),
        ("semi_train_optshard", Some(json!({"parallel_optimizer_threshold": 0})), &[0]),
        ("optshard2", Some(json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": 2})), &[0, 5]),
        ("optshard_thr64", Some(json!({"parallel_optimizer_threshold": 64})), &[0]),
    ] {
        let mut c = ctx();
        if let Some(cfg) = &shard {
            c.set("enable_parallel_optimizer", &json!(true)).unwrap();
            c.set("parallel_optimizer_config", cfg).unwrap();
        }
        let p = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &c, strategy_file: None, profile: None }).unwrap();
        let dir = fixtures().join("strategies").join(folder);
        let keys = |name: &str| vec![format!("moments.{name}")];
        let ours = strategy_file(&p, true, &keys);
        let theirs = StrategyFile::load(dir.join("strategy_rank0.ckpt")).unwrap();
        // The protobuf form has no full shapes.
        let mut shapeless = sorted(ours.clone());
        shapeless.layout_items.iter_mut().for_each(|l| l.tensor_shape = None);
        assert_eq!(shapeless, sorted(theirs), "{folder}: strategy file");
        for &r in ranks {
            let text = std::fs::read_to_string(dir.join(format!("layout_rank{r}.txt"))).unwrap();
            let lines: Vec<String> =
                autopar_parallel::parameter_layout_dict(&p, r, &keys).iter().map(|(n, l)| format!("{n}: {l}")).collect();
            assert_eq!(lines, text.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(), "{folder} rank {r}: parameter_layout_dict");
            let program = rank_program(&p, r).unwrap();
            let info = group_info(&p, &program, 0, p.device_num);
            let want = GroupInfo::load(dir.join(format!("group_info_rank{r}.pb"))).unwrap();
            assert_eq!(info, want, "{folder} rank {r}: group info");
            assert_eq!(info.to_protobuf(), std::fs::read(dir.join(format!("group_info_rank{r}.pb"))).unwrap(), "{folder} rank {r}");
        }
    }
}
