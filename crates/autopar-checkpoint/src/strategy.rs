//! Strategy checkpoint files (MindSpore's `ParallelStrategyMap`, protobuf or JSON), group-info
//! files, the per-stage merge, and the per-parameter layout map every transform works from.
//!
//! [`StrategyFile`] keeps each field as the file holds it (message counts included), so reading
//! and writing a file gives the same content; [`StrategyFile::layout_map`] is MindSpore's
//! `_convert_to_list`: names, device matrices, tensor maps, optimizer shard and pipeline stages.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use autopar_layout::{TensorLayout, TensorMap};
use prost::Message;
use serde_json::{Map, Value};

use crate::error::{CheckpointError, Result};
use crate::io::AtomicFile;
use crate::proto::straspb as pb;

/// One operator's strategy: `"<PrimName>_<param>"`, its pipeline stage and per-input split counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategyItem {
    /// The operator's name, `"<PrimName>_<param>"`.
    pub node_name: String,
    /// The operator's pipeline stage.
    pub stage: u32,
    /// Split counts: one list per input, one count per input dimension.
    pub parallel_strategy: Vec<Vec<u32>>,
}

/// One parameter's layout as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutItem {
    /// Parameter name; `"<stage>-<name>"` in merged pipeline files.
    pub name: String,
    /// The device matrix (MindSpore's `dev_matrix`).
    pub dev_matrix: Vec<u32>,
    /// The `TensorMap` messages: one holding the whole map, or one per tensor dimension when a
    /// dimension is split over several device axes (`[[-1], [0, 1]]`).
    pub tensor_map: Vec<Vec<i32>>,
    /// The `ParamSplitShape` messages as stored (MindSpore's per-slice sizes of an unevenly split parameter; empty when not used).
    pub param_split_shape: Vec<Vec<i64>>,
    /// The `IndicesOffset` messages as stored (MindSpore's slice offsets that go with `param_split_shape`).
    pub indices_offset: Vec<Vec<i64>>,
    /// MindSpore's `field` value, as stored (0 when unused).
    pub field: i32,
    /// MindSpore's `opt_weight_shard_step`: the rank distance between members of an optimizer-shard group (0 = not sharded).
    pub opt_weight_shard_step: i32,
    /// 0 = not sharded, -1 = the whole replica group, k > 0 = groups of k.
    pub opt_weight_shard_size: i32,
    /// Full shape; only the JSON form stores it.
    pub tensor_shape: Option<Vec<usize>>,
}

impl LayoutItem {
    /// A parameter's layout with `dev_matrix` and `tensor_map` (MindSpore's nested form) and
    /// nothing else: no split shape or offsets, no optimizer shard, no recorded tensor shape.
    pub fn new(name: impl Into<String>, dev_matrix: Vec<u32>, tensor_map: Vec<Vec<i32>>) -> Self {
        LayoutItem {
            name: name.into(),
            dev_matrix,
            tensor_map,
            param_split_shape: vec![Vec::new()],
            indices_offset: vec![Vec::new()],
            field: 0,
            opt_weight_shard_step: 0,
            opt_weight_shard_size: 0,
            tensor_shape: None,
        }
    }

    /// The tensor map in autopar's [`TensorMap`] form (multi-axis entries kept).
    pub fn map(&self) -> TensorMap {
        if !self.per_dimension() {
            TensorMap::single(&self.tensor_map[0].iter().map(|&v| v as i64).collect::<Vec<_>>())
        } else {
            TensorMap(self.tensor_map.iter().filter(|m| !m.is_empty()).map(|m| m.iter().map(|&v| v as i64).collect()).collect())
        }
    }

    /// Whether the `TensorMap` messages are one per tensor dimension (some dimension split over
    /// several axes) rather than one holding the whole map: several messages, or one with more
    /// entries than a one-dimensional recorded shape has dimensions.
    pub fn per_dimension(&self) -> bool {
        let one_dim_tuple =
            self.tensor_shape.as_ref().is_some_and(|s| s.len() == 1) && self.tensor_map.first().is_some_and(|m| m.len() > 1);
        self.tensor_map.len() > 1 || one_dim_tuple
    }

    /// The device matrix, `[1]` for an empty one: MindSpore before 2.10 wrote a stage of one
    /// device (every axis of size 1 removed) as `[]`, which its readers take as one device.
    pub fn devices(&self) -> Vec<usize> {
        if self.dev_matrix.is_empty() {
            return vec![1];
        }
        self.dev_matrix.iter().map(|&d| d as usize).collect()
    }

