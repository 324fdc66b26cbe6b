//! `autopar plan` end to end: planning without training, as text, JSON, SVG and MindSpore's
//! parameter_layout_dict, for a model larger than this machine and for a strategy file.

use std::path::Path;
use std::process::{Command, Output};

fn autopar(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(args).output().expect("autopar runs")
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let o = autopar(dir, args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{args:?}\n{out}\n{err}");
    out
}

/// The error `autopar` stops with.
fn fails(dir: &Path, args: &[&str]) -> String {
    let o = autopar(dir, args);
    assert!(!o.status.success(), "{args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_32_block_gpt_plans_for_4096_devices_with_every_section() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["plan", "--model", "gpt", "--depth", "32", "--width", "512", "--heads", "8", "--devices", "4096"];
    // By default the summary alone, in at most 30 lines, every figure it promises in it.
    let summary = ok(dir.path(), &args);
    assert!(summary.lines().count() <= 30, "{} lines:\n{summary}", summary.lines().count());
    for part in
        ["summary (rank 0 of 4096)", "  memory ", "  step time ", "compute ", "communication ", "costliest ops", "warning", "--full"]
    {
        assert!(summary.contains(part), "{part} missing:\n{summary}");
    }
    assert!(!summary.contains("\noperators\n"), "{summary}");
    // Its web page lists 64 ranks spread over the job, groups shortened: a page a browser opens.
    let mut html_args = args.to_vec();
    html_args.extend(["--html", "big.html"]);
    ok(dir.path(), &html_args);
    let page = std::fs::read_to_string(dir.path().join("big.html")).unwrap();
    assert!(page.len() < 4 << 20, "{} bytes", page.len());
    assert!(page.contains("64 of the 4096 ranks, spread over the job") && page.contains("data-v=\"4095\""));
    let quiet = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "8"]);
    assert!(quiet.contains("  warnings    none"), "{quiet}");
    // A plan over the memory a device has says so among the warnings (412 GB of weights,
    // gradients and AdamW state on one device: more than any machine this runs on).
    let huge = ok(dir.path(), &["plan", "--model", "gpt", "--depth", "8", "--width", "16384", "--heads", "16", "--optimizer", "adamw"]);
    assert!(huge.contains("warning: the plan needs"), "{huge}");
    // Many warnings still fit in 30 lines; --json lists them all with their hints, and the
    // predicted step.
    let many = [
        "plan",
        "--model",
        "mlp",
        "--width",
        "50000",
        "--depth",
        "4",
        "--devices",
        "8",
        "--batch-size",
        "4",
        "--parallel",
        "dataset_strategy=full_batch",
    ];
    let crowded = ok(dir.path(), &many);
    assert!(crowded.lines().count() <= 30 && crowded.matches("warning: ").count() >= 2, "{crowded}");
    let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &[&many[..], &["--json"]].concat())).unwrap();
    let warnings = v["summary"]["warnings"].as_array().unwrap();
    assert!(warnings.iter().any(|w| w.as_str().unwrap().starts_with("the plan needs") && w.as_str().unwrap().contains("hint: ")), "{v}");
    assert!(v["summary"]["step_seconds"]["total"].as_f64().unwrap() > 0.0, "{v}");
    let mut args = args.to_vec();
    args.push("--full");
    let out = ok(dir.path(), &args);
    assert!(out.contains("summary (rank 0 of 4096)"), "{out}");
    for section in ["operators", "parameters", "redistributions", "communication per step (rank 0)", "memory per device (rank 0)"] {
        assert!(out.contains(section), "{section} missing:\n{out}");
    }
    assert!(out.contains("on 4096 devices (semi_auto_parallel)") && out.contains("blocks.31.mlp.fc2.matmul"), "{out}");
    let mut json_args = args.to_vec();
    json_args.extend(["--json", "--rank", "4095", "--optimizer", "adamw"]);
    let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &json_args)).unwrap();
    assert_eq!(v["device_num"], 4096);
    assert_eq!(v["rank"], 4095);
    let params = v["parameters"].as_array().unwrap();
    assert!(params.iter().any(|p| p["name"] == "blocks.31.attn.q_proj.weight"));
    // Data parallel by default: every parameter whole on every rank, gradients summed over all.
    assert!(params.iter().all(|p| p["mirror_ranks"] == 4096 || p["trainable"] == false), "{params:?}");
    let m = &v["memory"];
    assert_eq!(m["optimizer_state"].as_u64().unwrap(), 2 * m["gradients"].as_u64().unwrap(), "adamw keeps two slots");
    assert!(m["peak_activations"].as_u64().unwrap() > 0 && v["flops"].as_f64().unwrap() > 0.0);
    let comm = v["communication"].as_array().unwrap();
    assert!(comm.iter().any(|c| c["kind"] == "all_reduce" && c["group"].as_array().unwrap().len() == 4096), "{comm:?}");
    assert!(v["planning_seconds"].as_f64().unwrap() < 10.0);
}

/// A model-parallel strategy file for the MLP (width 16) on 4 devices.
const MEGATRON: &str = r#"{"current_stage": 2, "parallel_strategy_item": {
  "MatMul_fc1.weight": {"stage": 0, "parallel_strategy": [[2, 1], [2, 1]]},
  "MatMul_fc2.weight": {"stage": 0, "parallel_strategy": [[2, 2], [1, 2]]}},
  "parallel_layout_item": {}}"#;

