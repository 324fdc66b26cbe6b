//! auto_parallel on the fixture network of `fixtures/mindspore`: each search reproduces the
//! strategies and parameter layouts MindSpore 2.10 chose (`strategies/{rec,rec_big,dp,shardprop}`).

use std::path::PathBuf;

use autopar_checkpoint::StrategyFile;
use autopar_graph::{DType, Graph, GraphBuilder, Initializer};
use autopar_parallel::strategy_files::strategy_file;
use autopar_parallel::{parameter_layout_dict, plan, ParallelContext, ParallelPlan};
use serde_json::json;

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

/// `generate_strategies.py`'s network: x [batch, d0] -> l1 (MatMul + Add + ReLU) -> l2 -> head
/// MatMul -> ReduceMean, with l1's MatMul optionally set to ((2,1),(1,4)).
fn network(dims: [usize; 4], batch: usize, shard_first: bool) -> Graph {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[batch, dims[0]], DType::F32).unwrap();
    let mut h = x;
    for (i, name) in ["l1", "l2"].iter().enumerate() {
        let w = b.parameter(&format!("{name}.w"), &[dims[i], dims[i + 1]], Initializer::Zeros).unwrap();
        let bias = b.parameter(&format!("{name}.b"), &[dims[i + 1]], Initializer::Zeros).unwrap();
        let m = b.matmul(&format!("{name}.mm"), h, w).unwrap();
        if shard_first && i == 0 {
            b.shard(m, "((2,1),(1,4))".parse().unwrap()).unwrap();
        }
        let a = b.add(&format!("{name}.add"), m, bias).unwrap();
        h = b.relu(&format!("{name}.relu"), a).unwrap();
    }
    let head = b.parameter("head.w", &[dims[2], dims[3]], Initializer::Zeros).unwrap();
    let m = b.matmul("head.mm", h, head).unwrap();
    let loss = b.reduce_mean("loss", m, &[], false).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

fn auto(search: &str, full_batch: bool) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(8)).unwrap();
    c.set("parallel_mode", &json!("auto_parallel")).unwrap();
    c.set("search_mode", &json!(search)).unwrap();
    if full_batch {
        c.set("full_batch", &json!(true)).unwrap();
    }
    c
}

fn sorted(mut f: StrategyFile) -> StrategyFile {
    f.strategy_items.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    f.layout_items.sort_by(|a, b| a.name.cmp(&b.name));
    f
}

/// The plan's strategy file equals MindSpore's, item by item: operator strategies and
/// parameter layouts.
fn assert_matches(p: &ParallelPlan, folder: &str) {
    let ours = sorted(strategy_file(p, false, &|_| Vec::new()));
    let theirs = sorted(StrategyFile::load(fixtures().join(format!("strategies/{folder}/strategy_rank0.ckpt"))).unwrap());
    let show = |f: &StrategyFile| f.strategy_items.iter().map(|i| format!("{} {:?}", i.node_name, i.parallel_strategy)).collect::<Vec<_>>();
    assert_eq!(show(&ours), show(&theirs), "{folder}: operator strategies");
    assert_eq!(ours.strategy_items, theirs.strategy_items, "{folder}");
    assert_eq!(ours.layout_items.len(), theirs.layout_items.len(), "{folder}");
    for (a, b) in ours.layout_items.iter().zip(&theirs.layout_items) {
        assert_eq!((&a.name, &a.dev_matrix, a.map()), (&b.name, &b.dev_matrix, b.map()), "{folder}");
    }
    // MindSpore's parameter_layout_dict (the input x included), line by line.
    let text = std::fs::read_to_string(fixtures().join(format!("strategies/{folder}/layout_rank0.txt"))).unwrap();
    let ours: Vec<String> = parameter_layout_dict(p, 0, &|_| Vec::new()).iter().map(|(n, l)| format!("{n}: {l}")).collect();
    let theirs: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(ours, theirs, "{folder}: parameter_layout_dict");
}

#[test]
fn dynamic_programming_chooses_data_parallel_on_the_small_mlp() {
    let p = plan(&network([64, 128, 32, 16], 256, false), &auto("dynamic_programming", false)).unwrap();
    assert_matches(&p, "dp");
}

#[test]
fn sharding_propagation_spreads_the_configured_strategy() {
    let p = plan(&network([64, 128, 32, 16], 256, true), &auto("sharding_propagation", false)).unwrap();
    assert_matches(&p, "shardprop");
}

/// Strategies MindSpore's own sharding_propagation tests assert (8 devices). The dataset is
/// a configured op whose walk comes after the user's: `test_auto_parallel_arithmetic_broadcast_left`
/// (nothing set, `full_batch`: every op runs replicated, as the dataset gives its inputs);
/// `test_out_strategy_propagate1` (`fully_use_devices`: the add after a MatMul set to
/// ((4, 2), (1, 2)) reads the MatMul's output and a batch-split input, and follows the MatMul
/// alone, decided before the dataset's walk: the first of its equally cheap strategies using
/// every device); `test_sharding_strategy_save_and_load1` (an add before a configured MatMul
/// waits for it and takes its input's split, not the split of the MatMul before it).
#[test]
fn sharding_propagation_walks_as_mindspores_unit_tests_assert() {
    let strategies = |g: &Graph, c: &ParallelContext| -> Vec<(String, String)> {
        let p = plan(g, c).unwrap();
        p.nodes.iter().filter_map(|n| n.strategy.as_ref().map(|s| (n.name.clone(), s.to_string()))).collect()
    };
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[64, 32], DType::F32).unwrap();
    let y = b.input("y", &[32, 32], DType::F32).unwrap();
    let d = b.input("b", &[128, 64, 32], DType::F32).unwrap();
    let m = b.matmul("matmul", x, y).unwrap();
    let f = b.div("floordiv", m, d).unwrap();
    b.output(f).unwrap();
    let g = b.finish();
    let want = [("matmul", "((1, 1), (1, 1))"), ("floordiv", "((1, 1), (1, 1, 1))")];
    assert_eq!(strategies(&g, &auto("sharding_propagation", true)), want.map(|(a, b)| (a.to_string(), b.to_string())));
    // The batch split instead: the MatMul takes it from the dataset.
    let split = strategies(&g, &auto("sharding_propagation", false));
    assert_eq!(split[0], ("matmul".to_string(), "((8, 1), (1, 1))".to_string()));

    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[64, 32], DType::F32).unwrap();
    let bias = b.input("b", &[64, 8], DType::F32).unwrap();
    let w = b.parameter("w", &[8, 32], Initializer::Zeros).unwrap();
    let m = b.matmul_t("matmul", x, w, false, true).unwrap();
    b.shard(m, "((4,2),(1,2))".parse().unwrap()).unwrap();
    let a = b.add("add", m, bias).unwrap();
    let r = b.relu("relu", a).unwrap();
    b.output(r).unwrap();
    let mut c = auto("sharding_propagation", false);
    c.set("fully_use_devices", &json!(true)).unwrap();
    let got = strategies(&b.finish(), &c);
    assert_eq!(got[1], ("add".to_string(), "((4, 2), (4, 2))".to_string()));

    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[64, 32], DType::F32).unwrap();
    let b1 = b.input("b1", &[64, 32], DType::F32).unwrap();
    let b2 = b.input("b2", &[64, 8], DType::F32).unwrap();
    let w1 = b.parameter("w1", &[8, 32], Initializer::Zeros).unwrap();
    let w2 = b.parameter("w2", &[16, 8], Initializer::Zeros).unwrap();
    let a1 = b.add("add1", x, b1).unwrap();
    let m1 = b.matmul_t("matmul1", a1, w1, false, true).unwrap();
    b.shard(m1, "((4,2),(1,2))".parse().unwrap()).unwrap();
    let a2 = b.add("add2", m1, b2).unwrap();
    let m2 = b.matmul_t("matmul2", a2, w2, false, true).unwrap();
    b.shard(m2, "((2,4),(1,4))".parse().unwrap()).unwrap();
    b.output(m2).unwrap();
    let got = strategies(&b.finish(), &auto("sharding_propagation", false));
    assert_eq!(got[0], ("add1".to_string(), "((4, 2), (4, 2))".to_string()));
    assert_eq!(got[2], ("add2".to_string(), "((2, 4), (2, 4))".to_string()));
}

