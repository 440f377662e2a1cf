"""What the studies share (no study imports another): statistics over seeds (stats: mean ±
interval, the paired tie rule, verdicts; and the router's own histograms); the evaluation
matrix's workloads, policies, cluster and load calibration (matrix); the robustness regimes
(regimes); a live stack beside the replay (live); and for the router overhead study the
processes under test (processes), their CPU accounting (cpu), the raw-socket load client
(loadclient), and its two kinds of rows: what a router adds to a request, Switchyard beside
vllm-router (router_sidebyside), and what it costs in CPU and throughput (router_cost)."""
