"""The coordinator: the data plane and control plane between one learner and many workers.

The path of a prompt, with the gate at each arrow (and the code that keeps it):

    lease --> submit --> score --> admit --> buffer --> batch --> publish
      |         |          |         |                    |          |
      |         |          |         |                    |          +- signed by the pinned learner key, the next
      |         |          |         |                    |             version; news to every worker on its line
      |         |          |         |                    |             (parts.versions, http.news)
      |         |          |         |                    +- B groups, at most a share from one worker
      |         |          |         |                       (desks.learner, parts.groups)
      |         |          |         +- t - v <= S at the learner's step (per token: the stale share under
      |         |          |            train.max_masked_fraction); uninformative groups dropped (policy.admission)
      |         |          +- in the scoring pool, within its budget of CPU; a reward is never the worker's
      |         |             word (scoring.pool, scoring.limits)
      |         +- the lease still held, its version and every size checked (desks.rollouts, scoring.validation)
      +- the lease window: S steps, room for new workers, what the worker has earned
         (desks.workers, parts.leases, policy.trust)

Rooms, by what each part is:
- `parts/`: the state each part owns, built from its own config section (`Parts`): registry,
  leases, groups, versions and their dissemination, the audit's ledger, evaluations, relay
  probes, credentials.
- `desks/`: the transactions that span parts, one desk per asker: workers (join, heartbeat,
  news, lease), the fleet (sweep, activation), rollout intake, the learner, evaluations.
- `scoring/`: rewards computed where they can be trusted: the pool of scoring processes, jobs,
  limits, the child process, episode replay, submission checks.
- `records/`: the events metrics.jsonl gets, the SQLite store, the refusal error.
- `http/`: the aiohttp face: routes, long-held requests and news lines, the coordinator's own
  loops (sweep, news crier, load watch), the dashboard, Prometheus, views and history.
`state.py` wires parts and desks; `main.py` serves them.
"""
