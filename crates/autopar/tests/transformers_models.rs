//! Hugging Face `transformers`' Llama and Mixtral, written by
//! `fixtures/transformers/generate_{llama,mixtral}.py`: autopar loads their safetensors weights by
//! name, gives their logits, and trains with AdamW to PyTorch's losses, on one device and on 8
//! simulated devices under every auto_parallel search, semi_auto_parallel's defaults and a
//! pipeline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/transformers/llama")).join(name)
}

fn autopar(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).current_dir(dir).args(args).output().expect("autopar runs")
}

/// The `logits` of a safetensors file (transformers' or autopar predict's).
/// The losses of `autopar` run with `args` in `dir` (a training command), from its metrics lines.
fn trained_losses(dir: &Path, args: &[&str], what: &str) -> Vec<f64> {
    let args: Vec<&str> = args.iter().copied().chain(["--metrics", "m.jsonl"]).collect();
    let o = autopar(dir, &args);
    assert!(o.status.success(), "{what}: {}", String::from_utf8_lossy(&o.stderr));
    let lines = std::fs::read_to_string(dir.join("m.jsonl")).unwrap();
    lines.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter_map(|v| v.get("loss").and_then(Value::as_f64)).collect()
}

fn logits_of(path: &Path) -> Vec<f32> {
    let f = autopar_checkpoint::CheckpointFile::open(path).unwrap();
    f.read("logits").unwrap().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap()
}

/// The model flags of the fixture's sizes.
fn model_flags(e: &Value) -> Vec<String> {
    let s = &e["sizes"];
    let n = |k: &str| s[k].as_u64().unwrap().to_string();
    let mut v: Vec<String> = ["--model", "llama", "--data"].map(String::from).to_vec();
    v.push(fixture("tokens.safetensors").display().to_string());
    for (flag, key) in [
        ("--width", "hidden_size"),
        ("--depth", "num_hidden_layers"),
        ("--heads", "num_attention_heads"),
        ("--kv-heads", "num_key_value_heads"),
        ("--ffn-width", "intermediate_size"),
        ("--num-classes", "vocab_size"),
    ] {
        v.extend([flag.to_string(), n(key)]);
    }
    v.extend(["--rope-theta".into(), s["rope_theta"].as_f64().unwrap().to_string()]);
    v.extend(["--input-shape".into(), e["context"].as_u64().unwrap().to_string()]);
    v.extend(["--batch-size".into(), e["batch"].as_u64().unwrap().to_string()]);
    v
}

/// Stand-alone, and 8 devices: each search of auto_parallel, semi_auto_parallel's defaults, a
/// two-stage pipeline.
const LAYOUTS: &[&[&str]] = &[
    &[],
    &["--devices", "8", "--parallel-mode", "auto_parallel", "--parallel", "search_mode=recursive_programming"],
    &["--devices", "8", "--parallel-mode", "auto_parallel", "--parallel", "search_mode=dynamic_programming"],
    &["--devices", "8", "--parallel-mode", "auto_parallel", "--parallel", "search_mode=sharding_propagation"],
    &["--devices", "8", "--parallel-mode", "semi_auto_parallel"],
    &["--devices", "8", "--parallel", "pipeline_stages=2"],
];

#[test]
fn a_transformers_llama_gives_its_logits_on_every_layout() {
    let e = expected();
    let dir = tempfile::tempdir().unwrap();
    let want = logits_of(&fixture("logits.safetensors"));
    for layout in LAYOUTS {
        let mut args: Vec<String> =
            ["predict".to_string(), fixture("model.safetensors").display().to_string(), "--output".into(), "p.safetensors".into()].to_vec();
        args.extend(model_flags(&e));
        args.extend(layout.iter().map(|s| s.to_string()));
        let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{layout:?}: {}", String::from_utf8_lossy(&o.stderr));
        let got = logits_of(&dir.path().join("p.safetensors"));
        assert_eq!(got.len(), want.len(), "{layout:?}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{layout:?}: logit {i} is {a}, transformers {b}");
        }
    }
}

