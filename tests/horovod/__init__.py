"""The horovod extra's tests: Horovod's strategy under horovodrun and mpirun, and its GPU build."""
