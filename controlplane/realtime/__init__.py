"""Channels side of the control plane: websocket consumers and the telemetry publisher."""
