"""The router overhead bench's CPU split reads ``perf report --sort dso`` output."""

from __future__ import annotations

import pytest

from bench.lib.router_cpu_split import OTHER, dso_shares

REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 9K of event 'cpu-clock:ppp'
#
# Overhead  Shared Object
# ........  ..............................
#
    65.94%  libpython3.11.so.1.0
    15.39%  [kernel.kallsyms]
     7.47%  _multiarray_umath.cpython-311-x86_64-linux-gnu.so
     3.69%  libc.so.6
     3.30%  loop.cpython-311-x86_64-linux-gnu.so
     4.21%  parser.cpython-311-x86_64-linux-gnu.so
"""


def test_each_shared_object_counts_in_its_column() -> None:
    shares = dso_shares(REPORT)
    assert shares["Python"] == pytest.approx(0.6594)
    assert shares["kernel"] == pytest.approx(0.1539)
    assert shares["numpy"] == pytest.approx(0.0747)
    assert shares[OTHER] == pytest.approx(0.0369 + 0.0330 + 0.0421)


def test_a_report_without_samples_is_all_zeros() -> None:
    assert set(dso_shares("# no samples\n").values()) == {0.0}
