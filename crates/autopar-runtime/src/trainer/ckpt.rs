//! Training checkpoints: parameters and optimizer state of one rank in one safetensors file,
//! with the run's position in `__metadata__`, written atomically.
//!
//! Layout: stand-alone `<dir>/<prefix>-<step>.safetensors`; a parallel run writes one file per
//! rank, `<dir>/rank_<k>/<prefix>-<step>_<k>.safetensors`, holding that rank's local slices.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use autopar_checkpoint::{CheckpointFile, PieceReader};
use autopar_tensor::{DType, Tensor};

use super::error::{TrainError, TrainResult};
use crate::executor::ParamStore;
use crate::loss_scale::LossScaleState;

/// The `format` metadata value of a training checkpoint.
pub const FORMAT: &str = "autopar-train-1";

/// Where a run stands: saved with every checkpoint, read back to resume.
#[derive(Clone, Debug, PartialEq)]
pub struct RunPosition {
    /// Steps completed (the global step count).
    pub step: u64,
    /// Epoch of the next batch (counted from 0).
    pub epoch: u64,
    /// Batches of that epoch already consumed.
    pub step_in_epoch: u64,
    /// Ranks of the run that wrote the checkpoint.
    pub world_size: usize,
    /// The rank whose file this is, global.
    pub rank: usize,
    /// Global batch size (the data position is counted in its batches).
    pub batch_size: usize,
    /// The run's parallel mode, as MindSpore names it (`stand_alone`, `data_parallel`, ...).
    pub parallel_mode: String,
    /// The run's id, the same in every checkpoint of a run and its resumptions (empty: a file
    /// written before autopar recorded it).
    pub run_id: String,
    /// What the data position counts in: the training set's sample count, the seed of its
    /// order (and of synthetic data) and whether it is shuffled (None: a file written before
    /// autopar recorded them).
    pub data: Option<DataStream>,
    /// Updates the optimizer applied (fewer than `step` when loss scaling skipped steps; None:
    /// a file written before autopar recorded it, whose every step was applied).
    pub optimizer_steps: Option<u64>,
    /// The run's loss scaling when it scaled the loss: the choice, the next step's scale and
    /// its last overflow (None: no loss scaling, or a file written before autopar recorded it).
    pub loss_scale: Option<LossScaleState>,
}

/// What makes a data position mean the same batches in another run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataStream {
    /// Samples in the training set.
    pub samples: u64,
    /// The run's seed.
    pub seed: u64,
    /// Whether each epoch is shuffled.
    pub shuffle: bool,
}

impl RunPosition {
    /// Updates the optimizer applied by this position: its step count.
    pub fn updates(&self) -> u64 {
        self.optimizer_steps.unwrap_or(self.step)
    }

