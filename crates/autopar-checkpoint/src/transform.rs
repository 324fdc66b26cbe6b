//! Checkpoint transformation between strategies (MindSpore's `checkpoint_transform`).
//!
//! MindSpore simulates the redistribution operators (`AllConcat`, `StridedSlice`, `Reshape`) on
//! whole numpy copies of every needed source file. autopar computes the same result directly:
//! every stored piece (a rank's model-parallel slice, then its optimizer shard of dim 0) is a box
//! of the full tensor, so a destination piece is filled by copying its intersection with each
//! source box straight from the memory-mapped source file into the destination buffer. Only one
//! destination tensor per job is ever in memory, and source bytes nobody needs are never read.
//!
//! Which replica a piece is read from: one whose file was given (any set that covers the piece
//! works: MindSpore's rank list, autopar's smaller one, or a mix), then the one whose device
//! coordinates agree most with the destination rank (taken modulo the source device count, as
//! MindSpore pairs ranks when device counts differ), ties to the lowest rank.
//! [`TransformPlanner::rank_list`] is MindSpore's list, computed as MindSpore does
//! ([`crate::rank_list`]); [`TransformPlanner::minimal_rank_list`] names only the files whose
//! bytes are read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use autopar_layout::TensorLayout;

use crate::checkpoint::{collect_rank_files, CheckpointFile, CheckpointWriter, Format, OpenOptions, TensorSpec};
use crate::error::{CheckpointError, Misuse, Result};
use crate::io::{intersect, AtomicFile};
use crate::strategy::{state_parameter, LayoutMap, ParamLayout, StrategyFile};

/// Options of [`transform_checkpoints`] and [`transform_checkpoint_by_rank`].
#[derive(Clone, Debug)]
pub struct TransformOptions {
    /// Output format of [`transform_checkpoints`] (`transform_checkpoint_by_rank` takes it from the file name).
    pub format: Format,
    /// Output files are `<dst>/rank_<r>/<prefix><r>.<format>`.
    pub prefix: String,
    /// Destination files written at the same time.
    pub jobs: usize,
    /// Refuse tensors that are in one strategy but not the other, instead of copying them
    /// unchanged from the paired source rank as MindSpore does (they are listed either way).
    pub strict: bool,
    /// Show a progress bar on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
    /// Append MindSpore's CRC trailer to `.ckpt` outputs.
    pub crc: bool,
    /// Verify CRCs of the source files that have one.
    pub verify_crc: bool,
}

impl Default for TransformOptions {
    fn default() -> Self {
        Self { format: Format::Ckpt, prefix: "checkpoint_".into(), jobs: 1, strict: false, progress: false, crc: false, verify_crc: true }
    }
}

/// What a transform did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransformReport {
    /// The checkpoint files written.
    pub files: Vec<PathBuf>,
    /// Bytes written, all files together.
    pub bytes_written: u64,
    /// Tensors in one strategy but not the other: copied unchanged from the paired source rank,
    /// as MindSpore does (an error under `strict`).
    pub one_strategy: Vec<String>,
    /// Tensors in the strategies that no needed source file holds.
    pub absent: Vec<String>,
    /// Tensors in neither strategy, copied unchanged (`global_step`, `learning_rate`, ...).
    pub copied: Vec<String>,
    /// Set when the source strategy was taken as this one pipeline stage of the destination's
    /// network (outputs named `<prefix><r>_part<stage>`).
    pub per_stage: Option<u32>,
}

/// The source and destination strategies of a transform (`None` = one device, unsplit).
#[derive(Clone, Debug)]
pub struct TransformPlanner {
    src: Option<LayoutMap>,
    dst: Option<LayoutMap>,
    src_stage_devs: usize,
    dst_stage_devs: usize,
    dst_stages: usize,
    one_strategy: Vec<String>,
    /// MindSpore's per-stage transform: the source strategy describes one pipeline stage
    /// (this one) of a network the destination holds whole.
    by_stage: Option<u32>,
    /// The files as read, for MindSpore's rank lists (which depend on their entry order).
    src_file: Option<StrategyFile>,
    dst_file: Option<StrategyFile>,
}

/// A strategy file, its layout map and the stage of its first operator strategy.
fn load_map(path: Option<&Path>) -> Result<Option<(LayoutMap, Option<u32>, StrategyFile)>> {
    let Some(p) = path else { return Ok(None) };
    let s = StrategyFile::load(p)?;
    if s.layout_items.is_empty() {
        return Err(CheckpointError::EmptyStrategy { path: p.to_path_buf(), missing: "layout items" });
    }
    let m = s.layout_map()?;
    let devs = m.stage_device_num();
    if let Some((name, p2)) = m.params.iter().find(|(_, l)| l.device_num() != devs) {
        return Err(CheckpointError::InvalidStrategy {
            path: p.to_path_buf(),
            reason: format!("parameter {name:?} has device matrix {:?}, others span {devs} devices", p2.dev_matrix),
        });
    }
    let stages = m.stages();
    if stages.iter().enumerate().any(|(i, &s)| s as usize != i) {
        return Err(CheckpointError::MissingStages { path: p.to_path_buf(), count: stages.len(), stages });
    }
    let stage = s.stage();
    Ok(Some((m, stage, s)))
}

