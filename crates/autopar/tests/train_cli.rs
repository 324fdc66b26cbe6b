//! `autopar train` end to end: small, fast runs of the real binary.

use std::path::Path;
use std::process::{Command, Output};

fn autopar(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(args).output().expect("autopar runs")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

const SMALL: &[&str] = &["--model", "mlp", "--data", "synthetic", "--synthetic-samples", "256", "--width", "16", "--batch-size", "16"];

fn losses(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn a_small_run_prints_loss_lines_writes_metrics_a_plot_and_keeps_the_newest_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = SMALL.to_vec();
    args.extend([
        "--epochs",
        "2",
        "--log-every",
        "8",
        "--metrics",
        "out/m.jsonl",
        "--plot",
        "--checkpoint-dir",
        "ck",
        "--checkpoint-every",
        "4",
        "--keep-checkpoint-max",
        "2",
    ]);
    let o = autopar(dir.path(), &["train"].iter().chain(&args).copied().collect::<Vec<_>>());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("epoch: 1 step: 8, loss is ") && out.contains("epoch: 2 step: 16, loss is "), "{out}");
    assert!(out.contains("trained mlp for 32 steps") && out.contains("eval: accuracy"), "{out}");
    let rows = std::fs::read_to_string(dir.path().join("out/m.jsonl")).unwrap();
    assert_eq!(rows.lines().count(), 32);
    let first: serde_json::Value = serde_json::from_str(rows.lines().next().unwrap()).unwrap();
    for key in ["step", "epoch", "loss", "lr", "samples_per_sec"] {
        assert!(first.get(key).is_some(), "{key} missing in {first}");
    }
    assert!(std::fs::read_to_string(dir.path().join("out/m.svg")).unwrap().contains("<polyline"));
    let mut ck: Vec<String> =
        std::fs::read_dir(dir.path().join("ck")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    ck.sort();
    assert_eq!(ck, ["mlp-28.safetensors", "mlp-32.safetensors"]);
}

#[test]
fn a_resumed_run_continues_the_uninterrupted_loss_trajectory() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec!["train"];
        a.extend(SMALL);
        a.extend([
            "--optimizer",
            "adamw",
            "--lr",
            "0.01",
            "--schedule",
            "cosine",
            "--warmup-steps",
            "4",
            "--steps",
            "24",
            "--eval",
            "false",
        ]);
        a.extend(extra);
        let o = autopar(dir.path(), &a);
        assert!(o.status.success(), "{:?}", text(&o));
    };
    run(&["--metrics", "full.jsonl"]);
    run(&["--metrics", "part.jsonl", "--checkpoint-dir", "ck", "--checkpoint-every", "10", "--keep-checkpoint-max", "0"]);
    std::fs::remove_file(dir.path().join("ck/mlp-24.safetensors")).unwrap();
    std::fs::remove_file(dir.path().join("ck/mlp-20.safetensors")).unwrap();
    let part = losses(&dir.path().join("part.jsonl"));
    std::fs::write(dir.path().join("part.jsonl"), part[..10].iter().map(|l| format!("{{\"loss\":{l}}}\n")).collect::<String>()).unwrap();
    run(&["--metrics", "part.jsonl", "--resume", "ck"]);
    assert_eq!(losses(&dir.path().join("part.jsonl")), losses(&dir.path().join("full.jsonl")));
}

