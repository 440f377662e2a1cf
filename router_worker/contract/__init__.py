"""The router's contract with the control plane, in one package: what each side may rely
on of the other, and the only part of ``router_worker`` (with the policies of
``router_worker.routing``) that the control plane imports (the import-linter contract
``control-plane-uses-the-router-contract``).

* :mod:`router_worker.contract.config`: the configuration document a router applies (the
  control plane stores and serves it as a ``ConfigVersion``);
* :mod:`router_worker.contract.telemetry`: every record a router writes to Redis (state
  snapshots, metrics, events, decisions, captured traffic), the keys and channels they go
  to, and the Redis ACL rules a router's user gets; each per-instance field's merge rule
  across routers is declared beside the dashboard's merge
  (``controlplane/realtime/snapshot.py``'s tables, checked against these records);
* :mod:`router_worker.contract.capture`: the keyed digests of captured traffic, which the
  router computes and the control plane's ingest checks;
* :mod:`router_worker.contract.tracing`: when both sides trace, as the standard ``OTEL_*``
  variables say, and how they export.
"""
