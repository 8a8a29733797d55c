"""The policy core: pure, torch-free rules that the coordinator (which adds SQLite, the worker
registry and HTTP) and the simulator (which adds simulated time) both drive, and the worker
consults. One rule, one place:

    admission    the staleness bound: admissibility, who may lease, lease capacity
    dataplane    leases, submission, stale drops and batches combined on plain data
    trust        what a worker id earned: slow start and the new workers' pool, lease
                 deadlines, a worker's share of a batch (the data plane applies them)
    controller   the activation decide(): headroom, hysteresis, scale-down delay, run-all
                 fallback, probation for unmeasured workers (import it from
                 `echo2.policy.controller`: it pulls in the planner, the worker does not need it);
                 `credit` discounts and caps the rates it credits
"""

from echo2.policy.admission import is_admissible, lease_capacity, staleness, too_stale, worker_may_lease
from echo2.policy.dataplane import DataPlane, LeaseGrant

__all__ = [
    "DataPlane",
    "LeaseGrant",
    "is_admissible",
    "lease_capacity",
    "staleness",
    "too_stale",
    "worker_may_lease",
]
