"""Trace replay: a discrete-event simulator of a routed enginesim cluster.

``python -m enginesim replay --trace FILE --policy all --out DIR``. Modules: traces
(readers, token synthesis), synth (generators for agentic sessions and hotspot bursts),
simulator (the event loop), metrics (summaries, the TTFT lower bound), plots, cli.

Only this package (in enginesim) imports ``router_worker.routing``: the policies and
indicator-state code the live router runs, so a simulated result is a statement about
the production code.
"""
