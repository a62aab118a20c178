"""Shared test settings: seeded, and one thread.

The models in tests are tiny: with two threads every operation pays OpenMP's fork and join (and stalls
outright when the other core is busy), so one thread is 10-30x faster here and gives the same results.
"""

import pytest
import torch


def pytest_configure(config):
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
