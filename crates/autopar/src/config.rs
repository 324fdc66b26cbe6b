//! The TOML config file of `autopar train` and `autopar plan`: the flags' names with `_` for
//! `-`, plus a `[parallel]` table of `set_auto_parallel_context` options. Unknown keys are
//! errors.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::Deserialize;

/// The TOML file: the flags' names with `_`, and a `[parallel]` table.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub model: Option<String>,
    pub data: Option<String>,
    pub epochs: Option<u64>,
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub micro_batches: Option<usize>,
    pub grad_accumulation: Option<usize>,
    pub seed: Option<u64>,
    pub shuffle: Option<bool>,
    pub synthetic_samples: Option<usize>,
    pub prefetch: Option<usize>,
    pub optimizer: Option<String>,
    pub lr: Option<f64>,
    pub schedule: Option<String>,
    pub warmup_steps: Option<u64>,
    pub min_lr: Option<f64>,
    pub momentum: Option<f64>,
    pub weight_decay: Option<f64>,
    pub clip_grad_norm: Option<f64>,
    pub width: Option<usize>,
    pub depth: Option<usize>,
    pub heads: Option<usize>,
    pub num_classes: Option<usize>,
    pub input_shape: Option<serde_json::Value>,
    pub stem: Option<String>,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: Option<u64>,
    pub keep_checkpoint_max: Option<usize>,
    pub checkpoint_prefix: Option<String>,
    pub init: Option<PathBuf>,
    pub init_strategy: Option<PathBuf>,
    pub resume: Option<PathBuf>,
    pub metrics: Option<PathBuf>,
    pub plot: Option<bool>,
    pub log_every: Option<u64>,
    pub eval: Option<bool>,
    pub eval_batch_size: Option<usize>,
    pub devices: Option<usize>,
    pub parallel_mode: Option<String>,
    pub strategy: Option<PathBuf>,
    pub parallel: Option<serde_json::Map<String, serde_json::Value>>,
}

pub fn toml_to_json(item: &toml_edit::Item) -> Option<serde_json::Value> {
    use serde_json::Value;
    match item {
        toml_edit::Item::None => None,
        toml_edit::Item::Value(v) => Some(value_to_json(v)),
        toml_edit::Item::Table(t) => Some(Value::Object(t.iter().filter_map(|(k, v)| Some((k.to_string(), toml_to_json(v)?))).collect())),
        toml_edit::Item::ArrayOfTables(a) => {
            Some(Value::Array(a.iter().map(|t| toml_to_json(&toml_edit::Item::Table(t.clone())).unwrap_or(Value::Null)).collect()))
        }
    }
}

fn value_to_json(v: &toml_edit::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        toml_edit::Value::String(s) => Value::String(s.value().clone()),
        toml_edit::Value::Integer(i) => Value::from(*i.value()),
        toml_edit::Value::Float(f) => serde_json::Number::from_f64(*f.value()).map_or(Value::Null, Value::Number),
        toml_edit::Value::Boolean(b) => Value::Bool(*b.value()),
        toml_edit::Value::Datetime(d) => Value::String(d.value().to_string()),
        toml_edit::Value::Array(a) => Value::Array(a.iter().map(value_to_json).collect()),
        toml_edit::Value::InlineTable(t) => Value::Object(t.iter().map(|(k, v)| (k.to_string(), value_to_json(v))).collect()),
    }
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
    let json = toml_to_json(doc.as_item()).unwrap_or_default();
    serde_json::from_value(json).map_err(|e| {
        anyhow!(
            "config file {}: {e}\nhint: keys are the flags of `autopar train --help` with `_` for `-`, plus a [parallel] table",
            path.display()
        )
    })
}
