"""`manage.py run_publisher`: the live-dashboard publisher for every cluster (one process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import redis.asyncio as aioredis
from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.realtime.publisher import Publisher, PublisherSettings, channel_layer_sender

log = logging.getLogger("controlplane.realtime.publisher")


class Command(BaseCommand):
    help = "Publish routers' live state, events and config changes to dashboards (Channels)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--interval",
            type=float,
            default=0.25,
            help="minimum seconds between two snapshots of a cluster",
        )
        parser.add_argument(
            "--poll",
            type=float,
            default=0.025,
            help="seconds between two reads of the routers' state",
        )

    def handle(self, *args, **options) -> None:
        tuning = PublisherSettings(interval_s=options["interval"], poll_s=options["poll"])
        asyncio.run(_serve(tuning))


async def _serve(tuning: PublisherSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    client = aioredis.from_url(settings.REDIS_URL)
    publisher = Publisher(client, channel_layer_sender(), tuning)
    task = asyncio.create_task(publisher.run(stop))
    log.info("publisher running (interval %.3fs, poll %.3fs)", tuning.interval_s, tuning.poll_s)
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await client.aclose()
