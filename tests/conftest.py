"""Shared test settings: the repository root, and seeds for reproducible random inputs."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(20261121)