    /// What is wrong with this layout on its own, in words (`None`: nothing): the device matrix
    /// (no empty axis, at most 4096 devices), the tensor map (values name axes of the matrix,
    /// no axis twice, as many entries as the recorded shape has dimensions, each split dividing
    /// its dimension unless the file records an uneven split) and the optimizer shard (MindSpore's
    /// values: a size of -1 or more, a step of 0 or more, a size only with a step, and a size that
    /// divides the parameter's replicas).
    pub fn problem(&self) -> Option<String> {
        let dev = self.devices();
        let mut map = self.map();
        let uneven = self.param_split_shape.iter().any(|p| !p.is_empty());
        let shape: Vec<usize> = match &self.tensor_shape {
            Some(shape) if !uneven => {
                if shape.len() == 1 && self.tensor_map.len() == 1 && map.len() > 1 {
                    map = TensorMap(vec![map.flattened()]);
                }
                shape.clone()
            }
            // Without a (usable) recorded shape: one that every split divides.
            _ => map
                .0
                .iter()
                .map(|entry| {
                    entry
                        .iter()
                        .filter(|&&v| v >= 0)
                        .map(|&v| dev.len().checked_sub(1 + v as usize).and_then(|a| dev.get(a)).copied().unwrap_or(1).max(1))
                        .fold(1usize, usize::saturating_mul)
                })
                .collect(),
        };
        let layout = match TensorLayout::from_mindspore(&dev, &map, &shape) {
            Ok(l) => l,
            Err(e) => return Some(format!("parameter {:?}: {e}", self.name)),
        };
        let (step, size) = (self.opt_weight_shard_step, self.opt_weight_shard_size);
        if step < 0 || size < -1 || (step == 0 && size > 0) {
            return Some(format!(
                "parameter {:?}: the optimizer shard (opt_weight_shard_step {step}, opt_weight_shard_size {size}) is not a MindSpore value\n  hint: MindSpore writes both 0 (not sharded), or a step above 0 with a size of -1 or more",
                self.name
            ));
        }
        let replicas = layout.mesh().num_devices() / layout.num_slices().max(1);
        if step > 0 && size > 1 && replicas % size as usize != 0 {
            return Some(format!(
                "parameter {:?}: an optimizer shard of {size} does not divide its {replicas} replicas (device matrix {dev:?}, tensor map {})",
                self.name, map
            ));
        }
        None
    }

    /// `(stage, name)` of a merged `"<stage>-<name>"` entry.
    pub fn split_stage(&self) -> Option<(u32, &str)> {
        let (s, rest) = self.name.split_once('-')?;
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((s.parse().ok()?, rest))
    }
}

/// A strategy checkpoint file.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StrategyFile {
    /// MindSpore 2.10 writes 2 in fresh files and 1 in merged ones; readers ignore it.
    pub current_stage: u32,
    /// Operator strategies, in file order.
    pub strategy_items: Vec<StrategyItem>,
    /// Parameter layouts, in file order.
    pub layout_items: Vec<LayoutItem>,
}

fn is_json(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()) == Some("json")
}

impl StrategyFile {
    /// The file as decoded, if it holds something and every layout is valid on its own
    /// ([`LayoutItem::problem`]) and spans as many devices as the others of its pipeline stage.
    /// Every reader goes through this, so `ckpt rank-list`, `ckpt redundancy`, transforms and
    /// training refuse the same files.
    fn checked(self, path: &Path) -> Result<Self> {
        if self.strategy_items.is_empty() && self.layout_items.is_empty() {
            return Err(CheckpointError::EmptyStrategy { path: path.to_path_buf(), missing: "strategy items and no layout items" });
        }
        let invalid = |reason: String| CheckpointError::InvalidStrategy { path: path.to_path_buf(), reason };
        let mut spans: BTreeMap<u32, (&str, usize)> = BTreeMap::new();
        for l in &self.layout_items {
            if let Some(reason) = l.problem() {
                return Err(invalid(reason));
            }
            let stage = l.split_stage().map_or(0, |(s, _)| s);
            let devices: usize = l.devices().iter().product();
            match spans.get(&stage) {
                Some(&(first, n)) if n != devices => {
                    return Err(invalid(format!(
                        "parameter {:?} spans {devices} devices (device matrix {:?}), but {first:?} spans {n}: the layouts of one pipeline stage span its devices",
                        l.name, l.dev_matrix
                    )))
                }
                Some(_) => {}
                None => {
                    spans.insert(stage, (l.name.as_str(), devices));
                }
            }
        }
        Ok(self)
    }

