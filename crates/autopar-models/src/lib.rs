//! autopar-models: see DESIGN.md. This crate is built by its own issue; it is a placeholder until then.
