//! `parameter_broadcast(trainer, layout, cur_rank, initial_rank)`: make every replica of every
//! parameter equal to one owner's value, after ranks initialised or loaded their slices
//! independently (different seeds, partial checkpoints).
//!
//! The layout is MindSpore's `parameter_layout_dict` (or its text, as `autopar plan
//! --mindspore-layouts` prints it) or a strategy file. Its groups of ranks holding the same piece and
//! the single owner of each parameter in each group are MindSpore's
//! (`get_parameter_redundancy` / `remove_param_redundancy`, [`autopar_layout::redundancy`]);
//! the owner's value is broadcast to the other members of its group (MindSpore zeroes the
//! others and all-reduces, which gives the same values).
//!
//! Unlike MindSpore, a bad call cannot hang the job: every rank checks its arguments and the
//! layout against its own program first, then the ranks agree (one all-gather over the world)
//! before any group is created, so when one rank fails every rank returns an error naming
//! that rank and what was wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use autopar_checkpoint::strategy::state_parameter;
use autopar_checkpoint::StrategyFile;
use autopar_comm::Communicator;
use autopar_layout::redundancy::{group_owners, opt_pieces, replica_groups, split_by_opt_shard};
use autopar_layout::{LayoutError, ParameterLayout};
use thiserror::Error;

use crate::collective::{broadcast_tensor, CommGroups};
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::ParamStore;
use crate::optim::Optimizer;
use crate::rank::RankTrainer;

/// Why `parameter_broadcast` refused to run. Raised on every rank: the rank that found the
/// problem returns it, the others [`BroadcastError::OnRank`] with its text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BroadcastError {
    /// `cur_rank` is not the calling rank.
    #[error(
        "parameter_broadcast: cur_rank {cur_rank} is not this rank, which is rank {rank}\n  hint: pass the caller's own rank as cur_rank"
    )]
    CurRank {
        /// The `cur_rank` argument that was passed.
        cur_rank: usize,
        /// This rank, global.
        rank: usize,
    },

    /// `initial_rank` is not the first global rank of this rank's pipeline stage.
    #[error("parameter_broadcast: initial_rank {initial_rank} is not the first rank of rank {rank}'s pipeline stage, which is {start} ({stages} stage(s) of {stage_devices} ranks)\n  hint: pass initial_rank = (rank / {stage_devices}) * {stage_devices}")]
    InitialRank {
        /// The `initial_rank` argument that was passed.
        initial_rank: usize,
        /// This rank, global.
        rank: usize,
        /// The first global rank of this rank's pipeline stage (the expected `initial_rank`).
        start: usize,
        /// Pipeline stages of the job.
        stages: usize,
        /// Ranks per pipeline stage.
        stage_devices: usize,
    },

    /// A layout name this rank would broadcast is neither a parameter nor kept optimizer state of the network.
    #[error("parameter_broadcast: layout name {name:?} is not a parameter of the network{}\n  hint: pass the layout of this network (its parameter_layout_dict or strategy file)", closest.as_ref().map(|c| format!("; did you mean {c:?}?")).unwrap_or_default())]
    UnknownName {
        /// The layout name that was not found.
        name: String,
        /// The closest parameter name this rank holds, if one is close enough.
        closest: Option<String>,
    },

    /// A layout entry's device matrix spans another number of devices than a pipeline stage of the job.
    #[error("parameter_broadcast: the layout of {name} spans {devices} devices (device matrix {dev_matrix:?}), but a pipeline stage of this job has {stage_devices}\n  hint: pass the layout of this job (its parameter_layout_dict or strategy file)")]
    Devices {
        /// The layout name.
        name: String,
        /// The entry's device matrix.
        dev_matrix: Vec<usize>,
        /// The devices the device matrix spans (the product of its axes).
        devices: usize,
        /// The ranks of one pipeline stage of this job.
        stage_devices: usize,
    },

    /// The layout puts this rank's piece of a parameter on other ranks than the job stores it on.
    #[error("parameter_broadcast: the layout puts rank {rank}'s piece of {name} on ranks {layout:?}, but this job stores it on ranks {job:?}\n  hint: the layout comes from another strategy; pass this job's parameter_layout_dict or strategy file")]
    Replicas {
        /// The layout name (parameter or optimizer state).
        name: String,
        /// This rank, global.
        rank: usize,
        /// The global ranks the layout puts this rank's piece on.
        layout: Vec<usize>,
        /// The global ranks the job stores this rank's piece on.
        job: Vec<usize>,
    },

    /// A layout entry is invalid: its replica groups cannot be computed or its optimizer-shard group is malformed.
    #[error("parameter_broadcast: layout of {name}: {reason}")]
    Layout {
        /// The layout name (parameter or optimizer state).
        name: String,
        /// What is wrong, in words.
        reason: String,
    },

    /// The layout file cannot be read or parsed as a strategy file or `parameter_layout_dict` lines.
    #[error("parameter_broadcast: cannot read layout {}: {reason}\n  hint: pass a strategy file (.ckpt or .json) or parameter_layout_dict lines (autopar plan --mindspore-layouts)", path.display())]
    Read {
        /// The file that was read.
        path: PathBuf,
        /// Why reading or parsing failed.
        reason: String,
    },

    /// Two ranks of one group would broadcast different names or groups to each other (their layouts or optimizers differ).
    #[error("parameter_broadcast: rank {rank} and rank {peer} would broadcast different parameters or optimizer state to each other (their layouts or optimizers differ)\n  hint: pass the same layout and the same optimizer type on every rank")]
    Disagree {
        /// This rank, global.
        rank: usize,
        /// The rank it disagrees with, global.
        peer: usize,
    },

    /// Another rank's checks failed; every other rank returns this, with that rank's error text.
    #[error("parameter_broadcast failed on rank {rank}, so no rank changed its parameters:\n{message}")]
    OnRank {
        /// The rank whose checks failed, global.
        rank: usize,
        /// That rank's error text (at most 2048 bytes).
        message: String,
    },
}