#[test]
fn two_data_parallel_devices_from_a_toml_config_equal_stand_alone() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("run.toml"),
        "model = \"mlp\"\ndata = \"synthetic\"\nsynthetic_samples = 256\nwidth = 16\nbatch_size = 16\nsteps = 12\neval = false\n\n[parallel]\nparallel_mode = \"data_parallel\"\ndevice_num = 2\n",
    )
    .unwrap();
    let o = autopar(dir.path(), &["train", "--config", "run.toml", "--metrics", "dp.jsonl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("2 devices (data_parallel)"), "{out}");
    let o = autopar(dir.path(), &["train", "--config", "run.toml", "--parallel-mode", "stand_alone", "--metrics", "sa.jsonl"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let (dp, sa) = (losses(&dir.path().join("dp.jsonl")), losses(&dir.path().join("sa.jsonl")));
    assert_eq!(dp.len(), 12);
    for (a, b) in dp.iter().zip(&sa) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
    }
}

fn fails(dir: &Path, args: &[&str], needles: &[&str]) {
    let o = autopar(dir, args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}\n{out}\n{err}");
    assert!(err.lines().any(|l| l.starts_with("autopar: ") || l.starts_with("error:")), "{err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in:\n{err}");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_file_or_value() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails(d, &["train", "--model", "mlp", "--data", "no_such_dir"], &["no_such_dir"]);
    fails(d, &["train", "--model", "vgg", "--data", "synthetic"], &["unknown model \"vgg\"", "resnet18"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--optimizer", "lamb"], &["unknown optimizer \"lamb\""]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--parallel", "nonsense"], &["nonsense"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--schedule", "step"], &["unknown schedule"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--bogus-flag"], &["--bogus-flag"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--clip-grad-norm", "0"], &["--clip-grad-norm 0"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--steps", "0"], &["--steps 0 trains nothing"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--eval-batch-size", "0"], &["--eval-batch-size 0 evaluates nothing"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--synthetic-samples", "0"], &["--synthetic-samples 0 generates no data"]);
    fails(
        d,
        &["train", "--model", "mlp", "--data", "synthetic", "--checkpoint-dir", "ck", "--checkpoint-prefix", "../evil"],
        &["--checkpoint-prefix \"../evil\" is not a file name prefix"],
    );
    fails(
        d,
        &["train", "--model", "mlp", "--data", "synthetic", "--devices", "2", "--resume", "ck", "--verify"],
        &["--verify and --resume both given"],
    );
    fails(
        d,
        &["train", "--model", "mlp", "--data", "synthetic", "--steps", "2", "--schedule", "cosine", "--lr", "0.1", "--min-lr", "1"],
        &["minimum learning rate (--min-lr) = 1"],
    );
    // Negative numbers are values, refused for being negative; a file is not a folder.
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--lr", "-1"], &["learning rate = -1 is invalid", "cannot be negative"]);
    fails(d, &["train", "--model", "mlp", "--data", "synthetic", "--weight-decay", "-0.5"], &["weight_decay = -0.5", "cannot be negative"]);
    std::fs::write(d.join("afile"), "").unwrap();
    fails(
        d,
        &["train", "--model", "mlp", "--data", "synthetic", "--checkpoint-dir", "afile"],
        &["checkpoint folder afile itself is a file"],
    );
    // A parent that is a file, found before anything is written (the metrics file is not made).
    fails(
        d,
        &["train", "--model", "mlp", "--data", "synthetic", "--checkpoint-dir", "afile/sub", "--metrics", "m.jsonl"],
        &["checkpoint folder afile/sub cannot be made: afile is a file, not a folder"],
    );
    assert!(!d.join("m.jsonl").exists(), "a run refused up front wrote its metrics file");
    // pipeline_result_broadcast applies to pipeline inference, not to training.
    fails(
        d,
        &[
            "train",
            "--model",
            "mlp",
            "--data",
            "synthetic",
            "--devices",
            "4",
            "--parallel",
            "pipeline_stages=2",
            "--parallel",
            "pipeline_result_broadcast=true",
        ],
        &["pipeline_result_broadcast sends a pipeline's inference outputs to every rank, and this job trains"],
    );

    // A truncated CIFAR-10 file, and one with a label out of range.
    let mut rec = vec![3u8];
    rec.extend(std::iter::repeat_n(7u8, 3072));
    let mut trunc = rec.repeat(2);
    trunc.truncate(3073 * 2 - 100);
    std::fs::write(d.join("trunc.bin"), &trunc).unwrap();
    fails(d, &["train", "--model", "resnet18", "--data", "trunc.bin"], &["trunc.bin", "truncated"]);
    let mut bad = rec.clone();
    bad[0] = 12;
    std::fs::write(d.join("labels.bin"), &bad).unwrap();
    fails(d, &["train", "--model", "resnet18", "--data", "labels.bin"], &["labels.bin", "12"]);

    // Unknown keys in the config file.
    std::fs::write(d.join("bad.toml"), "model = \"mlp\"\nlearning_rate = 0.1\n").unwrap();
    fails(d, &["train", "--config", "bad.toml", "--data", "synthetic"], &["bad.toml", "learning_rate"]);
    // A float that is not finite is no value, not an unset key.
    for v in ["nan", "inf"] {
        std::fs::write(d.join("nan.toml"), format!("model = \"mlp\"\nlr = {v}\n")).unwrap();
        fails(d, &["train", "--config", "nan.toml", "--data", "synthetic"], &["nan.toml", "lr = ", "not a finite number"]);
    }
}

/// Options that would change nothing in the run they are given to are refused, naming what
/// they need, rather than accepted and ignored.
#[test]
fn options_that_would_be_ignored_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |extra: &[&'static str]| {
        let mut a = vec!["train", "--model", "mlp", "--data", "synthetic", "--steps", "3"];
        a.extend(extra);
        a
    };
    fails(d, &run(&["--epochs", "0"]), &["--epochs 0 trains nothing"]);
    fails(d, &run(&["--micro-batches", "0"]), &["--micro-batches 0"]);
    fails(d, &run(&["--warmup-steps", "3"]), &["--warmup-steps", "--schedule cosine"]);
    fails(d, &run(&["--min-lr", "0.001"]), &["--min-lr", "--schedule cosine"]);
    fails(d, &run(&["--optimizer", "sgd", "--momentum", "0.5"]), &["--momentum 0.5 applies to --optimizer momentum, not sgd"]);
    fails(d, &run(&["--optimizer", "adamw", "--momentum", "0.5"]), &["not adamw"]);
    fails(d, &run(&["--momentum=-1"]), &["--momentum -1 is not a momentum coefficient"]);
    fails(d, &run(&["--init-strategy", "s.json"]), &["--init-strategy s.json applies to a folder of per-rank checkpoints"]);
    fails(d, &run(&["--checkpoint-prefix", "foo"]), &["--checkpoint-prefix", "--checkpoint-dir"]);
    std::fs::create_dir_all(d.join("adir")).unwrap();
    fails(d, &run(&["--devices", "2", "--strategy", "adir"]), &["strategy file \"adir\" is a directory"]);
}

/// The device count given as a parallel option alone is the device count, as --devices is:
/// `--parallel device_num=2` runs semi_auto_parallel on 2 devices, not stand_alone on one.
#[test]
fn device_num_given_as_a_parallel_option_runs_that_many_devices() {
    let dir = tempfile::tempdir().unwrap();
    for extra in [&["--parallel", "device_num=2"][..], &["--devices", "2"][..]] {
        let mut a = vec!["train"];
        a.extend(SMALL);
        a.extend(["--steps", "2", "--eval", "false"]);
        a.extend(extra);
        let o = autopar(dir.path(), &a);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        assert!(err.contains("2 devices (semi_auto_parallel)"), "{extra:?}: {err}");
    }
}

/// A run resumed from a checkpoint at or past its last step trains nothing, and says so (a
/// restart loop that resumes a finished run still succeeds).
#[test]
fn resuming_past_the_last_step_says_there_is_nothing_to_train() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = vec!["train"];
    a.extend(SMALL);
    a.extend(["--steps", "4", "--eval", "false", "--checkpoint-dir", "ck"]);
    let o = autopar(dir.path(), &a);
    assert!(o.status.success(), "{:?}", text(&o));
    let mut b = vec!["train"];
    b.extend(SMALL);
    b.extend(["--steps", "3", "--eval", "false", "--resume", "ck"]);
    let o = autopar(dir.path(), &b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(err.contains("nothing to train") && err.contains("at step 4") && err.contains("hint: pass --steps"), "{err}");
    // Another network's checkpoint is named as such first (not its seed or batch size).
    let c = [
        "train",
        "--model",
        "gpt",
        "--data",
        "synthetic",
        "--width",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
        "--steps",
        "8",
        "--seed",
        "9",
        "--resume",
        "ck",
    ];
    fails(dir.path(), &c, &["none of this network's parameters", "saved from another network"]);
}

#[test]
fn init_from_a_checkpoint_of_another_width_names_the_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = vec!["train"];
    a.extend(SMALL);
    a.extend(["--steps", "2", "--checkpoint-dir", "ck", "--eval", "false"]);
    let o = autopar(dir.path(), &a);
    assert!(o.status.success(), "{:?}", text(&o));
    fails(
        dir.path(),
        &[
            "train",
            "--model",
            "mlp",
            "--data",
            "synthetic",
            "--synthetic-samples",
            "64",
            "--width",
            "24",
            "--steps",
            "1",
            "--init",
            "ck/mlp-2.safetensors",
        ],
        &["fc1.bias", "[16]", "[24]", "mlp-2.safetensors"],
    );
    fails(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--init", "ck/none.safetensors"], &["none.safetensors"]);
}

/// A model-parallel strategy file for the MLP of `SMALL` on 4 devices (not the default data
/// parallel): fc1 split on its output columns, fc2 on its rows.
const MEGATRON: &str = r#"{"current_stage": 2, "parallel_strategy_item": {
  "MatMul_fc1.weight": {"stage": 0, "parallel_strategy": [[2, 1], [2, 1]]},
  "MatMul_fc2.weight": {"stage": 0, "parallel_strategy": [[2, 2], [1, 2]]}},
  "parallel_layout_item": {}}"#;

