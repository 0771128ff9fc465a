"""How training is spread across processes (Horovod for Lightning 2.x, Azure ML's MPI launch)."""
