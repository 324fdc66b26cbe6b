//! Compiles MindSpore's protobuf schemas with `protox` (pure Rust, no `protoc` needed) and
//! generates the `prost` types.

fn main() {
    let protos = ["proto/node_strategy.proto", "proto/checkpoint.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = match protox::compile(protos, ["proto"]) {
        Ok(fds) => fds,
        Err(e) => panic!("cannot compile the protobuf schemas: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(fds) {
        panic!("cannot generate Rust code from the protobuf schemas: {e}");
    }
}