#[test]
fn a_semi_auto_run_with_a_model_parallel_strategy_file_splits_the_weights_and_saves_the_strategy_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("megatron.json"), MEGATRON).unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec!["train"];
        a.extend(SMALL);
        a.extend(["--steps", "6", "--eval", "false", "--devices", "4", "--parallel-mode", "semi_auto_parallel"]);
        a.extend(extra);
        let o = autopar(dir.path(), &a);
        assert!(o.status.success(), "{:?}", text(&o));
        text(&o).0
    };
    let out = run(&["--strategy", "megatron.json", "--checkpoint-dir", "ck", "--metrics", "a.jsonl", "--verify"]);
    assert!(out.contains("strategy file: ck/strategy.json") && out.contains("verify:") && !out.contains("MISMATCH"), "{out}");
    for k in 0..4 {
        // fc1.weight [16, 784] split 2 ways on its rows: every rank holds half of it.
        let f = autopar_checkpoint::CheckpointFile::open(dir.path().join(format!("ck/rank_{k}/mlp-6_{k}.safetensors"))).unwrap();
        assert_eq!(f.get("fc1.weight").unwrap().shape, vec![8, 784]);
    }
    let saved = autopar_checkpoint::StrategyFile::load(dir.path().join("ck/strategy.json")).unwrap();
    let item = saved.strategy_items.iter().find(|i| i.node_name == "MatMul_fc2.weight").unwrap();
    assert_eq!(item.parallel_strategy, vec![vec![2, 2], vec![1, 2]]);
    // The strategy the run saved applies to a later run: the same losses.
    run(&["--strategy", "ck/strategy.json", "--metrics", "b.jsonl"]);
    assert_eq!(losses(&dir.path().join("a.jsonl")), losses(&dir.path().join("b.jsonl")));
    fails(
        dir.path(),
        &["train", "--model", "mlp", "--data", "synthetic", "--devices", "2", "--strategy", "ck/none.json"],
        &["none.json", "not found"],
    );
}

