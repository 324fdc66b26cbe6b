//! Any box of any tensor of a checkpoint saved as per-rank files, read from the bytes of the
//! files that hold it: what a rank of a job loading a checkpoint saved under another strategy
//! or device count reads for its own slices, without the full tensor or another rank's pieces
//! ever entering the process. Each stored piece (model-parallel slice, then optimizer shard of
//! dimension 0) is a box of the full tensor; the box asked for is the union of its
//! intersections with those pieces, copied with positioned reads of their rows.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::checkpoint::{CheckpointFile, OpenOptions};
use crate::dtype::DType;
use crate::error::{CheckpointError, Result};
use crate::strategy::{LayoutMap, ParamLayout, StrategyFile};
use crate::transform::{cover_box, Side};

/// Where one tensor's pieces lie: its layout in the source files, the first global rank of its
/// stage, its element type and full shape.
struct Placed {
    side: Side,
    base: usize,
    dtype: DType,
    full: Vec<usize>,
}

/// A checkpoint of per-rank files (`files`: global rank -> file) saved under a strategy, or
/// whole tensors (no strategy: each file holds every tensor whole), read a box at a time.
/// Files are opened when a box first needs them.
pub struct PieceReader {
    paths: BTreeMap<usize, PathBuf>,
    open: BTreeMap<usize, CheckpointFile>,
    /// The source layouts, the devices of a stage, and the strategy file.
    strategy: Option<(LayoutMap, usize, PathBuf)>,
    /// Of replicas holding the same piece, the reader prefers the one whose device coordinates
    /// agree most with this rank's (so that ranks spread their reads over the files).
    near: usize,
    verify_crc: bool,
}

impl std::fmt::Debug for PieceReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceReader").field("files", &self.paths.len()).field("near", &self.near).finish()
    }
}

impl PieceReader {
    /// A reader of the rank files `files` saved under the strategy file `strategy` (None: whole
    /// tensors in every file), preferring among replicas those nearest to rank `near`.
    pub fn new(files: BTreeMap<usize, PathBuf>, strategy: Option<&Path>, near: usize) -> Result<Self> {
        let strategy = match strategy {
            None => None,
            Some(p) => {
                let s = StrategyFile::load(p)?;
                if s.layout_items.is_empty() {
                    return Err(CheckpointError::EmptyStrategy { path: p.to_path_buf(), missing: "layout items" });
                }
                let map = s.layout_map()?;
                let devs = map.stage_device_num().max(1);
                Some((map, devs, p.to_path_buf()))
            }
        };
        Ok(Self { paths: files, open: BTreeMap::new(), strategy, near, verify_crc: true })
    }

    /// Whether source files' CRCs are verified when they are opened (default: yes).
    pub fn verify_crc(mut self, on: bool) -> Self {
        self.verify_crc = on;
        self
    }

    fn file(&mut self, rank: usize) -> Result<&CheckpointFile> {
        if !self.open.contains_key(&rank) {
            let path = self.paths.get(&rank).ok_or(CheckpointError::MissingRankFile { rank })?;
            let f = CheckpointFile::open_with(path, OpenOptions { verify_crc: self.verify_crc })?;
            self.open.insert(rank, f);
        }
        Ok(&self.open[&rank])
    }

    /// The first given file among `ranks` that holds `name`, with its entry's local shape.
    fn holder(&mut self, ranks: impl Iterator<Item = usize>, name: &str) -> Result<Option<(usize, DType, Vec<usize>)>> {
        let given: Vec<usize> = ranks.filter(|r| self.paths.contains_key(r)).collect();
        for r in given {
            if let Some(e) = self.file(r)?.get(name) {
                return Ok(Some((r, e.dtype, e.shape.clone())));
            }
        }
        Ok(None)
    }

