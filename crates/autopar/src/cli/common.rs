//! What `train` and `plan` share: the model flags, the parallel flags, and the TOML config file
//! (the flags' names with `_` for `-`, plus a `[parallel]` table of `set_auto_parallel_context`
//! options). Flags given on the command line override the file; unknown keys are errors. The
//! parallel context is built and validated here, before any data or model is loaded, so an
//! option autopar does not implement is refused up front.

use std::path::{Path, PathBuf};

pub use crate::config::{read_config, toml_to_json, FileConfig};
use anyhow::{anyhow, bail, Context, Result};
use autopar_data::{Dataset, DatasetKind, Split, Transforms};
use autopar_graph::precision::{AmpLevel, Precision};
use autopar_graph::RecomputeChoice;
use autopar_models::{ModelOptions, Stem};
use autopar_parallel::{ParallelContext, ParallelMode};
use autopar_runtime::trainer::OptimizerKind;
use clap::Args;

/// The model and its sizes (shared by `train` and `plan`).
#[derive(Args, Debug, Default, Clone)]
pub struct ModelArgs {
    /// Model: mlp, resnet18, resnet34, resnet50, gpt, llama or moe (a llama whose MLPs are experts).
    #[arg(long, help_heading = "Model")]
    pub model: Option<String>,
    /// Hidden width (mlp), base channels (resnet) or model width (gpt, llama).
    #[arg(long, help_heading = "Model")]
    pub width: Option<usize>,
    /// Hidden layers (mlp) or transformer blocks (gpt, llama).
    #[arg(long, help_heading = "Model")]
    pub depth: Option<usize>,
    /// Attention heads (gpt; llama: query heads).
    #[arg(long, help_heading = "Model")]
    pub heads: Option<usize>,
    /// Key/value heads of grouped-query attention (llama, moe; default: --heads when that is given, else 2).
    #[arg(long, help_heading = "Model")]
    pub kv_heads: Option<usize>,
    /// The MLP's hidden size (llama; default 344).
    #[arg(long, help_heading = "Model")]
    pub ffn_width: Option<usize>,
    /// The rotary position embedding's base (llama, moe; default 10000).
    #[arg(long, value_name = "THETA", help_heading = "Model")]
    pub rope_theta: Option<f64>,
    /// Epsilon of the RMSNorms (llama, moe; default 1e-6).
    #[arg(long, value_name = "EPS", help_heading = "Model")]
    pub rms_eps: Option<f64>,
    /// The LM head reuses the token embedding (llama, moe; default false).
    #[arg(long, value_name = "true|false", help_heading = "Model")]
    pub tie_embeddings: Option<bool>,
    /// Experts of each block's MLP (moe; default 4).
    #[arg(long, help_heading = "Model")]
    pub experts: Option<usize>,
    /// Experts each token is routed to, weighted by its renormalised router probabilities (moe; default 2).
    #[arg(long, help_heading = "Model")]
    pub top_k: Option<usize>,
    /// Weight of the auxiliary load-balancing loss added to the training loss, Mixtral's (moe; default 0: none).
    #[arg(long, value_name = "WEIGHT", help_heading = "Model")]
    pub aux_loss_coef: Option<f64>,
    /// Expert capacity factor, MindSpore's: each expert takes at most ceil(top_k x tokens x FACTOR / experts) of a batch's tokens, the choices beyond dropped (moe; default: none, every choice kept).
    #[arg(long, value_name = "FACTOR", help_heading = "Model")]
    pub capacity_factor: Option<f64>,
    /// Classes (the vocabulary for gpt, llama and moe); default: the dataset's.
    #[arg(long, help_heading = "Model")]
    pub num_classes: Option<usize>,
    /// Shape of one sample, e.g. 784 or 3,32,32 (gpt, llama: the context length); default: the data's.
    #[arg(long, value_name = "DIMS", help_heading = "Model")]
    pub input_shape: Option<String>,
    /// ResNet stem: cifar or imagenet.
    #[arg(long, help_heading = "Model")]
    pub stem: Option<String>,
}