/// `save_pretrained`'s shards, named by their folder or by their index, give the same logits.
#[test]
fn a_sharded_transformers_checkpoint_loads_from_its_folder_or_its_index() {
    let e = expected();
    let dir = tempfile::tempdir().unwrap();
    let want = logits_of(&fixture("logits.safetensors"));
    let sharded = fixture("sharded");
    for (source, layout) in [(sharded.clone(), &[][..]), (sharded.join("model.safetensors.index.json"), LAYOUTS[1])] {
        let mut args: Vec<String> =
            ["predict".to_string(), source.display().to_string(), "--output".into(), "p.safetensors".into()].to_vec();
        args.extend(model_flags(&e));
        args.extend(layout.iter().map(|s| s.to_string()));
        let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(o.status.success(), "{source:?}: {}", String::from_utf8_lossy(&o.stderr));
        let got = logits_of(&dir.path().join("p.safetensors"));
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{source:?}: logit {i} is {a}, transformers {b}");
        }
    }
    // The folder's config.json gives the sizes no flag sets.
    let data = fixture("tokens.safetensors").display().to_string();
    let (context, batch) = (e["context"].to_string(), e["batch"].to_string());
    let bare = ["--model", "llama", "--data", &data, "--input-shape", &context, "--batch-size", &batch];
    let mut args: Vec<String> = ["predict".to_string(), sharded.display().to_string(), "--output".into(), "q.safetensors".into()].to_vec();
    args.extend(bare.iter().map(|s| s.to_string()));
    let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "sizes from config.json: {}", String::from_utf8_lossy(&o.stderr));
    let got = logits_of(&dir.path().join("q.safetensors"));
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-4), "sizes from config.json");
    // A config.json of another architecture is refused by name.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("model.safetensors"), other.path().join("model.safetensors")).unwrap();
    std::fs::write(other.path().join("config.json"), r#"{"model_type": "qwen2", "hidden_size": 32}"#).unwrap();
    let mut args: Vec<String> =
        ["predict".to_string(), other.path().display().to_string(), "--output".into(), "q.safetensors".into()].to_vec();
    args.extend(bare.iter().map(|s| s.to_string()));
    let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("config.json describes a \"qwen2\" model"), "{err}");

    // What autopar's llama cannot follow is refused by the key that asks for it.
    let base: Value = serde_json::from_str(&std::fs::read_to_string(sharded.join("config.json")).unwrap()).unwrap();
    for (key, value, says) in [
        ("rope_parameters", serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0}), "rope_parameters.rope_type"),
        ("sliding_window", serde_json::json!(4), "sliding_window"),
        ("head_dim", serde_json::json!(4), "head_dim"),
        ("attention_dropout", serde_json::json!(0.1), "attention_dropout"),
        ("rms_norm_eps", serde_json::json!("small"), "rms_norm_eps is \"small\", not a number"),
    ] {
        let mut cfg = base.clone();
        cfg[key] = value;
        std::fs::write(other.path().join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
        let mut args: Vec<String> =
            ["predict".to_string(), other.path().display().to_string(), "--output".into(), "q.safetensors".into()].to_vec();
        args.extend(bare.iter().map(|s| s.to_string()));
        let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{key}: {err}");
    }

    // A shard the index lists but the folder lacks is named.
    let broken = tempfile::tempdir().unwrap();
    std::fs::copy(sharded.join("model.safetensors.index.json"), broken.path().join("model.safetensors.index.json")).unwrap();
    std::fs::copy(sharded.join("model-00001-of-00002.safetensors"), broken.path().join("model-00001-of-00002.safetensors")).unwrap();
    let mut args: Vec<String> =
        ["predict".to_string(), broken.path().display().to_string(), "--output".into(), "p.safetensors".into()].to_vec();
    args.extend(model_flags(&e));
    let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn a_transformers_llama_trains_to_pytorchs_adamw_losses_on_every_layout() {
    let e = expected();
    let dir = tempfile::tempdir().unwrap();
    let want: Vec<f64> = e["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    for layout in LAYOUTS {
        let mut args: Vec<String> = ["train", "--init"].map(String::from).to_vec();
        args.push(fixture("model.safetensors").display().to_string());
        args.extend(model_flags(&e));
        let steps = want.len().to_string();
        let (lr, wd) = (e["lr"].as_f64().unwrap().to_string(), e["weight_decay"].as_f64().unwrap().to_string());
        for a in ["--optimizer", "adamw", "--lr", &lr, "--weight-decay", &wd, "--steps", &steps, "--shuffle", "false", "--eval", "false"] {
            args.push(a.to_string());
        }
        args.extend(layout.iter().map(|s| s.to_string()));
        let got = trained_losses(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>(), &format!("{layout:?}"));
        assert_eq!(got.len(), want.len(), "{layout:?}");
        for (s, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{layout:?}: loss at step {s} is {a}, PyTorch {b}");
        }
    }
}

/// `ckpt export --format hf` of a run's per-rank checkpoints: whole tensors under transformers'
/// names and a config.json with the sizes, which autopar itself then loads with no size flag
/// and predicts with exactly as from the run's folder.
#[test]
fn a_runs_checkpoint_exports_as_a_transformers_folder() {
    let e = expected();
    let dir = tempfile::tempdir().unwrap();
    let flags = model_flags(&e);
    let mut args: Vec<String> = ["train", "--init"].map(String::from).to_vec();
    args.push(fixture("model.safetensors").display().to_string());
    args.extend(flags.iter().cloned());
    for a in [
        "--steps",
        "2",
        "--optimizer",
        "adamw",
        "--eval",
        "false",
        "--devices",
        "4",
        "--parallel-mode",
        "auto_parallel",
        "--checkpoint-dir",
        "run",
    ] {
        args.push(a.into());
    }
    let o = autopar(dir.path(), &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Only the model flags (sizes) of the run, without its data flags.
    let sizes: Vec<&str> = flags
        .chunks(2)
        .filter(|p| !["--data", "--batch-size", "--input-shape"].contains(&p[0].as_str()))
        .flatten()
        .map(String::as_str)
        .collect();
    let mut args = vec!["ckpt", "export", "run", "hf", "--format", "hf"];
    args.extend(&sizes);
    let o = autopar(dir.path(), &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("hf/config.json")).unwrap()).unwrap();
    let s = &e["sizes"];
    for key in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"] {
        assert_eq!(config[key], s[key], "{key}");
    }
    assert_eq!(config["architectures"][0], "LlamaForCausalLM");
    let file = autopar_checkpoint::CheckpointFile::open(dir.path().join("hf/model.safetensors")).unwrap();
    assert_eq!(file.get("model.layers.1.self_attn.k_proj.weight").unwrap().shape, vec![16, 32]);
    assert!(file.tensors().iter().all(|t| !t.name.contains("adam") && !t.name.contains("moment")), "model weights only");
    let logits = |src: &str, extra: &[&str]| -> Vec<f32> {
        let data = fixture("tokens.safetensors").display().to_string();
        let mut args = vec![
            "predict",
            src,
            "--output",
            "p.safetensors",
            "--model",
            "llama",
            "--data",
            &data,
            "--input-shape",
            "12",
            "--batch-size",
            "8",
        ];
        args.extend(extra);
        let o = autopar(dir.path(), &args);
        assert!(o.status.success(), "{src}: {}", String::from_utf8_lossy(&o.stderr));
        logits_of(&dir.path().join("p.safetensors"))
    };
    let from_run = logits("run", &sizes[2..]);
    let from_export = logits("hf", &[]);
    assert_eq!(from_run, from_export);
    // Another model is refused up front.
    let o = autopar(dir.path(), &["ckpt", "export", "run", "x", "--format", "hf", "--model", "gpt"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("writes Llama and Mixtral checkpoints"));
}

/// The Mixtral fixture: a `save_pretrained` folder, its sizes from its config.json.
fn mixtral(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/transformers/mixtral")).join(name)
}

#[test]
fn a_transformers_mixtral_gives_its_logits_and_trains_to_pytorchs_losses_on_every_layout() {
    let e: Value = serde_json::from_str(&std::fs::read_to_string(mixtral("expected.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let want = logits_of(&mixtral("logits.safetensors"));
    let want_losses: Vec<f64> = e["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let folder = mixtral("").display().to_string();
    let data = mixtral("tokens.safetensors").display().to_string();
    let (context, batch) = (e["context"].to_string(), e["batch"].to_string());
    let model = ["--model", "moe", "--data", &data, "--input-shape", &context, "--batch-size", &batch];
    for layout in LAYOUTS {
        let mut args = vec!["predict", &folder, "--output", "p.safetensors"];
        args.extend(model);
        args.extend(layout.iter());
        let o = autopar(dir.path(), &args);
        assert!(o.status.success(), "{layout:?}: {}", String::from_utf8_lossy(&o.stderr));
        for (i, (a, b)) in logits_of(&dir.path().join("p.safetensors")).iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{layout:?}: logit {i} is {a}, transformers {b}");
        }
        let mut args = vec!["train", "--init", &folder];
        args.extend(model);
        args.extend(["--optimizer", "adamw", "--lr", "1e-3", "--weight-decay", "0.01", "--steps", "5", "--shuffle", "false"]);
        args.extend(["--eval", "false"]);
        args.extend(layout.iter());
        let got = trained_losses(dir.path(), &args, &format!("{layout:?}"));
        assert_eq!(got.len(), want_losses.len(), "{layout:?}");
        for (s, (a, b)) in got.iter().zip(&want_losses).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{layout:?}: loss at step {s} is {a}, PyTorch {b}");
        }
    }
    // Exported again (sizes from its config.json), it is Mixtral's config and the same logits.
    let o = autopar(dir.path(), &["ckpt", "export", &folder, "again", "--format", "hf", "--model", "moe"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("again/config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["model_type"].as_str(), config["num_local_experts"].as_u64()),
        (Some("mixtral"), e["sizes"]["num_local_experts"].as_u64())
    );
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["rms_norm_eps"], e["sizes"]["rms_norm_eps"]);
    let mut args = vec!["predict", "again", "--output", "p.safetensors"];
    args.extend(model);
    let o = autopar(dir.path(), &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(logits_of(&dir.path().join("p.safetensors")).iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-4), "the export's logits");
}

#[test]
fn a_transformers_mixtral_trains_with_its_load_balancing_loss_to_pytorchs_losses() {
    let e: Value = serde_json::from_str(&std::fs::read_to_string(mixtral("expected.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let want: Vec<f64> = e["losses_aux"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let plain: Vec<f64> = e["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let folder = mixtral("").display().to_string();
    let data = mixtral("tokens.safetensors").display().to_string();
    let (context, batch, coef) = (e["context"].to_string(), e["batch"].to_string(), e["aux_loss_coef"].to_string());
    // The same checkpoint whose config.json asks for the loss (output_router_logits).
    let asking = dir.path().join("asking");
    std::fs::create_dir(&asking).unwrap();
    std::fs::copy(mixtral("model.safetensors"), asking.join("model.safetensors")).unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(mixtral("config.json")).unwrap()).unwrap();
    config["output_router_logits"] = Value::Bool(true);
    config["router_aux_loss_coef"] = e["aux_loss_coef"].clone();
    std::fs::write(asking.join("config.json"), config.to_string()).unwrap();
    let asking = asking.display().to_string();
    let runs: [(&str, &[&str], &[&str]); 3] = [
        (&folder, &["--aux-loss-coef", &coef], LAYOUTS[0]),
        // Not a pipeline: its micro-batches each count their own tokens' assignments.
        (&folder, &["--aux-loss-coef", &coef], LAYOUTS[4]),
        (&asking, &[], LAYOUTS[1]),
    ];
    for (init, flags, layout) in runs {
        let mut args = vec!["train", "--init", init, "--model", "moe", "--data", &data, "--input-shape", &context];
        args.extend(flags.iter());
        args.extend(["--batch-size", &batch, "--optimizer", "adamw", "--lr", "1e-3"]);
        args.extend(["--weight-decay", "0.01", "--steps", "5", "--shuffle", "false", "--eval", "false"]);
        args.extend(layout.iter());
        let got = trained_losses(dir.path(), &args, &format!("{layout:?}"));
        assert_eq!(got.len(), want.len(), "{layout:?}");
        for (s, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4, "{layout:?}: loss at step {s} is {a}, PyTorch {b} (without the auxiliary loss {})", plain[s]);
        }
    }
}

/// `--capacity-factor`: with room for every choice, transformers' logits; with less, choices
/// dropped (other logits), the same on 8 devices as on one.
#[test]
fn an_expert_capacity_drops_choices_alike_on_every_layout() {
    let e: Value = serde_json::from_str(&std::fs::read_to_string(mixtral("expected.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let want = logits_of(&mixtral("logits.safetensors"));
    let folder = mixtral("").display().to_string();
    let data = mixtral("tokens.safetensors").display().to_string();
    let (context, batch) = (e["context"].to_string(), e["batch"].to_string());
    let predict = |factor: &str, layout: &[&str]| -> Vec<f32> {
        let mut args = vec!["predict", &folder, "--output", "p.safetensors", "--model", "moe", "--data", &data];
        args.extend(["--input-shape", &context, "--batch-size", &batch, "--capacity-factor", factor]);
        args.extend(layout.iter());
        let o = autopar(dir.path(), &args);
        assert!(o.status.success(), "{factor} {layout:?}: {}", String::from_utf8_lossy(&o.stderr));
        logits_of(&dir.path().join("p.safetensors"))
    };
    let roomy = predict("100", LAYOUTS[0]);
    assert_eq!(roomy.len(), want.len());
    assert!(roomy.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-4), "room for every choice: transformers' logits");
    let tight = predict("0.5", LAYOUTS[0]);
    assert!(tight.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-3), "half the room: some choices dropped");
    let parallel = predict("0.5", LAYOUTS[4]);
    assert_eq!(parallel.len(), tight.len());
    assert!(parallel.iter().zip(&tight).all(|(a, b)| (a - b).abs() <= 1e-5), "8 devices drop what one drops");
}