/// Where the layout of `parameter_broadcast` comes from.
#[derive(Clone, Debug)]
pub enum LayoutSource {
    /// MindSpore's `parameter_layout_dict` (`autopar_parallel::parameter_layout_dict`): the
    /// optimizer shard is field 5's group (`"<size>-<hash>"`, `hccl_world_group`, or none).
    Dict(Vec<(String, ParameterLayout)>),
    /// A strategy file: the optimizer shard is `opt_weight_shard_step` / `_size`.
    Strategy(StrategyFile),
}

impl LayoutSource {
    /// A strategy file (`.ckpt` protobuf or `.json`), or a text file of `parameter_layout_dict`
    /// lines (`name: (12-tuple)`).
    pub fn load(path: &Path) -> Result<Self, BroadcastError> {
        let read = |reason: String| BroadcastError::Read { path: path.to_path_buf(), reason };
        let bytes = std::fs::read(path).map_err(|e| read(e.to_string()))?;
        if let Ok(text) = std::str::from_utf8(&bytes) {
            if text.lines().any(|l| l.contains(": (")) {
                let dict = text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(ParameterLayout::parse_line)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| read(e.to_string()))?;
                return Ok(LayoutSource::Dict(dict));
            }
        }
        let file = StrategyFile::load(path).map_err(|e| read(e.to_string()))?;
        if file.layout_items.is_empty() {
            return Err(read("the strategy file holds operator strategies but no parameter layouts (parallel_layout_item)".into()));
        }
        Ok(LayoutSource::Strategy(file))
    }

    /// The devices of the first layout entry's device matrix (one pipeline stage's).
    pub fn devices(&self) -> usize {
        self.entries().first().map_or(0, |e| e.dev_matrix.iter().product())
    }

    /// Every layout name with its device matrix, flattened tensor map and optimizer shard.
    fn entries(&self) -> Vec<Entry> {
        match self {
            LayoutSource::Dict(d) => d
                .iter()
                .map(|(name, l)| Entry {
                    name: name.clone(),
                    dev_matrix: l.dev_matrix.clone(),
                    tensor_map: l.tensor_map.clone(),
                    opt: OptSource::Group(l.opt_shard_group.clone()),
                })
                .collect(),
            LayoutSource::Strategy(f) => f
                .layout_items
                .iter()
                .map(|it| Entry {
                    name: it.name.clone(),
                    dev_matrix: it.devices(),
                    tensor_map: it.tensor_map.iter().flatten().map(|&v| v as i64).collect(),
                    opt: OptSource::StepSize(it.opt_weight_shard_step as i64, it.opt_weight_shard_size as i64),
                })
                .collect(),
        }
    }

    /// MindSpore's `get_parameter_redundancy(layout, initial_rank)`: for every layout name, the
    /// groups of global ranks holding the same piece (optimizer shard included), by name.
    pub fn redundancy(&self, initial_rank: usize, world_size: usize) -> Result<BTreeMap<String, Vec<Vec<usize>>>, BroadcastError> {
        let mut out = BTreeMap::new();
        for e in self.entries() {
            let bad = |reason: String| BroadcastError::Layout { name: e.name.clone(), reason };
            let groups = replica_groups(&e.dev_matrix, &e.tensor_map, initial_rank).map_err(|x: LayoutError| bad(x.to_string()))?;
            let pieces = match &e.opt {
                OptSource::StepSize(step, size) => opt_pieces(*step, *size, &groups),
                OptSource::Group(g) if g.is_empty() => None,
                OptSource::Group(g) if g == "hccl_world_group" => Some(world_size),
                OptSource::Group(g) => Some(
                    g.split_once('-')
                        .and_then(|(n, _)| n.parse::<usize>().ok())
                        .ok_or_else(|| bad(format!("optimizer-shard group {g:?} is not named <size>-<hash> or hccl_world_group")))?,
                ),
            };
            out.insert(
                e.name,
                match pieces {
                    Some(k) => split_by_opt_shard(groups, k),
                    None => groups,
                },
            );
        }
        Ok(out)
    }
}

