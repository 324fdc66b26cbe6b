#![allow(dead_code)]

use std::path::PathBuf;

/// MindSpore fixtures: `$AUTOPAR_FIXTURES`, else `fixtures/mindspore` of this repository.
pub fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

pub fn strategies() -> PathBuf {
    fixtures().join("strategies")
}

pub fn transforms() -> PathBuf {
    fixtures().join("transforms")
}

use std::collections::BTreeMap;
use std::path::Path;

use autopar_checkpoint::{save, DType, LayoutItem, StrategyFile, StrategyItem, TensorSpec};
use autopar_layout::{scatter, Block, TensorLayout, TensorMap};

/// A small deterministic generator (xorshift64*), so failures print a reproducible seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One parameter of a synthetic network: a full tensor of u32 values (stored as `dtype` bytes).
#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub full: Block<u32>,
}

impl Param {
    pub fn new(name: &str, dtype: DType, shape: Vec<usize>, seed: u64) -> Self {
        let mut r = Rng(seed | 1);
        let full = Block::from_fn(shape.clone(), |_| r.next() as u32);
        Self { name: name.into(), dtype, shape, full }
    }
}

/// Layout of one parameter in a synthetic strategy (MindSpore conventions).
#[derive(Clone, Debug)]
pub struct PLayout {
    pub dev: Vec<usize>,
    pub map: TensorMap,
    /// 0 = not optimizer-sharded, -1 = whole replica group, k = groups of k
    pub opt: i32,
}

impl PLayout {
    pub fn layout(&self, shape: &[usize]) -> TensorLayout {
        TensorLayout::from_mindspore(&self.dev, &self.map, shape).unwrap()
    }
    pub fn opt_size(&self, l: &TensorLayout) -> usize {
        let replicas = l.mesh().num_devices() / l.num_slices();
        match self.opt {
            0 => 1,
            -1 => replicas,
            k => k as usize,
        }
    }
}

/// Element bytes of a u32 block as `dtype` (truncated or widened, little endian).
pub fn bytes_of(b: &Block<u32>, dtype: DType) -> Vec<u8> {
    let n = dtype.size();
    b.data().iter().flat_map(|&v| (v as u64 | ((v as u64) << 32)).to_le_bytes()[..n].to_vec()).collect()
}

/// Rank `rank`'s stored piece: model-parallel slice, then its optimizer shard of dim 0.
pub fn piece(p: &Param, l: &PLayout, rank: usize) -> Block<u32> {
    let layout = l.layout(&p.shape);
    let mp = scatter(&p.full, &layout).unwrap().swap_remove(rank);
    let opt = l.opt_size(&layout);
    if opt <= 1 {
        return mp;
    }
    let g = layout.replica_group(rank).unwrap();
    let idx = g.iter().position(|&r| r == rank).unwrap();
    mp.chunk(0, opt, idx % opt).unwrap()
}

/// MindSpore's optimizer-shard step: the product of the device axes right of the innermost
/// replicated axis.
pub fn opt_step(l: &PLayout) -> i32 {
    let nd = l.dev.len() as i64;
    let used: Vec<i64> = l.map.flattened().iter().filter(|&&v| v >= 0).map(|&v| nd - 1 - v).collect();
    let inner = (0..l.dev.len()).rev().find(|&i| l.dev[i] > 1 && !used.contains(&(i as i64)));
    inner.map_or(1, |i| l.dev[i + 1..].iter().product::<usize>() as i32)
}

pub fn strategy_file(layouts: &[(&Param, &PLayout, u32)]) -> StrategyFile {
    let mut s = StrategyFile { current_stage: 2, ..Default::default() };
    for (p, l, stage) in layouts {
        s.strategy_items.push(StrategyItem { node_name: format!("MatMul_{}", p.name), stage: *stage, parallel_strategy: vec![vec![1, 1]] });
        let per_dim = l.map.0.iter().any(|e| e.len() > 1);
        let tensor_map: Vec<Vec<i32>> = if per_dim {
            l.map.0.iter().map(|e| e.iter().map(|&v| v as i32).collect()).collect()
        } else {
            vec![l.map.flattened().iter().map(|&v| v as i32).collect()]
        };
        let name = if layouts.iter().any(|x| x.2 > 0) { format!("{stage}-{}", p.name) } else { p.name.clone() };
        s.layout_items.push(LayoutItem {
            opt_weight_shard_step: if l.opt == 0 { 0 } else { opt_step(l) },
            opt_weight_shard_size: l.opt,
            ..LayoutItem::new(name, l.dev.iter().map(|&d| d as u32).collect(), tensor_map)
        });
    }
    s
}

/// Write `dir/rank_<stage*N + r>/net_<k>.<ext>` for every rank, each holding its pieces of the
/// parameters of its stage, plus the `extra` tensors (copied to every rank).
pub fn write_ranks(dir: &Path, ext: &str, params: &[(&Param, &PLayout, u32)], extra: &[(TensorSpec, Vec<u8>)]) {
    let n: usize = params[0].1.dev.iter().product();
    let stages = params.iter().map(|p| p.2).max().unwrap() as usize + 1;
    for g in 0..n * stages {
        let (stage, r) = (g / n, g % n);
        let mut tensors: Vec<(TensorSpec, Vec<u8>)> = extra.to_vec();
        for (p, l, s) in params {
            if *s as usize == stage {
                let b = piece(p, l, r);
                tensors.push((TensorSpec { name: p.name.clone(), dtype: p.dtype, shape: b.shape().to_vec() }, bytes_of(&b, p.dtype)));
            }
        }
        save(&dir.join(format!("rank_{g}/net_{g}.{ext}")), &tensors, &BTreeMap::new()).unwrap();
    }
}
