"""The router bench's library (bench/bench_router.py): processes under test (processes),
their CPU placement and accounting (cpu), the raw-socket load client (loadclient), the
prober (prober) and the statistics of what they measured (stats)."""