/// MindSpore compiled the rec fixtures for inference without `full_batch`; its
/// recursive_programming then sets the dataset's strategy back to nothing split
/// (`AjustToNoTraining`): the input `x` is whole in its layouts, where the other searches
/// split its batch.
#[test]
fn recursive_programming_chooses_data_parallel_on_the_small_mlp() {
    let p = plan(&network([64, 128, 32, 16], 256, false), &auto("recursive_programming", false)).unwrap();
    assert_matches(&p, "rec");
}

#[test]
fn recursive_programming_mixes_model_parallel_on_the_large_mlp() {
    let g = network([8192, 8192, 8192, 1024], 32, false);
    let p = plan(&g, &auto("recursive_programming", false)).unwrap();
    assert_matches(&p, "rec_big");
    // The ops MindSpore's file leaves out, by its inference rules: its list of the ops left
    // out runs from the loss back (a depth-first walk from the output), and the first pass
    // of `GenerateStrategyV1` visits it from the loss: l1.relu comes before l1.add has a
    // strategy, so the backward pass gives it what l2's MatMul wants of its input, (2, 4),
    // not l1's MatMul output split (4, 2). Training (`GenerateStrategyV3`) visits from the
    // input end, widest first: l1.add, then l1.relu from it.
    let relu = |p: &ParallelPlan| p.nodes.iter().find(|n| n.name == "l1.relu").unwrap().strategy.as_ref().unwrap().to_string();
    assert_eq!(relu(&p), "((2, 4))");
    let loss = g.outputs[0];
    let c = auto("recursive_programming", false);
    let train = autopar_parallel::plan_network(&autopar_parallel::PlanRequest {
        graph: &g,
        loss: Some(loss),
        context: &c,
        strategy_file: None,
        profile: None,
    })
    .unwrap();
    assert_eq!(relu(&train), "((4, 2))");
}

/// An auto plan saves a strategy file (`strategy_ckpt_config.save_file`) that replays it under
/// semi_auto_parallel: the same strategies and layouts.
#[test]
fn an_auto_plan_replays_from_its_strategy_file_under_semi_auto_parallel() {
    use autopar_parallel::strategy_files::{load_strategy_items, save_strategy_file};
    use autopar_parallel::{plan_network, PlanRequest, StrategySource};
    let dir = tempfile::tempdir().unwrap();
    for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
        let g = network([8192, 8192, 8192, 1024], 32, search == "sharding_propagation");
        let p = plan(&g, &auto(search, false)).unwrap();
        assert!(p.nodes.iter().any(|n| n.source == Some(StrategySource::Searched) || n.source == Some(StrategySource::Propagated)));
        let path = dir.path().join(format!("{search}.ckpt"));
        save_strategy_file(&p, &path, true, &|_| Vec::new()).unwrap();
        let items = load_strategy_items(&path).unwrap();
        let mut c = ParallelContext::default();
        c.set("device_num", &json!(8)).unwrap();
        c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        let fresh = network([8192, 8192, 8192, 1024], 32, false);
        let replay =
            plan_network(&PlanRequest { graph: &fresh, loss: None, context: &c, strategy_file: Some(&items), profile: None }).unwrap();
        assert_eq!(p.parameter_layouts(), replay.parameter_layouts(), "{search}");
        for (a, b) in p.nodes.iter().zip(&replay.nodes) {
            if items.items.iter().any(|(k, _)| k.ends_with(&format!("_{}", a.name))) {
                assert_eq!(a.strategy, b.strategy, "{search}: {}", a.name);
            }
        }
    }
}

/// The exact solver certifies the searches: no search's plan is cheaper than the exact optimum
/// of the cost model, and dynamic_programming (exact on the candidates it keeps) is never
/// dearer than pure data parallel, over the fixture network, MLPs of random widths, a small GPT
/// and a ResNet on 2, 4 and 8 devices.
#[test]
fn no_search_beats_the_exact_optimum() {
    use autopar_models::{Gpt, GptConfig, Mlp, MlpConfig, Mode, Model, ResNet, ResNetConfig};
    use autopar_parallel::{compare_searches, PlanRequest};
    let mut graphs: Vec<(String, Graph, Option<autopar_graph::NodeId>)> =
        vec![("fixture".into(), network([64, 128, 32, 16], 64, false), None)];
    let mut rng = autopar_data::Rng::new(11);
    let mut models: Vec<(String, Box<dyn Model>)> = Vec::new();
    for _ in 0..3 {
        let w = |r: u64| [8usize, 16, 64, 256][(r % 4) as usize];
        let hidden = vec![w(rng.next_u64()), w(rng.next_u64())];
        models.push((format!("mlp {hidden:?}"), Box::new(Mlp::new(MlpConfig { input_shape: vec![32], hidden, num_classes: 8 }).unwrap())));
    }
    let gpt = GptConfig { vocab: 32, context: 8, width: 32, heads: 2, layers: 1, mlp_ratio: 2, dropout: 0.0, ..GptConfig::default() };
    models.push(("gpt".into(), Box::new(Gpt::new(gpt).unwrap())));
    let resnet = ResNetConfig::resnet18(4).with_width(4).with_stem(autopar_models::Stem::Cifar, &[3, 8, 8]);
    models.push(("resnet18".into(), Box::new(ResNet::new(resnet).unwrap())));
    for (name, m) in &models {
        let (g, ids) = m.build_graph(16, Mode::Train, 1).unwrap();
        graphs.push((name.clone(), g, Some(ids.loss)));
    }
    for (name, g, loss) in &graphs {
        for n in [2usize, 4, 8] {
            let mut c = ParallelContext::default();
            c.set("device_num", &json!(n)).unwrap();
            c.set("parallel_mode", &json!("auto_parallel")).unwrap();
            let req = PlanRequest { graph: g, loss: *loss, context: &c, strategy_file: None, profile: None };
            let rows = compare_searches(&req).unwrap();
            let rows: Vec<_> = rows.into_iter().map(|(s, r)| (s, r.unwrap_or_else(|e| panic!("{name} n={n}: {e}")).0)).collect();
            let get = |s: &str| rows.iter().find(|(search, _)| search.name() == s).unwrap().1.objective;
            let exact = get("exact");
            for (_, r) in &rows {
                assert!(
                    r.objective >= exact * (1.0 - 1e-9),
                    "{name} n={n}: {} {} below the exact optimum {exact}",
                    r.search.name(),
                    r.objective
                );
            }
            assert!(get("dynamic_programming (seconds)") <= get("data_parallel") * (1.0 + 1e-9), "{name} n={n}");
        }
    }
}

