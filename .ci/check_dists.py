"""Check what the package index would show of each built distribution (run by ``.ci/wheels``).

``twine check --strict`` validates that the metadata and README render; this adds what twine does
not know we want: the MIT license file inside every wheel and sdist, authors, classifiers and
project URLs, and README links that work on the package index (absolute, not ``../../examples``).

Usage: ``python .ci/check_dists.py DIST_DIR``.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

PACKAGES = ["lightning_rl", "lightning_langchain", "lightning_autogen", "lightning_openai_agents", "lightning_crewai"]
RELATIVE_LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)]+)\)")


def check_wheel(path: Path) -> list[str]:
    problems: list[str] = []
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        [meta_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(whl.read(meta_name).decode())
        if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
            problems.append("no LICENSE in the wheel")
    if meta.get("License-Expression") != "MIT":
        problems.append(f"License-Expression is {meta.get('License-Expression')!r}, not 'MIT'")
    if not (meta.get("Author") or meta.get("Author-email")):
        problems.append("no author")
    classifiers = meta.get_all("Classifier") or []
    if not any(c.startswith("Programming Language :: Python :: 3.") for c in classifiers):
        problems.append("no Python version classifiers")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    for label in ("Homepage", "Repository", "Issues", "Changelog", "Documentation"):
        if not urls.get(label, "").startswith("https://"):
            problems.append(f"no Project-URL {label}")
    description = meta.get_payload() or ""
    for link in RELATIVE_LINK.findall(description):
        problems.append(f"README link {link!r} is relative: it breaks on the package index")
    return problems


def check_sdist(path: Path) -> list[str]:
    with tarfile.open(path) as sdist:
        if not any(n.endswith("/LICENSE") for n in sdist.getnames()):
            return ["no LICENSE in the sdist"]
    return []


def main() -> int:
    dist = Path(sys.argv[1])
    failures = 0
    for package in PACKAGES:
        wheels = sorted(dist.glob(f"{package}-*.whl"))
        sdists = sorted(dist.glob(f"{package}-*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1:
            print(f"FAIL {package}: expected one wheel and one sdist in {dist}, found {wheels + sdists}")
            failures += 1
            continue
        problems = check_wheel(wheels[0]) + check_sdist(sdists[0])
        for problem in problems:
            print(f"FAIL {wheels[0].name}: {problem}")
        failures += bool(problems)
        if not problems:
            print(f"ok   {wheels[0].name}: LICENSE, authors, classifiers, URLs, absolute README links")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
