//! A crash at the wrong moment loses nothing: `autopar train` killed with SIGKILL at random
//! moments while it saves a checkpoint every step (tensors being written, before and after the
//! rename, old checkpoints being deleted by --keep-checkpoint-max) always leaves a complete
//! checkpoint that `--resume` continues from, never picks up a half-written one, and leaves no
//! temp files piling up; after 50 kills the run ends with the uninterrupted run's parameters,
//! bit for bit. `ckpt transform` killed mid-way never leaves a half-written output, and a
//! rerun writes the complete, correct files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEVICES: usize = 2;
const STEPS: u64 = 40;
const KEEP: usize = 2;

fn autopar(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_autopar"));
    c.current_dir(dir).args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

/// The words of a command line.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// `autopar ARGS` in `dir` with the words of `line`.
fn autopar_line(dir: &Path, line: &str) -> Command {
    autopar(dir, &words(line).iter().map(String::as_str).collect::<Vec<_>>())
}

fn train_args(ck: &str, resume: bool) -> Vec<String> {
    let mut a = words(
        "train --model mlp --data synthetic --synthetic-samples 256 --width 16 --batch-size 16 --optimizer adamw --lr 0.01 \
         --eval false --log-every 0 --checkpoint-every 1 --keep-checkpoint-max",
    );
    a.push(KEEP.to_string());
    a.extend(["--steps".into(), STEPS.to_string(), "--devices".into(), DEVICES.to_string(), "--checkpoint-dir".into(), ck.into()]);
    if resume {
        a.extend(["--resume".into(), ck.into()]);
    }
    a
}

/// A tiny deterministic generator for the kill delays.
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// Runs `cmd`, killing it (SIGKILL) after `after` unless it ends first; whether it was killed.
fn run_or_kill(mut cmd: Command, after: Duration) -> (bool, Child) {
    let mut child = cmd.spawn().expect("autopar starts");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (false, child);
        }
        if start.elapsed() >= after {
            child.kill().unwrap();
            child.wait().unwrap();
            return (true, child);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every rank folder's checkpoint steps and temp files.
fn folder_state(ck: &Path) -> (Vec<Vec<u64>>, Vec<usize>) {
    let mut steps = Vec::new();
    let mut temps = Vec::new();
    for r in 0..DEVICES {
        let mut s = Vec::new();
        let mut t = 0;
        for e in std::fs::read_dir(ck.join(format!("rank_{r}"))).into_iter().flatten().flatten() {
            let name = e.file_name().into_string().unwrap();
            if name.contains(".tmp-") {
                t += 1;
            } else if let Some(step) = name.strip_prefix("mlp-").and_then(|n| n.strip_suffix(&format!("_{r}.safetensors"))) {
                s.push(step.parse::<u64>().unwrap());
            }
        }
        s.sort();
        steps.push(s);
        temps.push(t);
    }
    (steps, temps)
}

/// The tensors of a safetensors file (header names, shapes and bytes), without its metadata.
fn tensors(path: &Path) -> BTreeMap<String, (Vec<u64>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            let off: Vec<usize> = v["data_offsets"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            assert!(off[1] <= data.len(), "{}: {k} runs past the end of the file", path.display());
            (k.clone(), (shape, data[off[0]..off[1]].to_vec()))
        })
        .collect()
}

#[test]
fn training_killed_fifty_times_while_saving_resumes_to_the_uninterrupted_result() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let start = Instant::now();
    let o = autopar(d, &train_args("reference", false).iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // A run's length, measured again by every whole run that ends before its kill (the first
    // one may have shared the cores with other tests and taken longer than the runs after it).
    let mut full_run = start.elapsed();

    let ck = d.join("ck");
    let mut rng = Lcg(2026);
    let (mut kills, mut mid_write, mut between_ranks, mut mid_delete) = (0, 0, 0, 0);
    let mut newest_seen = 0;
    while kills < 50 {
        let (steps, _) = folder_state(&ck);
        let complete = steps[0].iter().any(|s| steps.iter().all(|r| r.contains(s)));
        let args = train_args("ck", complete);
        // Mostly early (each run starts by loading and planning), sometimes late.
        let limit = full_run.as_micros() as u64;
        let delay = Duration::from_micros(limit / 10 + rng.below(limit / 2));
        let started = Instant::now();
        let (killed, child) = run_or_kill(autopar(d, &args.iter().map(String::as_str).collect::<Vec<_>>()), delay);
        if !killed {
            if !complete {
                // It trained from step 0 to the end: a whole run's length.
                full_run = full_run.min(started.elapsed());
            }
            let status = child.wait_with_output().unwrap();
            assert!(status.status.success(), "an unkilled run failed: {}", String::from_utf8_lossy(&status.stderr));
            // It finished: start over from nothing, so that every kill lands in a live run.
            std::fs::remove_dir_all(&ck).unwrap();
            continue;
        }
        kills += 1;
        let (steps, temps) = folder_state(&ck);
        assert!(temps.iter().all(|&t| t <= 1), "kill {kills}: temp files pile up: {temps:?} per rank folder");
        mid_write += temps.iter().filter(|&&t| t > 0).count().min(1);
        if steps.iter().any(|s| s.len() > KEEP) {
            mid_delete += 1;
        }
        if steps.iter().any(|s| s.last() != steps[0].last()) {
            between_ranks += 1;
        }
        // The newest step every rank wrote is complete: each of its files reads whole.
        if let Some(newest) = steps[0].iter().rev().find(|s| steps.iter().all(|r| r.contains(s))) {
            for r in 0..DEVICES {
                let t = tensors(&ck.join(format!("rank_{r}/mlp-{newest}_{r}.safetensors")));
                assert!(t.contains_key("fc1.weight") && t.contains_key("adam_m.fc1.weight"), "kill {kills}: rank {r} step {newest}");
            }
            newest_seen = newest_seen.max(*newest);
        }
    }
    // The last resume runs to the end, from whatever the kills left (a fresh run when the last
    // kill came before any checkpoint of a run started over).
    let (steps, _) = folder_state(&ck);
    let complete = steps[0].iter().any(|s| steps.iter().all(|r| r.contains(s)));
    let o = autopar(d, &train_args("ck", complete).iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    assert!(o.status.success(), "the final resume failed: {}", String::from_utf8_lossy(&o.stderr));
    let (steps, temps) = folder_state(&ck);
    assert_eq!(temps, vec![0; DEVICES], "temp files left after a clean run");
    for (r, kept) in steps.iter().enumerate() {
        assert_eq!(*kept, ((STEPS + 1 - KEEP as u64)..=STEPS).collect::<Vec<_>>(), "rank {r} keeps the newest {KEEP}");
        let name = format!("rank_{r}/mlp-{STEPS}_{r}.safetensors");
        assert!(tensors(&ck.join(&name)) == tensors(&d.join("reference").join(&name)), "{name} differs from the uninterrupted run's");
    }
    eprintln!(
        "{kills} kills: {mid_write} left a temp file (killed while writing), {between_ranks} between two ranks' files of a step, \
         {mid_delete} with more files than kept (a new file written, the oldest not yet deleted); newest complete step seen {newest_seen}"
    );
    assert!(newest_seen > 0, "no kill came after a checkpoint was saved: the delays are too short");
}

fn transform(d: &Path, out: &str) -> Command {
    autopar(
        d,
        &["ckpt", "transform", "run/ck", out, "--src-strategy", "run/ck/strategy.json", "--format", "ckpt", "--crc", "--prefix", "net_"],
    )
}

fn outputs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten().map(|f| f.path()).collect::<Vec<_>>())
        .collect();
    v.sort();
    v
}

