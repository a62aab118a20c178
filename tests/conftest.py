"""Shared test settings: seeded, and one thread.

The models in tests are tiny: with two threads every operation pays OpenMP's fork and join (and stalls
outright when the other core is busy), so one thread is 10-30x faster here and gives the same results.
"""

import os
import tempfile

import pytest
import torch

from qkv.generation import kernels


def pytest_configure(config):
    torch.set_num_threads(1)
    # Decoding's kernel choices are measured into a file of the test session's own, not the user's cache
    # (subprocesses inherit it).
    os.environ[kernels.CACHE_ENV] = os.path.join(tempfile.mkdtemp(prefix="qkv-kernels-"), "kernels.json")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