/// How the job is spread over devices (shared by `train` and `plan`).
#[derive(Args, Debug, Default, Clone)]
pub struct ParallelArgs {
    /// Number of devices (ranks, run as threads; under mpirun one per process).
    #[arg(long, value_name = "N", help_heading = "Parallel")]
    pub devices: Option<usize>,
    /// stand_alone, data_parallel, semi_auto_parallel (default with --devices > 1), auto_parallel
    /// (strategy search; --parallel search_mode=...) or hybrid_parallel.
    #[arg(long, value_name = "MODE", help_heading = "Parallel")]
    pub parallel_mode: Option<String>,
    /// Any set_auto_parallel_context option, e.g. --parallel gradients_mean=true (repeatable).
    #[arg(long, value_name = "KEY=VALUE", help_heading = "Parallel")]
    pub parallel: Vec<String>,
    /// Operator strategies from this strategy file (MindSpore's strategy_ckpt_load_file).
    #[arg(long, value_name = "FILE", help_heading = "Parallel")]
    pub strategy: Option<PathBuf>,
    /// auto_parallel's cost model under this device profile (`autopar calibrate --out FILE`;
    /// default: the built-in one).
    #[arg(long, value_name = "FILE", help_heading = "Parallel")]
    pub profile: Option<PathBuf>,
    /// Where pipeline stages begin (with --parallel pipeline_stages=P): the first op of each
    /// stage after the first, in network order (names as `autopar plan` prints them), e.g.
    /// blocks.2.ln1; default: the model's own stages, else stages of about equal FLOPs cut
    /// between blocks.
    #[arg(long, value_name = "OP,...", value_delimiter = ',', help_heading = "Parallel")]
    pub pipeline_split: Option<Vec<String>>,
    /// What the backward pass recomputes instead of keeping (MindSpore's recompute): blocks
    /// (every block of the model: a GPT's transformer blocks, a ResNet's residual blocks, each
    /// but its output), none, or ops by the names `autopar plan` prints and cells by the prefix
    /// of their ops' names (blocks.1.attn.scores,blocks.2.); default: what the network marks
    /// itself (nothing, for the built-in models), and under auto_parallel every block when no
    /// plan fits device_memory_capacity without.
    #[arg(long, value_name = "blocks|none|OP,...", value_delimiter = ',', help_heading = "Parallel")]
    pub recompute: Option<Vec<String>>,
    /// Mixed precision (MindSpore's amp_level): O0 (float32, the default); O1 (matrix products,
    /// convolutions and ReLU in --amp-dtype); O2 (every op but normalisations, softmax, losses
    /// and reductions); O3 (every op). Parameters and gradients stay float32.
    #[arg(long, value_name = "O0|O1|O2|O3", help_heading = "Parallel")]
    pub amp_level: Option<String>,
    /// The half-precision type of --amp-level: bf16 (the default) or f16.
    #[arg(long, value_name = "bf16|f16", help_heading = "Parallel")]
    pub amp_dtype: Option<String>,
}

/// `--amp-level` and `--amp-dtype`, else the config file's `amp_level` and `amp_dtype`.
pub fn precision(p: &ParallelArgs, file: &FileConfig) -> Result<Precision> {
    let level = p.amp_level.clone().or_else(|| file.amp_level.clone());
    let dtype = p.amp_dtype.clone().or_else(|| file.amp_dtype.clone());
    let level: AmpLevel = match &level {
        Some(l) => l.parse().map_err(|e| anyhow::anyhow!("--amp-level (amp_level in a config file): {e}"))?,
        None => AmpLevel::O0,
    };
    if level == AmpLevel::O0 {
        if let Some(d) = dtype {
            bail!("amp dtype {d} (--amp-dtype, or amp_dtype in the config) names the half-precision type of --amp-level O1, O2 or O3, and the level is O0 (float32)\nhint: pass --amp-level O2, or drop the amp dtype");
        }
        return Ok(Precision::default());
    }
    let dtype = match &dtype {
        Some(d) => autopar_graph::precision::half_dtype(d).map_err(|e| anyhow::anyhow!("--amp-dtype (amp_dtype in a config file): {e}"))?,
        None => autopar_graph::DType::BF16,
    };
    Ok(Precision::new(level, dtype)?)
}