#[test]
fn cifar10_and_mnist_folders_train_with_the_input_shape_and_classes_of_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cifar = d.join("cifar");
    std::fs::create_dir(&cifar).unwrap();
    let images: Vec<u8> = (0..16 * 3072).map(|i| (i * 7 % 251) as u8).collect();
    let labels: Vec<u8> = (0..16).map(|i| (i % 10) as u8).collect();
    autopar_data::write_cifar10_file(cifar.join("data_batch_1.bin"), &images, &labels).unwrap();
    autopar_data::write_cifar10_file(cifar.join("test_batch.bin"), &images[..8 * 3072], &labels[..8]).unwrap();
    let o = autopar(d, &["train", "--model", "resnet18", "--width", "4", "--data", "cifar", "--batch-size", "8", "--steps", "2"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(err.contains("input [3, 32, 32]") && out.contains("eval: accuracy") && out.contains("on 8 samples"), "{out}\n{err}");

    let mnist = d.join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    let images: Vec<u8> = (0..32 * 784).map(|i| (i * 13 % 256) as u8).collect();
    let labels: Vec<u8> = (0..32).map(|i| (i % 10) as u8).collect();
    autopar_data::write_mnist(&mnist, "train", &images, 28, 28, &labels, false).unwrap();
    let o = autopar(d, &["train", "--model", "mlp", "--width", "16", "--data", "mnist", "--batch-size", "8", "--epochs", "1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("trained mlp for 4 steps") && out.contains("eval: skipped"), "{out}\n{err}");
}

#[test]
fn verify_trains_stand_alone_beside_a_parallel_run() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_autopar"))
        .args([
            "train",
            "--model",
            "mlp",
            "--data",
            "synthetic",
            "--synthetic-samples",
            "512",
            "--steps",
            "6",
            "--batch-size",
            "32",
            "--devices",
            "4",
            "--clip-grad-norm",
            "0.05",
            "--verify",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("verify: beside stand_alone on the same data, largest loss difference"), "{stdout}");
    assert!(!stdout.contains("MISMATCH"), "clipped over 4 devices as on one: {stdout}");
}

/// A mismatch that is expected by design says why: gradients_mean under semi_auto_parallel
/// divides the gradients by the mirror group (exit code 1 all the same).
#[test]
fn verify_says_why_a_mismatch_is_expected() {
    let dir = tempfile::tempdir().unwrap();
    let args = "train --model mlp --width 16 --data synthetic --synthetic-samples 64 --steps 3 --batch-size 16 --devices 2 \
                --parallel-mode semi_auto_parallel --parallel gradients_mean=true --eval false --verify";
    let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("MISMATCH") && stdout.contains("gradients_mean=true under semi_auto_parallel divides"), "{stdout}");
    assert!(!stdout.contains("diverged"), "{stdout}");
    // The GPT too: its frozen causal mask (-1e9) once set the scale every difference was
    // measured against, and the same mismatch passed.
    let args = "train --model gpt --depth 1 --width 16 --heads 2 --data synthetic --synthetic-samples 64 --steps 1 --batch-size 8 \
                --optimizer sgd --lr 0.5 --devices 4 --parallel-mode semi_auto_parallel --parallel gradients_mean=true --eval false --verify";
    let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    let (stdout, stderr) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("MISMATCH"), "{stdout}");
}

/// The GPT with AdamW in a pipeline verifies: every parameter follows stand-alone (before the
/// key projection lost its bias, whose gradient is zero in exact arithmetic, AdamW turned that
/// bias's rounding noise into full-size updates and --verify reported a mismatch).
#[test]
fn a_gpt_pipeline_with_adamw_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let args = "train --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic \
                --synthetic-samples 256 --steps 20 --batch-size 16 --devices 8 --parallel pipeline_stages=2 --micro-batches 4 \
                --optimizer adamw --lr 0.01 --eval false --verify";
    let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("verify: beside stand_alone") && !stdout.contains("MISMATCH"), "{stdout}");
}

