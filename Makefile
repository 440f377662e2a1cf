# The two commands of the README. Both set up what they need first (scripts/bootstrap.sh).
.PHONY: demo test setup lint lock

# Each demo starts fresh (an earlier run's database, Redis and router configs emptied);
# `make demo KEEP=1` keeps them.
demo:
	@bash scripts/bootstrap.sh
	@.venv/bin/python scripts/demo.py $(if $(filter-out 0,$(KEEP)),--keep)

# The suite runs on parallel workers, one per core (at most 6: each takes a Redis database of
# its own, 10 to 15), each test file whole on one worker, the longest files first
# (tests/conftest.py, LONG_FILES); then the tests that must run in one process (marker
# single_process).
test:
	@WANT_BROWSER=1 bash scripts/bootstrap.sh
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@.venv/bin/lint-imports
	@.venv/bin/mypy
	@.venv/bin/python -m pytest -n auto --maxprocesses 6 --dist loadfile --no-loadscope-reorder \
		-m "not single_process"
	@.venv/bin/python -m pytest -m single_process

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
