//! Every parser of outside input behind one function `fn(&[u8])`, for the fuzz targets in
//! `fuzz/` (`cargo +nightly fuzz run <target>`) and for replaying their corpora and past
//! findings under `cargo test` (`tests/corpora.rs`). Each function feeds the bytes through the
//! same code a user's file or flag goes through, and returns normally for every input: a bad
//! input must be an error, never a panic, a hang or an allocation the input does not justify.
//!
//! File formats are written to a temp file first, because their readers take paths (as
//! users' files do).

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A fuzz target's function.
pub type Target = fn(&[u8]);

/// The fuzz targets: name and function, in the order `fuzz/Cargo.toml` lists them.
pub const TARGETS: &[(&str, Target)] = &[
    ("safetensors", safetensors),
    ("ckpt", ckpt),
    ("strategy_protobuf", strategy_protobuf),
    ("strategy_json", strategy_json),
    ("group_info", group_info),
    ("cifar10", cifar10),
    ("mnist", mnist),
    ("tensor_dataset", tensor_dataset),
    ("toml_config", toml_config),
    ("strategy_string", strategy_string),
    ("parallel_option", parallel_option),
    ("layout_dict_line", layout_dict_line),
];

thread_local! {
    static SCRATCH: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// `data` written to `name` in this thread's scratch folder (in memory where /dev/shm exists).
fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let dir = s.get_or_insert_with(|| {
            let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
            let dir = base.join(format!("autopar-fuzz-{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
            std::fs::create_dir_all(&dir).expect("a scratch folder");
            dir
        });
        let path = dir.join(name);
        std::fs::write(&path, data).expect("the scratch file is written");
        path
    })
}

/// A checkpoint file: open it (header, index, CRC when present) and read every tensor.
fn checkpoint(name: &str, data: &[u8]) {
    let path = scratch_file(name, data);
    if let Ok(file) = autopar_checkpoint::CheckpointFile::open(&path) {
        let names: Vec<String> = file.tensors().iter().map(|t| t.name.clone()).collect();
        for n in names {
            let _ = file.read(&n);
        }
    }
}

/// A safetensors checkpoint.
pub fn safetensors(data: &[u8]) {
    checkpoint("fuzz.safetensors", data);
}

/// A MindSpore `.ckpt` checkpoint (protobuf, chunked values, CRC trailer).
pub fn ckpt(data: &[u8]) {
    checkpoint("fuzz.ckpt", data);
}

/// A strategy file in MindSpore's protobuf form.
pub fn strategy_protobuf(data: &[u8]) {
    let _ = autopar_checkpoint::StrategyFile::from_protobuf(Path::new("fuzz.ckpt"), data);
}

/// A strategy file in MindSpore's JSON form.
pub fn strategy_json(data: &[u8]) {
    let _ = autopar_checkpoint::StrategyFile::from_json(Path::new("fuzz.json"), data);
}

/// A MindSpore group-info file.
pub fn group_info(data: &[u8]) {
    let _ = autopar_checkpoint::GroupInfo::load(scratch_file("fuzz_group.pb", data));
}

/// A CIFAR-10 binary batch file.
pub fn cifar10(data: &[u8]) {
    if let Ok(c) = autopar_data::Cifar10::open_file(scratch_file("data_batch_1.bin", data)) {
        for i in 0..c.labels().len().min(4) {
            let _ = c.image(i);
        }
    }
}

/// An MNIST IDX file, plain or gzip-compressed (the first byte picks which name it gets).
pub fn mnist(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else { return };
    let name = if pick % 2 == 0 { "fuzz-idx3-ubyte" } else { "fuzz-idx3-ubyte.gz" };
    if let Ok(a) = autopar_data::read_idx(scratch_file(name, rest), "images", None) {
        let _ = a.to_f64();
    }
}

/// A safetensors file of training data (`--data FILE.safetensors`).
pub fn tensor_dataset(data: &[u8]) {
    let _ = autopar_data::TensorDataset::open(scratch_file("fuzz_data.safetensors", data));
}

/// The TOML config file of `autopar train`, its `[parallel]` table applied and validated.
pub fn toml_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cfg) = autopar::config::parse_config(text, Path::new("fuzz.toml")) {
        if let Some(table) = &cfg.parallel {
            let mut ctx = autopar_parallel::ParallelContext::default();
            if ctx.apply_table(table).is_ok() {
                let _ = ctx.validate();
            }
        }
    }
}

/// A strategy string such as `((2,1),(1,4))`, and its layouts for inputs of matching rank.
pub fn strategy_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(s) = autopar_layout::Strategy::from_str(text) {
        let _ = s.to_string();
    }
}

/// One `--parallel KEY=VALUE` flag, applied to a fresh context and validated.
pub fn parallel_option(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Some((k, v)) = text.split_once('=') else { return };
    let mut ctx = autopar_parallel::ParallelContext::default();
    if ctx.set_str(k.trim(), v.trim()).is_ok() {
        let _ = ctx.validate();
    }
}

/// One line of MindSpore's `parameter_layout_dict` text (`name: (12-tuple)`).
pub fn layout_dict_line(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = autopar_layout::ParameterLayout::parse_line(text);
}
