#![allow(dead_code)]

use std::path::PathBuf;

/// MindSpore fixtures: `$AUTOPAR_FIXTURES`, else `shared/fixtures/mindspore` beside the repository.
pub fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures/mindspore")),
    }
}

pub fn strategies() -> PathBuf {
    fixtures().join("strategies")
}

pub fn transforms() -> PathBuf {
    fixtures().join("transforms")
}
