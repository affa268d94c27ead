"""Draw each synthetic item's base output length from its category's distribution and store it in the file.

``python -m backends.workloads.draw [--force]`` fills in ``output_tokens`` for items that lack it (all items
with ``--force``) in every synthetic file of every split, seeded by the item id so that the result is
reproducible. Lines are edited in place so the hand-written prompts and comments stay as they are. The
acceptance is not drawn: it comes from each item's content (``backends.emulator.acceptance``), as does the
length where the content plainly sets it (a rewrite, a translation, a one-word answer). Recorded files are
left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
import sys
from pathlib import Path

from backends.workloads.loader import SPLITS, CategoryFile, ItemSpec, load_category_file

_ID_LINE = re.compile(r"^  - id: (?P<id>\S+)\s*$")
_DRAWN_LINE = re.compile(r"^    output_tokens: ")


def draw_tokens(item: ItemSpec, spec: CategoryFile) -> int:
    """The base output length of ``item``: log-normal from its category, seeded by its id."""
    if spec.distribution is None:
        raise ValueError(f"category {spec.category} has no distribution to draw from")
    rng = random.Random(int(hashlib.sha256(item.id.encode()).hexdigest()[:16], 16))
    length = spec.distribution.output_tokens
    drawn = math.exp(math.log(length.median) + length.sigma * rng.gauss(0.0, 1.0))
    return int(min(max(round(drawn), length.minimum), length.maximum))


def rewrite(path: Path, *, force: bool) -> int:
    spec = load_category_file(path)
    if spec.provenance != "synthetic":
        return 0
    wanted = {item.id: item for item in spec.items if force or item.output_tokens is None}
    out: list[str] = []
    current: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _ID_LINE.match(line)
        if current in wanted and _DRAWN_LINE.match(line):
            continue
        out.append(line)
        if match:
            current = match.group("id")
            if current in wanted:
                out.append(f"    output_tokens: {draw_tokens(wanted[current], spec)}")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return len(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--force", action="store_true", help="redraw every item")
    args = parser.parse_args(argv)
    for directory in SPLITS.values():
        for path in sorted(directory.glob("*.yaml")):
            print(f"{path}: drew {rewrite(path, force=args.force)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
