//! Transform benchmark: a synthetic 1 GiB model (16 tensors of 4096x4096 f32) saved by 8 ranks
//! under a (2, 4) model-parallel strategy, transformed (a) to 4 ranks data-parallel and (b) to one
//! merged file, from safetensors and from .ckpt sources. Prints the bytes written (in (a) every
//! rank's file holds the whole model: 4 copies) and the distinct tensor bytes, GB/s of each, the
//! transform's peak RSS (VmHWM of a child process that runs only the transform), and `cp -r` +
//! fsync of the same output on the same disk (outputs are fsync'ed). The transform and `cp`
//! alternate round by round (`AUTOPAR_BENCH_ROUNDS`, 3; which goes first alternates too):
//! medians, and the median per-round ratio time(transform) / time(cp).
//!
//! `cargo bench -p autopar-checkpoint --bench transform` (scratch files under $TMPDIR or /tmp,
//! deleted afterwards; `AUTOPAR_BENCH_DIM=1024` for a quick run, `AUTOPAR_BENCH_JOBS=2`,
//! `AUTOPAR_BENCH_FORMATS=ckpt,safetensors` to choose the source formats and their order;
//! `AUTOPAR_BENCH_KEEP=DIR` only writes the `.ckpt` source (`DIR/src/rank_<r>/net_<r>.ckpt`) and
//! both strategy files into DIR and stops, for other tools to transform the same files:
//! `crates/autopar-py/bench/versus_mindspore.py DIR`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use autopar_checkpoint::{
    transform_checkpoints, CheckpointWriter, DType, LayoutItem, StrategyFile, StrategyItem, TensorSpec, TransformOptions,
};
use autopar_layout::{TensorLayout, TensorMap};

const TENSORS: usize = 16;

fn dim() -> usize {
    std::env::var("AUTOPAR_BENCH_DIM").ok().and_then(|v| v.parse().ok()).unwrap_or(4096)
}

fn layout_item(name: &str, dev: &[u32], map: &[i32]) -> LayoutItem {
    LayoutItem::new(name, dev.to_vec(), vec![map.to_vec()])
}

fn strategy(dev: &[u32], map_of: impl Fn(usize) -> Vec<i32>) -> StrategyFile {
    let mut s = StrategyFile { current_stage: 2, ..Default::default() };
    for i in 0..TENSORS {
        let name = format!("layer{i:02}.w");
        s.strategy_items.push(StrategyItem { node_name: format!("MatMul_{name}"), stage: 0, parallel_strategy: vec![] });
        s.layout_items.push(layout_item(&name, dev, &map_of(i)));
    }
    s
}

/// Source: half the tensors split 8 ways ([2,4], map [1,0]), half split 4 ways and replicated
/// twice (map [-1,0], MindSpore's MatMul weight layout).
fn src_map(i: usize) -> Vec<i32> {
    if i & 1 == 0 {
        vec![1, 0]
    } else {
        vec![-1, 0]
    }
}

