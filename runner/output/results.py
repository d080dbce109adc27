"""The results folder: one row per window, appended and synced as soon as it exists.

Three files grow side by side (seed 004 section 8):

``results.jsonl``
    one JSON object per window holding exactly the :class:`WindowRow` fields, in order;
``results.csv``
    the same row as CSV, header written once;
``windows_detail.jsonl``
    ``{"row": ..., "detail": ...}`` with the per-user and per-bucket figures.

Every append is flushed and ``fsync``'d, so a window that finished is on disk even if
the machine dies a moment later. Files are only ever appended to: a resumed run adds
its windows after the ones already there. A process killed in the middle of a write
can leave a torn last line; readers ignore it and the next writer cuts it off before
appending, so it never fuses with a complete row.

This module also renders the one-line console summary of a window.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

from runner.errors import ResultsError
from runner.measure.result import WindowDetail, WindowResult, WindowRow

log = logging.getLogger("runner")

JSONL_NAME = "results.jsonl"
CSV_NAME = "results.csv"
DETAIL_NAME = "windows_detail.jsonl"


class ResultsWriter:
    """Appends each finished window to the results folder (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in (JSONL_NAME, CSV_NAME, DETAIL_NAME):
                _cut_torn_tail(self.directory / name)
        except OSError as exc:
            raise ResultsError(
                f"The results folder {self.directory} cannot be prepared ({exc}). "
                "runner writes every window there as soon as it is measured; choose a "
                "writable folder with results.dir=PATH or fix its permissions."
            ) from exc
        self._check_csv_header()

    @property
    def jsonl_path(self) -> Path:
        return self.directory / JSONL_NAME

    @property
    def csv_path(self) -> Path:
        return self.directory / CSV_NAME

    @property
    def detail_path(self) -> Path:
        return self.directory / DETAIL_NAME

    def append(self, result: WindowResult) -> None:
        """Append one window to all three files and sync them to disk."""
        row = result.row.as_dict()
        try:
            _append_synced(self.jsonl_path, json.dumps(row) + "\n")
            _append_synced(self.csv_path, _csv_text(row, header=_is_empty(self.csv_path)))
            detail = {"row": row, "detail": result.detail.as_dict()}
            _append_synced(self.detail_path, json.dumps(detail, default=str) + "\n")
        except OSError as exc:
            raise ResultsError(
                f"The window at users={result.row.users} could not be written to "
                f"{self.directory} ({exc}). The measurement itself is lost for this "
                "folder; free disk space or fix permissions and resume the run."
            ) from exc

    def _check_csv_header(self) -> None:
        if _is_empty(self.csv_path):
            return
        with self.csv_path.open(encoding="utf-8", newline="") as handle:
            header = next(csv.reader(handle), [])
        if header != WindowRow.field_names():
            raise ResultsError(
                f"{self.csv_path} has columns {header}, not the ones this version of "
                f"runner writes ({WindowRow.field_names()}). Appending would mix two "
                "layouts in one file; point results.dir at a new folder instead."
            )


def read_rows(directory: Path) -> list[WindowRow]:
    """The rows already in ``results.jsonl`` (empty if none), for resuming a run."""
    return [WindowRow(**record) for record in read_jsonl(Path(directory) / JSONL_NAME)]


def read_results(directory: Path) -> list[WindowResult]:
    """Rows with their details from ``windows_detail.jsonl``, for reports on resume."""
    return [
        WindowResult(WindowRow(**record["row"]), WindowDetail.from_dict(record["detail"]))
        for record in read_jsonl(Path(directory) / DETAIL_NAME)
    ]










def _csv_text(row: dict[str, Any], *, header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=WindowRow.field_names(), lineterminator="\n")
    if header:
        writer.writeheader()
    # Same spelling as the JSONL file: empty for unavailable, lower-case booleans.
    writer.writerow({key: _csv_value(value) for key, value in row.items()})
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _append_synced(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _is_empty(path: Path) -> bool:
    return not path.exists() or path.stat().st_size == 0


def _cut_torn_tail(path: Path) -> None:
    """Drop a partial last line left by a killed writer; complete lines end in a newline."""
    if _is_empty(path):
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    log.warning(
        "%s ends with a partial line (%d bytes) from an interrupted write; dropping it",
        path,
        len(data) - keep,
    )
    with path.open("r+b") as handle:
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL file runner appends to; [] if absent; a torn last line is dropped."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                log.warning("ignoring a partial last line in %s", path)
                break
            raise ResultsError(
                f"Line {number} of {path} is not valid JSON ({exc.msg}). Only the last "
                "line can be torn by an interrupted run; a damaged line in the middle "
                "means the file was edited or corrupted. Restore it or start a new run."
            ) from exc
    return records
