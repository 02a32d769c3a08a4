import subprocess
import sys

import pytest

pytestmark = pytest.mark.procs  # starts processes: not in make test-fast


def test_client_import_needs_neither_accounting_libraries_nor_transport():
    # Edge clients install only the lean core; importing the DP layer for clipping and
    # encoding must not pull in accountants, torch, Flower or FastAPI.
    code = (
        "import sys, fedveil.privacy.dp\n"
        "heavy = ['dp_accounting', 'opacus', 'scipy', 'torch', 'flwr', 'fastapi']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
