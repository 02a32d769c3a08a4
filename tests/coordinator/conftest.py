from __future__ import annotations

import sys
from pathlib import Path

# Helper modules of the coordinator tests (deployment_harness; deploy_task lives in tests/)
# import as top-level names here and, through PYTHONPATH, in the processes the tests start.
sys.path.insert(0, str(Path(__file__).parent))