    /// The position as safetensors `__metadata__` entries, with `format` set to [`FORMAT`].
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("format".into(), FORMAT.into());
        m.insert("step".into(), self.step.to_string());
        m.insert("epoch".into(), self.epoch.to_string());
        m.insert("step_in_epoch".into(), self.step_in_epoch.to_string());
        m.insert("world_size".into(), self.world_size.to_string());
        m.insert("rank".into(), self.rank.to_string());
        m.insert("batch_size".into(), self.batch_size.to_string());
        m.insert("parallel_mode".into(), self.parallel_mode.clone());
        m.insert("run_id".into(), self.run_id.clone());
        if let Some(d) = &self.data {
            m.insert("data_samples".into(), d.samples.to_string());
            m.insert("seed".into(), d.seed.to_string());
            m.insert("shuffle".into(), d.shuffle.to_string());
        }
        if let Some(n) = self.optimizer_steps {
            m.insert("optimizer_steps".into(), n.to_string());
        }
        if let Some(l) = &self.loss_scale {
            m.insert("loss_scale_kind".into(), l.kind.to_string());
            // f64's shortest round-trip form: read back bit for bit.
            m.insert("loss_scale".into(), crate::loss_scale::scale_text(l.scale));
            m.insert("loss_scale_last_overflow".into(), l.last_overflow_iter.to_string());
        }
        m
    }

    /// The position a checkpoint's metadata records; `path` names the file in errors, which say
    /// when the metadata is not a training checkpoint's or a key is missing or malformed.
    pub fn from_metadata(path: &Path, m: &BTreeMap<String, String>) -> TrainResult<Self> {
        let bad = |problem: String| TrainError::Resume {
            path: path.to_path_buf(),
            problem,
            hint: "resume from a checkpoint written by `autopar train` (its __metadata__ records the step and data position)".into(),
        };
        match m.get("format") {
            Some(f) if f == FORMAT => {}
            Some(f) => return Err(bad(format!("its metadata says format {f:?}, expected {FORMAT:?}"))),
            None => return Err(bad("it has no training metadata (format, step, epoch, ...)".into())),
        }
        let num = |key: &str| -> TrainResult<u64> {
            let v = m.get(key).ok_or_else(|| bad(format!("metadata key {key} is missing")))?;
            v.parse().map_err(|_| bad(format!("metadata {key} = {v:?} is not a number")))
        };
        let step = num("step")?;
        Ok(RunPosition {
            step,
            epoch: num("epoch")?,
            step_in_epoch: num("step_in_epoch")?,
            world_size: num("world_size")? as usize,
            rank: num("rank")? as usize,
            batch_size: num("batch_size")? as usize,
            parallel_mode: m.get("parallel_mode").cloned().unwrap_or_else(|| "stand_alone".into()),
            run_id: m.get("run_id").cloned().unwrap_or_default(),
            data: match m.get("data_samples") {
                None => None,
                Some(_) => Some(DataStream {
                    samples: num("data_samples")?,
                    seed: num("seed")?,
                    shuffle: match m.get("shuffle").map(String::as_str) {
                        Some("true") => true,
                        Some("false") => false,
                        other => return Err(bad(format!("metadata shuffle = {other:?} is not true or false"))),
                    },
                }),
            },
            optimizer_steps: match m.get("optimizer_steps") {
                None => None,
                Some(_) => Some(num("optimizer_steps")?)
                    .filter(|&n| n <= step)
                    .map(Some)
                    .ok_or_else(|| bad(format!("metadata optimizer_steps = {} is more than its {step} steps", m["optimizer_steps"])))?,
            },
            loss_scale: match m.get("loss_scale") {
                None => None,
                Some(v) => {
                    let kind = m.get("loss_scale_kind").map(String::as_str).unwrap_or_default();
                    Some(LossScaleState {
                        kind: kind.parse().map_err(|e| bad(format!("metadata loss_scale_kind: {e}")))?,
                        scale: v
                            .parse::<f64>()
                            .ok()
                            .filter(|s| s.is_finite() && *s > 0.0)
                            .ok_or_else(|| bad(format!("metadata loss_scale = {v:?} is not a positive number")))?,
                        last_overflow_iter: Some(num("loss_scale_last_overflow")?).filter(|&n| n <= step).ok_or_else(|| {
                            bad(format!("metadata loss_scale_last_overflow = {} is past its {step} steps", m["loss_scale_last_overflow"]))
                        })?,
                    })
                }
            },
        })
    }
}

/// The checkpoint file of `rank` at `step`.
pub fn checkpoint_path(dir: &Path, prefix: &str, step: u64, rank: usize, world_size: usize) -> PathBuf {
    if world_size <= 1 {
        dir.join(format!("{prefix}-{step}.safetensors"))
    } else {
        dir.join(format!("rank_{rank}")).join(format!("{prefix}-{step}_{rank}.safetensors"))
    }
}

/// The step of a checkpoint file name written by [`checkpoint_path`] for `prefix` and `rank`.
pub fn step_of(name: &str, prefix: &str, rank: usize, world_size: usize) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?.strip_suffix(".safetensors")?;
    let digits = if world_size <= 1 { rest } else { rest.strip_suffix(&format!("_{rank}"))? };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The checkpoints of `rank` under `dir`, oldest first.
