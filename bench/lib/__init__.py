"""The router bench's library (bench/bench_router.py): processes under test (processes),
their CPU placement and accounting (cpu), the raw-socket load client (loadclient), the
prober (prober), the statistics of what they measured (stats), and the bench's two kinds of
rows: what the router adds to TTFT (router_latency) and what it costs in CPU and throughput
(router_cost)."""