struct Entry {
    name: String,
    dev_matrix: Vec<usize>,
    tensor_map: Vec<i64>,
    opt: OptSource,
}

enum OptSource {
    Group(String),
    StepSize(i64, i64),
}

/// What a rank of a job offers `parameter_broadcast`: its stored pieces and where the job
/// keeps their copies. Implemented by [`RankTrainer`].
pub trait Replicas {
    /// The rank's stored parameter pieces.
    fn pieces_mut(&mut self) -> &mut ParamStore;
    /// Pipeline stages and ranks per stage.
    fn stages(&self) -> (usize, usize);
    /// The global ranks storing the same piece of `name` as this rank (`None`: not a
    /// parameter this rank holds).
    fn holders(&self, name: &str) -> Option<Vec<usize>>;
    /// Whether `name` is an input or a parameter of the network, held here or not (layout
    /// dicts list inputs too, and a pipeline rank's the other stages' parameters).
    fn in_network(&self, name: &str) -> bool;
    /// The parameters this rank holds, for suggestions.
    fn held_names(&self) -> Vec<String>;
}

impl Replicas for RankTrainer {
    fn pieces_mut(&mut self) -> &mut ParamStore {
        self.params_mut()
    }
    fn stages(&self) -> (usize, usize) {
        self.pipeline_shape()
    }
    fn holders(&self, name: &str) -> Option<Vec<usize>> {
        let p = self.program();
        let start = p.rank - p.position;
        self.param_slots().into_iter().find(|s| s.name == name).map(|s| {
            if s.mirror.is_empty() {
                vec![p.rank]
            } else {
                s.mirror.iter().map(|r| r + start).collect()
            }
        })
    }
    fn in_network(&self, name: &str) -> bool {
        let p = &self.program().program;
        p.inputs.iter().any(|s| s.name == name) || p.params.iter().any(|s| s.name == name)
    }
    fn held_names(&self) -> Vec<String> {
        self.param_slots().iter().map(|s| s.name.clone()).collect()
    }
}