fn write_source(dir: &Path, s: &StrategyFile, ext: &str) -> u64 {
    let n = dim();
    let mut writers = Vec::new();
    let layouts: Vec<TensorLayout> = (0..TENSORS)
        .map(|i| {
            let m: Vec<i64> = src_map(i).iter().map(|&v| v as i64).collect();
            TensorLayout::from_mindspore(&[2, 4], &TensorMap::single(&m), &[n, n]).unwrap()
        })
        .collect();
    for r in 0..8 {
        let specs: Vec<TensorSpec> = s
            .layout_items
            .iter()
            .zip(&layouts)
            .map(|(l, lay)| TensorSpec { name: l.name.clone(), dtype: DType::Float32, shape: lay.slice_shape() })
            .collect();
        let path = dir.join(format!("rank_{r}/net_{r}.{ext}"));
        writers.push(CheckpointWriter::create(&path, specs, &BTreeMap::new(), false).unwrap());
    }
    let mut bytes = 0u64;
    for (i, lay) in layouts.iter().enumerate() {
        // full tensor values: f32 of (tensor, row, col)
        for (r, w) in writers.iter_mut().enumerate() {
            let region = lay.slice_of(r).unwrap();
            let mut buf = Vec::with_capacity(lay.slice_len() * 4);
            for row in region[0].clone() {
                for col in region[1].clone() {
                    buf.extend_from_slice(&((i * n * n + row * n + col) as f32).to_le_bytes());
                }
            }
            bytes += buf.len() as u64;
            w.write_next(&buf).unwrap();
        }
    }
    for w in writers {
        w.finish().unwrap();
    }
    bytes
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// User + system CPU seconds of this process (from /proc/self/stat, 100 ticks per second).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// Child mode: run one transform and print "bytes seconds vmhwm_kib cpu_seconds".
fn child(args: &[String]) {
    let (src, dst, ss, ds, fmt, jobs) = (&args[0], &args[1], &args[2], &args[3], &args[4], &args[5]);
    let ds = if ds == "none" { None } else { Some(PathBuf::from(ds)) };
    let opts = TransformOptions { format: fmt.parse().unwrap(), prefix: "net_".into(), jobs: jobs.parse().unwrap(), ..Default::default() };
    let t = Instant::now();
    let rep = transform_checkpoints(Path::new(src), Path::new(dst), Some(Path::new(ss)), ds.as_deref(), &opts).unwrap();
    println!("{} {} {} {}", rep.bytes_written, t.elapsed().as_secs_f64(), vm_hwm_kib(), cpu_seconds());
}

fn run_child(src: &Path, dst: &Path, ss: &Path, ds: Option<&Path>, fmt: &str, jobs: usize) -> (u64, f64, u64, f64) {
    let _ = std::fs::remove_dir_all(dst);
    let out = Command::new(std::env::current_exe().unwrap())
        .env("AUTOPAR_BENCH_CHILD", "1")
        .args([
            src.as_os_str(),
            dst.as_os_str(),
            ss.as_os_str(),
            ds.map_or("none".as_ref(), |p| p.as_os_str()),
            fmt.as_ref(),
            jobs.to_string().as_ref(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = text.split_whitespace().collect();
    (v[0].parse().unwrap(), v[1].parse().unwrap(), v[2].parse().unwrap(), v[3].parse().unwrap())
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Seconds for `cp -r` of `dir` on the same disk, then `sync FILE...` (an fsync of each copied
/// file, as the transform fsyncs its outputs; a bare `sync` would flush the whole machine).
fn cp_sync(dir: &Path) -> f64 {
    assert!(Command::new("sync").status().unwrap().success());
    let copy = dir.with_extension("copy");
    let t = Instant::now();
    assert!(Command::new("cp").arg("-r").arg(dir).arg(&copy).status().unwrap().success());
    assert!(Command::new("sync").args(files_under(&copy)).status().unwrap().success());
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&copy);
    secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::var_os("AUTOPAR_BENCH_CHILD").is_some() {
        let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
        child(&args);
        return;
    }
    if let Some(dir) = std::env::var_os("AUTOPAR_BENCH_KEEP") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src_s = strategy(&[2, 4], src_map);
        src_s.save(dir.join("src_strategy.ckpt")).unwrap();
        strategy(&[4], |_| vec![-1, -1]).save(dir.join("dp4_strategy.ckpt")).unwrap();
        let bytes = write_source(&dir.join("src"), &src_s, "ckpt");
        println!("wrote an 8-rank .ckpt checkpoint of {:.3} GB and its strategy files into {}", bytes as f64 / 1e9, dir.display());
        return;
    }
    let rounds: usize = std::env::var("AUTOPAR_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    let jobs: usize = std::env::var("AUTOPAR_BENCH_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let base = std::env::temp_dir().join(format!("autopar-ckpt-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let n = dim();
    let src_s = strategy(&[2, 4], src_map);
    let dp_s = strategy(&[4], |_| vec![-1, -1]);
    let (ss, ds) = (base.join("src_strategy.ckpt"), base.join("dp4_strategy.ckpt"));
    src_s.save(&ss).unwrap();
    dp_s.save(&ds).unwrap();
    let model = (TENSORS * n * n * 4) as f64;
    let largest = (n * n * 4) as f64;
    println!(
        "model: {TENSORS} tensors of {n}x{n} f32 = {:.3} GiB; largest tensor {:.0} MiB; jobs {jobs}",
        model / (1u64 << 30) as f64,
        largest / (1u64 << 20) as f64
    );
    let formats = std::env::var("AUTOPAR_BENCH_FORMATS").unwrap_or_else(|_| "safetensors,ckpt".into());
    for ext in formats.split(',') {
        let src = base.join(format!("src_{ext}"));
        let t = Instant::now();
        let src_bytes = write_source(&src, &src_s, ext);
        println!("\nsource .{ext}: 8 ranks, {:.3} GB written in {:.2}s", src_bytes as f64 / 1e9, t.elapsed().as_secs_f64());
        for (label, dst_strategy, fmt) in [("(a) -> 4 ranks data-parallel", Some(ds.as_path()), ext), ("(b) -> one merged file", None, ext)]
        {
            // A first transform, untimed, makes the output the `cp` baseline copies.
            let dst = base.join("dst");
            run_child(&src, &dst, &ss, dst_strategy, fmt, jobs);
            let out = base.join("dst_timed");
            let (mut secs, mut cps, mut ratios, mut peak, mut cpus, mut bytes) = (vec![], vec![], vec![], 0u64, vec![], 0u64);
            for round in 0..rounds {
                let transform = || {
                    assert!(Command::new("sync").status().unwrap().success());
                    let r = run_child(&src, &out, &ss, dst_strategy, fmt, jobs);
                    let _ = std::fs::remove_dir_all(&out);
                    r
                };
                // Alternate which goes first, so neither always meets the page cache the other left.
                let ((b, t, hwm, cpu), c) = if round % 2 == 0 {
                    let r = transform();
                    (r, cp_sync(&dst))
                } else {
                    let c = cp_sync(&dst);
                    (transform(), c)
                };
                (bytes, peak) = (b, peak.max(hwm));
                secs.push(t);
                cps.push(c);
                cpus.push(cpu);
                ratios.push(t / c);
            }
            let _ = std::fs::remove_dir_all(&dst);
            let (t, c) = (median(secs), median(cps));
            let rss = peak as f64 * 1024.0;
            println!(
                "  {label:<30} {:.3} GB written ({:.3} GB of distinct tensor values, {:.0} cop{}) in {t:.2}s (cpu {:.2}s) = {:.2} GB/s written, {:.2} GB/s of distinct values; cp -r + fsync of the same output: {:.2} GB/s; time / cp time {:.2} (median per round); peak RSS {:.0} MiB (target <= 2 x largest + 64 MiB = {:.0} MiB)",
                bytes as f64 / 1e9,
                model / 1e9,
                bytes as f64 / model,
                if bytes as f64 / model > 1.5 { "ies" } else { "y" },
                median(cpus),
                bytes as f64 / t / 1e9,
                model / t / 1e9,
                bytes as f64 / c / 1e9,
                median(ratios),
                rss / (1u64 << 20) as f64,
                (2.0 * largest) / (1u64 << 20) as f64 + 64.0
            );
        }
        let _ = std::fs::remove_dir_all(&src);
    }
    let _ = std::fs::remove_dir_all(&base);
}
