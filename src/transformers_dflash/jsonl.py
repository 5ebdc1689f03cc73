"""JSONL data files read with errors that name the file, the line and what is wrong.

Every stage that reads rows (prompt sets, regenerated responses) goes through `read_jsonl`: a line that is not a
JSON object fails with `path:line`, never with the decoder's "line 1 column 1"; a last line cut short (a run killed
mid-write, which the writing stages repair when they resume) is dropped with a one-line notice and a count.
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line number, object) for every non-blank line of a JSONL file (`.gz` and `.xz` are read compressed).

    Raises a ValueError naming the file and the line for a line that is not a JSON object; a last line without
    its newline that does not parse (a killed writer) is dropped, with a notice on stderr.
    """
    path = Path(path)
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    rows: list[tuple[int, dict[str, Any]]] = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                if not line.endswith("\n"):  # the last line, cut short
                    print(
                        f"dflash: {path}: dropped line {number}, cut off mid-write (a killed run); kept {len(rows)} "
                        "rows. Rerunning the stage that writes this file redoes that row.",
                        file=sys.stderr,
                    )
                    break
                raise ValueError(
                    f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno}); fix or delete that line."
                ) from error
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}; fix or delete that line."
                )
            rows.append((number, row))
    return rows


def require_fields(path: str | Path, number: int, row: dict[str, Any], fields: dict[str, type], fix: str) -> None:
    """Refuses row `number` of `path` unless it has every field of `fields` (name -> type); `fix` says how."""
    for name, kind in fields.items():
        if name not in row:
            raise ValueError(f"{path}:{number}: the row has no {name!r} (it has {sorted(row)}); {fix}")
        if not isinstance(row[name], kind):
            raise ValueError(
                f"{path}:{number}: {name!r} must be a {kind.__name__}, got {type(row[name]).__name__}; {fix}"
            )