/// A strategy file applies inside a pipeline's stages: a model-parallel layer replayed on 2
/// stages of 2 devices equals stand-alone, and `plan` shows the file as the strategies' source.
#[test]
fn a_strategy_file_applies_inside_pipeline_stages() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mp.json"),
        r#"{"current_stage": 0, "parallel_layout_item": {}, "parallel_strategy_item": {
            "MatMul_fc1.weight": {"parallel_strategy": [[1, 1], [2, 1]], "stage": 0},
            "MatMul_fc2.weight": {"parallel_strategy": [[1, 2], [1, 2]], "stage": 0}}}"#,
    )
    .unwrap();
    let common =
        "--model mlp --width 32 --depth 2 --batch-size 16 --devices 4 --parallel pipeline_stages=2 --micro-batches 2 --strategy mp.json";
    let args = format!("train {common} --data synthetic --synthetic-samples 256 --steps 3 --eval false --verify --checkpoint-dir ck");
    let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("verify: beside stand_alone") && !stdout.contains("MISMATCH"), "{stdout}");
    // One rank's file of that run holds its slices only: --init of it says so and names the folder.
    let o = autopar(
        dir.path(),
        &"train --model mlp --width 32 --depth 2 --data synthetic --steps 1 --init ck/rank_0/mlp-3_0.safetensors"
            .split_whitespace()
            .collect::<Vec<_>>(),
    );
    let (_, stderr) = text(&o);
    assert!(stderr.contains("rank 0's file of a run on 4 devices") && stderr.contains("--init ck"), "{stderr}");
    assert!(!stderr.contains("saved from another network"), "{stderr}");
    let o = autopar(dir.path(), &format!("plan {common} --full").split_whitespace().collect::<Vec<_>>());
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.lines().any(|l| l.contains("fc2.matmul") && l.contains("((1, 2), (1, 2)) file")), "{stdout}");
}

#[test]
fn init_from_per_rank_checkpoints_of_another_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let run = |extra: &[&str]| {
        let mut args =
            vec!["train", "--model", "mlp", "--data", "synthetic", "--synthetic-samples", "512", "--batch-size", "32", "--lr", "0.1"];
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_autopar")).args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let first_loss = |s: &str| -> f64 {
        let l = s.lines().find(|l| l.trim_start().starts_with("loss ")).unwrap();
        l.trim_start()["loss ".len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    let trained = run(&["--steps", "30", "--devices", "4", "--checkpoint-dir", ck.to_str().unwrap()]);
    assert!(ck.join("strategy.json").exists() && ck.join("rank_3").is_dir(), "{trained}");
    // Two devices, another layout: starts from the trained weights.
    let strategy = ck.join("strategy.json");
    let resumed = run(&["--steps", "2", "--devices", "2", "--init", ck.to_str().unwrap(), "--init-strategy", strategy.to_str().unwrap()]);
    let fresh = run(&["--steps", "2", "--devices", "2"]);
    assert!(first_loss(&resumed) < first_loss(&fresh) - 0.05, "init did not load the trained weights:\n{resumed}\n{fresh}");
    // without --init-strategy, the strategy.json beside the checkpoints is used
    let beside = run(&["--steps", "2", "--devices", "2", "--init", ck.to_str().unwrap()]);
    assert_eq!(first_loss(&beside), first_loss(&resumed), "{beside}");
    // per-rank checkpoints without any strategy: the error names the option, not a file never given
    let bare = dir.path().join("bare");
    for r in 0..4 {
        let from = ck.join(format!("rank_{r}"));
        std::fs::create_dir_all(bare.join(format!("rank_{r}"))).unwrap();
        for f in std::fs::read_dir(&from).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, bare.join(format!("rank_{r}")).join(f.file_name().unwrap())).unwrap();
        }
    }
    let o = autopar(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--steps", "1", "--devices", "2", "--init", "bare"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(err.contains("init = bare") && err.contains("4 per-rank checkpoints") && err.contains("--init-strategy"), "{err}");
    assert!(!err.contains("the strategy file does not belong"), "{err}");
}

#[test]
fn init_says_which_checkpoint_entries_it_did_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = vec!["train"];
    a.extend(SMALL);
    a.extend(["--steps", "2", "--optimizer", "momentum", "--checkpoint-dir", "ck", "--eval", "false"]);
    let o = autopar(dir.path(), &a);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let ck = std::fs::read_dir(dir.path().join("ck"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut b = vec!["train"];
    b.extend(SMALL);
    b.extend(["--steps", "1", "--eval", "false", "--init", ck.to_str().unwrap()]);
    let o = autopar(dir.path(), &b);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(err.contains("--init:") && err.contains("moments.") && err.contains("not loaded"), "{err}");
}

#[test]
fn a_failing_rank_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = vec!["train"];
    a.extend(SMALL);
    a.extend(["--devices", "2", "--lr", "1e30", "--steps", "30", "--eval", "false"]);
    let o = autopar(dir.path(), &a);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    let line = err.lines().find(|l| l.starts_with("autopar[")).unwrap_or_else(|| panic!("no autopar[RANK]: line in\n{err}"));
    assert!((line.starts_with("autopar[0]: ") || line.starts_with("autopar[1]: ")) && line.contains("the loss is"), "{err}");
    assert!(err.contains("hint: lower --lr"), "{err}");
    // Said once: not again as its own cause.
    assert_eq!(err.matches("the loss is").count(), 1, "{err}");
    assert_eq!(err.matches("hint: lower --lr").count(), 1, "{err}");
}

