//! Every example in `examples/` is built and run here, as a user would run it (`cargo run
//! --example NAME`): each checks its own results (equal to stand-alone, resharded bytes
//! unchanged, the dataset learnt) and returns an error otherwise.

macro_rules! example {
    ($name:ident) => {
        mod $name {
            include!(concat!("../examples/", stringify!($name), ".rs"));
        }

        #[test]
        fn $name() {
            if let Err(e) = $name::main() {
                panic!("example {}: {e}", stringify!($name));
            }
        }
    };
}

example!(custom_network);
example!(custom_dataset);
example!(pipeline_stages);
example!(reshard_checkpoint);

#[test]
fn every_example_is_run_here() {
    let here = include_str!("examples.rs");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned();
        assert!(here.contains(&format!("example!({name});")), "examples/{name}.rs is not run by tests/examples.rs");
    }
}