    /// Read a strategy file: `.json` is the JSON variant, anything else protobuf.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Err(CheckpointError::IsADirectory { path: path.to_path_buf(), what: "strategy" });
        }
        let bytes = fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::NotFound { what: "strategy file", path: path.to_path_buf() },
            _ => CheckpointError::Io { op: "read", path: path.to_path_buf(), source: e },
        })?;
        if is_json(path) {
            Self::from_json(path, &bytes)
        } else {
            Self::from_protobuf(path, &bytes)
        }
    }

    /// Write atomically; the extension picks the form as in [`Self::load`].
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = if is_json(path) { self.to_json().into_bytes() } else { self.to_protobuf() };
        let mut f = AtomicFile::create(path)?;
        f.write_all(&bytes)?;
        Ok(f.commit()?)
    }

    /// Decodes the protobuf form; `path` is for error messages.
    pub fn from_protobuf(path: &Path, bytes: &[u8]) -> Result<Self> {
        let m = pb::ParallelStrategyMap::decode(bytes).map_err(|e| CheckpointError::Decode {
            what: "strategy file",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let invalid = |reason: String| CheckpointError::InvalidStrategy { path: path.to_path_buf(), reason };
        let strategy_items = m
            .parallel_strategy_item
            .into_iter()
            .map(|s| StrategyItem {
                node_name: s.node_name,
                stage: s.parallel_strategys.stage,
                parallel_strategy: s.parallel_strategys.parallel_strategy.into_iter().map(|p| p.dim).collect(),
            })
            .collect();
        let mut layout_items = Vec::new();
        for l in m.parallel_layout_item {
            let pl = l.parallel_layouts;
            if pl.dev_matrix.len() != 1 {
                return Err(invalid(format!("parameter {:?} has {} dev_matrix entries, expected 1", l.param_name, pl.dev_matrix.len())));
            }
            if pl.tensor_map.is_empty() {
                return Err(invalid(format!("parameter {:?} has no tensor_map", l.param_name)));
            }
            layout_items.push(LayoutItem {
                name: l.param_name,
                dev_matrix: pl.dev_matrix.into_iter().next().map(|d| d.dim).unwrap_or_default(),
                tensor_map: pl.tensor_map.into_iter().map(|t| t.dim).collect(),
                param_split_shape: pl.param_split_shape.into_iter().map(|p| p.dim).collect(),
                indices_offset: pl.indices_offset.into_iter().map(|p| p.dim).collect(),
                field: pl.field,
                opt_weight_shard_step: pl.opt_weight_shard_step,
                opt_weight_shard_size: pl.opt_weight_shard_size,
                tensor_shape: None,
            });
        }
        Self { current_stage: m.current_stage, strategy_items, layout_items }.checked(path)
    }

    /// Encodes the protobuf form (`ParallelStrategyMap`).
    pub fn to_protobuf(&self) -> Vec<u8> {
        let m = pb::ParallelStrategyMap {
            current_stage: self.current_stage,
            parallel_strategy_item: self
                .strategy_items
                .iter()
                .map(|s| pb::ParallelStrategyItem {
                    node_name: s.node_name.clone(),
                    parallel_strategys: pb::ParallelStrategys {
                        stage: s.stage,
                        parallel_strategy: s.parallel_strategy.iter().map(|d| pb::ParallelStrategy { dim: d.clone() }).collect(),
                    },
                })
                .collect(),
            parallel_layout_item: self
                .layout_items
                .iter()
                .map(|l| pb::ParallelLayoutItem {
                    param_name: l.name.clone(),
                    parallel_layouts: pb::ParallelLayouts {
                        dev_matrix: vec![pb::DevMatrix { dim: l.dev_matrix.clone() }],
                        tensor_map: l.tensor_map.iter().map(|d| pb::TensorMap { dim: d.clone() }).collect(),
                        param_split_shape: l.param_split_shape.iter().map(|d| pb::ParamSplitShape { dim: d.clone() }).collect(),
                        indices_offset: l.indices_offset.iter().map(|d| pb::IndicesOffset { dim: d.clone() }).collect(),
                        field: l.field,
                        opt_weight_shard_step: l.opt_weight_shard_step,
                        opt_weight_shard_size: l.opt_weight_shard_size,
                    },
                })
                .collect(),
        };
        m.encode_to_vec()
    }

    /// Decodes the JSON form; `path` is for error messages.
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Self> {
        let invalid = |reason: String| CheckpointError::InvalidStrategy { path: path.to_path_buf(), reason };
        let v: Value = serde_json::from_slice(bytes).map_err(|e| CheckpointError::Decode {
            what: "strategy file",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let obj = v.as_object().ok_or_else(|| invalid("the top level is not a JSON object".into()))?;
        let current_stage = match obj.get("current_stage") {
            None => 0,
            Some(v) => v.as_u64().ok_or_else(|| invalid("current_stage is not a non-negative integer".into()))? as u32,
        };
        let ints = |v: &Value, what: &str| -> Result<Vec<i64>> {
            v.as_array()
                .ok_or_else(|| invalid(format!("{what} is not a list")))?
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| invalid(format!("{what} holds a non-integer {x}"))))
                .collect()
        };
        let u32s = |v: &Value, what: &str| -> Result<Vec<u32>> {
            ints(v, what)?.into_iter().map(|x| u32::try_from(x).map_err(|_| invalid(format!("{what} holds {x}")))).collect()
        };
        let i32s = |v: &Value, what: &str| -> Result<Vec<i32>> {
            ints(v, what)?.into_iter().map(|x| i32::try_from(x).map_err(|_| invalid(format!("{what} holds {x}")))).collect()
        };
        let mut strategy_items = Vec::new();
        if let Some(items) = obj.get("parallel_strategy_item") {
            let items = items.as_object().ok_or_else(|| invalid("parallel_strategy_item is not an object".into()))?;
            for (name, it) in items {
                let stage = it.get("stage").and_then(Value::as_u64).ok_or_else(|| invalid(format!("{name}: no stage")))? as u32;
                let ps = it
                    .get("parallel_strategy")
                    .and_then(Value::as_array)
                    .ok_or_else(|| invalid(format!("{name}: no parallel_strategy")))?;
                let parallel_strategy = ps.iter().map(|d| u32s(d, name)).collect::<Result<Vec<_>>>()?;
                strategy_items.push(StrategyItem { node_name: name.clone(), stage, parallel_strategy });
            }
        }
        let mut layout_items = Vec::new();
        if let Some(items) = obj.get("parallel_layout_item") {
            let items = items.as_object().ok_or_else(|| invalid("parallel_layout_item is not an object".into()))?;
            for (name, it) in items {
                let get = |k: &str| it.get(k).ok_or_else(|| invalid(format!("parameter {name:?}: no {k}")));
                let int = |k: &str| -> Result<i32> {
                    match it.get(k) {
                        None => Ok(0),
                        Some(v) => v
                            .as_i64()
                            .and_then(|x| i32::try_from(x).ok())
                            .ok_or_else(|| invalid(format!("parameter {name:?}: {k} is not an integer"))),
                    }
                };
                let tm = get("tensor_map")?.as_array().ok_or_else(|| invalid(format!("parameter {name:?}: tensor_map is not a list")))?;
                let tensor_map = if tm.iter().any(Value::is_array) {
                    tm.iter().map(|d| i32s(d, "tensor_map")).collect::<Result<Vec<_>>>()?
                } else {
                    vec![i32s(get("tensor_map")?, "tensor_map")?]
                };
                let opt_list = |k: &str| -> Result<Vec<Vec<i64>>> {
                    match it.get(k) {
                        None => Ok(vec![Vec::new()]),
                        Some(v) => Ok(vec![ints(v, k)?]),
                    }
                };
                let tensor_shape = match it.get("tensor_shape") {
                    None => None,
                    Some(v) => Some(
                        ints(v, "tensor_shape")?
                            .into_iter()
                            .map(|x| usize::try_from(x).map_err(|_| invalid(format!("parameter {name:?}: tensor_shape holds {x}"))))
                            .collect::<Result<Vec<_>>>()?,
                    ),
                };
                layout_items.push(LayoutItem {
                    name: name.clone(),
                    dev_matrix: u32s(get("dev_matrix")?, "dev_matrix")?,
                    tensor_map,
                    param_split_shape: opt_list("param_split_shape")?,
                    indices_offset: opt_list("indices_offset")?,
                    field: int("field")?,
                    opt_weight_shard_step: int("opt_weight_shard_step")?,
                    opt_weight_shard_size: int("opt_weight_shard_size")?,
                    tensor_shape,
                });
            }
        }
        Self { current_stage, strategy_items, layout_items }.checked(path)
    }

    /// The JSON form as MindSpore writes it: compact, keys sorted.
    pub fn to_json(&self) -> String {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|&x| Value::from(x)).collect());
        let mut strategies: Vec<&StrategyItem> = self.strategy_items.iter().collect();
        strategies.sort_by(|a, b| a.node_name.cmp(&b.node_name));
        let mut layouts: Vec<&LayoutItem> = self.layout_items.iter().collect();
        layouts.sort_by(|a, b| a.name.cmp(&b.name));
        // Every map is filled in sorted key order, so the output is sorted with or without
        // serde_json's `preserve_order`.
        let mut lmap = Map::new();
        for l in layouts {
            let mut o = Map::new();
            o.insert("dev_matrix".into(), ints(&l.dev_matrix.iter().map(|&x| x as i64).collect::<Vec<_>>()));
            o.insert("field".into(), Value::from(l.field));
            if let Some(p) = l.indices_offset.first().filter(|p| !p.is_empty()) {
                o.insert("indices_offset".into(), ints(p));
            }
            o.insert("opt_weight_shard_size".into(), Value::from(l.opt_weight_shard_size));
            o.insert("opt_weight_shard_step".into(), Value::from(l.opt_weight_shard_step));
            if let Some(p) = l.param_split_shape.first().filter(|p| !p.is_empty()) {
                o.insert("param_split_shape".into(), ints(p));
            }
            let tm = if l.tensor_map.len() == 1 {
                ints(&l.tensor_map[0].iter().map(|&x| x as i64).collect::<Vec<_>>())
            } else {
                Value::Array(l.tensor_map.iter().map(|m| ints(&m.iter().map(|&x| x as i64).collect::<Vec<_>>())).collect())
            };
            o.insert("tensor_map".into(), tm);
            if let Some(s) = &l.tensor_shape {
                o.insert("tensor_shape".into(), ints(&s.iter().map(|&x| x as i64).collect::<Vec<_>>()));
            }
            lmap.insert(l.name.clone(), Value::Object(o));
        }
        let mut smap = Map::new();
        for s in strategies {
            let mut o = Map::new();
            o.insert(
                "parallel_strategy".into(),
                Value::Array(s.parallel_strategy.iter().map(|d| ints(&d.iter().map(|&x| x as i64).collect::<Vec<_>>())).collect()),
            );
            o.insert("stage".into(), Value::from(s.stage));
            smap.insert(s.node_name.clone(), Value::Object(o));
        }
        let mut top = Map::new();
        top.insert("current_stage".into(), Value::from(self.current_stage));
        top.insert("parallel_layout_item".into(), Value::Object(lmap));
        top.insert("parallel_strategy_item".into(), Value::Object(smap));
        serde_json::to_string(&Value::Object(top)).unwrap_or_default()
    }

    /// The pipeline stage this (per-stage) file describes: the stage of its first strategy item.
    pub fn stage(&self) -> Option<u32> {
        self.strategy_items.first().map(|s| s.stage)
    }

    /// Per-parameter layouts, as MindSpore's `_convert_to_list` without a rank: a name seen in
    /// several stages (`"0-w"`, `"1-w"`) keeps the lowest stage's layout and lists every stage.
    pub fn layout_map(&self) -> Result<LayoutMap> {
        let mut params: BTreeMap<String, ParamLayout> = BTreeMap::new();
        let mut per_stage: BTreeMap<(String, u32), ParamLayout> = BTreeMap::new();
        for l in &self.layout_items {
            let (stage, name) = l.split_stage().unwrap_or((0, l.name.as_str()));
            let dev = l.devices();
            let p = ParamLayout {
                dev_matrix: dev,
                tensor_map: l.map(),
                field: l.field,
                opt_shard_step: l.opt_weight_shard_step as i64,
                opt_shard_size: l.opt_weight_shard_size as i64,
                stages: vec![stage],
                tensor_shape: l.tensor_shape.clone(),
                single_message: l.tensor_map.len() == 1,
            };
            per_stage.insert((name.to_string(), stage), p.clone());
            match params.get_mut(name) {
                None => {
                    params.insert(name.to_string(), p);
                }
                Some(old) => {
                    let mut stages = old.stages.clone();
                    if !stages.contains(&stage) {
                        stages.push(stage);
                    }
                    if stage <= *old.stages.iter().min().unwrap_or(&u32::MAX) {
                        *old = p;
                    }
                    old.stages = stages;
                }
            }
        }
        Ok(LayoutMap { params, per_stage })
    }
}

