//! `autopar._native`: the Rust side of the `autopar` Python package.
//!
//! Thin bindings over `autopar-checkpoint` and the command line (`autopar::cli`, for `plan` and
//! `train`): every function takes plain paths, numbers and
//! strings, releases the interpreter lock while it works, and turns a [`CheckpointError`] into
//! the Python exception MindSpore raises in the same case (`NotADirectoryError` for a folder
//! that is not one, `ValueError` for everything a file or strategy got wrong). The argument
//! checks and MindSpore's signatures live in `python/autopar/checkpoint.py`.

mod network;

use std::collections::BTreeMap;
use std::path::PathBuf;

use autopar_checkpoint::{
    merge_strategies, rank_list_for_transform as rank_list, save_with, transform_checkpoint_by_rank as by_rank,
    transform_checkpoints as all_ranks, CheckpointError, CheckpointFile, DType, Format, OpenOptions, TensorSpec, TransformOptions,
    TransformReport,
};
use pyo3::exceptions::{PyIsADirectoryError, PyNotADirectoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};

fn to_py(err: CheckpointError) -> PyErr {
    match err {
        CheckpointError::NotADirectory { .. } => PyNotADirectoryError::new_err(err.to_string()),
        CheckpointError::IsADirectory { .. } => PyIsADirectoryError::new_err(err.to_string()),
        other => PyValueError::new_err(other.to_string()),
    }
}

fn report_dict<'py>(py: Python<'py>, r: &TransformReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("files", r.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>())?;
    d.set_item("bytes_written", r.bytes_written)?;
    d.set_item("one_strategy", &r.one_strategy)?;
    d.set_item("absent", &r.absent)?;
    d.set_item("copied", &r.copied)?;
    d.set_item("per_stage", r.per_stage)?;
    Ok(d)
}

fn options(progress: bool, crc: bool) -> TransformOptions {
    TransformOptions { progress, crc, ..Default::default() }
}

/// MindSpore's `rank_list_for_transform`: the source ranks destination `rank` needs, highest first.
#[pyfunction]
#[pyo3(signature = (rank, src_strategy=None, dst_strategy=None))]
fn rank_list_for_transform(
    py: Python<'_>,
    rank: usize,
    src_strategy: Option<PathBuf>,
    dst_strategy: Option<PathBuf>,
) -> PyResult<Vec<usize>> {
    py.detach(|| rank_list(rank, src_strategy.as_deref(), dst_strategy.as_deref())).map_err(to_py)
}

/// MindSpore's `transform_checkpoint_by_rank`; returns what was written.
#[pyfunction]
#[pyo3(signature = (rank, files, save_path, src_strategy=None, dst_strategy=None, progress=true, crc=false))]
#[allow(clippy::too_many_arguments)]
fn transform_checkpoint_by_rank<'py>(
    py: Python<'py>,
    rank: usize,
    files: BTreeMap<usize, PathBuf>,
    save_path: PathBuf,
    src_strategy: Option<PathBuf>,
    dst_strategy: Option<PathBuf>,
    progress: bool,
    crc: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let report = py
        .detach(|| by_rank(rank, &files, &save_path, src_strategy.as_deref(), dst_strategy.as_deref(), &options(progress, crc)))
        .map_err(to_py)?;
    report_dict(py, &report)
}

/// MindSpore's `transform_checkpoints`: every destination rank into `dst_dir/rank_<r>/<prefix><r>.<format>`.
#[pyfunction]
#[pyo3(signature = (src_dir, dst_dir, prefix, src_strategy=None, dst_strategy=None, jobs=1, output_format="ckpt", progress=true, crc=false))]
#[allow(clippy::too_many_arguments)]
fn transform_checkpoints<'py>(
    py: Python<'py>,
    src_dir: PathBuf,
    dst_dir: PathBuf,
    prefix: String,
    src_strategy: Option<PathBuf>,
    dst_strategy: Option<PathBuf>,
    jobs: usize,
    output_format: &str,
    progress: bool,
    crc: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let format: Format = output_format.parse().map_err(to_py)?;
    let opts = TransformOptions { format, prefix, jobs: jobs.max(1), ..options(progress, crc) };
    let report = py.detach(|| all_ranks(&src_dir, &dst_dir, src_strategy.as_deref(), dst_strategy.as_deref(), &opts)).map_err(to_py)?;
    report_dict(py, &report)
}

/// MindSpore's `merge_pipeline_strategys`; returns the stages merged.
#[pyfunction]
fn merge_pipeline_strategys(py: Python<'_>, src_dir: PathBuf, dst_file: PathBuf) -> PyResult<Vec<u32>> {
    py.detach(|| merge_strategies(&src_dir, &dst_file)).map_err(to_py)
}

/// An open checkpoint file (`.ckpt` or safetensors): its index, and each tensor's bytes on demand.
#[pyclass(module = "autopar._native", frozen)]
struct CheckpointReader {
    file: CheckpointFile,
}