#[test]
fn json_prints_the_summary_alone_on_stdout_and_the_step_lines_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train"];
    args.extend(SMALL);
    args.extend(["--steps", "6", "--log-every", "2", "--devices", "2", "--verify", "--json", "--checkpoint-dir", "ck"]);
    let out = autopar(dir.path(), &args);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {stdout}"));
    assert_eq!(v["devices"], 2);
    assert_eq!((v["first_step"].as_u64(), v["last_step"].as_u64()), (Some(0), Some(6)));
    assert_eq!(v["losses"].as_array().unwrap().len(), 6);
    assert_eq!(v["loss_last"], v["losses"][5]);
    assert_eq!(v["verify"]["ok"], true);
    assert!(v["verify"]["loss_relative"].as_f64().unwrap() < 1e-5);
    assert!(v["eval"]["accuracy"].as_f64().is_some());
    assert!(dir.path().join(v["checkpoint"].as_str().unwrap()).is_file());
    assert!(stderr.contains("loss is"), "the step lines moved to stderr: {stderr}");
}

#[test]
fn verbose_flags_and_autopar_log_show_the_plan_and_each_ranks_steps_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["train", "-v"];
    args.extend(SMALL);
    args.extend(["--steps", "2", "--devices", "2", "--checkpoint-dir", "ck"]);
    let (_, quiet) = text(&autopar(dir.path(), &args[..1].iter().chain(&args[2..]).copied().collect::<Vec<_>>()));
    assert!(!quiet.contains("planned"), "no logs without -v: {quiet}");
    let (_, info) = text(&autopar(dir.path(), &args));
    for needle in ["planned", "rank-0", "rank-1", "rank starts training", "checkpoint written", "rank finished"] {
        assert!(info.contains(needle), "-v shows {needle:?}: {info}");
    }
    assert!(!info.contains("DEBUG"), "-v stays at info: {info}");
    args[1] = "-vv";
    let (_, debug) = text(&autopar(dir.path(), &args));
    assert!(debug.matches(" step ").count() >= 4, "-vv shows every step of both ranks: {debug}");
    let out = Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir.path()).env("AUTOPAR_LOG", "==bad").args(&args).output().unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("invalid AUTOPAR_LOG") && err.contains("hint:"), "{err}");
}

/// `safetensors` bytes without the tensor `drop` (offsets renumbered).
fn without_tensor(bytes: &[u8], drop: &str) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    for (name, v) in header {
        if name == drop {
            continue;
        }
        let mut v = v;
        if name == "__metadata__" {
            // The file's checksum no longer holds.
            v.as_object_mut().unwrap().retain(|k, _| !k.contains("crc"));
        }
        if let Some(offsets) = v.get("data_offsets").cloned() {
            let (a, b) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
            let start = out_data.len();
            out_data.extend_from_slice(&data[a..b]);
            v["data_offsets"] = serde_json::json!([start, out_data.len()]);
        }
        out_header.insert(name, v);
    }
    let h = serde_json::Value::Object(out_header).to_string().into_bytes();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(out_data);
    out
}

/// `--init` from a checkpoint that lacks a frozen parameter the network builds (the GPT's
/// causal mask, written by other tools' exports without it) keeps the built one and says so; a
/// trainable parameter missing is still an error naming it.
#[test]
fn init_without_a_frozen_mask_keeps_the_built_one() {
    let dir = tempfile::tempdir().unwrap();
    let gpt = ["--model", "gpt", "--data", "synthetic", "--synthetic-samples", "64", "--width", "16", "--depth", "1", "--heads", "2"];
    let mut a = vec!["train"];
    a.extend(gpt);
    a.extend(["--steps", "1", "--batch-size", "8", "--eval", "false", "--checkpoint-dir", "ck"]);
    let o = autopar(dir.path(), &a);
    assert!(o.status.success(), "{:?}", text(&o));
    let bytes = std::fs::read(dir.path().join("ck/gpt-1.safetensors")).unwrap();
    std::fs::write(dir.path().join("no_mask.safetensors"), without_tensor(&bytes, "causal_mask")).unwrap();
    let mut b = vec!["train"];
    b.extend(gpt);
    b.extend(["--steps", "2", "--batch-size", "8", "--eval", "false", "--init", "no_mask.safetensors"]);
    let o = autopar(dir.path(), &b);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(err.contains("lacks the frozen parameter causal_mask") && err.contains("kept as built"), "{err}");
    let names: serde_json::Value = {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        serde_json::from_slice(&bytes[8..8 + n]).unwrap()
    };
    let dropped = names.as_object().unwrap().keys().find(|k| k.ends_with("weight")).unwrap().clone();
    std::fs::write(dir.path().join("no_weight.safetensors"), without_tensor(&bytes, &dropped)).unwrap();
    let mut c = vec!["train"];
    c.extend(gpt);
    c.extend(["--steps", "2", "--batch-size", "8", "--eval", "false", "--init", "no_weight.safetensors"]);
    fails(dir.path(), &c, &["has no parameter", &dropped]);
}