/// sharding_propagation and dynamic_programming keep what the user set; recursive_programming
/// overwrites it, as MindSpore 2.10 does, and says so, unless `MS_INTERFERED_SAPP` is on (then
/// it keeps it too). The recursive search refuses device counts that are not powers of two, as
/// MindSpore does, naming the other searches.
#[test]
fn searches_keep_user_strategies_and_refuse_what_they_cannot_search() {
    use autopar_parallel::{compare_searches, PlanRequest, StrategySource};
    let g = network([8192, 8192, 8192, 1024], 32, true);
    let l1 = |p: &autopar_parallel::ParallelPlan| p.nodes.iter().find(|n| n.name == "l1.mm").unwrap().clone();
    for search in ["sharding_propagation", "dynamic_programming", "interfered recursive_programming"] {
        let mut c = auto(search.trim_start_matches("interfered "), false);
        c.set_interfered_sapp(search.starts_with("interfered"));
        let p = plan(&g, &c).unwrap();
        assert_eq!(l1(&p).strategy.as_ref().unwrap().to_string(), "((2, 1), (1, 4))", "{search}");
        assert_eq!(l1(&p).source, Some(StrategySource::User), "{search}");
        assert!(p.search.as_ref().unwrap().overwritten.is_empty());
    }
    let mut c = auto("recursive_programming", false);
    c.set_interfered_sapp(false);
    let p = plan(&g, &c).unwrap();
    assert_ne!(l1(&p).source, Some(StrategySource::User));
    assert_ne!(l1(&p).strategy.as_ref().unwrap().to_string(), "((2, 1), (1, 4))", "searched like any other MatMul");
    let report = p.search.as_ref().unwrap();
    assert_eq!(report.overwritten, vec!["l1.mm".to_string()]);
    let text = autopar_parallel::report::search_text(report);
    assert!(text.contains("overwritten: the .shard() strategies of l1.mm") && text.contains("MS_INTERFERED_SAPP=1"), "{text}");
    // --compare says why recursive_programming's problem differs from the others'.
    let rows = compare_searches(&PlanRequest { graph: &g, loss: None, context: &c, strategy_file: None, profile: None }).unwrap();
    let table = autopar_parallel::report::compare_text("network", 8, &rows);
    assert!(table.contains("recursive_programming: searched the 1 ops whose .shard() strategy the others keep"), "{table}");
    let mut c = auto("recursive_programming", false);
    c.set("device_num", &json!(6)).unwrap();
    let e = plan(&network([64, 128, 32, 16], 48, false), &c).unwrap_err().to_string();
    assert!(e.contains("power-of-two") && e.contains("dynamic_programming"), "{e}");
    c.set("search_mode", &json!("dynamic_programming")).unwrap();
    plan(&network([64, 128, 32, 16], 48, false), &c).unwrap();
}

/// MindSpore's own test of user strategies under recursive_programming
/// (`test_auto_parallel_sapp_custom_strategy{1,2}`): x [32768, 1024] through two MatMuls with
/// [1024, 1024] weights on 8 devices, the first set to ((1, 1), (1, 8)). With
/// `MS_INTERFERED_SAPP` on, the second contracts over the first's column split,
/// ((1, 8), (8, 1)), as MindSpore asserts; off, every MatMul is searched and splits the batch,
/// ((8, 1), (1, 1)), as MindSpore asserts.
#[test]
fn recursive_programming_keeps_user_strategies_only_when_interfered_as_mindspore_tests() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[32768, 1024], DType::F32).unwrap();
    let y = b.parameter("y", &[1024, 1024], Initializer::Zeros).unwrap();
    let z = b.parameter("z", &[1024, 1024], Initializer::Zeros).unwrap();
    let m1 = b.matmul("matmul1", x, y).unwrap();
    b.shard(m1, "((1,1),(1,8))".parse().unwrap()).unwrap();
    let m2 = b.matmul("matmul2", m1, z).unwrap();
    b.output(m2).unwrap();
    let g = b.finish();
    let strategy = |p: &ParallelPlan, name: &str| p.nodes.iter().find(|n| n.name == name).unwrap().strategy.as_ref().unwrap().to_string();
    let mut c = auto("recursive_programming", true);
    c.set_interfered_sapp(true);
    let p = plan(&g, &c).unwrap();
    assert_eq!(strategy(&p, "matmul1"), "((1, 1), (1, 8))");
    assert_eq!(strategy(&p, "matmul2"), "((1, 8), (8, 1))");
    c.set_interfered_sapp(false);
    let p = plan(&g, &c).unwrap();
    assert_eq!(strategy(&p, "matmul1"), "((8, 1), (1, 1))");
    assert_eq!(strategy(&p, "matmul2"), "((8, 1), (1, 1))");
}

/// In a pipeline, recursive_programming cuts a MatMul's rows no further than one sample of the
/// micro-batch per device, as MindSpore's does with `pipeline_stages` > 1: a GPT built for
/// micro-batches of 2 sequences on 2 stages of 4 devices (full_batch) splits its MLP's rows 2
/// ways and its columns 2 ways, where the same graph planned without stages splits the rows 4
/// ways.
#[test]
fn recursive_programming_keeps_a_sample_of_the_micro_batch_per_device_in_a_pipeline() {
    use autopar_models::{Gpt, GptConfig, Mode, Model};
    use autopar_parallel::{plan_stages, PlanRequest};
    let (g, ids) = Gpt::new(GptConfig { dropout: 0.0, ..GptConfig::default() }).unwrap().build_graph(2, Mode::Train, 0).unwrap();
    let fc1 =
        |p: &ParallelPlan| p.nodes.iter().find(|n| n.name == "blocks.0.mlp.fc1.matmul").unwrap().strategy.as_ref().unwrap().to_string();
    let mut c = auto("recursive_programming", true);
    c.set("pipeline_stages", &json!(2)).unwrap();
    let piped = plan_stages(&PlanRequest { graph: &g, loss: Some(ids.loss), context: &c, strategy_file: None, profile: None }, 4).unwrap();
    let mut flat = auto("recursive_programming", true);
    flat.set("device_num", &json!(4)).unwrap();
    let whole = autopar_parallel::plan_network(&PlanRequest {
        graph: &g,
        loss: Some(ids.loss),
        context: &flat,
        strategy_file: None,
        profile: None,
    })
    .unwrap();
    assert_eq!(fc1(&whole), "((4, 1), (1, 1))");
    assert_eq!(fc1(&piped.plan), "((2, 1), (2, 1))");
}

