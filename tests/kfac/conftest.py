"""K-FAC math tests compare against dense computations in float64 (``usefixtures("float64")``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def float64() -> Iterator[None]:
    """float64 as the default dtype for the test, restored after it."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