/// A layout with its optimizer shard: each rank's piece is its model-parallel slice, with dim 0
/// cut into `opt` parts across contiguous chunks of its (sorted) replica group.
pub(crate) struct Side {
    pub(crate) layout: TensorLayout,
    pub(crate) opt: usize,
}

impl Side {
    pub(crate) fn new(p: &ParamLayout, shape: &[usize], tensor: &str, which: &'static str) -> Result<Self> {
        let layout = p.tensor_layout(shape).map_err(|source| CheckpointError::Layout { tensor: tensor.to_string(), which, source })?;
        let opt = p.opt_group_size(&layout);
        if opt > 1 {
            let replicas = layout.mesh().num_devices() / layout.num_slices();
            if replicas % opt != 0 {
                return Err(CheckpointError::NotDivisible {
                    tensor: tensor.to_string(),
                    dim: 0,
                    size: replicas,
                    split: opt,
                    what: "replica group into optimizer shard groups",
                });
            }
            let rows = layout.slice_shape().first().copied().unwrap_or(1);
            if shape.is_empty() || rows % opt != 0 {
                return Err(CheckpointError::NotDivisible {
                    tensor: tensor.to_string(),
                    dim: 0,
                    size: rows,
                    split: opt,
                    what: "optimizer shard of the slice rows",
                });
            }
        }
        Ok(Self { layout, opt })
    }

    /// A shape-independent stand-in, for rank lists (MindSpore's "fake shape").
    pub(crate) fn fake(p: &ParamLayout, other: &ParamLayout, tensor: &str) -> Result<(Self, Self)> {
        let nd = p.tensor_map.len();
        let splits = |q: &ParamLayout, which| -> Result<(Vec<usize>, usize)> {
            let n = q.device_num().max(1);
            let l =
                q.tensor_layout(&vec![n; nd]).map_err(|source| CheckpointError::Layout { tensor: tensor.to_string(), which, source })?;
            Ok((l.splits(), q.opt_group_size(&l)))
        };
        let (a, ao) = splits(p, "source")?;
        let (b, bo) = splits(other, "destination")?;
        let mut shape: Vec<usize> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
        if let Some(s0) = shape.first_mut() {
            *s0 *= ao * bo;
        }
        Ok((Side::new(p, &shape, tensor, "source")?, Side::new(other, &shape, tensor, "destination")?))
    }

    fn region(&self, rank: usize) -> Vec<Range<usize>> {
        let mut r = self.layout.slice_of(rank).unwrap_or_default();
        if self.opt > 1 {
            let part = self.part(rank);
            let len = (r[0].end - r[0].start) / self.opt;
            let start = r[0].start + part * len;
            r[0] = start..start + len;
        }
        r
    }

    fn part(&self, rank: usize) -> usize {
        if self.opt <= 1 {
            return 0;
        }
        let g = self.layout.replica_group(rank).unwrap_or_default();
        g.iter().position(|&x| x == rank).unwrap_or(0) % self.opt
    }

    fn key(&self, rank: usize) -> (usize, usize) {
        (self.layout.slice_index(rank).unwrap_or(0), self.part(rank))
    }

    pub(crate) fn local_shape(&self) -> Vec<usize> {
        let mut s = self.layout.slice_shape();
        if self.opt > 1 {
            s[0] /= self.opt;
        }
        s
    }
}

/// A box of the full tensor: one range per dimension.
type Region = Vec<Range<usize>>;

/// Source ranks (local to their stage), their boxes, and the part of each that destination
/// `dst_local`'s piece needs. Each piece comes from a replica that is `available` when one is
/// (the files a user gave), then from the one agreeing most with the destination's coordinates.
fn cover(src: &Side, dst: &Side, dst_local: usize, available: &dyn Fn(usize) -> bool) -> Vec<(usize, Region, Region)> {
    cover_box(src, &dst.region(dst_local), dst_local, available)
}

/// [`cover`] of the box `d` of the full tensor, reading replicas nearest to rank `near`.
pub(crate) fn cover_box(src: &Side, d: &[Range<usize>], near: usize, available: &dyn Fn(usize) -> bool) -> Vec<(usize, Region, Region)> {
    let n = src.layout.mesh().num_devices();
    let pref = src.layout.mesh().coordinate(near % n).unwrap_or_default();
    let mut by_key: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    let mut index: HashMap<(usize, usize), usize> = HashMap::new();
    for q in 0..n {
        let k = src.key(q);
        match index.get(&k) {
            Some(&i) => by_key[i].1.push(q),
            None => {
                index.insert(k, by_key.len());
                by_key.push((k, vec![q]));
            }
        }
    }
    let mut out = Vec::new();
    for (_, ranks) in by_key {
        let region = src.region(ranks[0]);
        let Some(inter) = intersect(&region, d) else { continue };
        let best = ranks
            .iter()
            .copied()
            .max_by_key(|&q| {
                let c = src.layout.mesh().coordinate(q).unwrap_or_default();
                let agree = c.iter().zip(&pref).filter(|(a, b)| a == b).count();
                (available(q), agree, std::cmp::Reverse(q))
            })
            .unwrap_or(ranks[0]);
        out.push((best, src.region(best), inter));
    }
    out
}

/// One destination tensor: what to write and where each piece comes from.
#[derive(Clone, Debug)]
struct TensorPlan {
    spec: TensorSpec,
    /// (global source rank, box in the source tensor, start in the destination tensor)
    pieces: Vec<(usize, Vec<Range<usize>>, Vec<usize>)>,
}

