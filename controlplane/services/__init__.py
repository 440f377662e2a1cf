"""Services: the only code that writes control-plane state (one transaction, one audit row)."""
