"""How the operator copes with many services at once, on the local dev cluster.

    .venv/bin/python -m benchmarks.operator_scale [--services 1000] [--out benchmarks/results]

Starts a fresh dev cluster (controller manager and scheduler with raised client limits; audit
log extended to the operator's reads and to the bodies of readiness status writes), installs
the CRDs and the cluster-wide RBAC, then (`harness`):

1. bare Deployments: the engine Deployments the operator renders for the N services, applied
   directly with no operator running, timed to all rolled out, then deleted;
2. warm-up: the operator starts (`inferfleet run` as its service account); one service;
3. single services: one service applied alone, a few times in a row;
4. rollout: N services (a ModelDeployment on the `sim` engine and an InferenceService each) in
   one `kubectl apply --server-side`, each timed to its InferenceService's `Ready=True`;
5. steady: a settling pause, then a minute in which nothing changes.

Then it reads the API server's audit log (`audit`: requests per user, verb and resource,
where the time went, the operator-attributable latencies), the operator's log
(`operator_log`) and /proc (`procfs`: CPU seconds and peak RSS per process), stops
everything, checks that no process is left, judges the operator's scale goals (`summary`) and writes
`operator_scale.json` and `operator_scale.md` (`report`) to `--out`.
"""
