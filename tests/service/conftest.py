from __future__ import annotations

import sys
from pathlib import Path

# Helper modules of the service tests (harness, deploy_task) import as top-level
# names here and, through PYTHONPATH, in the processes the tests start.
sys.path.insert(0, str(Path(__file__).parent))
