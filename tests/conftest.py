"""Shared test settings: deterministic, single-threaded-friendly, float64 where parity demands it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