/// One parameter's layout in memory (MindSpore's 7-list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamLayout {
    /// The device matrix (MindSpore's `dev_matrix`).
    pub dev_matrix: Vec<usize>,
    /// The tensor map.
    pub tensor_map: TensorMap,
    /// MindSpore's `field` value, as stored (0 when unused).
    pub field: i32,
    /// MindSpore's `opt_weight_shard_step`: the rank distance between members of an optimizer-shard group (0 = not sharded).
    pub opt_shard_step: i64,
    /// MindSpore's `opt_weight_shard_size`: 0 = not sharded, -1 = the whole replica group, k > 0 = groups of k.
    pub opt_shard_size: i64,
    /// Pipeline stages holding the parameter (the first is the one whose layout this is).
    pub stages: Vec<u32>,
    /// Full shape, when the strategy file records it (only the JSON form does).
    pub tensor_shape: Option<Vec<usize>>,
    /// The file held the whole tensor map in one message. For a 1-d tensor whose only
    /// dimension is split over several axes that is ambiguous (`[0, 1]`); see [`Self::for_ndim`].
    pub single_message: bool,
}

impl ParamLayout {
    /// The layout for a tensor of `ndim` dimensions: a one-message map of several values on a
    /// 1-d tensor is that dimension's multi-axis entry.
    pub fn for_ndim(&self, ndim: usize) -> ParamLayout {
        let mut p = self.clone();
        if ndim == 1 && self.single_message && self.tensor_map.len() > 1 {
            p.tensor_map = TensorMap(vec![self.tensor_map.flattened()]);
        }
        p
    }

