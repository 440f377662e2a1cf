"""How busy and healthy the running demo is, measured from the outside (run.py)."""
