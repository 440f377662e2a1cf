"""vLLM's KV-event ZMQ protocol (``vllm/distributed/kv_events.py``), as enginesim publishes
it and the router reads it: frames ``[topic, seq, payload]`` on the PUB socket and
``[b"", seq, payload]`` from the replay socket, which ends a replay with ``END_SEQ``.

Constants only, importing nothing: the router's pure routing code uses them too.
"""

SEQ_BYTES = 8  # a sequence number frame: big-endian, signed
END_SEQ = -1  # the replay socket's end marker
MEDIUM_GPU = "GPU"  # the ``medium`` of events about the engine's own (GPU) KV cache
