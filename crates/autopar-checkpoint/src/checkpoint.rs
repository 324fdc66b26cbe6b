//! One API over both checkpoint formats: open (index only), read whole tensors (from a memory
//! map) or boxes of them (positioned reads of their bytes only), write with atomic rename, and folder-level helpers
//! (`rank_<k>/` discovery, segmented loading).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};

use crate::ckpt::{self, CkptWriter};
use crate::dtype::DType;
use crate::error::{CheckpointError, Misuse, Result};
use crate::io::copy_box;
use crate::safetensors::{self as st, SafetensorsWriter};

/// The two checkpoint formats. The file extension decides: `.safetensors`, otherwise `.ckpt`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// MindSpore's protobuf `.ckpt` format.
    Ckpt,
    /// The safetensors format (`.safetensors`).
    Safetensors,
}

impl Format {
    /// The file extension, without the dot.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Ckpt => "ckpt",
            Format::Safetensors => "safetensors",
        }
    }

    /// The format a path's extension names; `None` for any other extension.
    pub fn of_path(path: &Path) -> Option<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("ckpt") => Some(Format::Ckpt),
            Some("safetensors") => Some(Format::Safetensors),
            _ => None,
        }
    }
}

impl std::str::FromStr for Format {
    type Err = CheckpointError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ckpt" => Ok(Format::Ckpt),
            "safetensors" => Ok(Format::Safetensors),
            o => Err(CheckpointError::InvalidArgument(Misuse::UnknownFormat { format: o.to_string() })),
        }
    }
}

/// One tensor of a checkpoint file: name, element type, shape and where its bytes lie in the file
/// (one range, or one per chunk for `.ckpt` values over 512 MiB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// The tensor's name (MindSpore's parameter name).
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// Byte ranges of the tensor's data in the file, in order.
    pub segments: Vec<Range<u64>>,
}

impl TensorEntry {
    /// Bytes of data the file holds for the tensor (all segments together).
    pub fn byte_len(&self) -> u64 {
        self.segments.iter().map(|s| s.end - s.start).sum()
    }

    /// Bytes the dtype and shape call for (strings: the stored length).
    pub fn expected_len(&self) -> u64 {
        if self.dtype == DType::Str {
            return self.byte_len();
        }
        self.shape.iter().fold(self.dtype.size() as u64, |acc, &d| acc.saturating_mul(d as u64))
    }
}

/// Options for [`CheckpointFile::open_with`].
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Verify a `.ckpt` CRC trailer or a safetensors `crc_num` when present (reads the whole file once).
    pub verify_crc: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self { verify_crc: true }
    }
}

/// An open checkpoint: its tensor index, with data read on demand through memory maps.
pub struct CheckpointFile {
    path: PathBuf,
    format: Format,
    file: File,
    tensors: Vec<TensorEntry>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
    crc: Option<u32>,
    /// The file's length when it was opened: a file rewritten in place since (a `cp` over it)
    /// is refused before it is mapped, rather than read past its new end (a bus error).
    len: u64,
}