    /// The tensor's dimension count, when the map tells it without doubt.
    pub fn known_ndim(&self) -> Option<usize> {
        if let Some(s) = &self.tensor_shape {
            return Some(s.len());
        }
        if !self.single_message || self.tensor_map.len() <= 1 || self.tensor_map.0.iter().any(|e| e.len() > 1) {
            return Some(self.tensor_map.len());
        }
        None
    }

    /// A parameter on one device, not split (MindSpore's layout for a missing strategy file).
    pub fn unsharded(ndim: usize) -> Self {
        Self {
            dev_matrix: vec![1],
            tensor_map: TensorMap::single(&vec![-1; ndim]),
            field: 0,
            opt_shard_step: 0,
            opt_shard_size: 0,
            stages: vec![0],
            tensor_shape: None,
            single_message: true,
        }
    }

    /// Devices the layout spans: the product of the device matrix.
    pub fn device_num(&self) -> usize {
        self.dev_matrix.iter().product()
    }

    /// The layout as autopar's `TensorLayout` for a tensor of `full_shape`; fails when they do not fit together.
    pub fn tensor_layout(&self, full_shape: &[usize]) -> autopar_layout::Result<TensorLayout> {
        TensorLayout::from_mindspore(&self.dev_matrix, &self.tensor_map, full_shape)
    }