#[derive(Clone, Debug)]
struct RankPlan {
    path: PathBuf,
    tensors: Vec<TensorPlan>,
    bytes: u64,
}

impl TransformPlanner {
    /// Load the strategies; `strict` makes a tensor in one strategy but not the other an error
    /// (otherwise it is copied unchanged, as MindSpore does). Optimizer and accumulation state
    /// that a strategy does not list takes its parameter's layout ([`LayoutMap::layout_of`]).
    pub fn new(src_strategy: Option<&Path>, dst_strategy: Option<&Path>, strict: bool) -> Result<Self> {
        Self::new_with(src_strategy, dst_strategy, strict, false)
    }

    /// With `per_stage`, MindSpore's `transform_checkpoints` special case: when both strategies
    /// have one stage and the source's parameters (optimizer and accumulation states aside) are
    /// a strict subset of the destination's, the source is one pipeline stage (the stage of its
    /// strategy items) of the destination's network: its files are `rank_<stage*N + k>`, and
    /// only its parameters are written, to `<prefix><r>_part<stage>` files. (MindSpore takes this
    /// path for `.ckpt` sources only.)
    fn new_with(src_strategy: Option<&Path>, dst_strategy: Option<&Path>, strict: bool, per_stage: bool) -> Result<Self> {
        let src = load_map(src_strategy)?;
        let dst = load_map(dst_strategy)?;
        let by_stage = match (&src, &dst) {
            (Some((s, stage, _)), Some((d, _, _))) if per_stage && s.stages().len() == 1 && d.stages().len() == 1 => {
                let keys = |m: &LayoutMap| -> BTreeSet<String> {
                    m.params.keys().filter(|k| !["accu_grads", "adam_v", "adam_m"].iter().any(|p| k.starts_with(p))).cloned().collect()
                };
                let (ks, kd) = (keys(s), keys(d));
                (ks.is_subset(&kd) && ks.len() < kd.len()).then_some(stage.unwrap_or(0))
            }
            _ => None,
        };
        let mut one_strategy = Vec::new();
        if let (Some((s, _, _)), Some((d, _, _))) = (&src, &dst) {
            for (a, b, present, missing) in [(s, d, "source", "destination"), (d, s, "destination", "source")] {
                if by_stage.is_some() && present == "destination" {
                    continue; // the other stages' parameters
                }
                let names: Vec<String> = a.params.keys().filter(|k| b.layout_of(k).is_none()).cloned().collect();
                if !names.is_empty() && strict {
                    return Err(CheckpointError::NotInBothStrategies { count: names.len(), present, missing, names: names.join(", ") });
                }
                one_strategy.extend(names);
            }
        }
        let (src, src_file) = src.map_or((None, None), |(m, _, f)| (Some(m), Some(f)));
        let (dst, dst_file) = dst.map_or((None, None), |(m, _, f)| (Some(m), Some(f)));
        Ok(Self {
            src_stage_devs: src.as_ref().map_or(1, LayoutMap::stage_device_num),
            dst_stage_devs: dst.as_ref().map_or(1, LayoutMap::stage_device_num),
            dst_stages: dst.as_ref().map_or(1, |m| m.stages().len().max(1)),
            src,
            dst,
            one_strategy,
            by_stage,
            src_file,
            dst_file,
        })
    }

    /// The source stage of a per-stage transform (set when a `.ckpt` transform covers one pipeline stage).
    pub fn per_stage(&self) -> Option<u32> {
        self.by_stage
    }

    /// Destination ranks over all pipeline stages.
    pub fn dst_device_num(&self) -> usize {
        self.dst_stage_devs * self.dst_stages
    }

    /// Source ranks over all pipeline stages.
    pub fn src_device_num(&self) -> usize {
        self.src_stage_devs * self.src.as_ref().map_or(1, |m| m.stages().len().max(1))
    }

    /// Tensors one strategy lists and the other cannot place.
    pub fn one_strategy(&self) -> &[String] {
        &self.one_strategy
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.dst_device_num() {
            return Err(CheckpointError::RankOutOfRange { rank, devices: self.dst_device_num() });
        }
        Ok(())
    }

    /// Tensors destination `rank` holds that both sides can place, with (source layout, source
    /// stage, destination layout): the strategies' parameters, and `state` tensors (optimizer
    /// state found in the files) that take their parameter's layout.
    fn params_of(
        &self,
        rank: usize,
        state: &[String],
        ndim_hint: &dyn Fn(&str) -> Option<usize>,
    ) -> Vec<(String, ParamLayout, u32, ParamLayout)> {
        let stage = (rank / self.dst_stage_devs) as u32;
        let mut out = Vec::new();
        let mut names: Vec<&String> = match (&self.dst, &self.src) {
            (Some(d), _) => d.params.keys().collect(),
            (None, Some(s)) => s.params.keys().collect(),
            (None, None) => Vec::new(),
        };
        let extra: Vec<&String> = state.iter().filter(|n| !names.contains(n)).collect();
        names.extend(extra);
        for name in names {
            let dst = match &self.dst {
                Some(d) => match d.layout_of_in_stage(name, stage) {
                    Some(p) => Some(p.clone()),
                    None => continue,
                },
                None => None,
            };
            let src = match &self.src {
                Some(s) => match s.layout_of(name) {
                    Some(p) => Some(p.clone()),
                    None => continue, // in one strategy only: copied unchanged
                },
                None => None,
            };
            let nd = ndim_hint(name)
                .or_else(|| src.as_ref().and_then(ParamLayout::known_ndim))
                .or_else(|| dst.as_ref().and_then(ParamLayout::known_ndim))
                .or_else(|| dst.as_ref().or(src.as_ref()).map(|p| p.tensor_map.len()))
                .unwrap_or(0);
            let src = src.map(|p| p.for_ndim(nd));
            let dst = dst.map(|p| p.for_ndim(nd));
            let src_stage = self.by_stage.or_else(|| src.as_ref().and_then(|p| p.stages.iter().min().copied())).unwrap_or(0);
            out.push((
                name.clone(),
                src.unwrap_or_else(|| ParamLayout::unsharded(nd)),
                src_stage,
                dst.unwrap_or_else(|| ParamLayout::unsharded(nd)),
            ));
        }
        out
    }