impl std::fmt::Debug for CheckpointFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFile")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl CheckpointFile {
    /// Opens a checkpoint and reads its index, verifying its CRC when it has one; the format comes from the extension.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, OpenOptions::default())
    }

    /// [`Self::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Err(CheckpointError::IsADirectory { path: path.to_path_buf(), what: "checkpoint" });
        }
        let format = Format::of_path(path).ok_or_else(|| CheckpointError::UnknownFormat { path: path.to_path_buf() })?;
        let mut file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::NotFound { what: "checkpoint", path: path.to_path_buf() },
            _ => CheckpointError::Io { op: "open", path: path.to_path_buf(), source: e },
        })?;
        let len = file.metadata().map_err(CheckpointError::io("stat", path))?.len();
        let (tensors, metadata, crc) = match format {
            Format::Ckpt => {
                if len == 0 {
                    (Vec::new(), BTreeMap::new(), None)
                } else {
                    // SAFETY: the file is opened read-only; autopar never writes a checkpoint in
                    // place (writers rename a new file over the old one), so the mapping is stable.
                    let map = unsafe { Mmap::map(&file) }.map_err(CheckpointError::io("map", path))?;
                    let (payload, stored) = ckpt::trailer(&map);
                    let tensors = ckpt::parse_index(path, &map, payload)?;
                    drop(map);
                    if let (Some(stored), true) = (stored, opts.verify_crc) {
                        let computed = ckpt::crc32_prefix(path, payload as u64)?;
                        if computed != stored {
                            return Err(CheckpointError::BadCrc { path: path.to_path_buf(), stored, computed });
                        }
                    }
                    (tensors, BTreeMap::new(), stored)
                }
            }
            Format::Safetensors => {
                let p = st::parse_index(path, &mut file, len)?;
                (p.tensors, p.metadata, None)
            }
        };
        let mut by_name = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            by_name.insert(t.name.clone(), i);
        }
        let me = Self { path: path.to_path_buf(), format, file, tensors, by_name, metadata, crc, len };
        if me.format == Format::Safetensors && opts.verify_crc {
            if let Some(s) = me.metadata.get("crc_num") {
                let stored: u32 = s.trim().parse().map_err(|_| CheckpointError::Malformed {
                    path: path.to_path_buf(),
                    reason: format!("crc_num {s:?} is not a number"),
                })?;
                let computed = st::mindspore_crc(&me)?;
                if computed != stored {
                    return Err(CheckpointError::BadCrc { path: path.to_path_buf(), stored, computed });
                }
            }
        }
        Ok(me)
    }

    /// The file still has the length it had when it was opened (autopar never writes a file in
    /// place, but another program may: a mapping past a shortened file's end would kill the
    /// process with a bus error instead of giving an error).
    fn check_unchanged(&self) -> Result<()> {
        let now = self.file.metadata().map_err(CheckpointError::io("stat", &self.path))?.len();
        if now != self.len {
            return Err(CheckpointError::ChangedOnDisk { path: self.path.clone(), opened: self.len, now });
        }
        Ok(())
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The safetensors header's `__metadata__` entries (empty for `.ckpt`).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The CRC stored in a `.ckpt` trailer, if any.
    pub fn stored_crc(&self) -> Option<u32> {
        self.crc
    }

    /// The index entry of the tensor called `name`, if the file holds it.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.get(name).ok_or_else(|| CheckpointError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })
    }

    /// Call `f` with a reader of a tensor's logical bytes: positioned reads of the file, so
    /// that only the bytes asked for enter the process (a slice of a large tensor never maps
    /// the rest of it).
    fn with_reader<R>(&self, t: &TensorEntry, f: impl FnOnce(&mut dyn FnMut(u64, &mut [u8]) -> Result<()>) -> Result<R>) -> Result<R> {
        use std::os::unix::fs::FileExt;
        if t.byte_len() == 0 {
            let mut read = |_: u64, out: &mut [u8]| {
                if out.is_empty() {
                    Ok(())
                } else {
                    Err(CheckpointError::Malformed { path: self.path.clone(), reason: format!("tensor {:?} has no data", t.name) })
                }
            };
            return f(&mut read);
        }
        self.check_unchanged()?;
        // logical start of each segment
        let mut starts = Vec::with_capacity(t.segments.len());
        let mut acc = 0u64;
        for s in &t.segments {
            starts.push(acc);
            acc += s.end - s.start;
        }
        let path = &self.path;
        let mut read = |off: u64, out: &mut [u8]| -> Result<()> {
            let mut off = off;
            let mut done = 0usize;
            while done < out.len() {
                let i = match starts.binary_search(&off) {
                    Ok(i) => i,
                    Err(i) => i - 1,
                };
                let seg = &t.segments[i];
                let in_seg = off - starts[i];
                let avail = (seg.end - seg.start).saturating_sub(in_seg) as usize;
                let n = avail.min(out.len() - done);
                if n == 0 {
                    return Err(CheckpointError::Malformed { path: path.clone(), reason: format!("read past the end of {:?}", t.name) });
                }
                self.file.read_exact_at(&mut out[done..done + n], seg.start + in_seg).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        CheckpointError::Malformed { path: path.clone(), reason: format!("the file ends inside tensor {:?}", t.name) }
                    }
                    _ => CheckpointError::Io { op: "read", path: path.clone(), source: e },
                })?;
                done += n;
                off += n as u64;
            }
            Ok(())
        };
        f(&mut read)
    }

    /// Call `f` with each contiguous piece of a tensor's bytes, in order.
    pub fn with_bytes(&self, name: &str, f: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let t = self.entry(name)?;
        for s in &t.segments {
            if s.end == s.start {
                continue;
            }
            self.check_unchanged()?;
            // SAFETY: see `open_with`.
            let map = unsafe { MmapOptions::new().offset(s.start).len((s.end - s.start) as usize).map(&self.file) }
                .map_err(CheckpointError::io("map", &self.path))?;
            f(&map)?;
        }
        Ok(())
    }

    /// A whole tensor's raw bytes.
    pub fn read(&self, name: &str) -> Result<Vec<u8>> {
        let t = self.entry(name)?;
        let mut out = Vec::with_capacity(t.byte_len() as usize);
        self.with_bytes(name, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })?;
        Ok(out)
    }

    /// `len` bytes of tensor `name` from byte `offset` (clamped to the tensor's end).
    pub fn read_range(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let t = self.entry(name)?;
        let total = t.byte_len();
        let off = offset.min(total);
        let len = len.min((total - off) as usize);
        let mut out = vec![0u8; len];
        self.with_reader(t, |read| read(off, &mut out))?;
        Ok(out)
    }

    /// Copy the box `region` of tensor `name` into `dst` (row-major, shape `dst_shape`) at
    /// `dst_start`, reading only the box's bytes from the file.
    pub fn copy_region(&self, name: &str, region: &[Range<usize>], dst: &mut [u8], dst_shape: &[usize], dst_start: &[usize]) -> Result<()> {
        let t = self.entry(name)?;
        if region.len() != t.shape.len() || region.iter().zip(&t.shape).any(|(r, &s)| r.end > s || r.start > r.end) {
            return Err(CheckpointError::InvalidArgument(Misuse::RegionOutside {
                name: name.to_string(),
                region: region.to_vec(),
                shape: t.shape.clone(),
            }));
        }
        let start: Vec<usize> = region.iter().map(|r| r.start).collect();
        let extent: Vec<usize> = region.iter().map(|r| r.end - r.start).collect();
        let esz = t.dtype.size();
        self.with_reader(t, |read| copy_box(read, &t.shape, &start, dst, dst_shape, dst_start, &extent, esz))
    }
}

