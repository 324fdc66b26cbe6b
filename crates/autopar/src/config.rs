//! The TOML config file of `autopar train` and `autopar plan`: the flags' names with `_` for
//! `-`, plus a `[parallel]` table of `set_auto_parallel_context` options. Unknown keys are
//! errors.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// The TOML file: the flags' names with `_`, and a `[parallel]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--model` (see `autopar train --help`).
    pub model: Option<String>,
    /// `--data` (see `autopar train --help`).
    pub data: Option<String>,
    /// `--epochs` (see `autopar train --help`).
    pub epochs: Option<u64>,
    /// `--steps` (see `autopar train --help`).
    pub steps: Option<u64>,
    /// `--batch-size` (see `autopar train --help`).
    pub batch_size: Option<usize>,
    /// `--micro-batches` (see `autopar train --help`).
    pub micro_batches: Option<usize>,
    /// `--grad-accumulation` (see `autopar train --help`).
    pub grad_accumulation: Option<usize>,
    /// `--seed` (see `autopar train --help`).
    pub seed: Option<u64>,
    /// `--shuffle` (see `autopar train --help`).
    pub shuffle: Option<bool>,
    /// `--synthetic-samples` (see `autopar train --help`).
    pub synthetic_samples: Option<usize>,
    /// `--prefetch` (see `autopar train --help`).
    pub prefetch: Option<usize>,
    /// `--optimizer` (see `autopar train --help`).
    pub optimizer: Option<String>,
    /// `--lr` (see `autopar train --help`).
    pub lr: Option<f64>,
    /// `--schedule` (see `autopar train --help`).
    pub schedule: Option<String>,
    /// `--warmup-steps` (see `autopar train --help`).
    pub warmup_steps: Option<u64>,
    /// `--min-lr` (see `autopar train --help`).
    pub min_lr: Option<f64>,
    /// `--momentum` (see `autopar train --help`).
    pub momentum: Option<f64>,
    /// `--weight-decay` (see `autopar train --help`).
    pub weight_decay: Option<f64>,
    /// `--clip-grad-norm` (see `autopar train --help`).
    pub clip_grad_norm: Option<f64>,
    /// `--loss-scale` (see `autopar train --help`).
    pub loss_scale: Option<String>,
    /// `--width` (see `autopar train --help`).
    pub width: Option<usize>,
    /// `--depth` (see `autopar train --help`).
    pub depth: Option<usize>,
    /// `--heads` (see `autopar train --help`).
    pub heads: Option<usize>,
    /// `--kv-heads` (see `autopar train --help`).
    pub kv_heads: Option<usize>,
    /// `--ffn-width` (see `autopar train --help`).
    pub ffn_width: Option<usize>,
    /// `--rope-theta` (see `autopar train --help`).
    pub rope_theta: Option<f64>,
    /// `--rms-eps` (see `autopar train --help`).
    pub rms_eps: Option<f64>,
    /// `--tie-embeddings` (see `autopar train --help`).
    pub tie_embeddings: Option<bool>,
    /// `--experts` (see `autopar train --help`).
    pub experts: Option<usize>,
    /// `--top-k` (see `autopar train --help`).
    pub top_k: Option<usize>,
    /// `--aux-loss-coef` (see `autopar train --help`).
    pub aux_loss_coef: Option<f64>,
    /// `--capacity-factor` (see `autopar train --help`).
    pub capacity_factor: Option<f64>,
    /// `--num-classes` (see `autopar train --help`).
    pub num_classes: Option<usize>,
    /// `--input-shape` (see `autopar train --help`).
    pub input_shape: Option<serde_json::Value>,
    /// `--stem` (see `autopar train --help`).
    pub stem: Option<String>,
    /// `--checkpoint-dir` (see `autopar train --help`).
    pub checkpoint_dir: Option<PathBuf>,
    /// `--checkpoint-every` (see `autopar train --help`).
    pub checkpoint_every: Option<u64>,
    /// `--keep-checkpoint-max` (see `autopar train --help`).
    pub keep_checkpoint_max: Option<usize>,
    /// `--checkpoint-prefix` (see `autopar train --help`).
    pub checkpoint_prefix: Option<String>,
    /// `--init` (see `autopar train --help`).
    pub init: Option<PathBuf>,
    /// `--init-strategy` (see `autopar train --help`).
    pub init_strategy: Option<PathBuf>,
    /// `--resume` (see `autopar train --help`).
    pub resume: Option<PathBuf>,
    /// `--metrics` (see `autopar train --help`).
    pub metrics: Option<PathBuf>,
    /// `--plot` (see `autopar train --help`).
    pub plot: Option<bool>,
    /// `--report` (see `autopar train --help`).
    pub report: Option<PathBuf>,
    /// `--log-every` (see `autopar train --help`).
    pub log_every: Option<u64>,
    /// `--eval` (see `autopar train --help`).
    pub eval: Option<bool>,
    /// `--eval-batch-size` (see `autopar train --help`).
    pub eval_batch_size: Option<usize>,
    /// `--devices` (see `autopar train --help`).
    pub devices: Option<usize>,
    /// `--parallel-mode` (see `autopar train --help`).
    pub parallel_mode: Option<String>,
    /// `--strategy` (see `autopar train --help`).
    pub strategy: Option<PathBuf>,
    /// `--profile` (see `autopar train --help`).
    pub profile: Option<PathBuf>,
    /// `--pipeline-split` (see `autopar train --help`), as a list of op names.
    pub pipeline_split: Option<Vec<String>>,
    /// `--recompute` (see `autopar train --help`): `"blocks"`, `"none"`, or a list of op and
    /// cell names.
    pub recompute: Option<Names>,
    /// `--amp-level` (see `autopar train --help`).
    pub amp_level: Option<String>,
    /// `--amp-dtype` (see `autopar train --help`).
    pub amp_dtype: Option<String>,
    /// The `[parallel]` table: `set_auto_parallel_context` options by name, as `--parallel KEY=VALUE`.
    pub parallel: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A key given as one string (commas separating names, as on the command line) or a list.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum Names {
    /// `key = "a,b"`.
    One(String),
    /// `key = ["a", "b"]`.
    List(Vec<String>),
}