/// `--recompute`, else the config file's `recompute`: what the backward pass recomputes.
pub fn recompute(p: &ParallelArgs, file: &FileConfig) -> Result<RecomputeChoice> {
    let Some(names) = p.recompute.clone().or_else(|| file.recompute.as_ref().map(|n| n.to_vec())) else {
        return Ok(RecomputeChoice::AsBuilt);
    };
    let names: Vec<String> = names.iter().map(|n| n.trim().to_string()).collect();
    if names.is_empty() {
        bail!("recompute is an empty list\nhint: give blocks, none, or op names, e.g. recompute = \"blocks\"");
    }
    if let Some(bad) = names.iter().find(|s| s.is_empty()) {
        bail!("--recompute has an empty name ({bad:?})\nhint: pass blocks, none, or op names separated by commas, e.g. --recompute blocks.0.attn.scores,blocks.1.");
    }
    Ok(match names.as_slice() {
        [one] if one == "blocks" => RecomputeChoice::Blocks,
        [one] if one == "none" => RecomputeChoice::Nothing,
        _ => {
            if let Some(word) = names.iter().find(|n| *n == "blocks" || *n == "none") {
                bail!("--recompute {} mixes {word} with op names\nhint: pass {word} alone, or only op and cell names", names.join(","));
            }
            RecomputeChoice::Named(names)
        }
    })
}

/// `--pipeline-split`, else the config file's `pipeline_split`; empty for none.
pub fn pipeline_split(p: &ParallelArgs, file: &FileConfig) -> Result<Vec<String>> {
    let split = p.pipeline_split.clone().or_else(|| file.pipeline_split.clone()).unwrap_or_default();
    if let Some(bad) = split.iter().find(|s| s.trim().is_empty()) {
        bail!("--pipeline-split has an empty op name ({bad:?})\nhint: name ops separated by commas, e.g. --pipeline-split blocks.2.ln1");
    }
    Ok(split)
}