/// Tensor description for writers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The tensor's shape.
    pub shape: Vec<usize>,
}

/// A checkpoint being written, either format. Tensors must be written in [`Self::order`]
/// (the given order for `.ckpt`, sorted names for safetensors).
pub struct CheckpointWriter {
    inner: WriterInner,
    order: Vec<TensorSpec>,
    next: usize,
}

enum WriterInner {
    Ckpt(CkptWriter),
    Safetensors(SafetensorsWriter),
}

impl CheckpointWriter {
    /// `metadata` goes into the safetensors header (ignored for `.ckpt`); `crc` adds a `.ckpt` trailer.
    pub fn create(path: &Path, specs: Vec<TensorSpec>, metadata: &BTreeMap<String, String>, crc: bool) -> Result<Self> {
        let format = Format::of_path(path).ok_or_else(|| CheckpointError::UnknownFormat { path: path.to_path_buf() })?;
        let mut order = specs;
        let inner = match format {
            Format::Ckpt => {
                let mut w = CkptWriter::create(path, crc)?;
                let sizes: Vec<(&str, usize, &[usize])> = order
                    .iter()
                    .map(|s| (s.name.as_str(), if s.dtype == DType::Str { 0 } else { s.dtype.size() }, s.shape.as_slice()))
                    .collect();
                w.reserve_for(&sizes);
                WriterInner::Ckpt(w)
            }
            Format::Safetensors => {
                order.sort_by(|a, b| a.name.cmp(&b.name));
                let list: Vec<_> = order.iter().map(|s| (s.name.clone(), s.dtype, s.shape.clone())).collect();
                WriterInner::Safetensors(SafetensorsWriter::create(path, metadata, &list)?)
            }
        };
        Ok(Self { inner, order, next: 0 })
    }

    /// The tensors in the order they must be written.
    pub fn order(&self) -> &[TensorSpec] {
        &self.order
    }