impl Names {
    /// The names, in order.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Names::One(s) => s.split(',').map(str::to_string).collect(),
            Names::List(l) => l.clone(),
        }
    }
}

/// A TOML item as the JSON value `ParallelContext::set` takes (None for an empty item). A float
/// that is not finite (`nan`, `inf`) has no JSON value and is an error naming its key, rather
/// than a key left unset.
pub fn toml_to_json(item: &toml_edit::Item) -> Result<Option<serde_json::Value>> {
    item_to_json(item, "")
}

fn item_to_json(item: &toml_edit::Item, key: &str) -> Result<Option<serde_json::Value>> {
    use serde_json::Value;
    let child = |k: &str| if key.is_empty() { k.to_string() } else { format!("{key}.{k}") };
    Ok(match item {
        toml_edit::Item::None => None,
        toml_edit::Item::Value(v) => Some(value_to_json(v, key)?),
        toml_edit::Item::Table(t) => {
            let mut map = serde_json::Map::new();
            for (k, v) in t.iter() {
                if let Some(j) = item_to_json(v, &child(k))? {
                    map.insert(k.to_string(), j);
                }
            }
            Some(Value::Object(map))
        }
        toml_edit::Item::ArrayOfTables(a) => Some(Value::Array(
            a.iter()
                .map(|t| Ok(item_to_json(&toml_edit::Item::Table(t.clone()), key)?.unwrap_or(Value::Null)))
                .collect::<Result<Vec<_>>>()?,
        )),
    })
}

fn value_to_json(v: &toml_edit::Value, key: &str) -> Result<serde_json::Value> {
    use serde_json::Value;
    let child = |k: &str| if key.is_empty() { k.to_string() } else { format!("{key}.{k}") };
    Ok(match v {
        toml_edit::Value::String(s) => Value::String(s.value().clone()),
        toml_edit::Value::Integer(i) => Value::from(*i.value()),
        toml_edit::Value::Float(f) => match serde_json::Number::from_f64(*f.value()) {
            Some(n) => Value::Number(n),
            None => bail!("{key} = {} is not a finite number\nhint: give {key} a finite value, or leave it out for the default", f.value()),
        },
        toml_edit::Value::Boolean(b) => Value::Bool(*b.value()),
        toml_edit::Value::Datetime(d) => Value::String(d.value().to_string()),
        toml_edit::Value::Array(a) => Value::Array(a.iter().map(|x| value_to_json(x, key)).collect::<Result<Vec<_>>>()?),
        toml_edit::Value::InlineTable(t) => {
            Value::Object(t.iter().map(|(k, x)| Ok((k.to_string(), value_to_json(x, &child(k))?))).collect::<Result<_>>()?)
        }
    })
}

/// The config file at `path` (`None`: no file, every key unset).
pub fn read_config(path: Option<&Path>) -> Result<FileConfig> {
    let Some(path) = path else { return Ok(FileConfig::default()) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}\nhint: check the path given to --config", path.display()))?;
    parse_config(&text, path)
}

/// The config file's text (`path` names it in errors).
pub fn parse_config(text: &str, path: &Path) -> Result<FileConfig> {
    let doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| anyhow!("config file {} is not valid TOML\n{e}\nhint: see https://toml.io for the syntax", path.display()))?;
    let mut json = toml_to_json(doc.as_item()).with_context(|| format!("in config file {}", path.display()))?.unwrap_or_default();
    // `loss_scale = 1024` is a fixed scale, as MindSpore's FixedLossScaleManager(1024).
    if let Some(n) = json.get("loss_scale").filter(|v| v.is_number()).map(|v| v.to_string()) {
        json["loss_scale"] = serde_json::Value::String(format!("fixed:{n}"));
    }
    serde_json::from_value(json.clone()).map_err(|e| {
        // serde names the type, not the key: the first key that fails alone is the one.
        let key = json.as_object().and_then(|o| {
            o.iter()
                .map(|(k, v)| (k, serde_json::json!({ k.as_str(): v })))
                .find(|(_, one)| serde_json::from_value::<FileConfig>(one.clone()).is_err())
        });
        let at = key.map(|(k, _)| format!(" key {k}:")).unwrap_or_default();
        anyhow!(
            "config file {}:{at} {e}\nhint: keys are the flags of `autopar train --help` with `_` for `-`, plus a [parallel] table",
            path.display()
        )
    })
}