/// The device profile of `--profile`, else of the config file's `profile` key (TOML, as
/// `autopar calibrate` writes it); None for the built-in one. Only auto_parallel's search
/// reads a profile: in another mode one is refused rather than ignored.
pub fn load_profile(p: &ParallelArgs, file: &FileConfig, ctx: &ParallelContext) -> Result<Option<autopar_parallel::DeviceProfile>> {
    let Some(path) = p.profile.as_deref().or(file.profile.as_deref()) else { return Ok(None) };
    if ctx.parallel_mode() != ParallelMode::AutoParallel {
        bail!(
            "--profile {} prices auto_parallel's strategy search, and the parallel mode is {}\nhint: add --parallel-mode auto_parallel, or drop --profile",
            path.display(),
            ctx.parallel_mode().name()
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| {
        let from_file = if p.profile.is_none() {
            "\n  it is the config file's `profile`: paths in the config file are relative to the working directory, not to the file"
        } else {
            ""
        };
        format!(
            "cannot read device profile {}{from_file}\nhint: write one with `autopar calibrate --out {}`",
            path.display(),
            path.display()
        )
    })?;
    let doc: toml_edit::DocumentMut = text.parse().map_err(|e| {
        anyhow::anyhow!("device profile {} is not valid TOML: {e}\nhint: write one with `autopar calibrate --out FILE`", path.display())
    })?;
    let json =
        toml_to_json(doc.as_item()).with_context(|| format!("in device profile {}", path.display()))?.unwrap_or(serde_json::Value::Null);
    Ok(Some(autopar_parallel::DeviceProfile::from_json(&json, &path.display().to_string())?))
}

fn parse_shape(text: &str) -> Result<Vec<usize>> {
    text.split([',', 'x'])
        .map(|d| d.trim().trim_matches(|c| c == '[' || c == ']').parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .ok()
        .filter(|s| !s.is_empty() && s.iter().all(|&d| d > 0))
        .ok_or_else(|| anyhow!("invalid --input-shape {text:?}\n  expected positive sizes separated by commas\nhint: e.g. --input-shape 784 or --input-shape 3,32,32"))
}

/// The model's name (lowercase, checked) and its options, flags over the file.
pub fn model_options(m: &ModelArgs, file: &FileConfig) -> Result<(String, ModelOptions)> {
    let name = m.model.clone().or_else(|| file.model.clone()).ok_or_else(|| {
        anyhow!(
            "no model given\nhint: pass --model mlp|resnet18|resnet34|resnet50|gpt|llama|moe (or `model = \"mlp\"` in the --config file)"
        )
    })?;
    let lower = name.to_ascii_lowercase();
    if !autopar_models::MODEL_NAMES.contains(&lower.as_str()) {
        bail!("unknown model {name:?}\n  valid models: {}\nhint: pass --model mlp for a quick run", autopar_models::MODEL_NAMES.join(", "));
    }
    let mut opts = ModelOptions {
        width: m.width.or(file.width),
        depth: m.depth.or(file.depth),
        heads: m.heads.or(file.heads),
        kv_heads: m.kv_heads.or(file.kv_heads),
        ffn_width: m.ffn_width.or(file.ffn_width),
        rope_theta: m.rope_theta.or(file.rope_theta),
        rms_eps: m.rms_eps.or(file.rms_eps),
        tie_embeddings: m.tie_embeddings.or(file.tie_embeddings),
        experts: m.experts.or(file.experts),
        top_k: m.top_k.or(file.top_k),
        aux_loss_coef: m.aux_loss_coef.or(file.aux_loss_coef),
        capacity_factor: m.capacity_factor.or(file.capacity_factor),
        num_classes: m.num_classes.or(file.num_classes),
        ..Default::default()
    };
    if let Some(stem) = m.stem.clone().or_else(|| file.stem.clone()) {
        opts.stem =
            Some(stem.parse::<Stem>().map_err(|e| anyhow!("invalid --stem {stem:?}: {e}\nhint: use --stem cifar or --stem imagenet"))?);
    }
    opts.input_shape = match (&m.input_shape, &file.input_shape) {
        (Some(t), _) => Some(parse_shape(t)?),
        (None, Some(serde_json::Value::Array(a))) => Some(parse_shape(&a.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(","))?),
        (None, Some(v)) => Some(parse_shape(v.to_string().trim_matches('"'))?),
        (None, None) => None,
    };
    Ok((lower, opts))
}

/// A Hugging Face checkpoint's model sizes, from the `config.json` beside its weights (`weights`
/// a `save_pretrained` folder, or a file in one), for the options no flag or config file set:
/// `hidden_size` (width), `num_hidden_layers` (depth), `num_attention_heads` (heads),
/// `num_key_value_heads`, `intermediate_size`, `vocab_size` (num_classes), `rope_theta`,
/// `rms_norm_eps`, `tie_word_embeddings` (and for `moe` `num_local_experts`,
/// `num_experts_per_tok`, and `router_aux_loss_coef` when `output_router_logits`). Only for
/// `llama` (model_type llama) and `moe` (mixtral); a `config.json` of another architecture, or
/// asking for what autopar's models lack (biases, rope scaling, a sliding window, attention
/// dropout, router noise, another activation or head size), is an error naming the key. Returns the file read, if any.
pub fn hf_model_options(model: &str, weights: &Path, opts: &mut ModelOptions) -> Result<Option<PathBuf>> {
    let want = match model {
        "llama" => "llama",
        "moe" => "mixtral",
        _ => return Ok(None),
    };
    let dir = if weights.is_dir() { weights } else { weights.parent().unwrap_or(Path::new(".")) };
    let path = dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let cfg: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON\nhint: it should be transformers' config.json of the checkpoint", path.display()))?;
    let kind = cfg.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
    if kind != want {
        bail!(
            "{} describes a {kind:?} model, not a {want:?} one\nhint: autopar's llama reads LlamaForCausalLM checkpoints (model_type \"llama\"), its moe MixtralForCausalLM ones (\"mixtral\")",
            path.display()
        );
    }
    let refuse = |key: &str, why: &str| refuse_key(&path, key, why);
    let number = |key: &str| -> Result<Option<f64>> {
        match cfg.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| anyhow!("{}: {key} is {v}, not a number", path.display())),
        }
    };
    let size = |key: &str| -> Result<Option<usize>> {
        match cfg.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| anyhow!("{}: {key} is {v}, not a size", path.display())),
        }
    };
    let flag = |key: &str| -> Result<Option<bool>> {
        match cfg.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| anyhow!("{}: {key} is {v}, not true or false", path.display())),
        }
    };
    // What autopar's models cannot follow is refused by name, not ignored.
    for key in ["attention_bias", "mlp_bias"] {
        if flag(key)? == Some(true) {
            refuse(key, "no projection has a bias")?;
        }
    }
    for (key, why) in [("router_jitter_noise", "its router adds no noise"), ("attention_dropout", "its attention has no dropout")] {
        if number(key)?.is_some_and(|v| v != 0.0) {
            refuse(key, why)?;
        }
    }
    if cfg.get("sliding_window").is_some_and(|v| !v.is_null()) {
        refuse("sliding_window", "its attention sees every earlier position")?;
    }
    if cfg.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        refuse("rope_scaling", "positions are rotated unscaled")?;
    }
    // transformers 5 nests the rotation's settings in rope_parameters.
    let rope = cfg.get("rope_parameters").filter(|v| !v.is_null());
    if let Some(kind) = rope.and_then(|r| r.get("rope_type")).and_then(|v| v.as_str()).filter(|k| *k != "default") {
        refuse("rope_parameters.rope_type", &format!("positions are rotated unscaled, not as {kind:?}"))?;
    }
    let theta = match rope.and_then(|r| r.get("rope_theta")) {
        Some(v) => Some(v.as_f64().ok_or_else(|| anyhow!("{}: rope_parameters.rope_theta is {v}, not a number", path.display()))?),
        None => number("rope_theta")?,
    };
    if let Some(act) = cfg.get("hidden_act").and_then(|v| v.as_str()).filter(|a| *a != "silu") {
        refuse("hidden_act", &format!("its MLP is SwiGLU, not {act}"))?;
    }
    if let (Some(hd), Some(w), Some(h)) = (size("head_dim")?, size("hidden_size")?, size("num_attention_heads")?) {
        if h == 0 || hd * h != w {
            refuse("head_dim", &format!("its heads are hidden_size / num_attention_heads = {w} / {h} wide, not {hd}"))?;
        }
    }
    opts.width = opts.width.or(size("hidden_size")?);
    opts.depth = opts.depth.or(size("num_hidden_layers")?);
    opts.heads = opts.heads.or(size("num_attention_heads")?);
    opts.kv_heads = opts.kv_heads.or(size("num_key_value_heads")?);
    opts.ffn_width = opts.ffn_width.or(size("intermediate_size")?);
    opts.num_classes = opts.num_classes.or(size("vocab_size")?);
    opts.rope_theta = opts.rope_theta.or(theta);
    opts.rms_eps = opts.rms_eps.or(number("rms_norm_eps")?);
    opts.tie_embeddings = opts.tie_embeddings.or(flag("tie_word_embeddings")?);
    if model == "moe" {
        opts.experts = opts.experts.or(size("num_local_experts")?);
        opts.top_k = opts.top_k.or(size("num_experts_per_tok")?);
        // The auxiliary loss is part of the training loss only with output_router_logits
        // (transformers' default weight 0.001).
        if flag("output_router_logits")? == Some(true) {
            opts.aux_loss_coef = opts.aux_loss_coef.or(Some(number("router_aux_loss_coef")?.unwrap_or(0.001)));
        }
    }
    Ok(Some(path))
}