    /// Write the next tensor of [`Self::order`].
    pub fn write_next(&mut self, data: &[u8]) -> Result<()> {
        let spec =
            self.order.get(self.next).ok_or(CheckpointError::InvalidArgument(Misuse::TooManyTensors { declared: self.order.len() }))?;
        match &mut self.inner {
            WriterInner::Ckpt(w) => w.write_tensor(&spec.name, spec.dtype, &spec.shape, data)?,
            WriterInner::Safetensors(w) => w.write_tensor(&spec.name, data)?,
        }
        self.next += 1;
        Ok(())
    }

    /// Completes the file and renames it into place; fails when not every tensor was written.
    pub fn finish(self) -> Result<()> {
        if self.next != self.order.len() {
            return Err(CheckpointError::InvalidArgument(Misuse::MissingTensors { written: self.next, declared: self.order.len() }));
        }
        match self.inner {
            WriterInner::Ckpt(w) => w.finish(),
            WriterInner::Safetensors(w) => w.finish(),
        }
    }
}

/// Write in-memory tensors to `path` (format from the extension). A safetensors file carries
/// MindSpore's `crc_num` in its metadata, so that a file corrupted later fails its check when
/// it is opened ([`CheckpointFile::open`]) instead of loading wrong values.
pub fn save(path: &Path, tensors: &[(TensorSpec, Vec<u8>)], metadata: &BTreeMap<String, String>) -> Result<()> {
    let by_name: HashMap<&str, &[u8]> = tensors.iter().map(|(s, d)| (s.name.as_str(), d.as_slice())).collect();
    let specs = tensors.iter().map(|(s, _)| s.clone()).collect();
    save_from(path, specs, metadata, &mut |name, sink| sink(by_name[name]))
}

/// Where [`save_from`]'s caller puts one tensor's bytes.
pub type ByteSink<'a> = &'a mut dyn FnMut(&[u8]) -> Result<()>;

/// [`save`] of tensors `specs` whose bytes `bytes` hands over one tensor at a time, when asked
/// (`bytes(name, sink)` calls `sink` with tensor `name`'s little-endian bytes, whole): the
/// writer never holds more than the tensor it writes, so a rank saves its pieces without a
/// copy of them all. A safetensors file's `crc_num` asks for every tensor once more, first.
pub fn save_from(
    path: &Path,
    specs: Vec<TensorSpec>,
    metadata: &BTreeMap<String, String>,
    bytes: &mut dyn FnMut(&str, ByteSink<'_>) -> Result<()>,
) -> Result<()> {
    let mut metadata = metadata.clone();
    if Format::of_path(path) == Some(Format::Safetensors) {
        let crc = st::crc_num(specs.iter().map(|s| s.name.as_str()).collect(), |name, h| {
            bytes(name, &mut |b| {
                h.update(b);
                Ok(())
            })
        })?;
        metadata.insert("crc_num".to_string(), crc.to_string());
    }
    let mut w = CheckpointWriter::create(path, specs, &metadata, false)?;
    for i in 0..w.order().len() {
        let name = w.order()[i].name.clone();
        bytes(&name, &mut |b| w.write_next(b))?;
    }
    w.finish()
}

/// [`save`], with MindSpore's CRC trailer on a `.ckpt` when `crc` is set.
pub fn save_with(path: &Path, tensors: &[(TensorSpec, Vec<u8>)], metadata: &BTreeMap<String, String>, crc: bool) -> Result<()> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let by_name: HashMap<&str, &Vec<u8>> = tensors.iter().map(|(s, d)| (s.name.as_str(), d)).collect();
    let mut w = CheckpointWriter::create(path, specs, metadata, crc)?;
    for i in 0..w.order().len() {
        let name = w.order()[i].name.clone();
        w.write_next(by_name[name.as_str()])?;
    }
    w.finish()
}

/// A loaded tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// The element type.
    pub dtype: DType,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// The raw element bytes, row-major.
    pub data: Vec<u8>,
}

/// Which names [`load_segmented`] keeps: `specify_prefix` (keep only these, if any) and
/// `filter_prefix` (drop these), as in MindSpore's `load_segmented_checkpoints`.
#[derive(Clone, Debug, Default)]
pub struct NameFilter {
    /// Keep only names starting with one of these (all names when empty).
    pub specify_prefix: Vec<String>,
    /// Drop names starting with one of these.
    pub filter_prefix: Vec<String>,
}

