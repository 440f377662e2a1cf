# The two commands of the README. Both set up what they need first (scripts/bootstrap.sh).
.PHONY: demo test setup lint lock

demo:
	@bash scripts/bootstrap.sh
	@.venv/bin/python scripts/demo.py

test:
	@WANT_BROWSER=1 bash scripts/bootstrap.sh
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@.venv/bin/lint-imports
	@.venv/bin/mypy
	@.venv/bin/python -m pytest

setup:
	@WANT_BROWSER=1 bash scripts/bootstrap.sh

lint:
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@.venv/bin/lint-imports
	@.venv/bin/mypy

# Re-pin requirements.lock (hashed) from pyproject.toml; keeps the versions already locked.
lock:
	@bash scripts/lock.sh