/// `op_strategy_config` (MindSpore's `set_op_strategy_config`): sharding propagation saves every
/// operator's strategy by name; loading the file gives every operator that strategy (an edited
/// strategy is followed), and a file that lacks or adds an operator, or another search mode, is
/// refused naming it.
#[test]
fn operator_strategy_files_save_and_load_every_operator() {
    use autopar_parallel::strategy_files::{load_plan_strategies, operator_strategy_file};
    use autopar_parallel::{plan_network, ParallelError, PlanRequest, StrategySource};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ops.json");
    let with = |mode: &str, search: &str| {
        let mut c = auto(search, false);
        c.set("op_strategy_config", &json!({"mode": mode, "path": path.display().to_string()})).unwrap();
        c
    };
    let g = network([8192, 8192, 8192, 1024], 32, true);
    let saving = with("SAVE", "sharding_propagation");
    assert_eq!(saving.op_strategy_save_file(), Some(path.to_str().unwrap()));
    let p = plan(&g, &saving).unwrap();
    operator_strategy_file(&p).save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let planned: Vec<&autopar_parallel::NodePlan> = p.nodes.iter().filter(|n| n.strategy.is_some()).collect();
    for n in &planned {
        assert!(text.contains(&format!("\"{}\"", n.name)), "{} is not in {text}", n.name);
    }

    // Loaded: every operator takes the file's strategy, marked as read from a file.
    let loading = with("LOAD", "sharding_propagation");
    let items = load_plan_strategies(&loading).unwrap().expect("LOAD reads the file");
    assert!(items.by_operator && items.items.len() == planned.len());
    let fresh = network([8192, 8192, 8192, 1024], 32, false);
    let req = |items| PlanRequest { graph: &fresh, loss: None, context: &loading, strategy_file: Some(items), profile: None };
    let replay = plan_network(&req(&items)).unwrap();
    assert_eq!(p.parameter_layouts(), replay.parameter_layouts());
    for (a, b) in p.nodes.iter().zip(&replay.nodes) {
        assert_eq!(a.strategy, b.strategy, "{}", a.name);
        if b.strategy.is_some() {
            assert_eq!(b.source, Some(StrategySource::StrategyFile), "{}", b.name);
        }
    }
    // An edited strategy is what the operator runs with.
    let mut edited = items.clone();
    let head = edited.items.iter_mut().find(|(name, _)| name == "head.mm").unwrap();
    head.1 = "((1, 8), (8, 1))".parse().unwrap();
    let replay = plan_network(&req(&edited)).unwrap();
    let node = replay.nodes.iter().find(|n| n.name == "head.mm").unwrap();
    assert_eq!(node.strategy, Some("((1, 8), (8, 1))".parse().unwrap()));

    // A missing operator, an unknown one, another search mode: refused, naming them.
    let mut missing = items.clone();
    missing.items.retain(|(name, _)| name != "l2.add");
    let e = plan_network(&req(&missing)).unwrap_err();
    assert!(matches!(&e, ParallelError::MissingOperator { op, .. } if op == "l2.add"), "{e}");
    assert!(e.to_string().contains("ops.json") && e.to_string().contains("\"l2.add\""), "{e}");
    let mut unknown = items.clone();
    unknown.items.push(("l9.mm".into(), "((8, 1), (1, 1))".parse().unwrap()));
    let e = plan_network(&req(&unknown)).unwrap_err();
    assert!(e.to_string().contains("\"l9.mm\" is not in the network"), "{e}");
    let mut parameter = items.clone();
    parameter.items.push(("l1.w".into(), "((8, 1),)".parse().unwrap()));
    let e = plan_network(&req(&parameter)).unwrap_err();
    assert!(matches!(&e, ParallelError::UnknownOperator { op, .. } if op == "l1.w"), "a parameter takes no strategy: {e}");
    // A LOAD context without the strategies read from its file is refused, not searched.
    let e = plan_network(&PlanRequest { graph: &fresh, loss: None, context: &loading, strategy_file: None, profile: None }).unwrap_err();
    assert!(matches!(&e, ParallelError::OperatorStrategiesNotGiven { .. }), "{e}");
    let e = with("LOAD", "recursive_programming").validate().unwrap_err();
    assert!(e.to_string().contains("op_strategy_config") && e.to_string().contains("sharding_propagation"), "{e}");
    let e = auto("sharding_propagation", false).set("op_strategy_config", &json!({"mode": "LOAD", "path": "ops.txt"})).unwrap_err();
    assert!(e.to_string().contains(".json"), "{e}");
}

/// With `fully_use_devices` off (the default, as MindSpore's since 2.5) dynamic_programming
/// searches every split while that stays small; past it (a 4-block GPT on 64 devices), the
/// strategies using every device or none, and its report says so.
#[test]
fn dynamic_programming_searches_every_split_while_the_search_stays_small() {
    use autopar_models::{Gpt, GptConfig, Mode, Model};
    use autopar_parallel::{plan_network, PlanRequest};
    let cfg = GptConfig { vocab: 32, context: 8, width: 64, heads: 4, layers: 4, mlp_ratio: 2, dropout: 0.0, ..GptConfig::default() };
    let (g, ids) = Gpt::new(cfg).unwrap().build_graph(64, Mode::Train, 1).unwrap();
    let mut candidates = Vec::new();
    for (n, fully_use, fallback) in [(16usize, false, false), (16, true, false), (64, false, true)] {
        let mut c = auto("dynamic_programming", false);
        c.set("device_num", &json!(n)).unwrap();
        c.set("fully_use_devices", &json!(fully_use)).unwrap();
        let p = plan_network(&PlanRequest { graph: &g, loss: Some(ids.loss), context: &c, strategy_file: None, profile: None }).unwrap();
        let report = p.search.as_ref().unwrap();
        assert_eq!(report.fully_use_fallback, fallback, "{n} devices, fully_use_devices {fully_use}");
        candidates.push(report.ops.iter().map(|o| o.candidates).sum::<usize>());
        let used: Vec<usize> = report.ops.iter().map(|o| o.splits.iter().product()).collect();
        if fully_use || fallback {
            assert!(used.iter().all(|&u| u == 1 || u == n), "{n} devices: {used:?}");
        }
        let text = autopar_parallel::report::search_text(report);
        assert_eq!(text.contains("fully_use_devices fallback"), fallback, "{text}");
    }
    // Off, every split is a candidate: more than the strategies using every device or none.
    assert!(candidates[0] > candidates[1], "{candidates:?}");
    // --compare says which searches took fewer candidates than the exact solver.
    let mut c = auto("dynamic_programming", false);
    c.set("device_num", &json!(16)).unwrap();
    c.set("fully_use_devices", &json!(true)).unwrap();
    let rows = autopar_parallel::compare_searches(&PlanRequest {
        graph: &g,
        loss: Some(ids.loss),
        context: &c,
        strategy_file: None,
        profile: None,
    })
    .unwrap();
    let table = autopar_parallel::report::compare_text("gpt", 16, &rows);
    for search in ["dynamic_programming", "sharding_propagation"] {
        assert!(table.contains(&format!("{search}: searched the strategies using every device or none (fully_use_devices)")), "{table}");
    }
    assert!(!table.contains("recursive_programming: searched the strategies using every device"), "{table}");
}

