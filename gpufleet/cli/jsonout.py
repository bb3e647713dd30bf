"""JSON for scripts (`--json`), without rich: a `--json` run never needs the table renderer's imports."""

from __future__ import annotations

import json


def print_json(data) -> None:
    print(json.dumps(data, indent=2, sort_keys=False, default=str))
