//! Every fuzz target's corpus (`fuzz/corpus/<target>`: seeds from real MindSpore and autopar
//! files, and the inputs the fuzzer kept) and past findings (`fuzz/regressions/<target>`) run
//! through the target's function under `cargo test`: none may panic, hang or run away with
//! memory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(folder: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(folder).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    v.sort();
    v
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target_file() {
    for (name, _) in autopar_fuzz::TARGETS {
        assert!(!inputs(&fuzz_dir().join("corpus").join(name)).is_empty(), "fuzz/corpus/{name} is empty");
        assert!(fuzz_dir().join("fuzz_targets").join(format!("{name}.rs")).is_file(), "fuzz/fuzz_targets/{name}.rs is missing");
    }
}

#[test]
fn corpora_and_past_findings_never_panic() {
    let mut total = 0;
    for (name, run) in autopar_fuzz::TARGETS {
        for folder in ["corpus", "regressions"] {
            for input in inputs(&fuzz_dir().join(folder).join(name)) {
                let data = std::fs::read(&input).unwrap();
                let start = Instant::now();
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(outcome.is_ok(), "{name}: {} panics", input.display());
                assert!(start.elapsed() < Duration::from_secs(10), "{name}: {} took {:?}", input.display(), start.elapsed());
                total += 1;
            }
        }
    }
    assert!(total >= autopar_fuzz::TARGETS.len());
}

#[test]
fn seeds_parse_so_the_fuzzer_starts_from_valid_files() {
    // The targets swallow errors; check directly that the real-file seeds are accepted.
    let seed = |t: &str, f: &str| std::fs::read(fuzz_dir().join("corpus").join(t).join(f)).unwrap();
    assert!(
        autopar_checkpoint::StrategyFile::from_protobuf(Path::new("s"), &seed("strategy_protobuf", "semi_all_strategy_rank0.ckpt")).is_ok()
    );
    assert!(autopar_checkpoint::StrategyFile::from_json(Path::new("s"), &seed("strategy_json", "mp4")).is_ok());
    let toml = String::from_utf8(seed("toml_config", "train")).unwrap();
    let cfg = autopar::config::parse_config(&toml, Path::new("train.toml")).unwrap();
    let mut ctx = autopar_parallel::ParallelContext::default();
    ctx.apply_table(cfg.parallel.as_ref().unwrap()).unwrap();
    assert_eq!(ctx.device_num(), 4);
}
