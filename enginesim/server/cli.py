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

Fleet variation (``--mixed-gpu``, ``--speeds``, ``--step-jitter``, ``--perturb``,
``--fleet-seed``; enginesim.engine.fleet, the same flags and the same per-instance engines
as ``replay``) makes instances unlike each other in simulated time: a speed-0.5 instance's
steps take twice as long, so its TTFT and ITL (``/metrics``) double, unlike a ``slow``
fault, which stretches only the wall clock. ``GET /admin/hardware`` on an instance's port
says what it runs on.

Prefill/decode disaggregation (``--roles``, ``--kv-link``, ``--kv-hold-timeout``;
enginesim.server.disagg): each instance is a prefill, decode or both instance and speaks
vLLM's NIXL ``kv_transfer_params``; reads go over the link preset. With ``--roles`` every
instance exports the transfer metrics (``vllm:nixl_*``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

from chat_templates import TemplateLoadError
from enginesim.engine import fleet, transfer
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
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory for weights, activations and KV cache (vLLM's option): "
        "lower leaves fewer KV blocks",
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
    fleet.add_arguments(parser, seed_default="0")
    transfer.add_arguments(parser)


def _engine_parts(
    args: argparse.Namespace, variation: fleet.FleetVariation
) -> tuple[list[Any], Any]:
    """Each instance's engine config and ``factory(config, tier_link) -> (kv_sink ->
    EngineCore)``."""
    from enginesim.engine.core import EngineCore
    from enginesim.engine.kvpool import GlobalKVTier

    blocks, bandwidth = args.global_tier_blocks, args.global_tier_bandwidth
    tier = GlobalKVTier(blocks, bandwidth) if blocks else None
    try:
        configs = variation.engine_configs(
            args.instances,
            args.gpu,
            args.model,
            max_model_len=args.max_model_len,
            global_tier=tier,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_link=args.kv_link,
            kv_hold_timeout=args.kv_hold_timeout,
        )
    except (KeyError, ValueError) as exc:  # an unknown GPU or model, a model that does not fit
        raise SystemExit(f"error: {exc}") from None

    def factory(config: Any, tier_link: int) -> Any:
        return lambda sink: EngineCore(config, kv_event_sink=sink, tier_link=tier_link)

    return configs, factory


def build_instances(
    args: argparse.Namespace, variation: fleet.FleetVariation | None = None
) -> list[Instance]:
    """The instances the flags describe; ``variation``: the fleet variation, if already
    taken from the flags."""
    if args.instances < 1 or args.stream_interval < 1:
        raise SystemExit("--instances and --stream-interval must be >= 1")
    if args.max_model_len < 0:
        raise SystemExit("--max-model-len must be >= 0 (0: the model's own)")
    if args.global_tier_blocks < 0 or args.global_tier_bandwidth <= 0:
        raise SystemExit("--global-tier-blocks must be >= 0 and --global-tier-bandwidth > 0")
    per_link = args.global_tier_link_instances
    if per_link < 0:
        raise SystemExit("--global-tier-link-instances must be >= 0 (0: one link for all)")
    if variation is None:
        variation = fleet.variation_from_args(args, args.instances, args.gpu, seed=0)
    configs, factory = _engine_parts(args, variation)
    try:
        template = model_template(configs[0].model.key, args.chat_template)
    except TemplateLoadError as exc:
        raise SystemExit(f"--chat-template: {exc}") from None
    request_log = RequestLog(args.request_log) if args.request_log else None
    try:
        roles = args.roles.resolve(args.instances, "both") if args.roles else None
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    instances = []
    for index in range(args.instances):
        publisher = None
        if args.kv_events:
            pub, replay = instance_endpoints(args.kv_events, index)
            publisher = KVEventPublisher(pub, replay, args.kv_encoding, args.kv_topic)
        settings = InstanceSettings(
            index,
            args.host,
            args.base_port + index,
            args.time_scale,
            args.stream_interval,
            role=roles[index] if roles else "both",
            kv_connector=roles is not None,
        )
        link = index // per_link if per_link else 0
        config = configs[index]
        instances.append(
            Instance(settings, config, factory(config, link), publisher, request_log, template)
        )
    return instances


async def serve(args: argparse.Namespace) -> None:
    from enginesim.server.admin import build_admin_app, start_admin_server
    from enginesim.server.app import build_app

    variation = fleet.variation_from_args(args, args.instances, args.gpu, seed=0)
    instances = build_instances(args, variation)
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
    varied = f"; {variation.describe(args.gpu)}" if variation.varies(args.gpu) else ""
    print(
        f"enginesim ready: {len(instances)} x {args.model} on {args.gpu}, "
        f"ports {args.base_port}-{last_port}, time scale {args.time_scale:g}{varied}",
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