#[test]
fn a_transform_killed_mid_way_leaves_no_half_written_file_and_a_rerun_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("run")).unwrap();
    let o = autopar_line(
        &d.join("run"),
        "train --model mlp --data synthetic --synthetic-samples 64 --width 512 --batch-size 16 --steps 1 --eval false \
         --devices 4 --checkpoint-dir ck --optimizer momentum",
    )
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let start = Instant::now();
    let o = transform(d, "reference").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let took = start.elapsed().as_micros() as u64;
    let reference = outputs(&d.join("reference"));
    assert!(!reference.is_empty());

    let mut rng = Lcg(7);
    let mut killed_runs = 0;
    for attempt in 0..20 {
        let (killed, child) = run_or_kill(transform(d, "out"), Duration::from_micros(rng.below(took + 1)));
        if killed {
            killed_runs += 1;
        } else {
            let err = stderr_of(child);
            assert!(err.is_empty() || !err.contains("error"), "attempt {attempt}: {err}");
        }
        // Whatever has its final name is complete and correct.
        for f in outputs(&d.join("out")) {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let want = d.join("reference").join(f.strip_prefix(d.join("out")).unwrap());
            assert!(
                std::fs::read(&f).unwrap() == std::fs::read(&want).unwrap(),
                "attempt {attempt}: {} is not the complete file",
                f.display()
            );
        }
    }
    let o = transform(d, "out").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: Vec<PathBuf> =
        outputs(&d.join("out")).into_iter().filter(|f| !f.file_name().unwrap().to_string_lossy().starts_with('.')).collect();
    assert_eq!(got.len(), reference.len());
    for (g, r) in got.iter().zip(&reference) {
        assert!(std::fs::read(g).unwrap() == std::fs::read(r).unwrap(), "{} differs after the rerun", g.display());
    }
    eprintln!("ckpt transform: {killed_runs} of 20 runs killed mid-way, the rerun's files equal the uninterrupted transform's");
}