#[test]
fn a_strategy_file_sets_the_strategies_and_the_plan_says_where_each_came_from() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.json"), MEGATRON).unwrap();
    let base = ["plan", "--model", "mlp", "--width", "16", "--devices", "4"];
    let mut a = base.to_vec();
    a.extend(["--strategy", "s.json", "--json", "--svg", "splits.svg"]);
    let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &a)).unwrap();
    let op = |name: &str| v["operators"].as_array().unwrap().iter().find(|o| o["name"] == name).unwrap().clone();
    assert_eq!(op("fc1.matmul")["source"], "file");
    assert_eq!(op("fc1.matmul")["strategy"], serde_json::json!([[2, 1], [2, 1]]));
    assert_eq!(op("fc3.matmul")["source"], "default");
    assert!(v["strategy_file"].as_str().unwrap().ends_with("s.json"));
    // Strategies for the job's 4 devices: no op runs twice.
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    // fc2 splits its contraction: its output is a partial sum, completed by a redistribution.
    assert_eq!(op("fc2.matmul")["output"]["partial"], true);
    assert!(v["redistributions"].as_array().unwrap().iter().any(|r| r["site"].as_str().unwrap().contains("fc2")), "{v}");
    let svg = std::fs::read_to_string(dir.path().join("splits.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("fc1.weight") && svg.matches("<rect").count() >= 4, "{svg}");
    // The device matrix, a legend, replicas said, and every caption within the picture.
    // The biggest activations too, the cuts in their axis' colours, and the redistributions drawn.
    for part in [
        "device matrix [2, 2]",
        "rK: the first rank holding a slice; xN: N ranks hold that slice (replicas)",
        ">r3</text>",
        "parameter fc1.weight [16, 784]",
        "dim 0 cut 2 ways by axis 1 (2, blue); dim 1 whole; 2 copies of each slice, along axis 0 (2, red)",
        "activation fc2.matmul (MatMul) [32, 16]",
        "partial sums along axis 1 (2, blue)",
        "redistributions between consecutive ops",
        "axis 0 red, axis 1 blue",
    ] {
        assert!(svg.contains(part), "{part} missing: {svg}");
    }
    assert_text_fits(&svg);
    // MindSpore's parameter_layout_dict lines: fc1.weight [16, 784] split 2 ways on rows.
    let mut a = base.to_vec();
    a.extend(["--strategy", "s.json", "--mindspore-layouts"]);
    let lines = ok(dir.path(), &a);
    let fc1 = lines.lines().find(|l| l.starts_with("fc1.weight: ")).unwrap();
    assert!(fc1.contains("[8, 784]") && fc1.contains("[16, 784]"), "{lines}");
    // Without the file, the same plan is data parallel.
    let mut a = base.to_vec();
    a.push("--json");
    let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &a)).unwrap();
    assert_eq!(v["operators"].as_array().unwrap().iter().find(|o| o["name"] == "fc1.matmul").unwrap()["source"], "default");
    // The file's strategies for 4 devices on 16: each of its ops runs 4 times over, and the
    // plan says so (the text and the JSON), as `train` does before its first step.
    let wide = ["plan", "--model", "mlp", "--width", "16", "--devices", "16", "--strategy", "s.json"];
    let text = ok(dir.path(), &wide);
    let warning = text.lines().find(|l| l.starts_with("warning: ")).unwrap_or_else(|| panic!("no warning in\n{text}"));
    assert!(
        warning.contains("split them over 4 of 16 devices: each slice is computed 4 times over") && warning.contains("fc1.matmul"),
        "{warning}"
    );
    let mut train = wide.to_vec();
    train[0] = "train";
    train.extend(["--data", "synthetic", "--steps", "1", "--eval", "false"]);
    let o = autopar(dir.path(), &train);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("each slice is computed 4 times over"), "{err}");
}