impl NameFilter {
    /// Whether the filter keeps the tensor called `name`.
    pub fn keeps(&self, name: &str) -> bool {
        (self.specify_prefix.is_empty() || self.specify_prefix.iter().any(|p| name.starts_with(p.as_str())))
            && !self.filter_prefix.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Merge every checkpoint file of a folder (`*.ckpt` and `*.safetensors`, in name order, later
/// files overriding earlier ones) into one name -> tensor map.
pub fn load_segmented(dir: &Path, filter: &NameFilter) -> Result<BTreeMap<String, Tensor>> {
    if !dir.is_dir() {
        return Err(CheckpointError::NotADirectory { path: dir.to_path_buf(), what: "checkpoint files" });
    }
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(CheckpointError::io("list", dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && Format::of_path(p).is_some())
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(CheckpointError::NoCheckpoints { dir: dir.to_path_buf() });
    }
    let mut out = BTreeMap::new();
    for f in files {
        let ck = CheckpointFile::open(&f)?;
        for t in ck.tensors() {
            if filter.keeps(&t.name) {
                out.insert(t.name.clone(), Tensor { dtype: t.dtype, shape: t.shape.clone(), data: ck.read(&t.name)? });
            }
        }
    }
    if out.is_empty() {
        return Err(CheckpointError::InvalidArgument(Misuse::NothingSelected { dir: dir.to_path_buf() }));
    }
    Ok(out)
}

/// `<dir>/rank_<k>/<file>` for every rank folder, and the format they share. In a folder with
/// several files, MindSpore's choice: for `.ckpt` the last name in lexicographic order, for
/// safetensors the one with the largest trailing `<epoch>_<step>` numbers (then the name).
pub fn collect_rank_files(dir: &Path) -> Result<(BTreeMap<usize, PathBuf>, Format)> {
    if !dir.is_dir() {
        return Err(CheckpointError::NotADirectory { path: dir.to_path_buf(), what: "rank_<k> checkpoint folders" });
    }
    let mut ckpt = BTreeMap::new();
    let mut st = BTreeMap::new();
    for e in fs::read_dir(dir).map_err(CheckpointError::io("list", dir))? {
        let e = e.map_err(CheckpointError::io("list", dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rank) = name.strip_prefix("rank_").and_then(|r| r.parse::<usize>().ok()) else { continue };
        if !e.path().is_dir() {
            continue;
        }
        let mut ck: Vec<PathBuf> = Vec::new();
        let mut sf: Vec<PathBuf> = Vec::new();
        for f in fs::read_dir(e.path()).map_err(CheckpointError::io("list", e.path()))? {
            let p = f.map_err(CheckpointError::io("list", e.path()))?.path();
            if !p.is_file() || p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')) {
                continue;
            }
            match Format::of_path(&p) {
                Some(Format::Ckpt) => ck.push(p),
                Some(Format::Safetensors) => sf.push(p),
                None => {}
            }
        }
        ck.sort();
        if ck.len() > 1 {
            // MindSpore's choice, which a stray file can make the wrong one: said.
            tracing::warn!(
                "{} holds {} .ckpt files; using {}, the last by name (as MindSpore does)",
                e.path().display(),
                ck.len(),
                ck[ck.len() - 1].file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            );
        }
        sf.sort_by_key(|p| (trailing_numbers(p), p.clone()));
        if let Some(p) = ck.pop() {
            ckpt.insert(rank, p);
        }
        if let Some(p) = sf.pop() {
            st.insert(rank, p);
        }
    }
    match (ckpt.is_empty(), st.is_empty()) {
        (false, false) => Err(CheckpointError::MixedCheckpointFormats { dir: dir.to_path_buf() }),
        (true, true) => Err(CheckpointError::NoCheckpoints { dir: dir.to_path_buf() }),
        (false, true) => Ok((ckpt, Format::Ckpt)),
        (true, false) => Ok((st, Format::Safetensors)),
    }
}

fn trailing_numbers(p: &Path) -> (u64, u64) {
    let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut parts = stem.rsplit(['-', '_']);
    let b = parts.next().and_then(|s| s.parse().ok());
    let a = parts.next().and_then(|s| s.parse().ok());
    match (a, b) {
        (Some(a), Some(b)) => (a, b),
        _ => (0, 0),
    }
}