    /// Where `name`'s pieces lie; None when no file holds it.
    fn placed(&mut self, name: &str) -> Result<Option<Placed>> {
        let layout: Option<(ParamLayout, usize)> = self.strategy.as_ref().and_then(|(map, devs, _)| {
            let p = map.layout_of(name)?;
            Some((p.clone(), p.stages.iter().min().copied().unwrap_or(0) as usize * devs))
        });
        let Some((p, base)) = layout else {
            // Whole tensors: any file holding it has all of it (each of a Hugging Face
            // checkpoint's shards holds some tensors), read from the first that does.
            let ranks: Vec<usize> = self.paths.keys().copied().collect();
            let Some((holder, dtype, full)) = self.holder(ranks.into_iter(), name)? else { return Ok(None) };
            let unsplit = ParamLayout::unsharded(full.len());
            let side = Side::new(&unsplit, &full, name, "source")?;
            return Ok(Some(Placed { side, base: holder, dtype, full }));
        };
        let devs = self.strategy.as_ref().map_or(1, |s| s.1);
        let Some((first, dtype, local)) = self.holder(base..base + devs, name)? else { return Ok(None) };
        let p = p.for_ndim(local.len());
        let (fake, _) = Side::fake(&p, &p, name)?;
        let (splits, opt) = (fake.layout.splits(), fake.opt);
        if splits.len() != local.len() {
            let path = self.paths[&first].clone();
            return Err(CheckpointError::ShapeMismatch {
                tensor: name.to_string(),
                rank: first,
                path,
                expected: fake.local_shape(),
                actual: local,
            });
        }
        let mut full: Vec<usize> = local.iter().zip(&splits).map(|(d, s)| d * s).collect();
        if let Some(d0) = full.first_mut() {
            *d0 *= opt;
        }
        if let Some(ts) = p.tensor_shape.as_ref().filter(|ts| **ts != full) {
            return Err(CheckpointError::StrategyShapeMismatch {
                tensor: name.to_string(),
                which: "source",
                file: self.strategy.as_ref().map(|s| s.2.clone()),
                strategy: ts.clone(),
                checkpoint: full,
            });
        }
        let side = Side::new(&p, &full, name, "source")?;
        Ok(Some(Placed { side, base, dtype, full }))
    }

    /// The names of the tensors: of every file of whole tensors (the shards of a Hugging Face
    /// checkpoint), or of the first of per-rank files (one rank's entries).
    pub fn names(&mut self) -> Result<Vec<String>> {
        let files: Vec<usize> = match self.strategy {
            None => self.paths.keys().copied().collect(),
            Some(_) => self.paths.keys().next().copied().into_iter().collect(),
        };
        let mut names = Vec::new();
        for r in files {
            for t in self.file(r)?.tensors() {
                if !names.contains(&t.name) {
                    names.push(t.name.clone());
                }
            }
        }
        Ok(names)
    }

    /// The element type and full shape of tensor `name`; None when no file holds it.
    pub fn full_shape(&mut self, name: &str) -> Result<Option<(DType, Vec<usize>)>> {
        Ok(self.placed(name)?.map(|p| (p.dtype, p.full)))
    }