    /// Ranks per optimizer-shard group: 1 when not sharded, the whole replica group for -1
    /// (MindSpore's `_extract_layout_item`), else the stored size.
    pub fn opt_group_size(&self, layout: &TensorLayout) -> usize {
        if self.opt_shard_step == 0 || self.opt_shard_size == 0 {
            return 1;
        }
        if self.opt_shard_size < 0 {
            layout.mesh().num_devices() / layout.num_slices()
        } else {
            self.opt_shard_size as usize
        }
    }
}

/// Names of per-parameter state: the prefix, then the parameter's name. MindSpore's Momentum
/// (`moments.`), Adam's first and second moments and gradient accumulation; autopar's
/// optimizers name their state the same way.
pub const MOMENTS: &str = "moments.";
/// Prefix of Adam's first-moment state.
pub const ADAM_M: &str = "adam_m.";
/// Prefix of Adam's second-moment state.
pub const ADAM_V: &str = "adam_v.";
/// Prefix of gradient-accumulation state.
pub const ACCU_GRADS: &str = "accu_grads.";
/// Every per-parameter state prefix.
pub const STATE_PREFIXES: [&str; 4] = [MOMENTS, ADAM_M, ADAM_V, ACCU_GRADS];

/// The parameter a state tensor belongs to (`moments.fc1.weight` -> `fc1.weight`).
pub fn state_parameter(name: &str) -> Option<&str> {
    STATE_PREFIXES.iter().find_map(|p| name.strip_prefix(p)).filter(|x| !x.is_empty())
}

/// Name -> layout for one strategy file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LayoutMap {
    /// Parameter name -> layout (for a parameter in several stages, the lowest stage's layout).
    pub params: BTreeMap<String, ParamLayout>,
    per_stage: BTreeMap<(String, u32), ParamLayout>,
}

impl LayoutMap {
    /// Devices per pipeline stage: the device-matrix product (the same for every parameter).
    pub fn stage_device_num(&self) -> usize {
        self.params.values().next().map(ParamLayout::device_num).unwrap_or(1)
    }

