//! File helpers: whole-file reads with gzip detection, and atomic writes (through the
//! workspace's atomic file).

use std::fs;
use std::io::Read;
use std::path::Path;

use crate::error::{DataError, Result};

/// Reads a whole file; a file that starts with the gzip magic bytes is decompressed.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    let raw = read(path)?;
    if raw.len() >= 2 && raw[0] == 0x1f && raw[1] == 0x8b {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|source| DataError::Gzip { path: path.to_path_buf(), source })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::MissingFile { path: path.to_path_buf() }
        } else {
            DataError::Read { path: path.to_path_buf(), source }
        }
    })
}

/// Writes `bytes` to `path` atomically (the project's one atomic writer,
/// [`autopar_files::write_atomic`]: a temp file beside it, fsync, rename, fsync of the folder;
/// a missing folder is created).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    autopar_files::write_atomic(path, bytes).map_err(|e| DataError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::new(e.source.kind(), format!("{} {}: {}", e.op, e.path.display(), e.source)),
    })
}

/// Checks that `dir` exists and is a folder.
pub(crate) fn require_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(DataError::MissingFolder { path: dir.to_path_buf() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn gzip_files_are_decompressed_and_plain_files_pass_through() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("p");
        fs::write(&plain, b"hello").unwrap();
        let gz = dir.path().join("p.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(b"hello").unwrap();
        fs::write(&gz, enc.finish().unwrap()).unwrap();
        assert_eq!(read_maybe_gz(&plain).unwrap(), b"hello");
        assert_eq!(read_maybe_gz(&gz).unwrap(), b"hello");
    }

    #[test]
    fn a_truncated_gzip_file_is_a_gzip_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let gz = dir.path().join("t.gz");
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&[7u8; 1000]).unwrap();
        let bytes = enc.finish().unwrap();
        fs::write(&gz, &bytes[..bytes.len() / 2]).unwrap();
        let err = read_maybe_gz(&gz).unwrap_err();
        assert!(matches!(err, DataError::Gzip { .. }), "{err}");
        assert!(err.to_string().contains("t.gz"));
    }

    #[test]
    fn a_missing_file_is_reported_with_its_path() {
        let err = read(Path::new("/nonexistent/x.bin")).unwrap_err();
        assert!(matches!(err, DataError::MissingFile { .. }));
        assert!(err.to_string().contains("/nonexistent/x.bin"));
    }
}