/// What `parameter_broadcast` did on this rank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BroadcastReport {
    /// MindSpore's `get_parameter_redundancy`: by layout name, the groups holding one piece.
    pub redundancy: BTreeMap<String, Vec<Vec<usize>>>,
    /// MindSpore's `remove_param_redundancy`: the names each rank is the single owner of.
    pub owners: BTreeMap<usize, BTreeSet<String>>,
    /// Names this rank sent (it owns them in a group of more than one rank).
    pub sent: Vec<String>,
    /// Names this rank received from their owner.
    pub received: Vec<String>,
}

/// A name of the layout this rank takes part in broadcasting: the store it lives in, the
/// group (global ranks) and the owner.
struct Transfer {
    name: String,
    /// The parameter whose optimizer state `name` is (None: `name` is a parameter).
    state_of: Option<String>,
    group: Vec<usize>,
    owner: usize,
}

/// MindSpore's `parameter_broadcast(net, layout, cur_rank, initial_rank)` on one rank of a job:
/// every piece of every parameter named by `layout` (and, given `optimizer`, every state entry
/// such as `moments.<name>` it names and the optimizer keeps) takes its single owner's value on
/// every rank of its group. Collective over `world`: every rank of the job calls it. Layout
/// names that are network inputs, or optimizer state when no optimizer is given, are left
/// alone. A state entry the optimizer has not created yet (it does so at the first update) is
/// taken as the zeros it would start from.
///
/// Errors, checked on every rank before any communication and then agreed by all ranks (so no
/// rank hangs): `cur_rank` is not this rank; `initial_rank` is not the first rank of this
/// rank's pipeline stage; a layout name this rank would broadcast is not a parameter of the
/// network (the closest name is suggested); the layout spans another device count or puts a
/// piece on other ranks than the job does; two ranks of one group would broadcast different
/// names (their layouts or optimizers differ).
pub fn parameter_broadcast(
    trainer: &mut dyn Replicas,
    optimizer: Option<&mut dyn Optimizer>,
    world: &dyn Communicator,
    layout: &LayoutSource,
    cur_rank: usize,
    initial_rank: usize,
) -> Result<BroadcastReport> {
    let rank = world.rank();
    let checked = check(&*trainer, optimizer.as_deref(), rank, layout, cur_rank, initial_rank, world.size());
    let peers = match &checked {
        Ok((_, transfers)) => peer_fingerprints(transfers, world.size()),
        Err(_) => vec![0; world.size()],
    };
    let mut theirs = vec![0i64; world.size()];
    world
        .all_to_all((&peers).into(), (&mut theirs).into())
        .map_err(RuntimeError::comm(CommPhase::ParameterBroadcast { name: "(checks)".into() }))?;
    let failed = match &checked {
        Err(e) => Some(Failure { error: e.clone(), primary: true }),
        Ok(_) => (0..world.size())
            .find(|&m| peers[m] != theirs[m])
            .map(|peer| Failure { error: BroadcastError::Disagree { rank, peer }, primary: false }),
    };
    agree(world, failed.as_ref())?;
    let (report, transfers) = checked.expect("a failed check returned above");

    // The stage's communicator, then one group per distinct partition (positions in the stage).
    let (stages, d) = trainer.stages();
    let stage_list: Vec<Vec<usize>> = (0..stages).map(|s| (s * d..(s + 1) * d).collect()).collect();
    let phase = |partition| CommPhase::CreateGroups { partition };
    let stage = world.split(&stage_list).map_err(RuntimeError::comm(phase(0)))?.expect("every rank is in a stage");
    let mut partitions: Vec<Vec<Vec<usize>>> = Vec::new();
    for groups in report.redundancy.values() {
        let local: Vec<Vec<usize>> = groups.iter().filter(|g| g.len() > 1).map(|g| g.iter().map(|r| r - initial_rank).collect()).collect();
        if !local.is_empty() && !partitions.contains(&local) {
            partitions.push(local);
        }
    }
    let groups = CommGroups::create(stage.as_ref(), &partitions)?;
    let mut state = optimizer;
    for t in &transfers {
        let local: Vec<usize> = t.group.iter().map(|r| r - initial_rank).collect();
        let comm = groups.get(&local)?;
        let root = t.group.iter().position(|&r| r == t.owner).expect("the owner is in its group");
        match (&mut state, &t.state_of) {
            (Some(o), Some(param)) => {
                let value = match o.state().get(&t.name) {
                    Some(v) => broadcast_tensor(comm, v, &t.name, root)?,
                    None => {
                        let p = trainer.pieces_mut().require(param)?;
                        broadcast_tensor(comm, &autopar_tensor::Tensor::zeros(p.shape(), p.dtype()), &t.name, root)?
                    }
                };
                o.state_mut().insert(&t.name, value);
            }
            _ => {
                let store = trainer.pieces_mut();
                let value = broadcast_tensor(comm, store.require(&t.name)?, &t.name, root)?;
                store.insert(&t.name, value);
            }
        }
    }
    Ok(report)
}