pub fn list_checkpoints(dir: &Path, prefix: &str, rank: usize, world_size: usize) -> Vec<(u64, PathBuf)> {
    let folder = if world_size <= 1 { dir.to_path_buf() } else { dir.join(format!("rank_{rank}")) };
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&folder)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            step_of(&name, prefix, rank, world_size).map(|s| (s, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The file of `rank` that belongs with `path` (the file of some rank of the same checkpoint).
pub fn rank_file(path: &Path, from_rank: usize, rank: usize, world_size: usize) -> PathBuf {
    if world_size <= 1 || from_rank == rank {
        return path.to_path_buf();
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let stem = name.strip_suffix(&format!("_{from_rank}.safetensors")).unwrap_or(name);
    let root = path.parent().and_then(Path::parent).unwrap_or(Path::new("."));
    root.join(format!("rank_{rank}")).join(format!("{stem}_{rank}.safetensors"))
}

/// Write `params` and `state` (optimizer) to `path` with `position` as metadata, atomically.
pub fn save_checkpoint(path: &Path, params: &ParamStore, state: &ParamStore, position: &RunPosition) -> TrainResult<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| TrainError::Write { path: dir.to_path_buf(), source })?;
    }
    crate::checkpoint_io::save_tensors(path, params.iter().chain(state.iter()), &position.to_metadata())
        .map_err(|source| TrainError::Checkpoint { path: path.to_path_buf(), error: Box::new(source) })
}

/// An opened checkpoint file.
pub struct Loaded {
    /// The file that was opened.
    pub path: PathBuf,
    /// The file's tensors and metadata.
    pub file: CheckpointFile,
}

impl Loaded {
    /// Opens the checkpoint at `path`; errors when it does not exist or is not a checkpoint file.
    pub fn open(path: &Path) -> TrainResult<Self> {
        if !path.is_file() {
            return Err(TrainError::Resume {
                path: path.to_path_buf(),
                problem: "the file does not exist".into(),
                hint: "pass a .safetensors file written by the checkpoint callback (rank 0's file for a parallel run)".into(),
            });
        }
        let file =
            CheckpointFile::open(path).map_err(|source| TrainError::Checkpoint { path: path.to_path_buf(), error: Box::new(source) })?;
        Ok(Self { path: path.to_path_buf(), file })
    }

    /// [`Self::open`] for reading the metadata alone: the file's CRC is not checked (that
    /// reads every byte), so a caller that loads tensors opens it with [`Self::open`].
    pub fn open_metadata(path: &Path) -> TrainResult<Self> {
        let file = CheckpointFile::open_with(path, autopar_checkpoint::OpenOptions { verify_crc: false })
            .map_err(|source| TrainError::Checkpoint { path: path.to_path_buf(), error: Box::new(source) })?;
        Ok(Self { path: path.to_path_buf(), file })
    }

    /// Whether the file holds a tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.file.get(name).is_some()
    }

    /// Tensor `name`, checked against `shape`.
    pub fn tensor(&self, name: &str, shape: &[usize]) -> TrainResult<Tensor> {
        let entry = self.file.get(name).ok_or_else(|| TrainError::InitMissing {
            path: self.path.clone(),
            name: name.to_string(),
            shape: shape.to_vec(),
        })?;
        if entry.shape != shape {
            return Err(TrainError::InitShape {
                path: self.path.clone(),
                name: name.to_string(),
                shape: shape.to_vec(),
                got: entry.shape.clone(),
            });
        }
        let (dtype, eshape) = (entry.dtype, entry.shape.clone());
        let bytes = self.file.read(name).map_err(|source| TrainError::Checkpoint { path: self.path.clone(), error: Box::new(source) })?;
        Ok(crate::checkpoint_io::tensor_from_bytes(dtype, &eshape, &bytes, name, &self.path)?)
    }

    /// Every tensor whose name starts with one of `prefixes`.
    pub fn tensors_with_prefix(&self, prefixes: &[&str]) -> TrainResult<Vec<(String, Tensor)>> {
        let names: Vec<(String, Vec<usize>)> = self
            .file
            .tensors()
            .iter()
            .filter(|e| prefixes.iter().any(|p| e.name.starts_with(p)))
            .map(|e| (e.name.clone(), e.shape.clone()))
            .collect();
        names.into_iter().map(|(n, s)| Ok((n.clone(), self.tensor(&n, &s)?))).collect()
    }
}

