"""Each test folder is a marker: unit, integration, horovod, slurm, container, bench."""

from pathlib import Path

import pytest

FOLDER_MARKERS = {"unit", "integration", "horovod", "slurm", "container", "bench"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.fspath).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, folder))