/// A `config.json` setting autopar's llama and moe cannot follow, refused by name.
fn refuse_key(path: &Path, key: &str, why: &str) -> Result<()> {
    bail!(
        "{} sets {key}, which autopar's llama does not have ({why})\nhint: only Llamas and Mixtrals without biases, rope scaling, router noise or auxiliary loss, with SiLU, load",
        path.display()
    )
}

/// The device count and the mode may each be given twice on the command line (`--devices N`
/// and `--parallel device_num=N`; likewise the mode) and twice in the config file (`devices`
/// and `[parallel] device_num`): two that disagree at the same level are an error naming both,
/// instead of one silently winning (a flag still overrides the file).
/// `--micro-batches` (flag or config file): none is refused.
pub fn check_micro_batches(given: Option<usize>) -> Result<Option<usize>> {
    if given == Some(0) {
        bail!("--micro-batches 0 runs no batch\nhint: pass --micro-batches 1 or more");
    }
    Ok(given)
}

/// The value `--parallel KEY=VALUE` gives `key` (the last one given), as written.
pub fn given_parallel_option(p: &ParallelArgs, key: &str) -> Option<String> {
    p.parallel
        .iter()
        .rev()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches(['"', '\'']).to_string())
}

/// The value the config file's `[parallel]` table gives `key`, as text.
pub fn file_parallel_option(file: &FileConfig, key: &str) -> Option<String> {
    file.parallel.as_ref().and_then(|t| t.get(key)).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
}