/// A checkpoint that ranks read their own pieces of: per-rank files saved under a strategy
/// file, or whole tensors (no strategy), named in errors by `path` (the file or folder the
/// user gave).
#[derive(Clone, Debug)]
pub struct PieceSource {
    /// The file or folder the user gave.
    pub path: PathBuf,
    /// Source files by global rank (one file of whole tensors: rank 0).
    pub files: BTreeMap<usize, PathBuf>,
    /// The strategy the files were saved under (None: whole tensors).
    pub strategy: Option<PathBuf>,
}

impl PieceSource {
    /// The checkpoint at `path`: a Hugging Face checkpoint (a `save_pretrained` folder, or its
    /// shards' index), a folder of per-rank files (`rank_<k>/`) with the strategy they were
    /// saved under (`strategy`, else `strategy.json` beside them; not needed for one file), or
    /// a file of whole tensors.
    pub fn open(path: &Path, strategy: Option<PathBuf>) -> TrainResult<Self> {
        let ck_err = |e: autopar_checkpoint::CheckpointError| TrainError::Checkpoint { path: path.to_path_buf(), error: Box::new(e) };
        if let Some(files) = autopar_checkpoint::hf::shard_files(path).map_err(ck_err)? {
            if let Some(s) = strategy {
                return Err(TrainError::Config {
                    option: "init_strategy",
                    value: s.display().to_string(),
                    expected: format!("none: {} is a Hugging Face checkpoint of whole tensors", path.display()),
                    hint: "drop the strategy file; it describes per-rank checkpoints".into(),
                });
            }
            return Ok(Self { path: path.to_path_buf(), files, strategy: None });
        }
        if path.is_dir() {
            let (files, _) = autopar_checkpoint::collect_rank_files(path).map_err(ck_err)?;
            let beside = path.join("strategy.json");
            let strategy = strategy.or_else(|| beside.is_file().then_some(beside));
            if strategy.is_none() && files.len() > 1 {
                return Err(TrainError::Config {
                    option: "init",
                    value: path.display().to_string(),
                    expected: format!("the strategy file of the {} per-rank checkpoints in it", files.len()),
                    hint: "pass `init_strategy=FILE`, the strategy file they were saved under (autopar writes strategy.json beside its checkpoints)"
                        .into(),
                });
            }
            return Ok(Self { path: path.to_path_buf(), files, strategy });
        }
        if path.is_file() {
            return Ok(Self { path: path.to_path_buf(), files: [(0, path.to_path_buf())].into(), strategy: None });
        }
        Err(ck_err(autopar_checkpoint::CheckpointError::NotFound { what: "checkpoint", path: path.to_path_buf() }))
    }

    /// A reader of the source for rank `rank` (which prefers the replicas nearest to it).
    pub fn reader(&self, rank: usize) -> TrainResult<PieceReader> {
        PieceReader::new(self.files.clone(), self.strategy.as_deref(), rank)
            .map_err(|e| TrainError::Checkpoint { path: self.path.clone(), error: Box::new(e) })
    }

    /// The full shape of tensor `name` in the source (None: no file holds it), checked against
    /// `shape`, the network's.
    pub fn check(&self, reader: &mut PieceReader, name: &str, shape: &[usize]) -> TrainResult<Option<()>> {
        let found = reader.full_shape(name).map_err(|e| TrainError::Checkpoint { path: self.path.clone(), error: Box::new(e) })?;
        match found {
            None => Ok(None),
            Some((_, got)) if got != shape => {
                Err(TrainError::InitShape { path: self.path.clone(), name: name.to_string(), shape: shape.to_vec(), got })
            }
            Some(_) => Ok(Some(())),
        }
    }

