//! # autopar-files: every file autopar writes, written atomically
//!
//! [`AtomicFile`] writes `<dir>/.<name>.tmp-<pid>-<n>`, then fsyncs it, renames it over the
//! final name and fsyncs the folder, so a reader (or a run resumed after a crash) sees the old
//! file or the whole new one, never a part; [`write_atomic`] is one such write;
//! [`remove_stale_temps`] removes the temp files killed writers left. Checkpoints, strategy
//! files, datasets, plots and reports all go through here: one writer for the workspace, with
//! no dependency of its own.

#![warn(missing_docs)]

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

/// A file operation that failed: what was done, to which path, and the system's error.
#[derive(Debug, Error)]
#[error("cannot {op} {}: {source}", path.display())]
pub struct FileError {
    /// The operation (`create`, `write`, `fsync`, `rename temp file to`, ...).
    pub op: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// A `map_err` adapter: the error of `op` on `path`.
    pub fn at(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.to_path_buf();
        move |source| FileError { op, path, source }
    }
}

/// Short for `Result<T, FileError>`.
pub type Result<T> = std::result::Result<T, FileError>;

/// A file written to `<dir>/.<name>.tmp-<pid>-<n>`, then fsync'ed and renamed over `path` by
/// [`AtomicFile::commit`]. Dropped without commit, the temp file is removed: a failed write never
/// leaves a partial file under the final name.
///
/// On Linux the kernel is asked to start writing each 8 MiB (`WRITEBACK_STEP`) of data to disk as soon
/// as it has been handed over (`sync_file_range`), so the disk works while later bytes are still
/// being assembled and the fsync of [`AtomicFile::commit`] only waits for the tail; without it,
/// the whole file would be written back after the last byte. Durability still rests on that
/// fsync alone.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    written: u64,
    /// Bytes whose writeback has been started.
    started: u64,
    /// Bytes reserved by [`AtomicFile::preallocate`] (the file is trimmed to `written` if fewer were written).
    reserved: u64,
}

/// Write `bytes` to `path` atomically (an [`AtomicFile`] of one write): a reader sees the old
/// file or the whole new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

/// Removes from `dir` the temp files (`.<target>.tmp-<pid>-<n>`) that a killed process left,
/// for the targets `wanted` accepts: those of processes that no longer run (on Linux, no
/// `/proc/<pid>`; elsewhere, any other process's). Returns how many were removed.
pub fn remove_stale_temps(dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<usize> {
    let own = std::process::id();
    let mut removed = 0;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(name) = e.file_name().into_string() else { continue };
        let Some((target, pid)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")).and_then(|(t, rest)| {
            let (pid, counter) = rest.split_once('-')?;
            counter.bytes().all(|b| b.is_ascii_digit()).then_some((t, pid.parse::<u32>().ok()?))
        }) else {
            continue;
        };
        let alive = pid == own || (cfg!(target_os = "linux") && Path::new(&format!("/proc/{pid}")).exists());
        if !alive && wanted(target) {
            match fs::remove_file(e.path()) {
                Ok(()) => removed += 1,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(FileError { op: "remove stale temp file", path: e.path(), source: err }),
            }
        }
    }
    Ok(removed)
}

/// Data handed to the kernel between two writeback requests.
pub const WRITEBACK_STEP: u64 = 8 << 20;

/// The two Linux calls used here, from the C library that std links anyway.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
    pub const SYNC_FILE_RANGE_WRITE: u32 = 2;
    extern "C" {
        pub fn fallocate(fd: i32, mode: i32, offset: i64, len: i64) -> i32;
        pub fn sync_file_range(fd: i32, offset: i64, nbytes: i64, flags: u32) -> i32;
    }
}

