"""Seed the demo cluster idempotently (after emptying everything with --fresh) and print
fresh operator and admin logins."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from controlplane.services.demo import (
    DemoSpec,
    DisaggDemoSpec,
    reset,
    reset_login,
    seed,
    seed_disaggregated,
)


class Command(BaseCommand):
    help = (
        "Create (once) the demo cluster h20-qwen2-7b (and, with --pd-instances, the "
        "disaggregated h20-qwen2-7b-pd) and reset the demo logins."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--instances", type=int, default=16)
        parser.add_argument("--engine-base-port", type=int, default=9100)
        parser.add_argument("--kv-events-base-port", type=int, default=5600)
        parser.add_argument("--router-host", default="localhost")
        parser.add_argument("--router-port", type=int, default=8000)
        parser.add_argument(
            "--time-scale", type=float, default=1.0, help="the engines' --time-scale"
        )
        parser.add_argument(
            "--pd-instances",
            type=int,
            default=0,
            help="instances of the disaggregated cluster (half prefill, half decode; 0: none)",
        )
        parser.add_argument("--pd-engine-base-port", type=int, default=9200)
        parser.add_argument("--pd-kv-events-base-port", type=int, default=5800)
        parser.add_argument("--pd-router-port", type=int, default=8001)
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="first empty the database, the Redis database and the routers' saved "
            "configs of an earlier run (the demo's default)",
        )

    def handle(self, *args, **options) -> None:
        if options["fresh"]:
            for what in reset():
                self.stdout.write(f"reset {what}")
        spec = DemoSpec(
            instances=options["instances"],
            engine_base_port=options["engine_base_port"],
            kv_events_base_port=options["kv_events_base_port"] or None,
            router_host=options["router_host"],
            router_port=options["router_port"],
            time_scale=options["time_scale"],
        )
        cluster = seed(spec)
        if options["pd_instances"]:
            pd = seed_disaggregated(
                DisaggDemoSpec(
                    instances=options["pd_instances"],
                    engine_base_port=options["pd_engine_base_port"],
                    kv_events_base_port=options["pd_kv_events_base_port"] or None,
                    router_host=options["router_host"],
                    router_port=options["pd_router_port"],
                    time_scale=options["time_scale"],
                )
            )
            self.stdout.write(f"pd_cluster {pd.pk} {pd.name}")
        operator = reset_login("operator", "operator")
        admin = reset_login("admin", "admin", superuser=True)
        self.stdout.write(f"cluster {cluster.pk} {cluster.name}")
        self.stdout.write(f"operator {operator}")
        self.stdout.write(f"admin {admin}")