/// dynamic_programming ties the layers of a deep network to one choice: the copies of the
/// repeated block are found whatever the depth (one block's ops, depth - 1 copies), every
/// copy's op takes the strategy of the first copy's op at the same place, the search's size
/// does not grow with depth, and the plan is never dearer than pure data parallel; over the
/// exact solver's candidates (`fully_use_devices` off) it is the exact optimum of the untied
/// network here, on 4 and 8 devices: the tie costs nothing.
#[test]
fn dynamic_programming_ties_the_layers_of_a_deep_network() {
    use autopar_models::{Gpt, GptConfig, Mode, Model};
    use autopar_parallel::{compare_searches, PlanRequest};
    let mut block_ops = Vec::new();
    for (layers, follow) in [(3usize, false), (6, false), (3, true)] {
        let cfg = GptConfig { vocab: 32, context: 8, width: 256, heads: 2, layers, mlp_ratio: 2, dropout: 0.0, ..GptConfig::default() };
        let (g, ids) = Gpt::new(cfg).unwrap().build_graph(8, Mode::Train, 1).unwrap();
        for n in [4usize, 8] {
            let mut c = ParallelContext::default();
            c.set("device_num", &json!(n)).unwrap();
            c.set("parallel_mode", &json!("auto_parallel")).unwrap();
            // The exact solver's candidates: every power-of-two split, idle devices allowed.
            c.set("fully_use_devices", &json!(false)).unwrap();
            // Element-wise ops forbidden to redistribute their first input: forbidden pairs on
            // the tied edges too.
            c.set("elementwise_op_strategy_follow", &json!(follow)).unwrap();
            let req = PlanRequest { graph: &g, loss: Some(ids.loss), context: &c, strategy_file: None, profile: None };
            let rows = compare_searches(&req).unwrap();
            let get = |s: &str| rows.iter().find(|(x, _)| x.name() == s).unwrap().1.as_ref().unwrap().0.clone();
            // The elimination against the exact solver: both in seconds.
            let dp = get("dynamic_programming (seconds)");
            let what = format!("{layers} layers on {n}, follow {follow}");
            assert_eq!(dp.tied.len(), 1, "{what}: {:?}", dp.tied);
            let t = &dp.tied[0];
            assert_eq!(t.copies, layers - 1, "{what}: {t:?}");
            block_ops.push(t.ops);
            // Copy i's op at place j has copy 0's strategy.
            let first = dp.ops.iter().position(|o| o.name == t.first).unwrap();
            for i in 1..t.copies {
                for j in 0..t.ops {
                    let (a, b) = (&dp.ops[first + j], &dp.ops[first + i * t.ops + j]);
                    assert_eq!(a.name.replace(char::is_numeric, ""), b.name.replace(char::is_numeric, ""), "{what}");
                    assert_eq!(a.strategy, b.strategy, "{what}: {} and {}", a.name, b.name);
                }
            }
            let (exact, data_parallel) = (get("exact").objective, get("data_parallel").objective);
            assert!(dp.objective <= data_parallel * (1.0 + 1e-9), "{what}: {} > {data_parallel}", dp.objective);
            assert!((dp.objective - exact).abs() <= 1e-9 * exact, "{what}: {} vs exact {exact}", dp.objective);
            // Something other than the batch is split at 8 devices, so the choice is not trivial.
            if n == 8 {
                assert!(dp.ops.iter().any(|o| o.splits.iter().skip(1).any(|&s| s > 1)), "{what}");
            }
        }
    }
    assert!(block_ops.windows(2).all(|w| w[0] == w[1]), "a copy's ops depend on depth: {block_ops:?}");
}

/// Under a memory budget the fastest plan exceeds, dynamic_programming keeps (time, memory)
/// cost lists and returns the fastest plan whose memory fits, as the exact solver does; below
/// the least memory any plan needs, both refuse naming the ops that need the most.
#[test]
fn dynamic_programming_keeps_the_plan_within_device_memory_capacity() {
    use autopar_parallel::{compare_searches, ParallelError, PlanRequest};
    let g = network([256, 1024, 1024, 16], 64, false);
    let rows = |capacity: Option<u64>| {
        let mut c = auto("dynamic_programming", false);
        c.set("fully_use_devices", &json!(false)).unwrap();
        if let Some(b) = capacity {
            c.set("device_memory_capacity", &json!(b)).unwrap();
        }
        compare_searches(&PlanRequest { graph: &g, loss: None, context: &c, strategy_file: None, profile: None }).unwrap()
    };
    let free = rows(None);
    fn get<'a>(rows: &'a [autopar_parallel::search::SearchRow], s: &str) -> Result<&'a autopar_parallel::SearchReport, &'a ParallelError> {
        rows.iter().find(|(x, _)| x.name() == s).unwrap().1.as_ref().map(|r| &r.0)
    }
    let fastest = get(&free, "dynamic_programming (seconds)").unwrap();
    let most = fastest.total().memory;
    let capacity = most * 2 / 3;
    let within = rows(Some(capacity));
    let dp = get(&within, "dynamic_programming (seconds)").unwrap();
    let exact = get(&within, "exact").unwrap();
    assert!(dp.total().memory <= capacity, "{} over {capacity}", dp.total().memory);
    assert!(dp.objective > fastest.objective, "the fastest plan ({most} bytes) does not fit {capacity}");
    assert!((dp.objective - exact.objective).abs() <= 1e-9 * exact.objective, "{} vs exact {}", dp.objective, exact.objective);
    assert!(dp.ops.iter().any(|o| o.splits.iter().skip(1).any(|&s| s > 1)), "some weight is split to fit");
    // The report says which searches' plans are over the capacity (here the candidates over
    // it, dropped op by op, already leave dynamic_programming a plan that fits).
    assert_eq!(dp.capacity, capacity);
    let rec = get(&within, "recursive_programming").unwrap();
    if rec.total().memory > capacity {
        let text = autopar_parallel::report::compare_text("mlp", 8, &within);
        assert!(text.contains("recursive_programming: its plan needs") && text.contains("checks each op alone"), "{text}");
    }
    // Budgets every op fits alone but no plan as a whole: refused, naming the ops.
    let mut refused = 0;
    for k in 2..40u64 {
        let some = rows(Some(most / k));
        match (get(&some, "dynamic_programming (seconds)"), get(&some, "exact")) {
            (Err(ParallelError::PlanOverMemory { least, largest, .. }), Err(ParallelError::PlanOverMemory { .. })) => {
                assert!(*least > most / k && largest.contains("mm ("), "{least} {largest}");
                refused += 1;
            }
            (Ok(dp), Ok(exact)) => {
                assert!(dp.total().memory <= most / k);
                assert!((dp.objective - exact.objective).abs() <= 1e-9 * exact.objective);
            }
            (Err(ParallelError::OutOfMemory { .. }), Err(ParallelError::OutOfMemory { .. })) => break,
            (a, b) => panic!("budget {}: dynamic_programming {a:?}, exact {b:?}", most / k),
        }
    }
    assert!(refused > 0, "no budget between one op's and the whole plan's least memory was tried");

    // A network whose layers dynamic_programming ties: under a budget that binds, the layers
    // are searched apart (they may do best with different strategies), memory priced into the
    // objective: the exact solver's plan.
    use autopar_models::{Gpt, GptConfig, Mode, Model};
    let cfg = GptConfig { vocab: 32, context: 4, width: 128, heads: 2, layers: 3, mlp_ratio: 2, dropout: 0.0, ..GptConfig::default() };
    let (g, ids) = Gpt::new(cfg).unwrap().build_graph(8, Mode::Train, 1).unwrap();
    let gpt_rows = |capacity: Option<u64>| {
        let mut c = auto("dynamic_programming", false);
        c.set("fully_use_devices", &json!(false)).unwrap();
        if let Some(b) = capacity {
            c.set("device_memory_capacity", &json!(b)).unwrap();
        }
        compare_searches(&PlanRequest { graph: &g, loss: Some(ids.loss), context: &c, strategy_file: None, profile: None }).unwrap()
    };
    let free = gpt_rows(None);
    let fastest = get(&free, "dynamic_programming (seconds)").unwrap();
    assert!(!fastest.tied.is_empty());
    let capacity = fastest.total().memory * 9 / 10;
    let within = gpt_rows(Some(capacity));
    let (dp, exact) = (get(&within, "dynamic_programming (seconds)").unwrap(), get(&within, "exact").unwrap());
    assert!(dp.total().memory <= capacity && dp.objective > fastest.objective);
    assert!(exact.total().memory <= capacity);
    assert!((dp.objective - exact.objective).abs() <= 1e-9 * exact.objective, "{} vs exact {}", dp.objective, exact.objective);
    assert!(dp.tied.is_empty(), "searched apart under the budget: {:?}", dp.tied);
    // The report says the budget bound: the fastest plan's memory and objective.
    assert_eq!(dp.fastest, Some((fastest.total().memory, fastest.objective)));
    assert!(autopar_parallel::report::search_text(dp).contains("memory: the fastest plan"));
}

