//! With the `mpi` feature: compile a one-function C shim exporting `MPI_IN_PLACE`, with the
//! same MPI compiler wrapper the `mpi` crate uses.

fn main() {
    println!("cargo:rerun-if-changed=csrc/mpi_shim.c");
    #[cfg(feature = "mpi")]
    {
        let lib = match build_probe_mpi::probe() {
            Ok(lib) => lib,
            Err(errs) => {
                for e in errs {
                    println!("cargo:warning=MPI probe: {e}");
                }
                panic!("the `mpi` feature needs an MPI installation: apt-get install openmpi-bin libopenmpi-dev libclang-dev");
            }
        };
        let mut b = cc::Build::new();
        b.file("csrc/mpi_shim.c");
        match lib.mpicc {
            Some(mpicc) => {
                b.compiler(mpicc);
            }
            None => {
                for inc in &lib.include_paths {
                    b.include(inc);
                }
            }
        }
        b.compile("autopar_mpi_shim");
    }
}
