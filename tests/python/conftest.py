"""pytest set-up for tests/python (imports neither torch nor a GPU).

`coda` is the installed package when there is one; otherwise the source tree's python/ is put on
sys.path (its libcoda.so found through $CODA_LIBRARY or build*/src/libcoda.so).

Seeds: each test draws its inputs from CODA_TEST_SEED (default: a fresh seed per session,
printed in the header) so that a failure can be replayed with the same numbers.
"""

import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import coda  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir, "python"))

SEED = int(os.environ.get("CODA_TEST_SEED", random.SystemRandom().randrange(1 << 31)))


def pytest_report_header(config):
    import coda

    return "coda: package %s, CODA_TEST_SEED=%d" % (os.path.dirname(coda.__file__), SEED)


@pytest.fixture(autouse=True)
def _fp32_references_without_tf32():
    """The fp32 references must be fp32: TF32 matmuls off (whatever another module set)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch.backends, "cuda"):
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