/// For every rank `m` of the world, a fingerprint of the names and groups this rank broadcasts
/// with `m` (0: none). Two ranks that agree on what they share send each other equal values.
fn peer_fingerprints(transfers: &[Transfer], world_size: usize) -> Vec<i64> {
    let mut out = vec![0i64; world_size];
    for t in transfers {
        let h = fingerprint(&t.name, &t.group);
        for &m in &t.group {
            if let Some(slot) = out.get_mut(m) {
                *slot ^= h;
            }
        }
    }
    out
}

/// FNV-1a over a name and its group: the same on every process.
fn fingerprint(name: &str, group: &[usize]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = name.bytes().chain([0u8]).chain(group.iter().flat_map(|&r| (r as u64).to_le_bytes()));
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

/// This rank's checks and its part of the broadcast, or what is wrong.
fn check(
    trainer: &dyn Replicas,
    optimizer: Option<&dyn Optimizer>,
    rank: usize,
    layout: &LayoutSource,
    cur_rank: usize,
    initial_rank: usize,
    world_size: usize,
) -> Result<(BroadcastReport, Vec<Transfer>), BroadcastError> {
    if cur_rank != rank {
        return Err(BroadcastError::CurRank { cur_rank, rank });
    }
    let (stages, d) = trainer.stages();
    let start = rank / d * d;
    if initial_rank != start {
        return Err(BroadcastError::InitialRank { initial_rank, rank, start, stages, stage_devices: d });
    }
    for e in layout.entries() {
        let devices: usize = e.dev_matrix.iter().product();
        if devices != d {
            return Err(BroadcastError::Devices { name: e.name, dev_matrix: e.dev_matrix, devices, stage_devices: d });
        }
    }
    let redundancy = layout.redundancy(initial_rank, world_size)?;
    let owners = group_owners(&redundancy);
    let mut transfers = Vec::new();
    let mut report = BroadcastReport { owners: autopar_layout::redundancy::single_owners(&redundancy), ..Default::default() };
    for (name, groups) in &redundancy {
        let group = groups.iter().find(|g| g.contains(&rank)).cloned().unwrap_or_default();
        // A parameter, or the optimizer state of one: where the job stores this rank's piece.
        let (state_of, job) = match trainer.holders(name) {
            Some(job) => (None, job),
            None if trainer.in_network(name) => continue,
            None => match state_parameter(name) {
                Some(p) if trainer.in_network(p) => {
                    let keeps = optimizer.is_some_and(|o| o.state_keys(p).iter().any(|k| k == name));
                    match trainer.holders(p) {
                        Some(job) if keeps => (Some(p.to_string()), job),
                        _ => continue,
                    }
                }
                _ => return Err(unknown(trainer, name)),
            },
        };
        if job != group {
            return Err(BroadcastError::Replicas { name: name.clone(), rank, layout: group, job });
        }
        if group.len() <= 1 {
            continue;
        }
        let owner = owners[&(name.clone(), group.clone())];
        if owner == rank { &mut report.sent } else { &mut report.received }.push(name.clone());
        transfers.push(Transfer { name: name.clone(), state_of, group: group.clone(), owner });
    }
    report.redundancy = redundancy;
    Ok((report, transfers))
}

/// `name` is not the network's: suggest the closest name the rank holds.
fn unknown(trainer: &dyn Replicas, name: &str) -> BroadcastError {
    let closest = trainer
        .held_names()
        .into_iter()
        .map(|h| (edit_distance(name, &h), h))
        .min()
        .filter(|(d, h)| *d <= h.len().max(name.len()) / 2 + 1)
        .map(|(_, h)| h);
    BroadcastError::UnknownName { name: name.to_string(), closest }
}

/// Levenshtein distance between two names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The longest error text one rank sends the others.
const MAX_MESSAGE: usize = 2048;

/// A rank's reason to refuse: `primary` when its own checks failed, not when it only found
/// that a peer disagrees (a peer whose checks failed disagrees with everyone).
struct Failure {
    error: BroadcastError,
    primary: bool,
}

/// Every rank learns whether any rank refused (one all-gather over `world`). A rank whose own
/// checks failed returns its error; the others the text of the first rank whose checks failed
/// or, when none did, of the first rank that found a disagreement.
fn agree(world: &dyn Communicator, failed: Option<&Failure>) -> Result<()> {
    let mut mine = vec![0i32; MAX_MESSAGE + 2];
    if let Some(f) = failed {
        let text = f.error.to_string();
        let bytes = &text.as_bytes()[..text.len().min(MAX_MESSAGE)];
        mine[0] = bytes.len() as i32 + 1;
        mine[1] = i32::from(f.primary);
        for (d, &b) in mine[2..].iter_mut().zip(bytes) {
            *d = b as i32;
        }
    }
    let mut all = vec![0i32; (MAX_MESSAGE + 2) * world.size()];
    world
        .all_gather((&mine).into(), (&mut all).into())
        .map_err(RuntimeError::comm(CommPhase::ParameterBroadcast { name: "(checks)".into() }))?;
    let parts: Vec<&[i32]> = all.chunks(MAX_MESSAGE + 2).collect();
    let first = |primary: bool| parts.iter().position(|p| p[0] > 0 && (p[1] == 1) == primary);
    let Some(r) = first(true).or_else(|| first(false)) else { return Ok(()) };
    if let Some(f) = failed.filter(|f| f.primary || r == world.rank()) {
        return Err(RuntimeError::Broadcast(Box::new(f.error.clone())));
    }
    let bytes: Vec<u8> = parts[r][2..parts[r][0] as usize + 1].iter().map(|&b| b as u8).collect();
    let message = String::from_utf8_lossy(&bytes).into_owned();
    Err(RuntimeError::Broadcast(Box::new(BroadcastError::OnRank { rank: r, message })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("l1.w", "l1.w"), 0);
        assert_eq!(edit_distance("l1.w", "l2.w"), 1);
        assert_eq!(edit_distance("fc.weight", "fc.wieght"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn fixture_layout_dict_gives_mindspores_groups() {
        // MindSpore 2.10's layout of the optimizer-sharded fixture on rank 0 (8 devices).
        let text = "l1.w: ([2, 4], [-1, 0], [64, 32], 0, True, '2-16453000547691086251', [64, 128], [64, 32], False, False, 0, 0)\n\
                    l2.b: ([2, 4], [-1], [32], 0, True, 'hccl_world_group', [32], [32], False, False, 0, 0)\n\
                    inputs0: ([8], [0, -1], [32, 64], 0, True, '', [256, 64], [32, 64], False, False, 0, 0)";
        let dict = text.lines().map(|l| ParameterLayout::parse_line(l.trim()).unwrap()).collect();
        let r = LayoutSource::Dict(dict).redundancy(0, 8).unwrap();
        assert_eq!(r["l1.w"], vec![vec![0], vec![4], vec![1], vec![5], vec![2], vec![6], vec![3], vec![7]]);
        assert_eq!(r["l2.b"], (0..8).map(|i| vec![i]).collect::<Vec<_>>());
        assert_eq!(r["inputs0"], (0..8).map(|i| vec![i]).collect::<Vec<_>>());
    }
}