    /// The box `region` (one range per dimension of the full tensor) of tensor `name`: its
    /// element type, and its bytes, row-major in the box's shape. None when no file holds
    /// `name`; an error when a piece the box needs is in no given file, or a file's piece has
    /// another shape or type than the strategy says.
    pub fn read_box(&mut self, name: &str, region: &[Range<usize>]) -> Result<Option<(DType, Vec<u8>)>> {
        let Some(placed) = self.placed(name)? else { return Ok(None) };
        if region.len() != placed.full.len() || region.iter().zip(&placed.full).any(|(r, &n)| r.start > r.end || r.end > n) {
            return Err(CheckpointError::InvalidArgument(crate::error::Misuse::RegionOutside {
                name: name.to_string(),
                region: region.to_vec(),
                shape: placed.full.clone(),
            }));
        }
        let shape: Vec<usize> = region.iter().map(|r| r.len()).collect();
        let esz = placed.dtype.size();
        let mut buf = vec![0u8; shape.iter().product::<usize>() * esz];
        if buf.is_empty() {
            return Ok(Some((placed.dtype, buf)));
        }
        let expect = placed.side.local_shape();
        let paths = &self.paths;
        let base = placed.base;
        let pieces = cover_box(&placed.side, region, self.near, &|q| paths.contains_key(&(base + q)));
        for (q, src_region, inter) in pieces {
            let rank = base + q;
            let f = self.file(rank)?;
            let e = f.get(name).ok_or_else(|| CheckpointError::MissingTensor { path: f.path().to_path_buf(), tensor: name.to_string() })?;
            if e.shape != expect {
                return Err(CheckpointError::ShapeMismatch {
                    tensor: name.to_string(),
                    rank,
                    path: f.path().to_path_buf(),
                    expected: expect,
                    actual: e.shape.clone(),
                });
            }
            if e.dtype != placed.dtype {
                return Err(CheckpointError::DtypeMismatch {
                    tensor: name.to_string(),
                    rank,
                    path: f.path().to_path_buf(),
                    expected: placed.dtype.to_string(),
                    actual: e.dtype.to_string(),
                });
            }
            let src_box: Vec<Range<usize>> = inter.iter().zip(&src_region).map(|(i, r)| i.start - r.start..i.end - r.start).collect();
            let dst_start: Vec<usize> = inter.iter().zip(region).map(|(i, r)| i.start - r.start).collect();
            f.copy_region(name, &src_box, &mut buf, &shape, &dst_start)?;
        }
        Ok(Some((placed.dtype, buf)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{save, TensorSpec};
    use crate::strategy::LayoutItem;

    /// A [4, 6] f32 tensor `w` with values 0..24, saved as the pieces of `item`'s layout over
    /// `devices` ranks (`piece(rank)`: its box), and its strategy file.
    fn saved(
        dir: &Path,
        item: LayoutItem,
        devices: usize,
        piece: &dyn Fn(usize) -> Vec<Range<usize>>,
    ) -> (BTreeMap<usize, PathBuf>, PathBuf) {
        let full: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let mut files = BTreeMap::new();
        for r in 0..devices {
            let b = piece(r);
            let mut bytes = Vec::new();
            for i in b[0].clone() {
                for j in b[1].clone() {
                    bytes.extend_from_slice(&full[i * 6 + j].to_le_bytes());
                }
            }
            let path = dir.join(format!("rank_{r}/w_{r}.safetensors"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let spec = TensorSpec { name: "w".into(), dtype: DType::Float32, shape: b.iter().map(|r| r.len()).collect() };
            save(&path, &[(spec, bytes)], &BTreeMap::new()).unwrap();
            files.insert(r, path);
        }
        let strategy = dir.join("strategy.json");
        StrategyFile { current_stage: 0, strategy_items: Vec::new(), layout_items: vec![item] }.save(&strategy).unwrap();
        (files, strategy)
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn a_box_across_column_slices_is_assembled_from_the_files_that_hold_it() {
        let dir = tempfile::tempdir().unwrap();
        // w split 2 ways on its columns over 2 ranks: [4, 3] each.
        let (files, strategy) =
            saved(dir.path(), LayoutItem::new("w", vec![2], vec![vec![-1], vec![0]]), 2, &|r| vec![0..4, r * 3..r * 3 + 3]);
        let mut reader = PieceReader::new(files.clone(), Some(&strategy), 0).unwrap();
        assert_eq!(reader.full_shape("w").unwrap(), Some((DType::Float32, vec![4, 6])));
        // rows 1..3, columns 2..5: straddles both files
        let (dtype, bytes) = reader.read_box("w", &[1..3, 2..5]).unwrap().unwrap();
        assert_eq!(dtype, DType::Float32);
        assert_eq!(floats(&bytes), vec![8.0, 9.0, 10.0, 14.0, 15.0, 16.0]);
        assert!(reader.read_box("v", &[Range { start: 0, end: 1 }]).unwrap().is_none(), "a tensor no file holds");
        // the second file missing: the box needs it
        let mut only0 = files.clone();
        only0.remove(&1);
        let e = PieceReader::new(only0, Some(&strategy), 0).unwrap().read_box("w", &[0..1, 0..6]).unwrap_err();
        assert!(matches!(e, CheckpointError::MissingRankFile { rank: 1 }), "{e}");
        // a box inside rank 0's piece does not open rank 1's file
        let mut reader = PieceReader::new(files, Some(&strategy), 0).unwrap();
        let (_, bytes) = reader.read_box("w", &[0..4, 0..1]).unwrap().unwrap();
        assert_eq!(floats(&bytes), vec![0.0, 6.0, 12.0, 18.0]);
        assert_eq!(reader.open.keys().copied().collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn whole_tensors_without_a_strategy_are_read_from_any_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = saved(dir.path(), LayoutItem::new("w", vec![1], vec![vec![-1], vec![-1]]), 1, &|_| vec![0..4, 0..6]);
        let mut reader = PieceReader::new(files, None, 3).unwrap();
        let (_, bytes) = reader.read_box("w", &[3..4, 4..6]).unwrap().unwrap();
        assert_eq!(floats(&bytes), vec![22.0, 23.0]);
        let e = reader.read_box("w", &[0..5, 0..6]).unwrap_err();
        assert!(e.to_string().contains("w"), "{e}");
    }
}