    /// Distinct pipeline stages named by the parameters.
    pub fn stages(&self) -> Vec<u32> {
        let mut s: Vec<u32> = self.params.values().flat_map(|p| p.stages.iter().copied()).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// The layout of `name`, or for optimizer and accumulation state the strategy does not list
    /// (`moments.X`, `adam_m.X`, `adam_v.X`, `accu_grads.X`) the layout of its parameter `X`:
    /// the state is split exactly as its parameter.
    pub fn layout_of(&self, name: &str) -> Option<&ParamLayout> {
        self.params.get(name).or_else(|| state_parameter(name).and_then(|x| self.params.get(x)))
    }

    /// [`Self::layout_of`] as pipeline stage `stage` holds it.
    pub fn layout_of_in_stage(&self, name: &str, stage: u32) -> Option<&ParamLayout> {
        match self.params.contains_key(name) {
            true => self.in_stage(name, stage),
            false => state_parameter(name).and_then(|x| self.in_stage(x, stage)),
        }
    }

    /// The layout of `name` as pipeline stage `stage` holds it.
    pub fn in_stage(&self, name: &str, stage: u32) -> Option<&ParamLayout> {
        let p = self.params.get(name)?;
        if !p.stages.contains(&stage) {
            return None;
        }
        self.per_stage.get(&(name.to_string(), stage)).or(Some(p))
    }
}

/// A group-info file: every communication group a rank created, and its restore rank list.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupInfo {
    /// Communication groups: name and member ranks.
    pub groups: Vec<(String, Vec<u32>)>,
    /// MindSpore's `ckpt_restore_rank_list`: the ranks whose checkpoints restore this rank.
    pub restore_rank_list: Vec<u32>,
}

impl GroupInfo {
    /// Reads a group-info file (protobuf `ParallelGroupMap`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::NotFound { what: "group-info file", path: path.to_path_buf() },
            _ => CheckpointError::Io { op: "read", path: path.to_path_buf(), source: e },
        })?;
        let m = pb::ParallelGroupMap::decode(bytes.as_slice()).map_err(|e| CheckpointError::Decode {
            what: "group-info file",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            groups: m.parallel_group_item.into_iter().map(|g| (g.group_name, g.parallel_group_ranks.dim)).collect(),
            restore_rank_list: m.ckpt_restore_rank_list.dim,
        })
    }

    /// Encodes the protobuf form (`ParallelGroupMap`).
    pub fn to_protobuf(&self) -> Vec<u8> {
        pb::ParallelGroupMap {
            parallel_group_item: self
                .groups
                .iter()
                .map(|(n, r)| pb::ParallelGroupItem {
                    group_name: n.clone(),
                    parallel_group_ranks: pb::ParallelGroupRanks { dim: r.clone() },
                })
                .collect(),
            ckpt_restore_rank_list: pb::ParallelGroupRanks { dim: self.restore_rank_list.clone() },
        }
        .encode_to_vec()
    }

    /// Writes the protobuf form atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let mut f = AtomicFile::create(path.as_ref())?;
        f.write_all(&self.to_protobuf())?;
        Ok(f.commit()?)
    }
}

/// MindSpore's `merge_pipeline_strategys`: the per-stage strategy files of `src_dir` (all `.ckpt`
/// or all `.json`) into one file whose layout names are `"<stage>-<name>"`. Byte-identical
/// duplicates and further files of an already merged stage are skipped. Returns the stages merged.
pub fn merge_strategies(src_dir: &Path, dst_file: &Path) -> Result<Vec<u32>> {
    if !src_dir.is_dir() {
        return Err(CheckpointError::NotADirectory { path: src_dir.to_path_buf(), what: "per-stage strategy files" });
    }
    let mut pbs: Vec<PathBuf> = Vec::new();
    let mut jsons: Vec<PathBuf> = Vec::new();
    for e in fs::read_dir(src_dir).map_err(CheckpointError::io("list", src_dir))? {
        let p = e.map_err(CheckpointError::io("list", src_dir))?.path();
        if !p.is_file() {
            continue;
        }
        match p.extension().and_then(|e| e.to_str()) {
            Some("ckpt") => pbs.push(p),
            Some("json") => jsons.push(p),
            _ => {}
        }
    }
    if !pbs.is_empty() && !jsons.is_empty() {
        return Err(CheckpointError::MixedStrategyFormats { dir: src_dir.to_path_buf() });
    }
    let mut files = if pbs.is_empty() { jsons } else { pbs };
    if files.is_empty() {
        return Err(CheckpointError::NoStrategyFiles { dir: src_dir.to_path_buf() });
    }
    files.sort();
    let mut loaded: Vec<(Vec<u8>, StrategyFile, PathBuf)> = Vec::new();
    for f in files {
        let bytes = fs::read(&f).map_err(CheckpointError::io("read", &f))?;
        if loaded.iter().any(|(b, _, _)| *b == bytes) {
            continue;
        }
        let s = if is_json(&f) { StrategyFile::from_json(&f, &bytes)? } else { StrategyFile::from_protobuf(&f, &bytes)? };
        if s.strategy_items.is_empty() {
            return Err(CheckpointError::EmptyStrategy { path: f, missing: "strategy items" });
        }
        if s.layout_items.is_empty() {
            return Err(CheckpointError::EmptyStrategy { path: f, missing: "layout items" });
        }
        loaded.push((bytes, s, f));
    }
    loaded.sort_by_key(|(_, s, p)| (s.stage().unwrap_or(0), p.clone()));
    let (merged, stages) = merge_stage_files(loaded.into_iter().map(|(_, s, _)| (s.stage().unwrap_or(0), s)));
    merged.save(dst_file)?;
    Ok(stages)
}