fn refuse_conflicts(p: &ParallelArgs, file: &FileConfig) -> Result<()> {
    let kv = |key: &str| given_parallel_option(p, key);
    let table = |key: &str| file_parallel_option(file, key);
    // Per key: the command line's two places, then the file's (which count only where no flag
    // gives the key: a flag overrides the file).
    let places = [
        (
            "device_num",
            [("--devices".to_string(), p.devices.map(|n| n.to_string())), ("--parallel device_num".to_string(), kv("device_num"))],
            [
                ("devices in the config file".to_string(), file.devices.map(|n| n.to_string())),
                ("device_num in its [parallel] table".to_string(), table("device_num")),
            ],
        ),
        (
            "parallel_mode",
            [("--parallel-mode".to_string(), p.parallel_mode.clone()), ("--parallel parallel_mode".to_string(), kv("parallel_mode"))],
            [
                ("parallel_mode in the config file".to_string(), file.parallel_mode.clone()),
                ("parallel_mode in its [parallel] table".to_string(), table("parallel_mode")),
            ],
        ),
    ];
    for (key, flags, in_file) in places {
        let pair = if flags.iter().any(|(_, v)| v.is_some()) { flags } else { in_file };
        if let [(a, Some(va)), (b, Some(vb))] = &pair {
            if !va.eq_ignore_ascii_case(vb) {
                bail!("{a} gives {va} but {b} gives {vb}\nhint: give the {key} once, or the same value in both places");
            }
        }
    }
    Ok(())
}

/// The parallel context: the file's `[parallel]` table, then `--parallel-mode`, `--devices`,
/// `--parallel KEY=VALUE` and `--strategy`, validated and checked for what autopar implements
/// (an option whose behaviour is missing is refused here, before any data or model is loaded),
/// with autopar's defaults applied ([`ParallelContext::resolved`]).
pub fn parallel_context(p: &ParallelArgs, file: &FileConfig) -> Result<ParallelContext> {
    refuse_conflicts(p, file)?;
    let mut ctx = ParallelContext::default();
    if let Some(table) = &file.parallel {
        ctx.apply_table(table).context("in the [parallel] table of the config file")?;
    }
    let devices = p.devices.or(file.devices);
    let mode = p.parallel_mode.clone().or_else(|| file.parallel_mode.clone());
    if let Some(m) = &mode {
        ctx.set_str("parallel_mode", m)?;
    }
    if let Some(n) = devices {
        if n == 0 {
            bail!("invalid --devices 0\nhint: pass --devices 1 or more");
        }
        ctx.set_str("device_num", &n.to_string())?;
    }
    for kv in &p.parallel {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("invalid --parallel {kv:?}\nhint: write --parallel KEY=VALUE, e.g. --parallel gradients_mean=true"))?;
        ctx.set_str(k.trim(), v.trim())?;
    }
    if let Some(path) = p.strategy.clone().or_else(|| file.strategy.clone()) {
        ctx.set("strategy_ckpt_load_file", &serde_json::Value::String(path.display().to_string()))?;
    }
    // autopar's defaults, as every job gets them (more than one device and no mode anywhere:
    // semi_auto_parallel; data_parallel averages gradients), applied now for the checks below.
    let ctx = ctx.resolved()?;
    if ctx.parallel_mode() != ParallelMode::StandAlone && ctx.device_num() < 2 && devices.is_none() {
        bail!(
            "parallel mode {} needs a device count\nhint: add --devices N (such as --devices 2), or drop --parallel-mode",
            ctx.parallel_mode().name()
        );
    }
    // A device_num from the config file is ignored by a stand_alone run (as in MindSpore; the
    // run says "1 device"), but --devices N on the command line contradicts it.
    if let Some(n) = p.devices.filter(|&n| n > 1 && ctx.parallel_mode() == ParallelMode::StandAlone) {
        bail!("stand_alone runs on one device, but --devices {n} asks for {n}\nhint: drop --devices, or pass --parallel-mode semi_auto_parallel");
    }
    if ctx.parallel_mode() == ParallelMode::HybridParallel {
        bail!(
            "hybrid_parallel runs rank graphs written by hand with the autopar library; the zoo models are whole networks\nhint: use --parallel-mode semi_auto_parallel or --parallel-mode data_parallel"
        );
    }
    ctx.validate()?;
    ctx.check_supported()?;
    if let Some(path) = ctx.strategy_load_file() {
        if Path::new(path).is_dir() {
            bail!("strategy file {path:?} is a directory\n  it was given as the strategy to load (--strategy or strategy_ckpt_config.load_file)\nhint: pass the file inside it, such as {path}/strategy.json");
        }
        if !Path::new(path).is_file() {
            bail!("strategy file {path:?} not found\n  it was given as the strategy to load (--strategy or strategy_ckpt_config.load_file)\nhint: check the path, or write one with --parallel 'strategy_ckpt_config={{\"save_file\": \"{path}\"}}'");
        }
    }
    if let Some(path) = ctx.op_strategy_load_file() {
        if !Path::new(path).is_file() {
            bail!("operator strategy file {path:?} not found\n  it was given as op_strategy_config's file to LOAD\nhint: check the path, or write one with --parallel 'op_strategy_config={{\"mode\": \"SAVE\", \"path\": \"{path}\"}}'");
        }
    }
    Ok(ctx)
}