/// Runs autopar under `sh -c 'ulimit -v KB; exec autopar ARGS'`.
fn autopar_limited(dir: &Path, kb: u64, args: &[&str]) -> Output {
    let script = format!("ulimit -v {kb} && exec \"$0\" \"$@\"");
    Command::new("sh").current_dir(dir).arg("-c").arg(script).arg(env!("CARGO_BIN_EXE_autopar")).args(args).output().expect("sh runs")
}

#[test]
fn a_job_the_machine_cannot_hold_is_refused_before_it_starts_with_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    // Over the machine: fc2 of a 1e6-wide MLP is 4 TB.
    let big = ["train", "--model", "mlp", "--data", "synthetic", "--width", "1000000", "--steps", "1"];
    fails(dir.path(), &big, &["this process needs, by the plan,", "hint:"]);
    // Over device_memory_capacity, per rank.
    let mut capped = vec!["train"];
    capped.extend_from_slice(SMALL);
    capped.extend(["--steps", "1", "--devices", "2", "--parallel-mode", "auto_parallel", "--parallel", "device_memory_capacity=100000"]);
    fails(dir.path(), &capped, &["the largest rank's plan needs", "device_memory_capacity is 97.7 KiB (100000 bytes) per device"]);

    // 1024 simulated ranks under a 4 GB address-space limit: their threads' stacks alone do not
    // fit; a clear refusal, not a failed thread start.
    let args = [
        "train",
        "--model",
        "mlp",
        "--data",
        "synthetic",
        "--synthetic-samples",
        "2048",
        "--batch-size",
        "1024",
        "--steps",
        "1",
        "--devices",
        "1024",
    ];
    let o = autopar_limited(dir.path(), 4_000_000, &args);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(err.contains("1024 simulated ranks need") && err.contains("ulimit -v"), "{err}");
    // A small job under the same limit trains.
    let mut small = vec!["train"];
    small.extend_from_slice(SMALL);
    small.extend(["--steps", "2", "--devices", "2"]);
    let o = autopar_limited(dir.path(), 4_000_000, &small);
    assert!(o.status.success(), "{:?}", text(&o));
}