/// recursive_programming on a GPT block whose layers are wide for its batch (8 sequences of
/// 16 tokens, width 1024, 8 devices): the partition cuts the projections' output columns (and
/// the batch; the MLP's 4 ways, the attention's 2), and MindSpore's rules carry that to the ops it leaves out: the bias adds take
/// the column split, the head reshapes and transposes turn it into a split of the heads, the
/// attention's batched matmuls, mask and softmax run per head (the softmax axis whole), the
/// output projections contract over the split heads; the embedding lookup, whose table the
/// LM head shares (tied embeddings), takes the head's split of the table and splits its indices
/// over the devices left.
#[test]
fn recursive_programming_carries_column_splits_into_the_attention_heads() {
    use autopar_models::{Gpt, GptConfig, Mode, Model};
    let cfg = GptConfig { vocab: 1000, context: 16, width: 1024, heads: 8, layers: 1, mlp_ratio: 4, dropout: 0.0, ..GptConfig::default() };
    let (graph, ids) = Gpt::new(cfg).unwrap().build_graph(8, Mode::Train, 0).unwrap();
    let mut c = auto("recursive_programming", false);
    c.set("device_num", &json!(8)).unwrap();
    let req = autopar_parallel::PlanRequest { graph: &graph, loss: Some(ids.loss), context: &c, strategy_file: None, profile: None };
    let p = autopar_parallel::plan_network(&req).unwrap();
    let strategy = |name: &str| {
        let n = p.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no op {name}"));
        n.strategy.as_ref().map(|s| s.to_string()).unwrap_or_default()
    };
    let strategy_of_training = strategy;
    for (op, want) in [
        ("wte.gather", "((2, 1), (4, 1))"),
        ("blocks.0.attn.q_proj.matmul", "((4, 1), (2, 1))"),
        ("blocks.0.attn.q_proj.bias_add", "((4, 2), (2,))"),
        ("blocks.0.attn.q.heads", "((4, 1, 2, 1))"),
        ("blocks.0.attn.scores", "((4, 2, 1, 1), (4, 2, 1, 1))"),
        ("blocks.0.attn.mask", "((4, 2, 1, 1), (1, 1))"),
        ("blocks.0.attn.softmax", "((4, 2, 1, 1))"),
        ("blocks.0.attn.context", "((4, 2, 1, 1), (4, 2, 1, 1))"),
        ("blocks.0.attn.out_proj.matmul", "((4, 2), (1, 2))"),
        ("blocks.0.attn.out_proj.bias_add", "((4, 1), (1,))"),
        ("blocks.0.ln2", "((4, 1), (1,), (1,))"),
        // MindSpore's visiting order (depth first from the loss, from the end) reaches the
        // MLP branch of the block first, with no neighbour cut yet: its wider layers take a
        // 4-way column split.
        ("blocks.0.mlp.fc1.matmul", "((2, 1), (4, 1))"),
        ("blocks.0.mlp.gelu", "((2, 4))"),
        ("blocks.0.mlp.fc2.matmul", "((2, 4), (1, 4))"),
    ] {
        assert_eq!(strategy(op), want, "{op}");
    }
    let report = p.search.as_ref().unwrap();
    let source = |name: &str| report.ops.iter().find(|o| o.name == name).map(|o| o.source.name());
    assert_eq!(source("blocks.0.attn.softmax"), Some("propagated"));
    assert_eq!(source("blocks.0.attn.q_proj.matmul"), Some("searched"));

    // Inference: the tied table's most-cut user is the LM head (rows 2 ways; the lookup's own
    // rule leaves the table whole), and the lookup is redone from it: the table's gathered
    // axis is split, so the indices stay whole (MindSpore's `MakeGatherStratFromParam`).
    let inference = plan(&graph, &c).unwrap();
    let strategy = |name: &str| inference.nodes.iter().find(|n| n.name == name).unwrap().strategy.as_ref().unwrap().to_string();
    assert_eq!(strategy("lm_head.matmul"), strategy_of_training("lm_head.matmul"));
    assert!(strategy("lm_head.matmul").ends_with("(2, 1))"), "{}", strategy("lm_head.matmul"));
    assert_eq!(strategy("wte.gather"), "((2, 1), (1, 1))");
}

/// recursive_programming's rules take the strategy that spans the most devices first: a ReLU
/// between a MatMul set to 2 devices and one set to 8 copies its consumer's 8-way split
/// (backward), not its producer's 2-way one (forward), as MindSpore's passes do.
#[test]
fn recursive_programming_copies_the_widest_neighbouring_strategy_first() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[16, 64], DType::F32).unwrap();
    let w1 = b.parameter("w1", &[64, 64], Initializer::Zeros).unwrap();
    let w2 = b.parameter("w2", &[64, 8], Initializer::Zeros).unwrap();
    let m1 = b.matmul("mm1", x, w1).unwrap();
    b.shard(m1, "((2,1),(1,1))".parse().unwrap()).unwrap();
    let r = b.relu("relu", m1).unwrap();
    let m2 = b.matmul("mm2", r, w2).unwrap();
    b.shard(m2, "((8,1),(1,1))".parse().unwrap()).unwrap();
    let loss = b.reduce_mean("loss", m2, &[], false).unwrap();
    b.output(loss).unwrap();
    let p = plan(&b.finish(), &auto("recursive_programming", false)).unwrap();
    let relu = p.nodes.iter().find(|n| n.name == "relu").unwrap();
    assert_eq!(relu.strategy.as_ref().unwrap().to_string(), "((8, 1))");
}

/// recursive_programming on a device count that is not a power of two is refused first, before
/// anything else the plan would find wrong (here a batch of 32 that 6 devices do not divide).
#[test]
fn recursive_programming_refuses_a_count_that_is_not_a_power_of_two_first() {
    let mut c = auto("recursive_programming", false);
    c.set("device_num", &json!(6)).unwrap();
    let err = plan(&network([64, 128, 32, 16], 32, false), &c).unwrap_err();
    assert!(matches!(err, autopar_parallel::ParallelError::SearchDevices { devices: 6, .. }), "{err}");
}