    /// MindSpore's `rank_list_for_transform`: the global source ranks whose files MindSpore's
    /// `transform_checkpoint_by_rank` reads for destination `rank`, highest first, exactly as
    /// MindSpore lists them (see [`crate::rank_list`]).
    pub fn rank_list(&self, rank: usize) -> Result<Vec<usize>> {
        self.check_rank(rank)?;
        crate::rank_list::mindspore_rank_list(rank, self.src_file.as_ref(), self.dst_file.as_ref())
    }

    /// The smallest set of source ranks whose bytes destination `rank` needs, highest first:
    /// each piece is read from the replica whose device coordinates agree most with the
    /// destination rank. Often fewer files than MindSpore's list.
    pub fn minimal_rank_list(&self, rank: usize) -> Result<Vec<usize>> {
        self.check_rank(rank)?;
        if self.src.is_none() {
            return Ok(vec![0]);
        }
        let local = rank % self.dst_stage_devs;
        let mut set = BTreeSet::new();
        for (name, src, src_stage, dst) in self.params_of(rank, &[], &|_| None) {
            let (s, d) = Side::fake(&src, &dst, &name)?;
            for (q, _, _) in cover(&s, &d, local, &|_| true) {
                set.insert(src_stage as usize * self.src_stage_devs + q);
            }
        }
        if set.is_empty() {
            set.insert(self.by_stage.unwrap_or(0) as usize * self.src_stage_devs + local % self.src_stage_devs);
        }
        Ok(set.into_iter().rev().collect())
    }

    /// Refuses strategies of two networks (no parameter in common) for a transform: every
    /// tensor would be copied unchanged as placed by one strategy only (a source rank's slices
    /// written as whole tensors). MindSpore's rank list of such a pair is empty, and stays so.
    fn refuse_disjoint(&self, src_strategy: Option<&Path>, dst_strategy: Option<&Path>) -> Result<()> {
        if let (Some(s), Some(d)) = (&self.src, &self.dst) {
            if !s.params.is_empty() && !d.params.is_empty() && s.params.keys().all(|k| d.layout_of(k).is_none()) {
                return Err(CheckpointError::DisjointStrategies {
                    src: src_strategy.map(Path::to_path_buf).unwrap_or_default(),
                    dst: dst_strategy.map(Path::to_path_buf).unwrap_or_default(),
                    src_example: s.params.keys().next().cloned().unwrap_or_default(),
                    dst_example: d.params.keys().next().cloned().unwrap_or_default(),
                });
            }
        }
        Ok(())
    }

    /// Whether a strategy (either) places `name`, directly or as its parameter's state.
    fn placed(&self, name: &str) -> bool {
        self.src.as_ref().is_some_and(|m| m.layout_of(name).is_some()) || self.dst.as_ref().is_some_and(|m| m.layout_of(name).is_some())
    }

    /// Whether the destination places `name` in another pipeline stage than `stage` only.
    fn in_other_stage(&self, name: &str, stage: u32) -> bool {
        self.dst.as_ref().is_some_and(|m| m.layout_of(name).is_some() && m.layout_of_in_stage(name, stage).is_none())
    }