/// The merged file of per-stage strategy files given with their stages: every layout item
/// renamed `"<stage>-<name>"`, `current_stage` 1; a stage seen again is skipped. Returns it and
/// the stages merged, in the order given.
pub fn merge_stage_files(files: impl IntoIterator<Item = (u32, StrategyFile)>) -> (StrategyFile, Vec<u32>) {
    let mut merged = StrategyFile { current_stage: 1, ..Default::default() };
    let mut stages = Vec::new();
    for (stage, s) in files {
        if stages.contains(&stage) {
            continue;
        }
        stages.push(stage);
        merged.strategy_items.extend(s.strategy_items);
        merged.layout_items.extend(s.layout_items.into_iter().map(|mut l| {
            l.name = format!("{stage}-{}", l.name);
            l
        }));
    }
    (merged, stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(name: &str, map: Vec<Vec<i32>>) -> LayoutItem {
        LayoutItem::new(name, vec![2, 2], map)
    }

    #[test]
    fn a_one_dimensional_tensor_split_along_two_axes_reads_as_one_dimension_when_its_shape_is_known() {
        let mut l = item("b", vec![vec![1, 0]]);
        assert_eq!(l.map().0.len(), 2, "without a shape: the whole map, two dimensions");
        l.tensor_shape = Some(vec![8]);
        assert!(l.per_dimension());
        assert_eq!(l.map().0, vec![vec![1, 0]]);
        l.tensor_shape = Some(vec![8, 4]);
        assert_eq!(l.map().0.len(), 2);
    }

    #[test]
    fn merged_names_split_into_stage_and_name_and_the_lowest_stage_wins() {
        assert_eq!(item("1-l2.w", vec![vec![0]]).split_stage(), Some((1, "l2.w")));
        assert_eq!(item("l2.w", vec![vec![0]]).split_stage(), None);
        assert_eq!(item("x-1.w", vec![vec![0]]).split_stage(), None);
        let s = StrategyFile {
            current_stage: 1,
            strategy_items: vec![],
            layout_items: vec![item("1-emb", vec![vec![1, -1]]), item("0-emb", vec![vec![0, -1]])],
        };
        let m = s.layout_map().unwrap();
        assert_eq!(m.params["emb"].stages, vec![1, 0]);
        assert_eq!(m.params["emb"].tensor_map, TensorMap::single(&[0, -1]));
        assert_eq!(m.in_stage("emb", 1).unwrap().tensor_map, TensorMap::single(&[1, -1]));
    }

    #[test]
    fn one_message_per_dimension_keeps_multi_axis_entries() {
        let p = item("w", vec![vec![-1], vec![0, 1]]);
        assert_eq!(p.map(), TensorMap(vec![vec![-1], vec![0, 1]]));
        // a 1-d tensor split over two axes is written as one message: ambiguous until the
        // tensor's dimension count is known
        let s = StrategyFile { current_stage: 2, strategy_items: vec![], layout_items: vec![item("b", vec![vec![0, 1]])] };
        let l = s.layout_map().unwrap().params["b"].clone();
        assert_eq!(l.known_ndim(), None);
        assert_eq!(l.for_ndim(1).tensor_map, TensorMap(vec![vec![0, 1]]));
        assert_eq!(l.for_ndim(2).tensor_map, TensorMap::single(&[0, 1]));
    }
}
