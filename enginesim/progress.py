"""A one-line progress display on stderr, shared by the replay and loadgen commands."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn


def progress_display() -> Progress:
    """Label, bar, done/total and a free-text status field (the task's ``now``)."""
    return Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[now]}"),
        console=Console(stderr=True),
        refresh_per_second=5,
    )
