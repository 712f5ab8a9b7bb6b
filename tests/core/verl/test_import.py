"""The VeRL backend is an optional extra: importing the package is free, using it without verl says what to install."""

from __future__ import annotations

import subprocess
import sys


def test_missing_verl_raises_an_import_error_naming_the_extra() -> None:
    code = (
        "import sys; sys.modules['verl'] = None\n"
        "import lightning_rl.backends.verl as v\n"  # importing the package itself never needs verl
        "try:\n    v.VerlBackend\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "ERR" in out.stdout and "pip install 'lightning-rl[verl]'" in out.stdout


def test_unsupported_python_says_to_use_an_older_one() -> None:
    # verl declares Requires-Python <3.13, so there the extra installs no verl; the message must say
    # why instead of repeating "pip install 'lightning-rl[verl]'" (which would change nothing).
    code = (
        "import sys; sys.modules['verl'] = None\n"
        "import lightning_rl.backends.verl._require as r\n"
        "r.PYTHON_LIMIT = sys.version_info[:2]\n"  # as if this interpreter were 3.13
        "try:\n    r.require_verl()\nexcept ImportError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "ERR" in out.stdout and "supports Python < 3.13 only" in out.stdout and "3.12" in out.stdout
