"""The benches' library: statistics over seeds (stats: mean ± interval, the paired tie
rule, verdicts; and the router's own histograms), and for the router bench
(bench/bench_router.py) the processes under test (processes), their CPU accounting (cpu),
the raw-socket load client (loadclient), and its two kinds of rows: what a router adds to a request,
Switchyard beside vllm-router (router_sidebyside), and what it costs in CPU and throughput
(router_cost)."""
