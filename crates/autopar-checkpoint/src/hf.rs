//! Hugging Face's checkpoint layouts: a `save_pretrained` folder (`model.safetensors`, or the
//! shards that `model.safetensors.index.json` lists) and the index file itself. Every shard
//! holds whole tensors, so a reader takes each tensor from the shard that holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::{CheckpointError, Result};

/// The index file of a sharded Hugging Face checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single file of an unsharded Hugging Face checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// The files of a Hugging Face checkpoint at `path`, in shard order: the shards its index
/// lists (`path` the index file, or a folder holding [`INDEX_FILE`]), or a folder's
/// [`SINGLE_FILE`]. `None` when `path` is neither (a plain file, or autopar's `rank_<k>`
/// folders). Errors name the index and what is wrong with it, or the shard that is missing.
pub fn shards(path: &Path) -> Result<Option<Vec<PathBuf>>> {
    let index = if path.is_dir() {
        let index = path.join(INDEX_FILE);
        if !index.is_file() {
            let single = path.join(SINGLE_FILE);
            return Ok(single.is_file().then(|| vec![single]));
        }
        index
    } else if path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".index.json")) {
        path.to_path_buf()
    } else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&index).map_err(CheckpointError::io("read", &index))?;
    let malformed = |reason: String| CheckpointError::Malformed { path: index.clone(), reason };
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| malformed(format!("not JSON: {e}")))?;
    let map = doc
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| malformed("no \"weight_map\" object (tensor name -> shard file), as transformers writes it".into()))?;
    let mut files = BTreeSet::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| malformed(format!("the shard of {name:?} is {file}, not a file name")))?;
        if Path::new(file).components().count() != 1 {
            return Err(malformed(format!("the shard of {name:?} is {file:?}, not a file beside the index")));
        }
        files.insert(file.to_string());
    }
    if files.is_empty() {
        return Err(malformed("its weight_map lists no tensors".into()));
    }
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for f in files {
        let p = dir.join(&f);
        if !p.is_file() {
            return Err(CheckpointError::NotFound { what: "checkpoint shard", path: p });
        }
        out.push(p);
    }
    Ok(Some(out))
}

/// [`shards`] as the files of a checkpoint of whole tensors: shard `i` as "rank" `i`.
pub fn shard_files(path: &Path) -> Result<Option<BTreeMap<usize, PathBuf>>> {
    Ok(shards(path)?.map(|s| s.into_iter().enumerate().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_lists_its_shards_once_each_and_a_folder_finds_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(INDEX_FILE);
        std::fs::write(
            &index,
            r#"{"metadata": {"total_size": 8}, "weight_map": {"a": "m-2.safetensors", "b": "m-1.safetensors", "c": "m-2.safetensors"}}"#,
        )
        .unwrap();
        // A missing shard is named.
        let err = shards(dir.path()).unwrap_err().to_string();
        assert!(err.contains("checkpoint shard") && err.contains("m-1.safetensors"), "{err}");
        for f in ["m-1.safetensors", "m-2.safetensors"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        let want = vec![dir.path().join("m-1.safetensors"), dir.path().join("m-2.safetensors")];
        assert_eq!(shards(dir.path()).unwrap(), Some(want.clone()));
        assert_eq!(shards(&index).unwrap(), Some(want));
        // A plain file is not a Hugging Face layout; nor is a folder without its files.
        assert_eq!(shards(&dir.path().join("m-1.safetensors")).unwrap(), None);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(shards(empty.path()).unwrap(), None);
        std::fs::write(empty.path().join(SINGLE_FILE), b"").unwrap();
        assert_eq!(shards(empty.path()).unwrap(), Some(vec![empty.path().join(SINGLE_FILE)]));
    }

    #[test]
    fn a_malformed_index_is_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(INDEX_FILE);
        for (text, says) in [
            ("{", "not JSON"),
            (r#"{"metadata": {}}"#, "weight_map"),
            (r#"{"weight_map": {"a": 3}}"#, "not a file name"),
            (r#"{"weight_map": {"a": "../x.safetensors"}}"#, "beside the index"),
            (r#"{"weight_map": {}}"#, "no tensors"),
        ] {
            std::fs::write(&index, text).unwrap();
            let err = shards(dir.path()).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains(INDEX_FILE), "{text}: {err}");
        }
    }
}
