"""Detection runs without Django: the classifier can be tested and benchmarked alone."""

from __future__ import annotations

import subprocess
import sys

from django.conf import settings


def test_detection_imports_no_django() -> None:
    code = (
        "import sys\n"
        "import recovery.detection.cli, recovery.detection.classify, recovery.detection.hang\n"
        "import recovery.detection.straggler, recovery.detection.facts\n"
        "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')], "
        "'django imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(settings.BASE_DIR)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