#[pymethods]
impl CheckpointReader {
    #[new]
    #[pyo3(signature = (path, verify_crc=true))]
    fn new(py: Python<'_>, path: PathBuf, verify_crc: bool) -> PyResult<Self> {
        let file = py.detach(|| CheckpointFile::open_with(&path, OpenOptions { verify_crc })).map_err(to_py)?;
        Ok(Self { file })
    }

    /// `(name, dtype, shape)` of every tensor in file order; dtype is MindSpore's name
    /// (`Float32`, `BFloat16`, ..., `str` for a string value).
    fn index(&self) -> Vec<(String, &'static str, Vec<usize>)> {
        self.file.tensors().iter().map(|t| (t.name.clone(), t.dtype.mindspore_name(), t.shape.clone())).collect()
    }

    /// The safetensors header's metadata (empty for `.ckpt`).
    fn metadata(&self) -> BTreeMap<String, String> {
        self.file.metadata().clone()
    }

    /// A tensor's bytes (little-endian, row-major), read straight into a new bytearray.
    fn read<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyByteArray>> {
        let len = self
            .file
            .get(name)
            .map(|t| t.byte_len() as usize)
            .ok_or_else(|| PyValueError::new_err(format!("tensor {name:?} not found in {}", self.file.path().display())))?;
        PyByteArray::new_with(py, len, |buf| {
            let mut at = 0;
            self.file
                .with_bytes(name, &mut |b| {
                    buf[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                    Ok(())
                })
                .map_err(to_py)
        })
    }
}

/// Write tensors `(name, dtype, shape, bytes)` to `path` (format from the extension), atomically.
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata=BTreeMap::new(), crc=false))]
fn write_checkpoint(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<(String, String, Vec<usize>, Vec<u8>)>,
    metadata: BTreeMap<String, String>,
    crc: bool,
) -> PyResult<()> {
    let mut specs = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, data) in tensors {
        let dtype = DType::from_mindspore(&dtype)
            .ok_or_else(|| PyValueError::new_err(format!("tensor {name:?}: unknown dtype {dtype:?} for {}", path.display())))?;
        specs.push((TensorSpec { name, dtype, shape }, data));
    }
    py.detach(|| save_with(&path, &specs, &metadata, crc)).map_err(to_py)
}

/// Run `autopar WORDS...` in this process and return what it printed as its result (`plan`
/// and `train` print their report into it, other commands on stdout). The exit code is not
/// returned: `train --verify` reports a mismatch in its summary (`verify.ok`). A bad flag is a
/// `ValueError` with clap's message; a failed run a `RuntimeError` with the message the command
/// line prints. Like the `autopar` binary, it first keeps freed memory in the process
/// ([`autopar::keep_freed_memory`]) so that a training run does not page-fault its buffers in
/// again at every step.
#[pyfunction]
fn run_cli(py: Python<'_>, words: Vec<String>) -> PyResult<String> {
    let cli = autopar::cli::parse_args(&words).map_err(PyValueError::new_err)?;
    autopar::keep_freed_memory();
    // The command runs on a thread of its own while this one waits with the interpreter free
    // and looks at its signals: on Ctrl-C a training run is asked to stop after its step, and
    // the KeyboardInterrupt is raised once it has.
    autopar::cli::clear_interrupt();
    let job = std::thread::spawn(move || {
        let mut out = Vec::new();
        let result = autopar::cli::run(cli, &mut out).map_err(|err| autopar::cli::error_text(&err).trim_end().to_string());
        (result, out)
    });
    let mut signal = None;
    while !job.is_finished() {
        py.detach(|| std::thread::sleep(std::time::Duration::from_millis(20)));
        if signal.is_none() {
            if let Err(e) = py.check_signals() {
                autopar::cli::interrupt();
                signal = Some(e);
            }
        }
    }
    let (result, out) = job.join().map_err(|_| PyRuntimeError::new_err("the autopar command panicked"))?;
    if let Some(e) = signal {
        return Err(e);
    }
    match result {
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        Err(text) => Err(PyRuntimeError::new_err(text)),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // AUTOPAR_LOG shows the checkpoint functions' logs too (plan/train also take verbose=N).
    if std::env::var_os("AUTOPAR_LOG").is_some() {
        autopar::logging::init(0).map_err(PyValueError::new_err)?;
    }
    m.add_function(wrap_pyfunction!(rank_list_for_transform, m)?)?;
    m.add_function(wrap_pyfunction!(transform_checkpoint_by_rank, m)?)?;
    m.add_function(wrap_pyfunction!(transform_checkpoints, m)?)?;
    m.add_function(wrap_pyfunction!(merge_pipeline_strategys, m)?)?;
    m.add_function(wrap_pyfunction!(write_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add_class::<CheckpointReader>()?;
    m.add_class::<network::Network>()?;
    m.add_function(wrap_pyfunction!(network::check_parallel_context, m)?)?;
    m.add_class::<network::Session>()?;
    Ok(())
}