    /// The plan of tensor `name` (laid out as `src` in source stage `src_stage`, as `dst` in the
    /// destination) for the destination rank at `local` in its stage: the pieces of the source
    /// files it is copied from, each replica checked once (`checked`). None: no source file
    /// holds it.
    fn plan_tensor(
        &self,
        name: &str,
        (src_p, src_stage, dst_p): (&ParamLayout, u32, &ParamLayout),
        local: usize,
        files: &BTreeMap<usize, CheckpointFile>,
        checked: &mut BTreeSet<(String, usize)>,
    ) -> Result<Option<TensorPlan>> {
        let base = src_stage as usize * self.src_stage_devs;
        let (fs, fd) = Side::fake(src_p, dst_p, name)?;
        let available = |q: usize| files.contains_key(&(base + q));
        let fake_cover = cover(&fs, &fd, local, &available);
        // the local shape of any source piece gives the full shape
        let first = base + fake_cover.first().map_or(0, |c| c.0);
        let file = files.get(&first).ok_or(CheckpointError::MissingRankFile { rank: first })?;
        let Some(entry) = file.get(name) else {
            if files.values().all(|f| f.get(name).is_none()) {
                return Ok(None);
            }
            return Err(CheckpointError::MissingTensor { path: file.path().to_path_buf(), tensor: name.to_string() });
        };
        let mut full = entry.shape.clone();
        let (splits, opt) = (fs.layout.splits(), fs.opt);
        if full.len() != splits.len() {
            return Err(CheckpointError::ShapeMismatch {
                tensor: name.to_string(),
                rank: first,
                path: file.path().to_path_buf(),
                expected: fs.local_shape(),
                actual: full,
            });
        }
        for (d, s) in full.iter_mut().zip(&splits) {
            *d *= s;
        }
        if let Some(d0) = full.first_mut() {
            *d0 *= opt;
        }
        for (which, p) in [("source", src_p), ("destination", dst_p)] {
            if let Some(ts) = &p.tensor_shape {
                if *ts != full {
                    return Err(CheckpointError::StrategyShapeMismatch {
                        tensor: name.to_string(),
                        which,
                        file: None,
                        strategy: ts.clone(),
                        checkpoint: full.clone(),
                    });
                }
            }
        }
        let s = Side::new(src_p, &full, name, "source")?;
        let d = Side::new(dst_p, &full, name, "destination")?;
        let d_region = d.region(local);
        let expect_src = s.local_shape();
        let mut pieces = Vec::new();
        for (q, s_region, inter) in cover(&s, &d, local, &available) {
            let g = base + q;
            let f = files.get(&g).ok_or(CheckpointError::MissingRankFile { rank: g })?;
            let e = f.get(name).ok_or_else(|| CheckpointError::MissingTensor { path: f.path().to_path_buf(), tensor: name.to_string() })?;
            if e.shape != expect_src {
                return Err(CheckpointError::ShapeMismatch {
                    tensor: name.to_string(),
                    rank: g,
                    path: f.path().to_path_buf(),
                    expected: expect_src.clone(),
                    actual: e.shape.clone(),
                });
            }
            if e.dtype != entry.dtype {
                return Err(CheckpointError::DtypeMismatch {
                    tensor: name.to_string(),
                    rank: g,
                    path: f.path().to_path_buf(),
                    expected: entry.dtype.to_string(),
                    actual: e.dtype.to_string(),
                });
            }
            let src_box: Vec<Range<usize>> = inter.iter().zip(&s_region).map(|(i, r)| i.start - r.start..i.end - r.start).collect();
            let dst_start: Vec<usize> = inter.iter().zip(&d_region).map(|(i, r)| i.start - r.start).collect();
            if checked.insert((name.to_string(), g)) {
                check_replica(&s, q, base, name, files)?;
            }
            pieces.push((g, src_box, dst_start));
        }
        Ok(Some(TensorPlan { spec: TensorSpec { name: name.to_string(), dtype: entry.dtype, shape: d.local_shape() }, pieces }))
    }

    /// Plan destination `rank`'s file from the open source files.
    fn plan_rank(
        &self,
        rank: usize,
        files: &BTreeMap<usize, CheckpointFile>,
        path: PathBuf,
        report: &mut TransformReport,
        checked: &mut BTreeSet<(String, usize)>,
    ) -> Result<RankPlan> {
        let local = rank % self.dst_stage_devs;
        let absent_before = report.absent.len();
        // the open files, the paired source rank's first: extras and entry order come from it
        let pref = self.by_stage.unwrap_or(0) as usize * self.src_stage_devs + local % self.src_stage_devs;
        let open: Vec<usize> = std::iter::once(pref).chain(files.keys().rev().copied().filter(|&r| r != pref)).collect();
        let mut tensors: Vec<TensorPlan> = Vec::new();
        let mut handled: BTreeSet<String> = BTreeSet::new();
        let hint = |name: &str| files.values().find_map(|f| f.get(name)).map(|e| e.shape.len());
        // optimizer state follows its parameter on the side whose strategy does not list it
        let mut state: Vec<String> = Vec::new();
        for f in files.values() {
            for t in f.tensors() {
                if state_parameter(&t.name).is_some() && !state.contains(&t.name) {
                    state.push(t.name.clone());
                }
            }
        }
        for (name, src_p, src_stage, dst_p) in self.params_of(rank, &state, &hint) {
            handled.insert(name.clone());
            match self.plan_tensor(&name, (&src_p, src_stage, &dst_p), local, files, checked)? {
                Some(t) => tensors.push(t),
                None => report.absent.push(name),
            }
        }
        // MindSpore copies the other tensors unchanged, from the paired source rank when its file
        // is open: those in neither strategy (global_step, learning_rate) and those in one only
        let transformed = tensors.len();
        let stage = (rank / self.dst_stage_devs) as u32;
        for &r in &open {
            let Some(f) = files.get(&r) else { continue };
            for t in f.tensors() {
                if handled.contains(&t.name) {
                    continue;
                }
                handled.insert(t.name.clone());
                if self.in_other_stage(&t.name, stage) {
                    continue; // another pipeline stage's parameter
                }
                if !self.placed(&t.name) {
                    report.copied.push(t.name.clone());
                } else if !report.one_strategy.contains(&t.name) {
                    report.one_strategy.push(t.name.clone());
                }
                tensors.push(TensorPlan {
                    spec: TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() },
                    pieces: vec![(r, t.shape.iter().map(|&n| 0..n).collect(), vec![0; t.shape.len()])],
                });
            }
        }
        // Nothing at all to write, while the strategies place tensors: the sources are not this
        // network's checkpoints (an empty file, another network's).
        if tensors.is_empty() {
            if let (Some(first), Some(file)) = (report.absent.get(absent_before), files.values().next()) {
                return Err(CheckpointError::NoSourceTensors {
                    path: file.path().to_path_buf(),
                    placed: report.absent.len() - absent_before,
                    first: first.clone(),
                });
            }
        }
        // .ckpt entry order as MindSpore writes it: the transformed tensors in the source file's
        // order, then the copied ones
        let pos: HashMap<&str, usize> = open
            .iter()
            .find_map(|r| files.get(r))
            .map(|f| f.tensors().iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect())
            .unwrap_or_default();
        let key = |t: &TensorPlan| (pos.get(t.spec.name.as_str()).copied().unwrap_or(usize::MAX), t.spec.name.clone());
        let (moved, copied) = tensors.split_at_mut(transformed);
        moved.sort_by_key(key);
        copied.sort_by_key(key);
        let bytes = tensors.iter().map(|t| spec_bytes(&t.spec)).sum();
        Ok(RankPlan { path, tensors, bytes })
    }
}

