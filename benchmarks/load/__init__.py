"""Pieces of the coordinator load benchmark (benchmarks/coordinator_load.py): the simulated
worker (`sim_worker`, the only module that speaks the worker wire protocol), the client
process that runs many of them (`client`), the fake learner (`fake_learner`), what is measured
and how it is merged (`stats`), the processes started and stopped (`processes`) and the report
read from what they all wrote (`report`, `scenarios`)."""