/// MindSpore's `TwoMatMulNet` / `TwoMatMulReshapeNet` (every tensor a network input):
/// `add2(reshape?(matmul2(sub(matmul1(x, y), b), p)), q)`, x and b `[m, n]`, y and p `[n, n]`.
fn two_matmuls(m: usize, n: usize, reshape: Option<&[i64]>, q: &[usize]) -> Graph {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[m, n], DType::F32).unwrap();
    let y = b.input("y", &[n, n], DType::F32).unwrap();
    let bias = b.input("b", &[m, n], DType::F32).unwrap();
    let p = b.input("p", &[n, n], DType::F32).unwrap();
    let q = b.input("q", q, DType::F32).unwrap();
    let m1 = b.matmul("matmul1", x, y).unwrap();
    let s = b.sub("sub", m1, bias).unwrap();
    let mut m2 = b.matmul("matmul2", s, p).unwrap();
    if let Some(r) = reshape {
        m2 = b.reshape("reshape", m2, r).unwrap();
    }
    let a = b.add("add2", m2, q).unwrap();
    b.output(a).unwrap();
    b.finish()
}

/// Strategies MindSpore's own unit tests of recursive_programming assert (8 devices,
/// full_batch; every tensor a network input but the gathers' constant indices):
/// `test_auto_parallel_two_matmul_no_seq_parallel` (`rp_matmul_mem_coef` 1024: the second
/// MatMul contracts over the first's column split, so the add after it runs whole; the inputs
/// are one dataset node shaped as the first, so the second input's shape is no neighbour of the
/// first MatMul), `test_auto_parallel_sapp_gather_{1,2,3}` (a gather of an input table by
/// constant indices, reshaped into a MatMul) and
/// `test_auto_parallel_sapp_optimizer_parallel_restrict`.
#[test]
fn recursive_programming_gives_what_mindsporess_unit_tests_assert() {
    let strategy = |g: &Graph, c: &ParallelContext, name: &str| {
        let p = plan(g, c).unwrap();
        p.nodes.iter().find(|n| n.name == name).unwrap().strategy.as_ref().unwrap().to_string()
    };
    let g = two_matmuls(160, 320, None, &[160, 320]);
    let mut c = auto("recursive_programming", true);
    c.set("rp_matmul_mem_coef", &json!(1024)).unwrap();
    assert_eq!(strategy(&g, &c, "add2"), "((1, 1), (1, 1))");
    assert_eq!(strategy(&g, &c, "matmul1"), "((1, 1), (1, 8))");
    assert_eq!(strategy(&g, &c, "matmul2"), "((1, 8), (8, 1))");

    let c = auto("recursive_programming", true);
    for (table, indices, want) in
        [(vec![64usize, 64], vec![64usize, 64], "((1, 1), (8, 1))"), (vec![1024, 128], vec![2, 1024], "((4, 1), (2, 1))")]
    {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &table, DType::F32).unwrap();
        let y = b.input("y", &[2048, 64], DType::F32).unwrap();
        let index = b.fill("index", &indices, DType::I32, 1.0).unwrap();
        let gathered = b.gather("gather", x, index, 0).unwrap();
        let r = b.reshape("reshape", gathered, &[128, 2048]).unwrap();
        let m = b.matmul("matmul", r, y).unwrap();
        b.output(m).unwrap();
        assert_eq!(strategy(&b.finish(), &c, "gather"), want, "table {table:?}, indices {indices:?}");
    }
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[128], DType::F32).unwrap();
    let index = b.fill("index", &[4], DType::I32, 1.0).unwrap();
    let gathered = b.gather("gather", x, index, 0).unwrap();
    b.output(gathered).unwrap();
    assert_eq!(strategy(&b.finish(), &c, "gather"), "((1,), (4,))");

    // `test_auto_parallel_sapp_optimizer_parallel_restrict`: with the parallel optimizer on, a
    // [160, 320] x [320, 320000] MatMul still cuts its columns.
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[160, 320], DType::F32).unwrap();
    let y = b.input("y", &[320, 320000], DType::F32).unwrap();
    let m = b.matmul("matmul1", x, y).unwrap();
    b.output(m).unwrap();
    let mut c = auto("recursive_programming", true);
    c.set("enable_parallel_optimizer", &json!(true)).unwrap();
    assert_eq!(strategy(&b.finish(), &c, "matmul1"), "((1, 1), (1, 8))");
}

/// MindSpore's `test_rec_shared_param_strmodif` (training, 8 devices, batches split,
/// `fully_use_devices` off): two [40000, 5120] tables, each gathered by the same token ids
/// (an integer add of the ids) and used again as the transposed weight of a MatMul of the
/// gathered rows, one through casts to f16. Every gather splits the ids 8 ways and keeps its
/// table whole, `((1, 1), (8, 1))`, as MindSpore asserts; the table's other users (the MatMul,
/// the cast to f16) keep it whole too, so the gathers' share of it agrees with theirs.
#[test]
fn recursive_programming_gives_gathers_of_shared_tables_what_mindspore_asserts() {
    use autopar_graph::ops::Cast;
    use autopar_parallel::{plan_network, PlanRequest};
    let mut b = GraphBuilder::new(0);
    // MindSpore compiles each device's [2, 1024] ids: 16 rows over the 8 devices.
    let ids = b.input("input_ids", &[16, 1024], DType::I32).unwrap();
    let table = b.parameter("param", &[40000, 5120], Initializer::Zeros).unwrap();
    let table_two = b.parameter("param_two", &[40000, 5120], Initializer::Zeros).unwrap();
    let ids = b.add("ids", ids, ids).unwrap();
    let rows = b.gather("gather", table, ids, 0).unwrap();
    let rows = b.reshape("rows", rows, &[-1, 5120]).unwrap();
    let rows_two = b.gather("gather_two", table_two, ids, 0).unwrap();
    let rows_two = b.reshape("rows_two", rows_two, &[-1, 5120]).unwrap();
    let rows = b.op("rows.f16", Cast::to(DType::F16), &[rows]).unwrap();
    let weight = b.op("param.f16", Cast::to(DType::F16), &[table]).unwrap();
    let logits = b.matmul_t("matmul", rows, weight, false, true).unwrap();
    let logits_two = b.matmul_t("matmul_two", rows_two, table_two, false, true).unwrap();
    let logits = b.op("matmul.f32", Cast::to(DType::F32), &[logits]).unwrap();
    let out = b.add("add", logits, logits_two).unwrap();
    b.output(out).unwrap();
    let g = b.finish();
    let mut c = auto("recursive_programming", false);
    c.set("fully_use_devices", &json!(false)).unwrap();
    let p = plan_network(&PlanRequest { graph: &g, loss: Some(out), context: &c, strategy_file: None, profile: None }).unwrap();
    let strategy = |name: &str| p.nodes.iter().find(|n| n.name == name).unwrap().strategy.as_ref().unwrap().to_string();
    for gather in ["gather", "gather_two"] {
        assert_eq!(strategy(gather), "((1, 1), (8, 1))", "{gather}");
    }
    assert_eq!(strategy("param.f16"), "((1, 1))");
    assert_eq!(strategy("matmul_two"), "((8, 1), (1, 1))");
}

