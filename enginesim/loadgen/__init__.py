"""Load generator: send a trace's requests to an OpenAI-compatible URL in real time.

``python -m enginesim loadgen --trace FILE --target URL``; see ``cli`` for the options,
``payloads`` for how requests are synthesised and ``runner`` for timing and measurement.
"""