/// The optimizer named on the command line or in the config file.
pub fn optimizer_kind(name: &str, momentum: f64) -> Result<OptimizerKind> {
    OptimizerKind::by_name(name, momentum)
        .ok_or_else(|| anyhow!("unknown optimizer {name:?}\n  valid optimizers: {}\nhint: pass --optimizer momentum", OptimizerKind::NAMES))
}

/// Whether progress bars and spinners are drawn: only on a terminal, and not with
/// `AUTOPAR_PROGRESS=0`.
pub fn progress_enabled() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("AUTOPAR_PROGRESS").is_none_or(|v| v != "0")
}

/// A spinner on stderr for a long step without a known length (planning a large graph), with
/// the step's name and the elapsed time; drawn only on a terminal, cleared when dropped.
pub struct Spinner(indicatif::ProgressBar);

impl Spinner {
    /// Starts the spinner with `msg`.
    pub fn start(msg: impl Into<String>) -> Self {
        let target = if progress_enabled() { indicatif::ProgressDrawTarget::stderr() } else { indicatif::ProgressDrawTarget::hidden() };
        let bar = indicatif::ProgressBar::with_draw_target(None, target);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.set_message(msg.into());
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        Self(bar)
    }

    /// Names the next step.
    pub fn step(&self, msg: impl Into<String>) {
        self.0.set_message(msg.into());
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// The training split of the dataset at `path` with its default transforms, and the model's
/// input shape and classes filled in from it where `opts` leaves them unset (the samples'
/// shape after the transforms, flattened for the MLP; the dataset's class count, not for the
/// GPT, whose classes are its vocabulary): how `train` and `plan` size a model to its data.
pub fn open_training_data(
    path: &Path,
    model: &str,
    opts: &mut ModelOptions,
) -> Result<(DatasetKind, std::sync::Arc<dyn Dataset>, Transforms)> {
    let (kind, ds) = autopar_data::open(path, Split::Train)?;
    let transforms = kind.default_transforms(Split::Train);
    let shape = transforms.output_shape(ds.sample_shape())?;
    if opts.input_shape.is_none() {
        opts.input_shape = Some(match model {
            "mlp" => vec![shape.iter().product()],
            _ => shape,
        });
    }
    if opts.num_classes.is_none() && !autopar_models::LANGUAGE_MODELS.contains(&model) {
        opts.num_classes = ds.num_classes();
    }
    Ok((kind, ds, transforms))
}

/// Refuses, before any work, an output file `flag` names that could not be written: a folder
/// by that name, or a file where one of its folders should be (missing folders are made).
/// `example` names a file the hint suggests.
pub fn check_output_file(path: &Path, flag: &str, example: &str) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {} is a folder\nhint: name a file in it, e.g. {}", path.display(), path.join(example).display());
    }
    let mut at = path.parent();
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty()) {
        if p.exists() {
            if !p.is_dir() {
                bail!("{flag} {}: {} is a file, not a folder\nhint: name a path under a folder", path.display(), p.display());
            }
            return Ok(());
        }
        at = p.parent();
    }
    Ok(())
}
