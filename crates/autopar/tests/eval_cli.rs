//! `autopar eval` and `autopar predict` end to end: a run's checkpoint folder evaluated on other
//! device counts and modes gives the training run's own evaluation; predictions are written.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn autopar(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(args).output().expect("autopar runs")
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(String::from_utf8_lossy(&o.stdout).trim()).unwrap()
}

const DATA: &[&str] = &["--model", "mlp", "--data", "synthetic", "--synthetic-samples", "300", "--width", "16"];

#[test]
fn a_checkpoint_folder_evaluates_alike_on_any_device_count_and_its_predictions_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut train = vec!["train"];
    train.extend(DATA);
    train.extend(["--steps", "12", "--batch-size", "16", "--devices", "4", "--parallel", "parallel_mode=semi_auto_parallel"]);
    train.extend(["--checkpoint-dir", "ck", "--eval-batch-size", "8", "--json"]);
    let trained = json(&autopar(dir.path(), &train));
    let want = &trained["eval"];
    assert_eq!(want["samples"].as_u64(), Some(30), "{trained}");
    for extra in [
        vec!["--devices", "2", "--parallel", "parallel_mode=auto_parallel"],
        vec!["--devices", "3", "--parallel", "parallel_mode=data_parallel", "--batch-size", "7"],
        vec![],
    ] {
        let mut args = vec!["eval", "ck"];
        args.extend(DATA);
        args.extend(extra.iter().copied());
        args.push("--json");
        let got = json(&autopar(dir.path(), &args));
        assert_eq!(got["samples"], want["samples"], "{extra:?}: {got}");
        let (a, b) = (got["loss"].as_f64().unwrap(), want["loss"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{extra:?}: loss {a} vs {b}");
        assert_eq!(got["accuracy"], want["accuracy"], "{extra:?}");
    }

    // Predictions: written by the rank reporting the outputs (rank 0, or a pipeline's last
    // stage), the same on both; their classes are the logits' largest.
    let mut seen = Vec::new();
    for extra in [vec![], vec!["--parallel", "parallel_mode=semi_auto_parallel", "--parallel", "pipeline_stages=2"]] {
        let mut args = vec!["predict", "ck", "--output", "p.safetensors", "--devices", "2"];
        args.extend(DATA);
        args.extend(extra.iter().copied());
        let o = autopar(dir.path(), &args);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
        let file = autopar_checkpoint::CheckpointFile::open(dir.path().join("p.safetensors")).unwrap();
        assert_eq!(file.get("logits").unwrap().shape, vec![30, 10]);
        assert_eq!(file.get("predicted_class").unwrap().shape, vec![30]);
        assert_eq!(file.metadata().get("checkpoint").map(String::as_str), Some("ck"), "{extra:?}: the checkpoint is named");
        let logits: Vec<f32> = file.read("logits").unwrap().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let classes: Vec<i64> =
            file.read("predicted_class").unwrap().chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
        for (row, &class) in logits.chunks(10).zip(&classes) {
            let best = row.iter().enumerate().fold(0, |b, (i, v)| if *v > row[b] { i } else { b });
            assert_eq!(class, best as i64, "{extra:?}: {row:?}");
        }
        seen.push(logits);
    }
    for (a, b) in seen[0].iter().zip(&seen[1]) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "a pipeline's predictions differ: {a} vs {b}");
    }

    // The folder's strategy file elsewhere, named by --ckpt-strategy.
    std::fs::rename(dir.path().join("ck/strategy.json"), dir.path().join("saved-under.json")).unwrap();
    let mut args = vec!["eval", "ck", "--devices", "2", "--ckpt-strategy", "saved-under.json", "--json"];
    args.extend(DATA);
    let got = json(&autopar(dir.path(), &args));
    assert_eq!((&got["samples"], &got["accuracy"]), (&want["samples"], &want["accuracy"]), "{got}");
    let mut args = vec!["eval", "ck", "--devices", "2"];
    args.extend(DATA);
    assert_eq!(autopar(dir.path(), &args).status.code(), Some(2), "without the strategy file the ranks' files cannot be read");

    // Bad input: a missing checkpoint, an output that is not safetensors.
    let mut args = vec!["eval", "nowhere"];
    args.extend(DATA);
    let o = autopar(dir.path(), &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("nowhere"), "{err}");
    let mut args = vec!["predict", "ck", "--output", "p.txt"];
    args.extend(DATA);
    let err = String::from_utf8_lossy(&autopar(dir.path(), &args).stderr).into_owned();
    assert!(err.contains("p.txt") && err.contains(".safetensors"), "{err}");
}

/// A checkpoint lacking a frozen parameter (the GPT's causal mask) is evaluated with the
/// network's own values of it, and `autopar eval` says so: the same result as the whole file.
#[test]
fn a_frozen_parameter_the_checkpoint_lacks_is_made_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let gpt = ["--model", "gpt", "--width", "16", "--heads", "2", "--depth", "1", "--input-shape", "8", "--num-classes", "16"];
    let data = ["--data", "synthetic", "--synthetic-samples", "40"];
    let mut train = vec!["train", "--steps", "2", "--batch-size", "4", "--checkpoint-dir", "ck", "--json"];
    train.extend(gpt);
    train.extend(data);
    json(&autopar(dir.path(), &train));
    // One device: the run's checkpoint is one file of whole tensors.
    let file = std::fs::read_dir(dir.path().join("ck"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .expect("a checkpoint file");
    let ck = autopar_checkpoint::CheckpointFile::open(&file).unwrap();
    assert!(ck.get("causal_mask").is_some(), "the run saves its frozen mask");
    let kept: Vec<_> = ck
        .tensors()
        .iter()
        .filter(|e| e.name != "causal_mask")
        .map(|e| {
            let spec = autopar_checkpoint::TensorSpec { name: e.name.clone(), dtype: e.dtype, shape: e.shape.clone() };
            (spec, ck.read(&e.name).unwrap())
        })
        .collect();
    autopar_checkpoint::save(&dir.path().join("no_mask.safetensors"), &kept, &Default::default()).unwrap();
    let eval = |path: &str, json_out: bool| {
        let mut args = vec!["eval", path];
        args.extend(gpt);
        args.extend(data);
        if json_out {
            args.push("--json");
        }
        autopar(dir.path(), &args)
    };
    let whole = json(&eval(file.to_str().unwrap(), true));
    let lacking = json(&eval("no_mask.safetensors", true));
    assert_eq!(whole.get("made_from_init"), None, "{whole}");
    assert_eq!(lacking["made_from_init"], serde_json::json!(["causal_mask"]), "{lacking}");
    assert_eq!((&lacking["loss"], &lacking["accuracy"]), (&whole["loss"], &whole["accuracy"]));
    let o = eval("no_mask.safetensors", false);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("lacks the frozen parameter causal_mask"), "{text}");
}