#[test]
fn options_autopar_does_not_implement_are_refused_before_planning() {
    let dir = tempfile::tempdir().unwrap();
    for (opt, needle) in [("pipeline_result_broadcast=true", "applies to pipelines"), ("costmodel_beta=2", "applies to auto_parallel")] {
        let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "8", "--parallel", opt]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{opt}: {err}");
        assert!(err.contains(needle), "{opt}: {err}");
    }
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "8", "--strategy", "missing.json"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.json"), "{:?}", o);
    // Contradictions: several devices in stand_alone, full_batch outside semi_auto_parallel.
    for (args, needle) in [
        (&["--devices", "4", "--parallel-mode", "stand_alone"][..], "stand_alone runs on one device, but --devices 4"),
        (&["--devices", "4", "--parallel-mode", "data_parallel", "--parallel", "full_batch=true"][..], "data_parallel does not support it"),
        // Two outputs asked for at once.
        (&["--devices", "2", "--compare", "--svg", "x.svg"][..], "--compare prints a table of every search; --svg draws one plan"),
        (&["--devices", "2", "--json", "--mindspore-layouts"][..], "--json and --mindspore-layouts both choose the output"),
        (&["--devices", "2", "--parallel", "search_mode=dynamic_programming"][..], "hint: pass --parallel-mode auto_parallel"),
        (&["--devices", "2", "--compare", "--mindspore-layouts"][..], "--compare prints a table of every search; --mindspore-layouts"),
        (
            &["--devices", "2", "--compare", "--parallel-mode", "data_parallel"][..],
            "--compare plans under auto_parallel, but the parallel mode is data_parallel",
        ),
        // One split list per network input (the MLP has two: its images and its labels).
        (
            &["--devices", "4", "--parallel", "dataset_strategy=[[2,1],[2],[1]]"][..],
            "dataset_strategy lists 3 inputs, but the network has 2",
        ),
        // A dictionary option's field is set with the dictionary: the hint says how.
        (
            &["--devices", "2", "--parallel", r#"comm_fusion={"allreduce": {"mode": "size", "config": -3}}"#][..],
            r#"--parallel 'comm_fusion={"allreduce": {"config": VALUE}}'"#,
        ),
        // The device count or the mode given twice, differently.
        (&["--devices", "2", "--parallel", "device_num=8"][..], "--devices gives 2 but --parallel device_num gives 8"),
        (
            &["--devices", "2", "--parallel", "parallel_mode=data_parallel", "--parallel-mode", "semi_auto_parallel"][..],
            "--parallel-mode gives semi_auto_parallel but --parallel parallel_mode gives data_parallel",
        ),
    ] {
        let o = autopar(dir.path(), &[&["plan", "--model", "mlp"][..], args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // The same in the config file; a flag still overrides the file.
    std::fs::write(dir.path().join("two.toml"), "model = \"mlp\"\ndevices = 2\n[parallel]\ndevice_num = 8\n").unwrap();
    let o = autopar(dir.path(), &["plan", "--config", "two.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("devices in the config file gives 2 but device_num in its [parallel] table gives 8"), "{err}");
    std::fs::write(dir.path().join("one.toml"), "model = \"mlp\"\ndevices = 2\n").unwrap();
    assert!(ok(dir.path(), &["plan", "--config", "one.toml", "--devices", "4"]).contains("on 4 devices"));
    // --compare reads the mode of the file's [parallel] table too.
    std::fs::write(dir.path().join("mode.toml"), "model = \"mlp\"\ndevices = 2\n[parallel]\nparallel_mode = \"data_parallel\"\n").unwrap();
    let o = autopar(dir.path(), &["plan", "--config", "mode.toml", "--compare"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--compare plans under auto_parallel, but the parallel mode is data_parallel"), "{err}");
}

/// auto_parallel explains its choice: per op the strategy, its source, its cost by part and the
/// runner-up; JSON carries the same.
#[test]
fn auto_parallel_plans_explain_every_search() {
    let dir = tempfile::tempdir().unwrap();
    for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
        let opt = format!("search_mode={search}");
        let args = ["plan", "--model", "mlp", "--devices", "8", "--parallel-mode", "auto_parallel", "--parallel", &opt, "--full"];
        let out = ok(dir.path(), &args);
        assert!(out.contains(&format!("strategy search: {search}")), "{out}");
        assert!(out.contains("runner-up (extra)") && out.contains("fc1.matmul"), "{out}");
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &json_args)).unwrap();
        assert_eq!(v["search"]["search"], search);
        let ops = v["search"]["operators"].as_array().unwrap();
        assert!(ops.iter().all(|o| o["compute_seconds"].as_f64().unwrap() >= 0.0), "{v}");
    }
    // --compare: every search, pure data parallel and the exact optimum, none below the optimum.
    // It plans under auto_parallel, so auto_parallel's options need no --parallel-mode.
    let out = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "4", "--compare", "--parallel", "search_mode=dynamic_programming"]);
    // dynamic_programming optimises MindSpore's cost model, and --compare shows it in seconds
    // too; under a device profile it optimises seconds, and the other row is MindSpore's.
    assert!(out.contains("dynamic_programming: optimised MindSpore's cost model"), "{out}");
    let row = |out: &str, name: &str| {
        out.lines().any(|l| l.trim_start().starts_with(name) && l.contains(" ms ") && !l.contains("could not plan"))
    };
    assert!(row(&out, "dynamic_programming (seconds)"), "{out}");
    std::fs::write(dir.path().join("profile.toml"), autopar_parallel::DeviceProfile::builtin().to_toml()).unwrap();
    let profiled = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "4", "--compare", "--profile", "profile.toml"]);
    assert!(row(&profiled, "dynamic_programming (MindSpore)"), "{profiled}");
    // Pure data parallel is the same row with a model-parallel strategy file loaded (the file
    // moves the searches' rows: recursive_programming keeps a layer of 512 whole), here
    // dynamic_programming's in seconds.
    ok(
        dir.path(),
        &[
            "plan",
            "--model",
            "mlp",
            "--devices",
            "4",
            "--parallel-mode",
            "auto_parallel",
            "--parallel",
            "search_mode=dynamic_programming",
            "--profile",
            "profile.toml",
            "--parallel",
            "strategy_ckpt_config={\"save_file\": \"mp.json\"}",
        ],
    );
    let with_file = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "4", "--compare", "--strategy", "mp.json"]);
    let cost = |out: &str, search: &str| {
        let row = out.lines().find(|l| l.trim_start().starts_with(search)).unwrap_or_else(|| panic!("{search} missing:\n{out}"));
        row.split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(cost(&with_file, "data_parallel"), cost(&out, "data_parallel"), "{out}\n{with_file}");
    assert_ne!(cost(&with_file, "recursive_programming"), cost(&out, "recursive_programming"), "{out}\n{with_file}");
    for search in ["recursive_programming", "sharding_propagation", "dynamic_programming", "data_parallel", "exact"] {
        let row = out.lines().find(|l| l.trim_start().starts_with(search)).unwrap_or_else(|| panic!("{search} missing:\n{out}"));
        let ratio: f64 = row.split_whitespace().last().unwrap().parse().unwrap();
        assert!(ratio >= 1.0 - 1e-9, "{row}");
    }
    // A memory budget no strategy fits names the op and its largest tensors.
    let o = autopar(
        dir.path(),
        &["plan", "--model", "mlp", "--devices", "2", "--parallel-mode", "auto_parallel", "--parallel", "device_memory_capacity=1000"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("device_memory_capacity = 1000") && err.contains("largest tensors"), "{err}");
}

/// `autopar calibrate` writes a device profile that `plan --profile` reads; a broken profile is
/// refused naming the file and the field.
#[test]
fn calibrated_profiles_drive_the_cost_model() {
    let dir = tempfile::tempdir().unwrap();
    ok(dir.path(), &["calibrate", "--quick", "--max-ranks", "2", "--out", "machine.toml"]);
    let text = std::fs::read_to_string(dir.path().join("machine.toml")).unwrap();
    assert!(text.contains("flops_per_s") && text.contains("[[links]]") && text.contains("ranks = 2"), "{text}");
    let args = ["plan", "--model", "mlp", "--devices", "2", "--parallel-mode", "auto_parallel", "--profile", "machine.toml", "--full"];
    let out = ok(dir.path(), &args);
    assert!(out.contains("device profile: calibrated on"), "{out}");
    // the same from a config file's `profile` key, and the flag wins over it
    std::fs::write(
        dir.path().join("run.toml"),
        "model = \"mlp\"\ndevices = 2\nparallel_mode = \"auto_parallel\"\nprofile = \"machine.toml\"\n",
    )
    .unwrap();
    let out = ok(dir.path(), &["plan", "--config", "run.toml"]);
    assert!(out.contains("by the device profile calibrated on"), "the summary prices the step with it:\n{out}");
    let out = ok(dir.path(), &["plan", "--config", "run.toml", "--full"]);
    assert!(out.contains("device profile: calibrated on"), "{out}");
    let o = autopar(dir.path(), &["plan", "--config", "run.toml", "--profile", "missing.toml"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.toml"), "--profile overrides the file's key");
    std::fs::write(dir.path().join("bad.toml"), text.replace("flops_per_s", "flops")).unwrap();
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--parallel-mode", "auto_parallel", "--profile", "bad.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml") && err.contains("flops_per_s"), "{err}");
    // A key the profile does not have (a misspelt one would leave its default), and a profile
    // in a mode whose plan no search prices.
    std::fs::write(dir.path().join("extra.toml"), text.replace("seconds_per_byte", "second_per_byte")).unwrap();
    let o =
        autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--parallel-mode", "auto_parallel", "--profile", "extra.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("links[0].second_per_byte is not a key of a device profile"), "{err}");
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--profile", "machine.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("prices auto_parallel's strategy search, and the parallel mode is semi_auto_parallel"), "{err}");
    // A group too large to simulate here is refused before anything is measured.
    for n in ["3", "128", "1099511627776"] {
        let o = autopar(dir.path(), &["calibrate", "--quick", "--max-ranks", n]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{n}: {err}");
        assert!(err.contains(&format!("invalid --max-ranks {n}: a power of two from 2 to 64")), "{err}");
    }
}

#[test]
fn a_pipeline_plan_shows_its_stages_transfers_activation_memory_and_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["plan", "--model", "gpt", "--devices", "8", "--parallel", "pipeline_stages=2", "--micro-batches", "4", "--full"];
    let mut a = base.to_vec();
    a.extend(["--svg", "schedule.svg"]);
    let text = ok(dir.path(), &a);
    assert!(text.contains("pipeline: 2 stages of 4 device(s), 4 micro-batches, 1f1b schedule"), "{text}");
    assert!(text.contains("stage 1 (ranks 4..8)"), "{text}");
    // Cut between two blocks: one [8 * 64 / 4, 128] value per micro-batch, on each of 4 ranks.
    assert_eq!(text.matches("  sends ").count(), 1, "{text}");
    assert!(text.contains("[128, 128] (64.0 KiB) to stage 1 (rank r+4) per micro-batch"), "{text}");
    assert!(text.contains("x 2 in flight") && text.contains("x 1 in flight"), "{text}");
    let svg = std::fs::read_to_string(dir.path().join("schedule.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains(">stage 1</text>"), "{svg}");
    let boxes = svg.matches(r##"fill="#9ecae1" stroke="#fff""##).count() + svg.matches(r##"fill="#3182bd" stroke="#fff""##).count();
    assert_eq!(boxes, 2 * 2 * 4, "a forward and a backward box per stage and micro-batch");
    // A legend, each stage's idle time, and a time axis in the milliseconds the summary predicts.
    for part in [">forward</text>", ">backward</text>", ">idle</text>", ">idle 20%</text>", "time, ms, predicted"] {
        assert!(svg.contains(part), "{part} missing: {svg}");
    }
    let step_ms = text.split("  step time   ").nth(1).and_then(|t| t.split(" ms").next()).unwrap_or_else(|| panic!("{text}"));
    assert!(svg.contains(&format!(">{step_ms}</text>")), "the axis ends at the predicted step, {step_ms} ms: {svg}");

    let mut a = base.to_vec();
    a.push("--json");
    let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &a)).unwrap();
    let stages = v["pipeline"]["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0]["peak_in_flight"], 2);
    assert!(stages[0]["activation_bytes"].as_u64().unwrap() > stages[1]["activation_bytes"].as_u64().unwrap());

    // The tied embedding is shared: rank 4 receives it from rank 0.
    let mut a = base.to_vec();
    a.extend(["--mindspore-layouts", "--rank", "4"]);
    let text = ok(dir.path(), &a);
    let wte = text.lines().find(|l| l.starts_with("wte.weight: ")).unwrap();
    assert!(wte.ends_with("True, False, 0, 1)"), "{wte}");

    // With the parallel optimizer, shard groups are named by world ranks: stage 1's by 4-7.
    let mut a = base.to_vec();
    a.extend([
        "--parallel",
        "enable_parallel_optimizer=true",
        "--parallel",
        r#"parallel_optimizer_config={"parallel_optimizer_threshold": 0}"#,
    ]);
    let text = ok(dir.path(), &a);
    let line = |name: &str| {
        text.lines().find(|l| l.trim_start().starts_with(name) && l.contains("sharded over")).unwrap_or_else(|| panic!("{name}: {text}"))
    };
    assert!(
        line("blocks.0.attn.q_proj.weight").contains(&format!("[0, 1, 2, 3] ({})", autopar::parallel::group_name(&[0, 1, 2, 3], 8))),
        "{text}"
    );
    assert!(
        line("blocks.3.attn.q_proj.weight").contains(&format!("[4, 5, 6, 7] ({})", autopar::parallel::group_name(&[4, 5, 6, 7], 8))),
        "{text}"
    );
    assert!(!text.contains("hccl_world_group"), "{text}");
    // Interleaved: 2 chunks per stage, and the last stage's first chunk sends back to stage 0.
    let mut a = base.to_vec();
    a.extend(["--parallel", r#"pipeline_config={"pipeline_interleave": true}"#]);
    let text = ok(dir.path(), &a);
    assert!(text.contains("2 chunks per stage (interleaved)") && text.contains("to stage 0 (rank r-4)"), "{text}");

    let o = autopar(dir.path(), &["plan", "--model", "gpt", "--devices", "8", "--parallel", "pipeline_stages=2", "--micro-batches", "3"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("3 micro-batches do not divide the batch of 32 rows"), "{o:?}");
    // Without stages, as `train` runs them: one micro-batch's plan, accumulated.
    let text = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--batch-size", "48", "--micro-batches", "3"]);
    assert!(text.contains("3 micro-batches a step, gradients accumulated") && text.contains("fc1.matmul"), "{text}");
    let text = ok(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--batch-size", "48", "--micro-batches", "3", "--full"]);
    assert!(text.contains("3 micro-batches of 16 rows, one after another"), "{text}");
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--batch-size", "32", "--micro-batches", "3"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("3 micro-batches do not divide the batch of 32 rows"), "{o:?}");
}

/// `op_strategy_config`: `plan` and `train` save the operator strategies (the same file), `plan`
/// and `train` load them (an edited strategy is the one planned; the run equals stand-alone);
/// `--compare` refuses to save; a missing file to load is named.
#[test]
fn operator_strategy_files_from_plan_drive_train() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["--model", "mlp", "--devices", "4", "--parallel-mode", "auto_parallel", "--parallel", "search_mode=sharding_propagation"];
    let data = ["--data", "synthetic", "--synthetic-samples", "256", "--steps", "2", "--batch-size", "32", "--eval", "false"];
    let op = |mode: &str, path: &str| format!(r#"op_strategy_config={{"mode": "{mode}", "path": "{path}"}}"#);
    let run = |cmd: &str, option: &str, extra: &[&str]| {
        let mut a = vec![cmd];
        a.extend(base);
        a.extend(["--parallel", option]);
        a.extend(extra);
        ok(dir.path(), &a)
    };
    run("plan", &op("SAVE", "ops.json"), &[]);
    run("train", &op("SAVE", "ops_train.json"), &data);
    let text = std::fs::read_to_string(dir.path().join("ops.json")).unwrap();
    assert!(text.contains("\"parallel_strategy_item\"") && text.contains("\"fc1.matmul\""), "{text}");
    assert_eq!(text, std::fs::read_to_string(dir.path().join("ops_train.json")).unwrap(), "plan and train save the same plan");

    // Edit fc1's strategy: the loaded plan runs it, marked as read from the file.
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["parallel_strategy_item"]["fc1.matmul"]["parallel_strategy"] = serde_json::json!([[1, 1], [4, 1]]);
    std::fs::write(dir.path().join("edited.json"), v.to_string()).unwrap();
    let out = run("plan", &op("LOAD", "edited.json"), &["--full"]);
    // The operators table's row (the summary lists the op too, without its source).
    let table = out.split("\noperators\n").nth(1).unwrap_or_else(|| panic!("no operators table:\n{out}"));
    let line = table.lines().find(|l| l.trim_start().starts_with("fc1.matmul ")).unwrap();
    assert!(line.contains("((1, 1), (4, 1))") && line.contains("file"), "{line}");
    let mut extra = data.to_vec();
    extra.push("--verify");
    let out = run("train", &op("LOAD", "edited.json"), &extra);
    assert!(out.contains("verify:") && !out.contains("MISMATCH"), "{out}");

    let mut a = vec!["plan", "--compare"];
    a.extend(base);
    let save = op("SAVE", "ops.json");
    a.extend(["--parallel", save.as_str()]);
    let o = autopar(dir.path(), &a);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--compare"));
    let mut a = vec!["plan"];
    a.extend(base);
    let load = op("LOAD", "missing.json");
    a.extend(["--parallel", load.as_str()]);
    let o = autopar(dir.path(), &a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("missing.json") && err.contains("op_strategy_config"), "{err}");
}

/// `--pipeline-split`: stage 1 begins at the named op (plan and train, from the flag or the
/// config file), and a name that is not an op is refused naming it.
#[test]
fn pipeline_split_starts_stages_at_the_named_ops() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["plan", "--model", "gpt", "--devices", "4", "--parallel", "pipeline_stages=2", "--micro-batches", "2", "--json"];
    let stage_ops = |extra: &[&str]| -> Vec<u64> {
        let mut a = base.to_vec();
        a.extend(extra);
        let v: serde_json::Value = serde_json::from_str(&ok(dir.path(), &a)).unwrap();
        v["pipeline"]["stages"].as_array().unwrap().iter().map(|s| s["ops"].as_u64().unwrap()).collect()
    };
    let balanced = stage_ops(&[]);
    let early = stage_ops(&["--pipeline-split", "blocks.1.ln1"]);
    assert_eq!(balanced.iter().sum::<u64>(), early.iter().sum::<u64>());
    assert!(early[0] < balanced[0] && early[0] * 2 < early[1], "{balanced:?} vs {early:?}");
    std::fs::write(dir.path().join("split.toml"), "pipeline_split = [\"blocks.1.ln1\"]\n").unwrap();
    assert_eq!(stage_ops(&["--config", "split.toml"]), early);

    let mut a = base.to_vec();
    a.extend(["--pipeline-split", "blocks.9.ln1"]);
    let o = autopar(dir.path(), &a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("\"blocks.9.ln1\"") && err.contains("--pipeline-split"), "{err}");

    // train: the stages' parameters (strategy.json beside the checkpoints) follow the split.
    let train = |split: Option<&str>, folder: &str| -> String {
        let mut a = vec![
            "train",
            "--model",
            "gpt",
            "--width",
            "32",
            "--depth",
            "3",
            "--heads",
            "2",
            "--input-shape",
            "16",
            "--num-classes",
            "32",
            "--data",
            "synthetic",
            "--synthetic-samples",
            "128",
            "--steps",
            "2",
            "--batch-size",
            "8",
            "--devices",
            "2",
            "--parallel",
            "pipeline_stages=2",
            "--micro-batches",
            "2",
            "--optimizer",
            "momentum",
            "--verify",
            "--eval",
            "false",
            "--checkpoint-dir",
            folder,
        ];
        if let Some(op) = split {
            a.extend(["--pipeline-split", op]);
        }
        let out = ok(dir.path(), &a);
        assert!(out.contains("verify:") && !out.contains("MISMATCH"), "{out}");
        std::fs::read_to_string(dir.path().join(folder).join("strategy.json")).unwrap()
    };
    for (op, last_on_0, first_on_1) in
        [("blocks.1.ln1", "0-blocks.0.ln1.gamma", "1-blocks.1.ln1.gamma"), ("blocks.2.ln1", "0-blocks.1.ln1.gamma", "1-blocks.2.ln1.gamma")]
    {
        let file = train(Some(op), op);
        assert!(file.contains(last_on_0) && file.contains(first_on_1), "split at {op}: {file}");
    }
}

/// `strategy_ckpt_config.save_file`: `plan` writes the strategy file that `train` writes at its
/// start (the same bytes), and refuses it with `--compare` rather than writing nothing.
#[test]
fn plan_writes_the_strategy_file_train_writes() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["--model", "mlp", "--devices", "4", "--parallel-mode", "auto_parallel", "--optimizer", "momentum"];
    let data = ["--data", "synthetic", "--synthetic-samples", "64", "--steps", "1", "--batch-size", "32", "--eval", "false"];
    let save = |path: &str| format!("strategy_ckpt_config={{\"save_file\": \"{path}\"}}");
    let mut a = vec!["plan"];
    a.extend(base);
    let s = save("plan.json");
    a.extend(["--parallel", s.as_str()]);
    ok(dir.path(), &a);
    let mut a = vec!["train"];
    a.extend(base);
    a.extend(data);
    let s = save("train.json");
    a.extend(["--parallel", s.as_str()]);
    ok(dir.path(), &a);
    let plan = std::fs::read_to_string(dir.path().join("plan.json")).unwrap();
    assert!(plan.contains("parallel_layout_item") && plan.contains("fc1.weight"), "{plan}");
    assert_eq!(plan, std::fs::read_to_string(dir.path().join("train.json")).unwrap());
    let mut a = vec!["plan", "--compare"];
    a.extend(base);
    let s = save("compare.json");
    a.extend(["--parallel", s.as_str()]);
    let o = autopar(dir.path(), &a);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("strategy_ckpt_config") && !dir.path().join("compare.json").exists());
}

/// An invalid strategy read from a strategy file names the file it came from.
#[test]
fn an_invalid_strategy_from_a_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    ok(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--parallel", r#"strategy_ckpt_config={"save_file": "s.json"}"#]);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("s.json")).unwrap()).unwrap();
    let items = v["parallel_strategy_item"].as_object_mut().unwrap();
    let key = items.keys().find(|k| k.starts_with("MatMul") && k.contains("fc1")).unwrap().clone();
    items[&key]["parallel_strategy"] = serde_json::json!([[1, 1], [3, 1]]);
    std::fs::write(dir.path().join("bad.json"), v.to_string()).unwrap();
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--strategy", "bad.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("strategy file bad.json: ") && err.contains("(3, 1)"), "{err}");
}

/// A MatMul strategy written for a weight stored [in, out] (a MindSpore MatMul without
/// transpose_b), given to a built-in model whose weights are stored [out, in], says so and
/// gives the strategy that fits; a strategy wrong either way does not claim it.
#[test]
fn a_strategy_for_a_weight_stored_the_other_way_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, strategy: serde_json::Value| {
        let v = serde_json::json!({"current_stage": 0, "parallel_strategy_item": {
            "MatMul_fc1.weight": {"stage": 0, "parallel_strategy": strategy}}, "parallel_layout_item": {}});
        std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    };
    file("in_out.json", serde_json::json!([[2, 1], [1, 4]]));
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "8", "--strategy", "in_out.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for part in [
        "strategy file in_out.json",
        "fc1.weight is stored transposed, [out, in] = [512, 784]",
        "hint: for this weight, swap its last two splits: ((2, 1), (4, 1))",
    ] {
        assert!(err.contains(part), "{part} missing: {err}");
    }
    assert_eq!(err.matches("hint:").count(), 1, "{err}");
    // The swapped strategy must plan too: on 2 devices it would use 8, so no suggestion.
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "2", "--strategy", "in_out.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("stored transposed"), "{err}");
    file("out_in.json", serde_json::json!([[2, 1], [4, 1]]));
    ok(dir.path(), &["plan", "--model", "mlp", "--devices", "8", "--strategy", "out_in.json"]);
    file("wrong.json", serde_json::json!([[2, 2], [4, 1]]));
    let o = autopar(dir.path(), &["plan", "--model", "mlp", "--devices", "8", "--strategy", "wrong.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("stored transposed"), "{err}");
}

/// `--recompute blocks`: the plan shows each recomputed block (the values it no longer keeps,
/// the FLOPs and bytes of running it again), and its peak activations fall while its FLOPs rise.
#[test]
fn a_recomputed_plan_shows_what_each_block_saves_and_costs() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["plan", "--model", "gpt", "--depth", "3", "--width", "64", "--heads", "4", "--devices", "4", "--json"];
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut a = base.to_vec();
        a.extend(extra);
        serde_json::from_str(&ok(dir.path(), &a)).unwrap()
    };
    let (plain, recomputed) = (plan(&[]), plan(&["--recompute", "blocks"]));
    assert_eq!(plain["recompute"], serde_json::json!([]));
    let regions = recomputed["recompute"].as_array().unwrap();
    let mut names: Vec<&str> = regions.iter().map(|r| r["region"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["blocks.0.", "blocks.1.", "blocks.2."]);
    for r in regions {
        assert!(r["ops"].as_u64().unwrap() > 0 && r["not_kept"].as_u64().unwrap() > 0 && r["flops"].as_f64().unwrap() > 0.0, "{r}");
    }
    let peak = |v: &serde_json::Value| v["memory"]["peak_activations"].as_u64().unwrap();
    assert!(peak(&recomputed) < peak(&plain), "{} vs {}", peak(&recomputed), peak(&plain));
    let extra: f64 = regions.iter().map(|r| r["flops"].as_f64().unwrap()).sum();
    let (f0, f1) = (plain["flops"].as_f64().unwrap(), recomputed["flops"].as_f64().unwrap());
    assert!((f1 - f0 - extra).abs() <= 1e-6 * f1, "flops {f0} + recomputed {extra} != {f1}");
    // One op alone, as text.
    let text = ok(dir.path(), &["plan", "--model", "mlp", "--recompute", "relu1", "--full"]);
    assert!(text.contains("recomputation (rank 0)") && text.contains("relu1"), "{text}");
}

/// auto_parallel under a `device_memory_capacity` no plan fits without its memory levers:
/// the search tries the parallel optimizer's levels and recomputing the first blocks (the
/// fewest that fit, by bisection), takes the fitting plan of least objective, and says what it
/// chose, why and what it tried; under a capacity the fastest plan fits, it uses none; a level
/// the job set is the only one tried.
#[test]
fn auto_parallel_chooses_memory_levers_when_no_plan_fits_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let plan = |extra: &str| -> serde_json::Value {
        let args = format!(
            "plan --model gpt --depth 4 --width 128 --heads 4 --devices 4 --parallel-mode auto_parallel \
             --parallel search_mode=dynamic_programming {extra} --json"
        );
        serde_json::from_str(&ok(dir.path(), &args.split_whitespace().collect::<Vec<_>>())).unwrap()
    };
    let roomy = plan("--parallel device_memory_capacity=1000000000");
    assert!(roomy["search"]["levers_chosen"].is_null(), "{}", roomy["search"]["levers_chosen"]);
    assert_eq!(roomy["recompute"], serde_json::json!([]));
    let tight = plan("--parallel device_memory_capacity=30000000");
    let chosen = &tight["search"]["levers_chosen"];
    assert!(chosen["without"].as_str().unwrap().contains("no plan fits device_memory_capacity = 30000000"), "{chosen}");
    let blocks = chosen["blocks"].as_array().unwrap().len();
    assert_eq!(chosen["of_blocks"], 4);
    assert!((1..=4).contains(&blocks), "{chosen}");
    assert_eq!(tight["recompute"].as_array().unwrap().len(), blocks, "a region per recomputed block");
    let level = chosen["optimizer_level"].clone();
    let tried = chosen["tried"].as_array().unwrap();
    let fitted = |t: &serde_json::Value| !t["memory_bytes"].is_null();
    let objective = |v: &serde_json::Value| v["objective_seconds"].as_f64().unwrap();
    // The chosen plan is the tried one of least objective, and one block fewer did not fit.
    let best = tried.iter().filter(|t| fitted(t)).min_by(|a, b| objective(a).total_cmp(&objective(b))).unwrap();
    assert_eq!((best["blocks"].as_u64().unwrap() as usize, &best["optimizer_level"]), (blocks, &level), "{chosen}");
    assert!((objective(best) - objective(&tight["search"])).abs() <= 1e-12, "{chosen}");
    let fewer = tried.iter().find(|t| t["blocks"].as_u64() == Some(blocks as u64 - 1) && t["optimizer_level"] == level);
    assert!(fewer.is_some_and(|t| !fitted(t)), "{chosen}");
    assert!(tried.iter().any(|t| !t["optimizer_level"].is_null()), "the optimizer's levels were tried: {chosen}");
    let search_memory = |v: &serde_json::Value| v["search"]["memory_bytes"].as_u64().unwrap();
    assert!(search_memory(&tight) <= 30_000_000 && search_memory(&roomy) > 30_000_000);
    // The time it costs: the plan with levers has the larger objective.
    assert!(objective(&tight["search"]) > objective(&roomy["search"]));
    // The text says what it chose and lists what it tried (train_cli trains with the choice).
    let text = ok(
        dir.path(),
        &[
            "plan",
            "--model",
            "gpt",
            "--depth",
            "4",
            "--width",
            "128",
            "--heads",
            "4",
            "--devices",
            "4",
            "--parallel-mode",
            "auto_parallel",
            "--parallel",
            "search_mode=dynamic_programming",
            "--parallel",
            "device_memory_capacity=30000000",
            "--full",
        ],
    );
    assert!(text.contains("memory levers chosen:") && text.contains("tried "), "{text}");
    // A level the job set is the only one tried; recomputation alone then.
    let fixed = plan(
        "--parallel device_memory_capacity=30000000 --parallel enable_parallel_optimizer=true \
         --parallel parallel_optimizer_config={\"optimizer_level\":\"level1\"}",
    );
    let chosen = &fixed["search"]["levers_chosen"];
    assert!(chosen["optimizer_level"].is_null(), "{chosen}");
    assert!(chosen["tried"].as_array().unwrap().iter().all(|t| t["optimizer_level"] == "level1"), "{chosen}");
    // No recomputation allowed (--recompute none): the levels alone, here not enough.
    let args = "plan --model gpt --depth 4 --width 128 --heads 4 --devices 4 --parallel-mode auto_parallel \
                --parallel search_mode=dynamic_programming --parallel device_memory_capacity=30000000 --recompute none";
    let e = fails(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    assert!(e.contains("no plan fits device_memory_capacity = 30000000"), "{e}");
}

/// `plan` sizes the model to the data a config (or `--data`) names, as `train` does: a
/// ResNet's input is the data's 3x32x32 images, not the model's own default.
#[test]
fn plan_sizes_the_model_to_the_data_the_config_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let images: Vec<u8> = (0..4 * 3072).map(|i| (i % 251) as u8).collect();
    autopar_data::write_cifar10_file(d.join("data_batch_1.bin"), &images, &[0, 1, 2, 9]).unwrap();
    std::fs::write(d.join("run.toml"), "model = \"resnet18\"\nstem = \"imagenet\"\ndata = \"data_batch_1.bin\"\n").unwrap();
    let first_input = |args: &[&str]| {
        let v: serde_json::Value = serde_json::from_str(&ok(d, args)).unwrap();
        let conv = v["operators"].as_array().unwrap().iter().find(|o| o["op"] == "Conv2D").unwrap().clone();
        conv["inputs"][0]["shape"].clone()
    };
    assert_eq!(first_input(&["plan", "--config", "run.toml", "--batch-size", "8", "--json"]), serde_json::json!([8, 3, 32, 32]));
    assert_eq!(
        first_input(&["plan", "--model", "resnet18", "--stem", "imagenet", "--data", "data_batch_1.bin", "--batch-size", "8", "--json"]),
        serde_json::json!([8, 3, 32, 32])
    );
    // Without data, the model's own input shape.
    assert_eq!(
        first_input(&["plan", "--model", "resnet18", "--stem", "imagenet", "--batch-size", "8", "--json"]),
        serde_json::json!([8, 3, 224, 224])
    );
}

/// Every `<text x=".." ...>` of `svg` (monospace, 11 px: at most 6.7 px a character) ends
/// within the picture's width.
fn assert_text_fits(svg: &str) {
    let attr = |tag: &str, name: &str| -> f64 {
        let at = tag.find(&format!("{name}=\"")).unwrap_or_else(|| panic!("no {name} in {tag}")) + name.len() + 2;
        tag[at..].split('"').next().unwrap().parse().unwrap()
    };
    let width = attr(svg.split('>').next().unwrap(), "width");
    for piece in svg.split("<text ").skip(1) {
        let (tag, rest) = piece.split_once('>').unwrap();
        let text = rest.split("</text>").next().unwrap();
        let end = attr(tag, "x") + text.chars().count() as f64 * 6.7;
        assert!(end <= width + 1.0, "{text:?} ends at {end:.0}, the picture is {width} wide");
    }
}
