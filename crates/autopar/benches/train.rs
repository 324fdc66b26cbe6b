//! `autopar train` on the README's quick-start command exactly (the MLP 784-512-512-10 on
//! synthetic MNIST-shaped data, 3 epochs, cosine schedule, 2 simulated devices under
//! semi_auto_parallel), then the same job stand-alone and on 4 simulated devices. Wall time of
//! the whole process, as a user sees it. `benches/versus.rs` puts PyTorch beside it.
//!
//! `cargo bench -p autopar --bench train` (set AUTOPAR_BENCH_EPOCHS to shorten or lengthen it).

#[path = "common/quickstart.rs"]
mod quickstart;

fn run(extra: &[&str], epochs: &str) -> (f64, f64, String) {
    let dir = std::env::temp_dir().join(format!("autopar-train-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (wall, stdout) = quickstart::run(&dir, epochs, extra);
    let _ = std::fs::remove_dir_all(&dir);
    let summary = stdout.lines().find(|l| l.starts_with("trained ")).unwrap_or_default().to_string();
    let sps = summary.rsplit(": ").next().and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let tail: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  ")).collect();
    (wall, sps, format!("{summary}\n{}", tail.join("\n")))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let epochs = std::env::var("AUTOPAR_BENCH_EPOCHS").unwrap_or_else(|_| "3".into());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("autopar train, MLP 784-512-512-10, synthetic 65536 samples, batch 64, {epochs} epochs, {threads} CPU threads");
    println!("{:<34} {:>10} {:>12}", "run", "wall s", "samples/s");
    for (name, extra) in [
        ("README: 2 devices, semi_auto", &["--devices", "2"][..]),
        ("stand_alone", &[][..]),
        ("4 devices, semi_auto", &["--devices", "4"][..]),
    ] {
        let (wall, sps, text) = run(extra, &epochs);
        println!("{name:<34} {wall:>10.1} {sps:>12.1}");
        for l in text.lines() {
            println!("    {l}");
        }
    }
}
