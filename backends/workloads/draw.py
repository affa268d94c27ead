"""Draw each item's ground truth from its category's distributions and store it in the file.

``python -m backends.workloads.draw [--force]`` fills in ``acceptance`` and ``output_tokens`` for items that
lack them (all items with ``--force``), seeded by the item id so that the result is reproducible. Lines are
edited in place so the hand-written prompts and comments stay as they are.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
import sys
from pathlib import Path

from backends.workloads.loader import DATA_DIR, CategoryFile, ItemSpec, load_category_file

_ID_LINE = re.compile(r"^  - id: (?P<id>\S+)\s*$")
_DRAWN_LINE = re.compile(r"^    (acceptance|output_tokens): ")


def draw_values(item: ItemSpec, spec: CategoryFile) -> tuple[float, int]:
    rng = random.Random(int(hashlib.sha256(item.id.encode()).hexdigest()[:16], 16))
    beta = spec.distribution.acceptance
    alpha = beta.mean * beta.concentration
    acceptance = rng.betavariate(alpha, beta.concentration - alpha)
    length = spec.distribution.output_tokens
    drawn = math.exp(math.log(length.median) + length.sigma * rng.gauss(0.0, 1.0))
    output_tokens = int(min(max(round(drawn), length.minimum), length.maximum))
    return round(min(max(acceptance, 0.05), 0.98), 3), output_tokens


def rewrite(path: Path, *, force: bool) -> int:
    spec = load_category_file(path)
    wanted = {item.id: item for item in spec.items if force or item.acceptance is None}
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
                acceptance, output_tokens = draw_values(wanted[current], spec)
                out += [f"    acceptance: {acceptance}", f"    output_tokens: {output_tokens}"]
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return len(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--force", action="store_true", help="redraw every item")
    args = parser.parse_args(argv)
    for path in sorted(DATA_DIR.glob("*.yaml")):
        print(f"{path.name}: drew {rewrite(path, force=args.force)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main())