/// Bytes compared at each end of a replicated source piece.
const REPLICA_SAMPLE: usize = 64 << 10;

/// A protobuf strategy has no full shapes, so a checkpoint saved under another strategy can have
/// slices of consistent shapes and still be read wrongly (optimizer shards taken for whole
/// slices). Ranks that the source strategy says hold the same piece must hold the same bytes:
/// compare the first and last 64 KiB of the piece with one other replica among the open files.
fn check_replica(s: &Side, q: usize, base: usize, name: &str, files: &BTreeMap<usize, CheckpointFile>) -> Result<()> {
    let n = s.layout.mesh().num_devices();
    let key = s.key(q);
    let Some(q2) = (0..n).find(|&o| o != q && files.contains_key(&(base + o)) && s.key(o) == key) else { return Ok(()) };
    let (fa, fb) = (&files[&(base + q)], &files[&(base + q2)]);
    let (Some(ea), Some(eb)) = (fa.get(name), fb.get(name)) else { return Ok(()) };
    let len = ea.byte_len();
    let differ = || CheckpointError::ReplicasDiffer {
        tensor: name.to_string(),
        rank_a: base + q,
        rank_b: base + q2,
        path_a: fa.path().to_path_buf(),
        path_b: fb.path().to_path_buf(),
    };
    if eb.byte_len() != len || eb.shape != ea.shape {
        return Err(differ());
    }
    for off in [0, len.saturating_sub(REPLICA_SAMPLE as u64)] {
        if fa.read_range(name, off, REPLICA_SAMPLE)? != fb.read_range(name, off, REPLICA_SAMPLE)? {
            return Err(differ());
        }
    }
    Ok(())
}

fn spec_bytes(s: &TensorSpec) -> u64 {
    s.shape.iter().map(|&d| d as u64).product::<u64>() * s.dtype.size() as u64
}

/// Fill and write one destination file. A writer thread writes tensor `i` while tensor `i + 1`
/// is assembled, so one job holds at most two destination tensors.
fn execute(
    plan: &RankPlan,
    files: &BTreeMap<usize, CheckpointFile>,
    crc: bool,
    progress: &(dyn Fn(u64) + Sync),
    abort: &AtomicBool,
) -> Result<()> {
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "ms".to_string());
    let specs: Vec<TensorSpec> = plan.tensors.iter().map(|t| t.spec.clone()).collect();
    let by_name: HashMap<&str, &TensorPlan> = plan.tensors.iter().map(|t| (t.spec.name.as_str(), t)).collect();
    let mut w = CheckpointWriter::create(&plan.path, specs, &meta, crc)?;
    let order: Vec<String> = w.order().iter().map(|s| s.name.clone()).collect();
    let (to_writer, from_producer) = std::sync::mpsc::sync_channel::<Vec<u8>>(0);
    let (to_producer, spare) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> Result<()> {
            for buf in from_producer {
                w.write_next(&buf)?;
                progress(buf.len() as u64);
                let _ = to_producer.send(buf);
            }
            // fails (and removes the temp file) unless every tensor arrived
            w.finish()
        });
        let produced = (|| -> Result<()> {
            let mut fresh = 2usize;
            for name in &order {
                if abort.load(Ordering::Relaxed) {
                    return Err(CheckpointError::InvalidArgument(Misuse::StoppedAfterOtherError));
                }
                let t = by_name[name.as_str()];
                let data = if t.spec.dtype == crate::DType::Str {
                    // string values have no shape to slice: copied whole
                    files[&t.pieces[0].0].read(name)?
                } else {
                    let len = spec_bytes(&t.spec) as usize;
                    let mut buf = match spare.try_recv() {
                        Ok(b) => b,
                        Err(_) if fresh > 0 => {
                            fresh -= 1;
                            // zeroed pages straight from the allocator, not a pass of memset
                            vec![0u8; len]
                        }
                        Err(_) => spare.recv().unwrap_or_default(),
                    };
                    // The source boxes partition the destination piece, so every byte is
                    // overwritten: a buffer of the same size is reused without clearing it.
                    buf.truncate(len);
                    buf.resize(len, 0);
                    for (r, src_box, dst_start) in &t.pieces {
                        files[r].copy_region(name, src_box, &mut buf, &t.spec.shape, dst_start)?;
                    }
                    buf
                };
                if to_writer.send(data).is_err() {
                    break; // the writer failed; its error is reported below
                }
            }
            Ok(())
        })();
        drop(to_writer);
        let written = writer.join().unwrap_or(Err(CheckpointError::InvalidArgument(Misuse::WorkerPanicked { what: "writer" })));
        produced.and(written)
    })
}

