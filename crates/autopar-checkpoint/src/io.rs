//! File plumbing shared by every writer and reader: atomic output files and region copies
//! between row-major byte arrays.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CheckpointError, Result};

/// A file written to `<dir>/.<name>.tmp-<pid>-<n>`, then fsync'ed and renamed over `path` by
/// [`AtomicFile::commit`]. Dropped without commit, the temp file is removed: a failed write never
/// leaves a partial file under the final name.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    written: u64,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl AtomicFile {
    pub fn create(path: &Path) -> Result<Self> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir).map_err(CheckpointError::io("create folder", &dir))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        let file = File::create(&tmp).map_err(CheckpointError::io("create", &tmp))?;
        Ok(Self { path: path.to_path_buf(), tmp, out: Some(BufWriter::with_capacity(1 << 20, file)), written: 0 })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("AtomicFile used after commit");
        out.write_all(bytes).map_err(CheckpointError::io("write", &self.tmp))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Append the whole of file `src` (a kernel-side copy on Linux: `copy_file_range`).
    pub fn copy_from(&mut self, src: &Path) -> Result<()> {
        let out = self.out.as_mut().expect("AtomicFile used after commit");
        out.flush().map_err(CheckpointError::io("write", &self.tmp))?;
        let mut input = File::open(src).map_err(CheckpointError::io("open", src))?;
        let n = std::io::copy(&mut input, out.get_mut()).map_err(CheckpointError::io("copy into", &self.tmp))?;
        self.written += n;
        Ok(())
    }

    /// Flush, fsync, rename over the final name, and fsync the folder.
    pub fn commit(mut self) -> Result<()> {
        let out = self.out.take().expect("AtomicFile committed twice");
        let file = out.into_inner().map_err(|e| CheckpointError::Io { op: "write", path: self.tmp.clone(), source: e.into_error() })?;
        file.sync_all().map_err(CheckpointError::io("fsync", &self.tmp))?;
        drop(file);
        fs::rename(&self.tmp, &self.path).map_err(CheckpointError::io("rename temp file to", &self.path))?;
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Row-major element strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Copy a box of `extent` elements per dimension, starting at `src_start` in a row-major source
/// array of shape `src_shape`, to `dst_start` in the row-major destination `dst` of shape
/// `dst_shape`. `read(byte_offset, out)` fills `out` from the source. Trailing dimensions that are
/// whole on both sides are merged into one contiguous run, so a copy is one call per run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_box(
    read: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    src_shape: &[usize],
    src_start: &[usize],
    dst: &mut [u8],
    dst_shape: &[usize],
    dst_start: &[usize],
    extent: &[usize],
    esz: usize,
) -> Result<()> {
    let nd = extent.len();
    if extent.contains(&0) {
        return Ok(());
    }
    if nd == 0 {
        return read(0, &mut dst[..esz]);
    }
    let ss = strides(src_shape);
    let ds = strides(dst_shape);
    // innermost dimension k such that every dimension after it is whole on both sides
    let mut k = nd - 1;
    while k > 0 && extent[k] == src_shape[k] && extent[k] == dst_shape[k] {
        k -= 1;
    }
    let run = extent[k] * ss[k] * esz;
    debug_assert_eq!(extent[k] * ss[k], extent[k] * ds[k]);
    let mut idx = vec![0usize; k];
    loop {
        let mut so = src_start[k] * ss[k];
        let mut doff = dst_start[k] * ds[k];
        for d in 0..k {
            so += (src_start[d] + idx[d]) * ss[d];
            doff += (dst_start[d] + idx[d]) * ds[d];
        }
        read((so * esz) as u64, &mut dst[doff * esz..doff * esz + run])?;
        let mut d = k;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Intersection of two boxes, `None` when empty.
pub(crate) fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Option<Vec<Range<usize>>> {
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.iter().zip(b) {
        let lo = x.start.max(y.start);
        let hi = x.end.min(y.end);
        if lo >= hi {
            return None;
        }
        out.push(lo..hi);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_box_moves_a_sub_block_between_arrays() {
        // src 4x6 of u8 values r*10+c; copy rows 1..3, cols 2..5 into dst 3x4 at (1,1)
        let src: Vec<u8> = (0..4).flat_map(|r| (0..6).map(move |c| (r * 10 + c) as u8)).collect();
        let mut dst = vec![0u8; 12];
        let mut read = |off: u64, out: &mut [u8]| {
            out.copy_from_slice(&src[off as usize..off as usize + out.len()]);
            Ok(())
        };
        copy_box(&mut read, &[4, 6], &[1, 2], &mut dst, &[3, 4], &[1, 1], &[2, 3], 1).unwrap();
        assert_eq!(dst, vec![0, 0, 0, 0, 0, 12, 13, 14, 0, 22, 23, 24]);
    }

    #[test]
    fn atomic_file_leaves_nothing_when_dropped_uncommitted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"abc").unwrap();
        drop(f);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"abc").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
