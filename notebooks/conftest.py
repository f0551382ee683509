"""The tutorial notebooks are collected by nbval (``--nbval-lax``, see pyproject's addopts).

Each cell is a test that runs in a real Jupyter kernel: mark them ``kernel`` so that
``-m "not kernel"`` leaves them out of a quick run.
"""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.split("::", 1)[0].endswith(".ipynb"):
            item.add_marker(pytest.mark.kernel)
