"""Write tests/durations.txt from a pytest JUnit XML: each test file's summed seconds, costliest first.

    python -m pytest -n auto --dist loadfile --junitxml=/tmp/junit.xml
    python scripts/test_durations.py /tmp/junit.xml

tests/conftest.py hands the files to the xdist workers in that order (the costliest first, so the
last files to run are short ones and no worker waits long for the other at the end).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.txt"


def main(junit: str) -> None:
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        seconds[case.get("classname", "").replace(".", "/") + ".py"] += float(case.get("time", 0.0))
    lines = [f"{s:.1f} {f}" for f, s in seconds.most_common() if s >= 0.5]
    OUT.write_text(
        "# seconds (summed over the file's tests) and file: written by scripts/test_durations.py\n"
        + "\n".join(lines)
        + "\n"
    )
    print(f"{OUT}: {len(lines)} files")


if __name__ == "__main__":
    main(sys.argv[1])