fn run_plans(plans: Vec<RankPlan>, files: &BTreeMap<usize, CheckpointFile>, opts: &TransformOptions) -> Result<u64> {
    let total: u64 = plans.iter().map(|p| p.bytes).sum();
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::with_draw_target(Some(total), indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}")
        {
            b.set_style(style);
        }
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    // Destination ranks that are replicas for every tensor (data parallel) get identical files:
    // each distinct file is assembled once, the others are kernel-side copies of it.
    let mut leader: HashMap<String, usize> = HashMap::new();
    let mut leaders = Vec::new();
    let mut followers = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        match leader.entry(format!("{:?}", p.tensors)) {
            std::collections::hash_map::Entry::Occupied(e) => followers.push((i, *e.get())),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(i);
                leaders.push(i);
            }
        }
    }
    let abort = AtomicBool::new(false);
    let inc = |n: u64| bar.inc(n);
    let result = run_tasks(leaders.len(), opts.jobs, &abort, &|k| {
        let plan = &plans[leaders[k]];
        let t = std::time::Instant::now();
        execute(plan, files, opts.crc, &inc, &abort)?;
        tracing::info!(path = %plan.path.display(), bytes = plan.bytes, ms = t.elapsed().as_secs_f64() * 1e3, "checkpoint written");
        Ok(())
    })
    .and_then(|()| {
        run_tasks(followers.len(), opts.jobs, &abort, &|k| {
            let (i, from) = followers[k];
            let mut out = AtomicFile::create(&plans[i].path)?;
            out.copy_from(&plans[from].path)?;
            out.commit()?;
            tracing::info!(path = %plans[i].path.display(), same_as = %plans[from].path.display(), "checkpoint copied");
            inc(plans[i].bytes);
            Ok(())
        })
    });
    bar.finish_and_clear();
    result.map(|()| total)
}

/// Run `task(0..n)` on up to `jobs` threads; the first error stops the others and is returned.
fn run_tasks(n: usize, jobs: usize, abort: &AtomicBool, task: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let next = AtomicUsize::new(0);
    let first_err: Mutex<Option<CheckpointError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, n.max(1)) {
            scope.spawn(|| loop {
                if abort.load(Ordering::Relaxed) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                if let Err(e) = task(i) {
                    let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none() && !abort.load(Ordering::Relaxed) {
                        *slot = Some(e);
                    }
                    abort.store(true, Ordering::Relaxed);
                    return;
                }
            });
        }
    });
    match first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// MindSpore's `rank_list_for_transform`.
pub fn rank_list_for_transform(rank: usize, src_strategy: Option<&Path>, dst_strategy: Option<&Path>) -> Result<Vec<usize>> {
    TransformPlanner::new(src_strategy, dst_strategy, false)?.rank_list(rank)
}

/// MindSpore's `transform_checkpoint_by_rank`: write destination `rank`'s checkpoint to `save_path`
/// (format from its extension) from the given source rank files.
pub fn transform_checkpoint_by_rank(
    rank: usize,
    files: &BTreeMap<usize, PathBuf>,
    save_path: &Path,
    src_strategy: Option<&Path>,
    dst_strategy: Option<&Path>,
    opts: &TransformOptions,
) -> Result<TransformReport> {
    if Format::of_path(save_path).is_none() {
        return Err(CheckpointError::UnknownFormat { path: save_path.to_path_buf() });
    }
    for p in files.values() {
        refuse_overwrite(save_path, p)?;
    }
    let planner = TransformPlanner::new(src_strategy, dst_strategy, opts.strict)?;
    planner.refuse_disjoint(src_strategy, dst_strategy)?;
    // Any file set that covers the destination piece will do: MindSpore's list, autopar's
    // smaller one, or a mix. Files of other ranks are not opened. (MindSpore cannot list some
    // files it reads wrongly, such as a 1-d tensor split over two axes; autopar's list serves.)
    let ms_list = planner.rank_list(rank).unwrap_or_default();
    let wanted: BTreeSet<usize> = ms_list.into_iter().chain(planner.minimal_rank_list(rank)?).collect();
    let mut open = BTreeMap::new();
    for (&r, p) in files.iter().filter(|(r, _)| wanted.contains(r)) {
        if !p.exists() {
            return Err(CheckpointError::MissingRank { dst_rank: rank, src_rank: r, path: p.clone() });
        }
        open.insert(r, CheckpointFile::open_with(p, OpenOptions { verify_crc: opts.verify_crc })?);
    }
    let mut report = TransformReport { one_strategy: planner.one_strategy().to_vec(), ..Default::default() };
    let plan = planner.plan_rank(rank, &open, save_path.to_path_buf(), &mut report, &mut BTreeSet::new())?;
    report.bytes_written = run_plans(vec![plan], &open, opts)?;
    report.files.push(save_path.to_path_buf());
    Ok(report)
}