/// Ask the kernel to start writing back `len` bytes of `file` from `offset`, without waiting.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory is passed. A failure only loses
    // the overlap (the fsync of `commit` writes everything back and reports errors).
    unsafe {
        sys::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, sys::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

/// Reserve `len` bytes of disk for `file` without changing its size; false if not done.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn reserve(file: &File, len: u64) -> bool {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory is passed.
    unsafe { sys::fallocate(file.as_raw_fd(), sys::FALLOC_FL_KEEP_SIZE, 0, len as i64) == 0 }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn reserve(_file: &File, _len: u64) -> bool {
    false
}

/// Bytes per kernel-side copy of [`AtomicFile::copy_from`].
const COPY_STEP: u64 = 64 << 20;

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl AtomicFile {
    /// Creates the temporary file next to `path` (and `path`'s folder if needed), first removing temporary files for the same
    /// target that processes which have ended left behind.
    pub fn create(path: &Path) -> Result<Self> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&dir).map_err(FileError::at("create folder", &dir))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        remove_stale_temps(&dir, |target| target == name)?;
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        let file = File::create(&tmp).map_err(FileError::at("create", &tmp))?;
        Ok(Self { path: path.to_path_buf(), tmp, out: Some(BufWriter::with_capacity(1 << 20, file)), written: 0, started: 0, reserved: 0 })
    }

    /// Reserve disk space for a file of `len` bytes (Linux: `fallocate` keeping the size), so
    /// that writes do not allocate blocks piecemeal. Only a hint: filesystems without it are fine,
    /// and a lack of space is reported by the writes.
    pub fn preallocate(&mut self, len: u64) {
        if len > self.reserved && self.out.as_ref().is_some_and(|out| reserve(out.get_ref(), len)) {
            self.reserved = len;
        }
    }

    /// The final path the file is renamed to on commit.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `bytes` to the file.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("AtomicFile used after commit");
        out.write_all(bytes).map_err(FileError::at("write", &self.tmp))?;
        self.written += bytes.len() as u64;
        self.kick_writeback();
        Ok(())
    }

    /// Start the writeback of what the kernel holds beyond the last request, once that is at
    /// least [`WRITEBACK_STEP`].
    fn kick_writeback(&mut self) {
        let Some(out) = &self.out else { return };
        let in_kernel = self.written - out.buffer().len() as u64;
        if in_kernel >= self.started + WRITEBACK_STEP {
            start_writeback(out.get_ref(), self.started, in_kernel - self.started);
            self.started = in_kernel;
        }
    }

    /// Append the whole of file `src` (a kernel-side copy on Linux: `copy_file_range`).
    pub fn copy_from(&mut self, src: &Path) -> Result<()> {
        let out = self.out.as_mut().expect("AtomicFile used after commit");
        out.flush().map_err(FileError::at("write", &self.tmp))?;
        let mut input = File::open(src).map_err(FileError::at("open", src))?;
        if let Ok(m) = input.metadata() {
            self.preallocate(self.written + m.len());
        }
        // in steps, so that the writeback of each starts while the next is copied
        loop {
            let out = self.out.as_mut().expect("AtomicFile used after commit");
            let n = std::io::copy(&mut (&mut input).take(COPY_STEP), out.get_mut()).map_err(FileError::at("copy into", &self.tmp))?;
            if n == 0 {
                return Ok(());
            }
            self.written += n;
            self.kick_writeback();
        }
    }

    /// Flush, fsync, rename over the final name, and fsync the folder. On failure the temp file
    /// is removed.
    pub fn commit(mut self) -> Result<()> {
        let out = self.out.take().expect("AtomicFile committed twice");
        let (tmp, written, reserved) = (&self.tmp, self.written, self.reserved);
        let durable = (|| -> Result<()> {
            let file = out.into_inner().map_err(|e| FileError { op: "write", path: tmp.clone(), source: e.into_error() })?;
            if reserved > written {
                // give back space reserved beyond what was written
                file.set_len(written).map_err(FileError::at("truncate", tmp))?;
            }
            file.sync_all().map_err(FileError::at("fsync", tmp))?;
            drop(file);
            fs::rename(tmp, &self.path).map_err(FileError::at("rename temp file to", &self.path))
        })();
        if durable.is_err() {
            let _ = fs::remove_file(&self.tmp);
            return durable;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_files_of_dead_processes_are_removed_when_the_target_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let own = std::process::id();
        for name in [".x.bin.tmp-4000000000-0", ".y.bin.tmp-4000000000-3", &format!(".x.bin.tmp-{own}-99"), ".x.bin.tmp-notapid-1"] {
            fs::write(d.join(name), b"partial").unwrap();
        }
        write_atomic(&d.join("x.bin"), b"whole").unwrap();
        let mut left: Vec<String> = fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        // The dead process's temp of x.bin went; y.bin's, this process's and a foreign name stay.
        let mut want =
            vec![".x.bin.tmp-notapid-1".to_string(), format!(".x.bin.tmp-{own}-99"), ".y.bin.tmp-4000000000-3".into(), "x.bin".into()];
        want.sort();
        assert_eq!(left, want);
        assert_eq!(remove_stale_temps(d, |t| t == "y.bin").unwrap(), 1);
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

    #[test]
    fn atomic_file_keeps_exactly_the_written_bytes_whatever_was_reserved() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        // more reserved than written: trimmed to what was written
        let mut f = AtomicFile::create(&p).unwrap();
        f.preallocate(3 << 20);
        f.write_all(b"abc").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"abc");
        // writes past several writeback steps, then a copy of the result appended
        let big: Vec<u8> = (0..(WRITEBACK_STEP as usize * 2 + 12345)).map(|i| (i % 251) as u8).collect();
        let q = dir.path().join("y.bin");
        let mut f = AtomicFile::create(&q).unwrap();
        f.preallocate(big.len() as u64);
        f.write_all(&big[..1000]).unwrap();
        f.write_all(&big[1000..]).unwrap();
        f.commit().unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        f.write_all(b"xyz").unwrap();
        f.copy_from(&q).unwrap();
        assert_eq!(f.written(), big.len() as u64 + 3);
        f.commit().unwrap();
        let mut want = b"xyz".to_vec();
        want.extend_from_slice(&big);
        assert_eq!(fs::read(&p).unwrap(), want);
        assert_eq!(fs::read(&q).unwrap(), big);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