#[test]
fn corrupted_and_mismatched_checkpoints_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |ck: &str, steps: &str| {
        let mut a = train_args(ck, false);
        let at = a.iter().position(|x| x == "--steps").unwrap();
        a[at + 1] = steps.into();
        let o = autopar(d, &a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run("a", "6");
    run("b", "6");
    let resume = |ck: &str| {
        let o = autopar(d, &train_args(ck, true).iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "resuming {ck} should fail");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let copy = |from: &str, to: &str| {
        let _ = std::fs::remove_dir_all(d.join(to));
        std::fs::create_dir_all(d.join(to)).unwrap();
        for r in 0..DEVICES {
            let (src, dst) = (d.join(from).join(format!("rank_{r}")), d.join(to).join(format!("rank_{r}")));
            std::fs::create_dir_all(&dst).unwrap();
            for e in std::fs::read_dir(src).unwrap().flatten() {
                std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
            }
        }
        std::fs::copy(d.join(from).join("strategy.json"), d.join(to).join("strategy.json")).unwrap();
    };

    // Rank 1's folder comes from another run of the same network and steps.
    copy("a", "x");
    std::fs::remove_dir_all(d.join("x/rank_1")).unwrap();
    std::fs::create_dir_all(d.join("x/rank_1")).unwrap();
    for e in std::fs::read_dir(d.join("b/rank_1")).unwrap().flatten() {
        std::fs::copy(e.path(), d.join("x/rank_1").join(e.file_name())).unwrap();
    }
    let err = resume("x");
    assert!(err.contains("x/rank_1/mlp-6_1.safetensors") && err.contains("belongs to another run"), "{err}");

    // Rank 1's newest file is a copy of its file of another step (mixed steps).
    copy("a", "x");
    std::fs::copy(d.join("x/rank_1/mlp-5_1.safetensors"), d.join("x/rank_1/mlp-6_1.safetensors")).unwrap();
    let err = resume("x");
    assert!(err.contains("mlp-6_1.safetensors") && err.contains("step 5") && err.contains("step 6"), "{err}");

    // A truncated rank file.
    copy("a", "x");
    let f = d.join("x/rank_1/mlp-6_1.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let err = resume("x");
    assert!(err.contains("mlp-6_1.safetensors"), "{err}");

    // A corrupted header.
    copy("a", "x");
    let f = d.join("x/rank_0/mlp-6_0.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[12] ^= 0xff;
    std::fs::write(&f, &bytes).unwrap();
    let err = resume("x");
    assert!(err.contains("mlp-6_0.safetensors"), "{err}");

    // The same checkpoints resumed over other data: another seed, sample count or order.
    for (flag, value, says) in [
        ("--seed", "7", "saved by a run with seed 1; this run has seed 7"),
        ("--synthetic-samples", "512", "over 256 training samples; this run has 512"),
        ("--shuffle", "false", "shuffle true; this run has shuffle false"),
    ] {
        let mut a = train_args("a", true);
        a.extend([flag.to_string(), value.to_string()]);
        if let Some(at) = a.iter().position(|x| x == "--synthetic-samples").filter(|_| flag == "--synthetic-samples") {
            a.drain(at..at + 2);
        }
        let o = autopar(d, &a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(says) && err.contains("--init"), "{flag} {value}: {err}");
    }

    // Rank 0's and rank 1's newest files swapped between their folders.
    copy("a", "x");
    let (f0, f1) = (d.join("x/rank_0/mlp-6_0.safetensors"), d.join("x/rank_1/mlp-6_1.safetensors"));
    let (b0, b1) = (std::fs::read(&f0).unwrap(), std::fs::read(&f1).unwrap());
    std::fs::write(&f0, &b1).unwrap();
    std::fs::write(&f1, &b0).unwrap();
    let err = resume("x");
    assert!(err.contains("mlp-6_0.safetensors") && err.contains("its metadata says it is rank 1's file"), "{err}");

    // A flipped byte in a tensor's data (the header intact): the file's CRC names it, in rank
    // 1's file and in rank 0's (which finding the newest checkpoint reads only the header of).
    for file in ["rank_1/mlp-6_1.safetensors", "rank_0/mlp-6_0.safetensors"] {
        copy("a", "x");
        let f = d.join("x").join(file);
        let mut bytes = std::fs::read(&f).unwrap();
        let at = bytes.len() - 52;
        bytes[at] ^= 0x40;
        std::fs::write(&f, &bytes).unwrap();
        let err = resume("x");
        let name = file.split('/').next_back().unwrap();
        assert!(err.contains(name) && err.contains("fails its CRC check"), "{err}");
    }

    // Only incomplete checkpoints: each step misses a rank's file.
    copy("a", "x");
    std::fs::remove_file(d.join("x/rank_1/mlp-6_1.safetensors")).unwrap();
    std::fs::remove_file(d.join("x/rank_0/mlp-5_0.safetensors")).unwrap();
    let err = resume("x");
    assert!(err.contains("no complete checkpoint") && err.contains("step 6 (no file of rank(s) [1])"), "{err}");

    // The strategy file of another network beside the checkpoints.
    copy("a", "x");
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let o = autopar_line(
        &other,
        "train --model mlp --data synthetic --synthetic-samples 64 --width 24 --batch-size 16 --steps 1 --eval false \
         --devices 2 --checkpoint-dir ck",
    )
    .output()
    .unwrap();
    assert!(o.status.success());
    std::fs::copy(other.join("ck/strategy.json"), d.join("x/strategy.json")).unwrap();
    let mut a = train_args("y", false);
    a.extend(["--resume".into(), "x".into()]);
    let o = autopar(d, &a.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains("x/strategy.json") && err.contains("full shape [24") && err.contains("does not belong to this network"), "{err}");
}
