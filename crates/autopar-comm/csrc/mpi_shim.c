/* MPI_IN_PLACE is a macro whose value differs between MPI implementations; export it. */
#include <mpi.h>

void *autopar_mpi_in_place(void) { return MPI_IN_PLACE; }
