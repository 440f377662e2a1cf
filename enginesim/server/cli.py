"""``python -m enginesim serve``: N simulated vLLM instances in one asyncio process.

Instance k listens on ``--base-port + k``. ``--admin-port`` (optional) serves a
process-wide ``POST /admin/fault`` taking ``{"instance": k, "mode": ...}``
(needed to recover a killed instance, whose own port is closed) and
``GET /admin/instances``.

``--global-tier-blocks`` gives the process's instances one shared global KV tier
(``GlobalKVTier``: write-through, loads on a local miss over a link shared with the
other instances' reads, ``--global-tier-link-instances`` per link). Their virtual
clocks start together, so their reads queue in one time base; a ``slow`` fault stretches
one instance's clock, and its reads then queue against the others only approximately.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from chat_templates import TemplateLoadError
from enginesim.server.chat import model_template
from enginesim.server.faults import FaultError, FaultRequest
from enginesim.server.instance import Instance, InstanceSettings
from enginesim.server.kv_events import ENCODINGS, KVEventPublisher, instance_endpoints
from enginesim.server.request_log import RequestLog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instances", type=int, default=1, help="number of instances")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--base-port", type=int, default=8100, help="instance k: base-port + k")
    parser.add_argument("--gpu", default="h20", help="simulated GPU (enginesim.engine.hardware)")
    parser.add_argument("--model", default="qwen2-7b", help="model key (enginesim.engine.models)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="wall seconds per simulated second (>1 = slow motion; <1 = faster than real)",
    )
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="tokens per SSE chunk (vLLM's option)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="context length in tokens (vLLM's option; default: the model's own)",
    )
    parser.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|PATH",
        help="chat template (vLLM's option): chatml, llama3, plain, or the path of a "
        "tokenizer_config.json or .jinja file; default: the model's own family (ChatML for "
        "Qwen, llama3 for Llama)",
    )
    parser.add_argument(
        "--kv-events",
        default=None,
        metavar="tcp://HOST:PORT",
        help="publish KV events: instance k on PORT+k, replay on PORT+100+k",
    )
    parser.add_argument("--kv-encoding", choices=ENCODINGS, default="map")
    parser.add_argument("--kv-topic", default="", help="ZMQ topic frame (vLLM's default: empty)")
    parser.add_argument("--admin-port", type=int, default=None, help="process-wide admin API")
    parser.add_argument(
        "--request-log",
        default=None,
        metavar="FILE",
        help="append one JSON line per request: the engine's arrival, first-token and finish "
        "times (CLOCK_MONOTONIC) and token counts, keyed by the request id (X-Request-Id)",
    )
    parser.add_argument(
        "--global-tier-blocks",
        type=int,
        default=0,
        help="blocks of a global KV tier shared by this process's instances (0 = none)",
    )
    parser.add_argument(
        "--global-tier-bandwidth", type=float, default=25e9, help="tier read bytes/s per link"
    )
    parser.add_argument(
        "--global-tier-link-instances",
        type=int,
        default=0,
        help="instances per tier link (0 = one link for all)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="INDEX:MODE[:ARG]",
        help="start with a fault, e.g. 2:slow:5, 3:error5xx, 1:drop_midstream:4, 0:drip:0.5 "
        "(repeatable)",
    )


def _engine_parts(
    gpu: str, model: str, max_model_len: int = 0, tier_blocks: int = 0, tier_bandwidth: float = 25e9
) -> tuple[Any, Any]:
    """The engine config and ``factory(tier_link) -> (kv_sink -> EngineCore)``."""
    from enginesim.engine.config import EngineConfig
    from enginesim.engine.core import EngineCore
    from enginesim.engine.kvpool import GlobalKVTier

    tier = GlobalKVTier(tier_blocks, tier_bandwidth) if tier_blocks else None
    config = EngineConfig.for_hardware(gpu, model, max_model_len=max_model_len, global_tier=tier)

    def factory(tier_link: int) -> Any:
        return lambda sink: EngineCore(config, kv_event_sink=sink, tier_link=tier_link)

    return config, factory


def build_instances(args: argparse.Namespace) -> list[Instance]:
    if args.instances < 1 or args.stream_interval < 1:
        raise SystemExit("--instances and --stream-interval must be >= 1")
    if args.max_model_len < 0:
        raise SystemExit("--max-model-len must be >= 0 (0: the model's own)")
    if args.global_tier_blocks < 0 or args.global_tier_bandwidth <= 0:
        raise SystemExit("--global-tier-blocks must be >= 0 and --global-tier-bandwidth > 0")
    per_link = args.global_tier_link_instances
    if per_link < 0:
        raise SystemExit("--global-tier-link-instances must be >= 0 (0: one link for all)")
    config, factory = _engine_parts(
        args.gpu,
        args.model,
        args.max_model_len,
        args.global_tier_blocks,
        args.global_tier_bandwidth,
    )
    try:
        template = model_template(config.model.key, args.chat_template)
    except TemplateLoadError as exc:
        raise SystemExit(f"--chat-template: {exc}") from None
    request_log = RequestLog(args.request_log) if args.request_log else None
    instances = []
    for index in range(args.instances):
        publisher = None
        if args.kv_events:
            pub, replay = instance_endpoints(args.kv_events, index)
            publisher = KVEventPublisher(pub, replay, args.kv_encoding, args.kv_topic)
        settings = InstanceSettings(
            index, args.host, args.base_port + index, args.time_scale, args.stream_interval
        )
        link = index // per_link if per_link else 0
        instances.append(
            Instance(settings, config, factory(link), publisher, request_log, template)
        )
    return instances


async def serve(args: argparse.Namespace) -> None:
    from enginesim.server.admin import build_admin_app, start_admin_server
    from enginesim.server.app import build_app

    instances = build_instances(args)
    initial_faults = [FaultRequest.from_cli(spec) for spec in args.fault]
    for inst in instances:
        if inst.kv_publisher is not None:
            inst.kv_publisher.start()
        await inst.start(build_app(inst))
    for index, fault in initial_faults:
        await instances[index].apply_fault(fault)
    admin = None
    if args.admin_port is not None:
        admin = await start_admin_server(build_admin_app(instances), args.host, args.admin_port)
    last_port = args.base_port + len(instances) - 1
    print(
        f"enginesim ready: {len(instances)} x {args.model} on {args.gpu}, "
        f"ports {args.base_port}-{last_port}, time scale {args.time_scale:g}",
        flush=True,
    )
    await _wait_for_signal()
    if admin is not None:
        await admin.stop()
    for inst in instances:
        await inst.stop()
        if inst.kv_publisher is not None:
            await inst.kv_publisher.close()
    if instances[0].request_log is not None:
        instances[0].request_log.close()


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        for spec in args.fault:
            FaultRequest.from_cli(spec)
    except FaultError as exc:
        raise SystemExit(str(exc)) from exc
    runner_kwargs: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        import uvloop

        runner_kwargs["loop_factory"] = uvloop.new_event_loop
    with asyncio.Runner(**runner_kwargs) as runner:
        runner.run(serve(args))
    return 0
