"""The coordinator: the data plane and control plane between one learner and many workers.

The path of a prompt, with the gate at each arrow:

    lease ---------> submit ---------> score ---------> admit ---------> buffer ---------> batch ---------> publish
      |                 |                 |                |                                  |                 |
      the lease window: the lease is    in the scoring   t - v <= S at the                    B groups, at      signed by the
      (S steps, room    still held,     pool, within     learner's step (per                  most a share      pinned learner
      for new workers,  version and     its CPU budget;  token: the stale share               from one          key, the next
      what the worker   sizes checked   a reward is      under max_masked_fraction);          worker            version; news
      has earned)                       never the        uninformative groups                                   to every worker
                                        worker's word    dropped                                                on its line

      desks.workers      desks.rollouts   scoring.pool     policy.admission via               desks.learner     parts.versions,
      parts.leases       scoring.         scoring.limits   parts.groups                       parts.groups      http.news
                         validation

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