/// `--recompute blocks` (or `recompute = "blocks"` in the config file) trains the GPT with
/// every block recomputed in the backward pass: the same losses, bit for bit, as without.
#[test]
fn recomputing_blocks_trains_the_same_losses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.toml"), "recompute = \"blocks\"\n").unwrap();
    let common = "train --model gpt --width 16 --depth 2 --heads 2 --input-shape 8 --num-classes 16 --data synthetic \
                  --synthetic-samples 64 --steps 4 --batch-size 8 --devices 2 --eval false";
    let run = |extra: &str, metrics: &str| {
        let args = format!("{common} {extra} --metrics {metrics}");
        let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args}: {out}{err}");
        assert_eq!(out.contains("  recomputation: "), !extra.is_empty(), "{args}: {out}");
        losses(&dir.path().join(metrics))
    };
    let plain = run("", "plain.jsonl");
    assert_eq!(plain.len(), 4);
    for (extra, metrics) in [("--recompute blocks", "flag.jsonl"), ("--config r.toml", "toml.jsonl")] {
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&run(extra, metrics)), bits(&plain), "{extra}");
    }
    fails(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--recompute", "blocks"], &["no blocks", "hint:"]);
    fails(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--recompute", "fc9.matmul"], &["fc9.matmul"]);
    fails(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--recompute", "none,fc1.matmul"], &["none", "alone"]);
    std::fs::write(dir.path().join("empty.toml"), "recompute = []\n").unwrap();
    fails(dir.path(), &["train", "--model", "mlp", "--data", "synthetic", "--config", "empty.toml"], &["empty list"]);
    for command in ["eval", "predict"] {
        let mut args = vec![command, "ck", "--model", "mlp", "--data", "synthetic", "--recompute", "blocks"];
        if command == "predict" {
            args.extend(["--output", "p.safetensors"]);
        }
        fails(dir.path(), &args, &["--recompute blocks", "no backward pass"]);
    }
}

#[test]
fn loss_scaling_from_the_command_line_and_toml_reports_the_scale_and_skips_overflowed_steps() {
    let dir = tempfile::tempdir().unwrap();
    let lines = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join(name)).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    // 1e60 and 1e40 seed the backward pass with an infinity in f32: the first two steps
    // overflow on every rank and the scale falls by 1e20 each time, to 1e20, which fits.
    let mut args = SMALL.to_vec();
    args.extend(["--steps", "4", "--devices", "4", "--loss-scale", "dynamic:1e60:1e20:1000", "--metrics", "m.jsonl"]);
    let o = autopar(dir.path(), &[&["train"], args.as_slice()].concat());
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(
        text(&o).0.contains("loss scale dynamic:1e60:1e20:1000: 2 of 4 steps overflowed (skipped), last scale 9.999999999999998e19"),
        "{}",
        text(&o).0
    );
    let m = lines("m.jsonl");
    let flags: Vec<bool> = m.iter().map(|l| l["overflow"].as_bool().unwrap()).collect();
    assert_eq!(flags, [true, true, false, false], "{m:?}");
    let last = m[3]["loss_scale"].as_f64().unwrap();
    assert!((last / 1e20 - 1.0).abs() < 1e-12, "{m:?}");
    assert!(m.iter().all(|l| l["loss"].as_f64().unwrap().is_finite()));

    // TOML, and a plain run's lines carry no scale.
    std::fs::write(dir.path().join("run.toml"), "loss_scale = \"fixed:1024\"\n").unwrap();
    let mut args = SMALL.to_vec();
    args.extend(["--steps", "2", "--config", "run.toml", "--metrics", "t.jsonl"]);
    assert!(autopar(dir.path(), &[&["train"], args.as_slice()].concat()).status.success());
    assert!(lines("t.jsonl").iter().all(|l| l["loss_scale"] == 1024.0 && l["overflow"] == false));
    // A number is a fixed scale, as MindSpore's FixedLossScaleManager(512).
    std::fs::write(dir.path().join("run.toml"), "loss_scale = 512\n").unwrap();
    assert!(autopar(dir.path(), &[&["train"], args.as_slice()].concat()).status.success());
    assert!(lines("t.jsonl").iter().all(|l| l["loss_scale"] == 512.0));
    // A value of the wrong type names its key.
    std::fs::write(dir.path().join("run.toml"), "loss_scale = true\n").unwrap();
    let err = text(&autopar(dir.path(), &[&["train"], args.as_slice()].concat())).1;
    assert!(err.contains("key loss_scale: invalid type"), "{err}");
    let mut args = SMALL.to_vec();
    args.extend(["--steps", "1", "--metrics", "p.jsonl"]);
    assert!(autopar(dir.path(), &[&["train"], args.as_slice()].concat()).status.success());
    assert!(lines("p.jsonl")[0].get("loss_scale").is_none());

    for (bad, says) in [("dynamic:0.5", "the first scale must be a finite value of 1 or more"), ("static", "not a form autopar knows")] {
        let mut args = SMALL.to_vec();
        args.extend(["--steps", "1", "--loss-scale", bad]);
        let o = autopar(dir.path(), &[&["train"], args.as_slice()].concat());
        let err = text(&o).1;
        assert!(!o.status.success() && err.contains(says) && err.contains("--loss-scale"), "{err}");
    }
}

/// auto_parallel's memory levers reach the run: under a capacity no plan fits without them,
/// `train` says which it chose, trains with them, and its losses equal the run that is given
/// the same levers by hand (the chosen optimizer level and recomputed blocks).
#[test]
fn auto_parallel_trains_with_the_memory_levers_it_chose() {
    let dir = tempfile::tempdir().unwrap();
    let common = "train --model gpt --depth 4 --width 128 --heads 4 --input-shape 64 --num-classes 256 --data synthetic \
                  --synthetic-samples 64 --steps 2 --batch-size 32 --devices 4 --eval false --parallel-mode auto_parallel \
                  --parallel search_mode=dynamic_programming";
    let plan_json = {
        let args = "plan --model gpt --depth 4 --width 128 --heads 4 --input-shape 64 --num-classes 256 --batch-size 32 --devices 4 \
                    --parallel-mode auto_parallel --parallel search_mode=dynamic_programming --parallel device_memory_capacity=30000000 --json";
        let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
        assert!(o.status.success(), "{:?}", text(&o));
        serde_json::from_str::<serde_json::Value>(&text(&o).0).unwrap()
    };
    let chosen = &plan_json["search"]["levers_chosen"];
    let blocks: Vec<String> = chosen["blocks"].as_array().unwrap().iter().map(|b| b.as_str().unwrap().to_string()).collect();
    let args = format!("{common} --parallel device_memory_capacity=30000000 --metrics levers.jsonl");
    let o = autopar(dir.path(), &args.split_whitespace().collect::<Vec<_>>());
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(out.contains("  recomputation: "), !blocks.is_empty(), "{out}");
    assert_eq!(out.contains("  parallel optimizer: "), chosen["optimizer_level"].is_string(), "{out}");
    // The same levers given by hand, with room enough: the same losses.
    let mut by_hand = format!("{common} --metrics by_hand.jsonl");
    if !blocks.is_empty() {
        by_hand += &format!(" --recompute {}", blocks.join(","));
    }
    if let Some(level) = chosen["optimizer_level"].as_str() {
        by_hand +=
            &format!(" --parallel enable_parallel_optimizer=true --parallel parallel_optimizer_config={{\"optimizer_level\":\"{level}\"}}");
    }
    let o = autopar(dir.path(), &by_hand.split_whitespace().collect::<Vec<_>>());
    assert!(o.status.success(), "{by_hand}: {:?}", text(&o));
    let (a, b) = (losses(&dir.path().join("levers.jsonl")), losses(&dir.path().join("by_hand.jsonl")));
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * y.abs(), "{a:?} vs {b:?}");
    }
}
