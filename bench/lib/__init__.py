"""The router bench's library (bench/bench_router.py): processes under test (processes),
their CPU accounting (cpu), the raw-socket load client (loadclient), the router's own
histograms (stats), and the bench's two kinds of rows: what a router adds to a request,
Switchyard beside vllm-router (router_sidebyside), and what it costs in CPU and throughput
(router_cost)."""
