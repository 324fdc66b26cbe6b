//! The (2, 4) data x model strategy of the MLP 784-512-512-10 on 8 devices, as the benches set
//! it (`versus`, and `autopar-runtime`'s `parallel` through a path include): the batch split 2
//! ways, the first layer split 4 ways by output column (its bias and ReLU too), the second 4 ways
//! by input row, the rest split by batch only. Every op of a layer has its strategy, as JAX's
//! sharding keeps it (`peers/mesh_jax.py`); an op left out would take the default (the batch
//! split 8 ways) and redistributions around it.

/// (op name, strategy) pairs for `Model::shard_graph`.
pub const MESH_2X4: [(&str, &str); 9] = [
    ("fc1.matmul", "((2,1),(4,1))"),
    ("fc1.bias_add", "((2,4),(4,))"),
    ("relu1", "((2,4),)"),
    ("fc2.matmul", "((2,4),(1,4))"),
    ("fc2.bias_add", "((2,1),(1,))"),
    ("relu2", "((2,1),)"),
    ("fc3.matmul", "((2,1),(1,1))"),
    ("fc3.bias_add", "((2,1),(1,))"),
    ("loss", "((2,1),(2,))"),
];