/// MindSpore's `test_auto_parallel_two_matmul{,_reshape1,_reshape2}_seq_parallel` (64 devices,
/// `rp_matmul_mem_coef` 1024, full_batch): the second MatMul contracts over the first's column
/// split, and above 32 devices its rows are split by that contraction too
/// (`ExtraShardMatmulOnBatchDim`): the add after it (directly or after a reshape to 3-D) takes
/// the 64-way row split, as MindSpore asserts, and the MatMul's partial sums reach it by one
/// reduce-scatter (MindSpore's output strategy), not an all-reduce.
#[test]
fn recursive_programming_shards_rows_after_a_contraction_above_32_devices_as_mindspore() {
    use autopar_layout::Step;
    for (reshape, q, want) in [
        (None, vec![640usize, 1280], "((64, 1), (64, 1))"),
        (Some(vec![64i64, 10, 1280]), vec![64, 10, 1280], "((64, 1, 1), (64, 1, 1))"),
        (Some(vec![10, 64, 1280]), vec![10, 64, 1280], "((1, 64, 1), (1, 64, 1))"),
    ] {
        let g = two_matmuls(640, 1280, reshape.as_deref(), &q);
        let mut c = auto("recursive_programming", true);
        c.set("device_num", &json!(64)).unwrap();
        c.set("rp_matmul_mem_coef", &json!(1024)).unwrap();
        let p = plan(&g, &c).unwrap();
        let strategy = |name: &str| p.nodes.iter().find(|n| n.name == name).unwrap().strategy.as_ref().unwrap().to_string();
        assert_eq!(strategy("add2"), want, "{reshape:?}");
        assert_eq!(strategy("matmul2"), "((1, 64), (64, 1))");
        if reshape.is_none() {
            let after = p.redistributions.iter().find(|r| g.node(r.producer).name == "matmul2").unwrap();
            assert!(matches!(after.plan.steps[..], [ref s] if matches!(s.step, Step::ReduceScatter { .. })), "{:?}", after.plan);
        }
    }
    // At 32 devices and below the rows are not split further: the add runs whole.
    let mut c = auto("recursive_programming", true);
    c.set("device_num", &json!(32)).unwrap();
    c.set("rp_matmul_mem_coef", &json!(1024)).unwrap();
    let p = plan(&two_matmuls(640, 1280, None, &[640, 1280]), &c).unwrap();
    assert_eq!(p.nodes.iter().find(|n| n.name == "add2").unwrap().strategy.as_ref().unwrap().to_string(), "((1, 1), (1, 1))");
}

/// A weight two matrix products share, in `x [1024, 1024] @ w` summed over its rows to
/// `[1, 1024] @ w`: the partition cuts the first product's rows (the weight whole) and the
/// second one's weight columns (one row to cut). Training (MindSpore's `GenerateStrategyV3`)
/// keeps both. Inference (`GenerateStrategyV1`) gives the weight its most-cut user's split and
/// redoes the other user from it (`SetParamStrategy`, `ApplyParamStrategy`): a matrix product
/// takes its contraction's split from the weight's first entry and caps its rows by that split
/// (`MakeMatMulStratFromParam`), so the first product leaves its rows whole. The input is whole
/// in inference, split by its batch in training.
#[test]
fn recursive_programming_gives_a_shared_weight_one_split_in_inference_as_mindspore() {
    use autopar_parallel::{plan_network, PlanRequest};
    let net = |rows: usize| {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[rows, 1024], DType::F32).unwrap();
        let w = b.parameter("w", &[1024, 1024], Initializer::Zeros).unwrap();
        let m1 = b.matmul("mm1", x, w).unwrap();
        let r = b.reduce_sum("rows", m1, &[0], true).unwrap();
        let m2 = b.matmul("mm2", r, w).unwrap();
        let loss = b.reduce_mean("loss", m2, &[], false).unwrap();
        b.output(loss).unwrap();
        (b.finish(), loss)
    };
    let (g, loss) = net(1024);
    let c = auto("recursive_programming", false);
    let strategy = |p: &ParallelPlan, name: &str| p.nodes.iter().find(|x| x.name == name).unwrap().strategy.as_ref().unwrap().to_string();
    let input = |p: &ParallelPlan| parameter_layout_dict(p, 0, &|_| Vec::new()).into_iter().find(|(n, _)| n == "x").unwrap().1.to_string();

    let train = plan_network(&PlanRequest { graph: &g, loss: Some(loss), context: &c, strategy_file: None, profile: None }).unwrap();
    assert_eq!(strategy(&train, "mm1"), "((8, 1), (1, 1))");
    assert_eq!(strategy(&train, "mm2"), "((1, 1), (1, 2))");
    assert!(input(&train).starts_with("([8], [0, -1]"), "{}", input(&train));

    let infer = plan(&g, &c).unwrap();
    assert_eq!(strategy(&infer, "mm1"), "((1, 1), (1, 2))");
    assert_eq!(strategy(&infer, "mm2"), "((1, 1), (1, 2))");
    assert!(input(&infer).starts_with("([8], [-1, -1]"), "{}", input(&infer));
    let report = infer.search.as_ref().unwrap();
    assert_eq!(report.ops.iter().find(|o| o.name == "mm1").map(|o| o.source.name()), Some("propagated"));
    assert_eq!(infer.dataset, autopar_parallel::DatasetStrategy::FullBatch, "the plan records the inputs whole");

    // Inputs whole need no batch that the devices divide; training does.
    let (odd, odd_loss) = net(1020);
    assert!(input(&plan(&odd, &c).unwrap()).starts_with("([8], [-1, -1]"));
    let err =
        plan_network(&PlanRequest { graph: &odd, loss: Some(odd_loss), context: &c, strategy_file: None, profile: None }).unwrap_err();
    assert!(matches!(err, autopar_parallel::ParallelError::BatchNotDivisible { .. }), "{err}");

    // A dataset strategy the user chose is kept.
    let mut chosen = c.clone();
    chosen.set("full_batch", &json!(false)).unwrap();
    let kept = plan(&g, &chosen).unwrap();
    assert!(input(&kept).starts_with("([8], [0, -1]"), "{}", input(&kept));
}

/// recursive_programming under full_batch: the dataset's strategy splits nothing (MindSpore's
/// `MakeFullBatchStrategy`), so an element-wise op reading a network input and a product
/// copies the product's strategy (MindSpore's `FindIndexOfOperatorIncoming` passes over the
/// input); with split inputs it stops at the input.
#[test]
fn recursive_programming_under_full_batch_copies_past_the_dataset() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[256, 64], DType::F32).unwrap();
    let w = b.parameter("w", &[64, 64], Initializer::Zeros).unwrap();
    let m = b.matmul("mm", x, w).unwrap();
    let a = b.add("add", x, m).unwrap();
    let loss = b.reduce_mean("loss", a, &[], false).unwrap();
    b.output(loss).unwrap();
    let g = b.finish();
    let strategy = |p: &ParallelPlan, name: &str| p.nodes.iter().find(|n| n.name == name).unwrap().strategy.clone().unwrap();
    let full = plan(&g, &auto("recursive_programming", true)).unwrap();
    let mm = strategy(&full, "mm");
    // The add's two inputs take the product's output strategy, rows and columns as it splits them.
    let out = mm.0[0][0];
    let cols = mm.0[1][1];
    assert_eq!(strategy(&full, "add").0, vec![vec![out, cols], vec![out, cols]], "product {mm}");
    assert!(out * cols > 1, "the product splits: {mm}");
    // With split inputs the copy stops at the input, whose strategy passes on nothing.
    let split = plan(&g, &auto("recursive_programming", false)).unwrap();
    assert_ne!(strategy(&split, "add"), strategy(&full, "add"));
}