    /// The piece `slice` of tensor `name` (full shape `shape`) as `dtype`, read from the bytes
    /// of the files holding it; None when no file holds `name`.
    pub fn piece(
        &self,
        reader: &mut PieceReader,
        name: &str,
        shape: &[usize],
        slice: &[Range<usize>],
        dtype: DType,
    ) -> TrainResult<Option<Tensor>> {
        if self.check(reader, name, shape)?.is_none() {
            return Ok(None);
        }
        let ck = |e| TrainError::Checkpoint { path: self.path.clone(), error: Box::new(e) };
        let Some((stored, bytes)) = reader.read_box(name, slice).map_err(ck)? else { return Ok(None) };
        let piece: Vec<usize> = slice.iter().map(|r| r.len()).collect();
        Ok(Some(crate::checkpoint_io::tensor_from_bytes(stored, &piece, &bytes, name, &self.path)?.cast(dtype)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_the_step_and_the_rank_and_parse_back() {
        let dir = Path::new("ck");
        assert_eq!(checkpoint_path(dir, "net", 40, 0, 1), Path::new("ck/net-40.safetensors"));
        let p3 = checkpoint_path(dir, "net", 40, 3, 4);
        assert_eq!(p3, Path::new("ck/rank_3/net-40_3.safetensors"));
        assert_eq!(step_of("net-40.safetensors", "net", 0, 1), Some(40));
        assert_eq!(step_of("net-40_3.safetensors", "net", 3, 4), Some(40));
        assert_eq!(step_of("net-40_2.safetensors", "net", 3, 4), None);
        assert_eq!(step_of("other-40.safetensors", "net", 0, 1), None);
        assert_eq!(step_of("net-4x.safetensors", "net", 0, 1), None);
        assert_eq!(rank_file(&p3, 3, 1, 4), Path::new("ck/rank_1/net-40_1.safetensors"));
    }

    #[test]
    fn a_checkpoint_round_trips_tensors_and_position_and_rejects_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/net-7.safetensors");
        let mut params = ParamStore::new();
        params.insert("w", Tensor::from_vec(&[2, 3], vec![1.5f32, -2.0, 3.25, 0.0, 1e-8, 7.0]).unwrap());
        params.insert("steps", Tensor::from_vec(&[1], vec![9i64]).unwrap());
        let mut state = ParamStore::new();
        state.insert("moments.w", Tensor::from_vec(&[2, 3], vec![0.5f64; 6]).unwrap());
        let pos = RunPosition {
            step: 7,
            epoch: 1,
            step_in_epoch: 2,
            world_size: 1,
            rank: 0,
            batch_size: 16,
            parallel_mode: "stand_alone".into(),
            run_id: "0123456789abcdef".into(),
            data: Some(DataStream { samples: 640, seed: 3, shuffle: true }),
            optimizer_steps: Some(5),
            loss_scale: Some(LossScaleState { kind: crate::LossScale::DYNAMIC, scale: 0.1 + 0.2, last_overflow_iter: 5 }),
        };
        save_checkpoint(&path, &params, &state, &pos).unwrap();
        let names: Vec<String> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, ["net-7.safetensors"], "no temp file is left behind");
        let ck = Loaded::open(&path).unwrap();
        assert_eq!(RunPosition::from_metadata(&path, ck.file.metadata()).unwrap(), pos);
        assert!(ck.tensor("w", &[2, 3]).unwrap().bit_eq(params.get("w").unwrap()));
        assert!(ck.tensor("moments.w", &[2, 3]).unwrap().bit_eq(state.get("moments.w").unwrap()));
        assert!(matches!(ck.tensor("w", &[3, 2]), Err(TrainError::InitShape { .. })));
        assert!(matches!(ck.tensor("v", &[1]), Err(TrainError::InitMissing { .. })));

        let mut meta = BTreeMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let err = RunPosition::from_metadata(&path, &meta).unwrap_err();
        assert!(err.to_string().contains("format \"pt\""), "{err}");
        let err = Loaded::open(&dir.path().join("missing.safetensors")).err().unwrap();
        assert!(err.to_string().contains("missing.safetensors"), "{err}");
    }
}