/// An error when `output` (a folder or file the transform writes) is `source` (one it reads),
/// however either is spelled.
fn refuse_overwrite(output: &Path, source: &Path) -> Result<()> {
    match (output.canonicalize(), source.canonicalize()) {
        (Ok(a), Ok(b)) if a == b => {
            Err(CheckpointError::OverwritesSource { output: output.to_path_buf(), source_path: source.to_path_buf() })
        }
        _ => Ok(()),
    }
}

/// MindSpore's `transform_checkpoints`: every destination rank of `dst_strategy` from
/// `src_dir/rank_<k>/*.{ckpt,safetensors}` into `dst_dir/rank_<r>/<prefix><r>.<format>`.
pub fn transform_checkpoints(
    src_dir: &Path,
    dst_dir: &Path,
    src_strategy: Option<&Path>,
    dst_strategy: Option<&Path>,
    opts: &TransformOptions,
) -> Result<TransformReport> {
    refuse_overwrite(dst_dir, src_dir)?;
    let (rank_files, src_format) = collect_rank_files(src_dir)?;
    // MindSpore transforms one stage into `_part` files for `.ckpt` sources only; its
    // safetensors path always transforms the whole network.
    let planner = TransformPlanner::new_with(src_strategy, dst_strategy, opts.strict, src_format == Format::Ckpt)?;
    planner.refuse_disjoint(src_strategy, dst_strategy)?;
    let n = planner.dst_device_num();
    let part = planner.per_stage().map_or(String::new(), |s| format!("_part{s}"));
    let mut needed_all = BTreeSet::new();
    for r in 0..n {
        for s in planner.minimal_rank_list(r)? {
            if !rank_files.contains_key(&s) {
                return Err(CheckpointError::MissingRank { dst_rank: r, src_rank: s, path: src_dir.join(format!("rank_{s}")) });
            }
            needed_all.insert(s);
        }
    }
    let mut files = BTreeMap::new();
    for s in needed_all {
        files.insert(s, CheckpointFile::open_with(&rank_files[&s], OpenOptions { verify_crc: opts.verify_crc })?);
    }
    let mut report =
        TransformReport { one_strategy: planner.one_strategy().to_vec(), per_stage: planner.per_stage(), ..Default::default() };
    let mut plans = Vec::with_capacity(n);
    let mut checked = BTreeSet::new();
    for r in 0..n {
        let path = dst_dir.join(format!("rank_{r}")).join(format!("{}{r}{part}.{}", opts.prefix, opts.format.extension()));
        let mut rr = TransformReport::default();
        plans.push(planner.plan_rank(r, &files, path.clone(), &mut rr, &mut checked)?);
        for v in rr.absent {
            if !report.absent.contains(&v) {
                report.absent.push(v);
            }
        }
        for v in rr.copied {
            if !report.copied.contains(&v) {
                report.copied.push(v);
            }
        }
        report.files.push(path);
    }
    report.bytes_written = run_plans(plans, &files, opts)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_layout::TensorMap;

    fn param(dev: &[usize], map: &[i64], step: i64, size: i64) -> ParamLayout {
        let mut p = ParamLayout::unsharded(map.len());
        p.dev_matrix = dev.to_vec();
        p.tensor_map = TensorMap::single(map);
        p.opt_shard_step = step;
        p.opt_shard_size = size;
        p
    }

    #[test]
    fn optimizer_shards_cut_the_slice_rows_across_the_sorted_replica_group() {
        // l1.w of the fixtures: [2,4] [-1,0], replicas {r, r+4}, opt group = the whole pair
        let s = Side::new(&param(&[2, 4], &[-1, 0], 4, -1), &[64, 128], "l1.w", "source").unwrap();
        assert_eq!(s.opt, 2);
        assert_eq!(s.local_shape(), vec![32, 32]);
        assert_eq!(s.region(1), vec![0..32, 32..64]);
        assert_eq!(s.region(5), vec![32..64, 32..64]);
        // groups of 2 among 8 replicas: ranks 0,1 share rows 0..16 / 16..32 of the full tensor
        let h = Side::new(&param(&[8], &[-1, -1], 1, 2), &[32, 16], "head.w", "source").unwrap();
        assert_eq!((h.region(0), h.region(1), h.region(2)), (vec![0..16, 0..16], vec![16..32, 0..16], vec![0..16, 0..16]));
    }

    #[test]
    fn cover_reads_the_replicas_nearest_to_the_destination_rank() {
        let src = Side::new(&param(&[2, 4], &[-1, 0], 0, 0), &[8, 8], "w", "source").unwrap();
        let dst = Side::new(&param(&[8], &[-1, -1], 0, 0), &[8, 8], "w", "destination").unwrap();
        let ranks = |r| cover(&src, &dst, r, &|_| true).into_iter().map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(ranks(1), vec![0, 1, 2, 3]);
        assert_eq!(ranks(6), vec![4, 5, 6, 7]);
        // every destination box is covered exactly once
        let total: usize = cover(&src, &dst, 6, &|_| true).iter().map(|c| c.2.iter().map(|r| r.len()).product::<usize>()).sum();
        assert_eq!(total, 64);
    }

    #[test]
    fn an_optimizer_shard_that_does_not_divide_the_rows_is_refused() {
        let e = Side::new(&param(&[8], &[-1], 1, -1), &[4], "b", "source").err().unwrap();
        assert!(matches!(e, CheckpointError::NotDivisible { size: 4, split: 8, .. }), "{e:?}");
    }
}
