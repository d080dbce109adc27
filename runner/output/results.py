"""The results folder: one row per window, appended and synced as soon as it exists.

Three files grow side by side (seed 004 section 8):

``windows_detail.jsonl``
    ``{"schema": 2, "row": ..., "detail": ...}`` per window, with the per-user and
    per-bucket figures: the file of record, written first;
``results.jsonl``
    one JSON object per window holding exactly the :class:`WindowRow` fields, in order;
``results.csv``
    the same row as CSV, header written once.

Every append is flushed and ``fsync``'d, so a window that finished is on disk even if
the machine dies a moment later. Files are only ever appended to: a resumed run adds
its windows after the ones already there.

A process killed in the middle of a write can leave a torn last line (one without its
newline): readers ignore it, and the next writer cuts it off before appending, so it
never fuses with a complete row. A process killed between the appends of one window
leaves ``results.jsonl``/``results.csv`` a row short: the next writer rebuilds both
from ``windows_detail.jsonl``, so no window is lost or written twice.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runner.errors import ResultsError
from runner.measure.result import WindowDetail, WindowResult, WindowRow

log = logging.getLogger("runner")

JSONL_NAME = "results.jsonl"
CSV_NAME = "results.csv"
DETAIL_NAME = "windows_detail.jsonl"
# The layout of a windows_detail.jsonl record; a record of another layout is refused.
SCHEMA = 2


class ResultsWriter:
    """Appends each finished window to the results folder (created if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in (JSONL_NAME, CSV_NAME, DETAIL_NAME):
                _cut_torn_tail(self.directory / name)
            self._check_csv_header()
            self._rebuild_rows()
        except OSError as exc:
            raise ResultsError(
                f"The results folder {self.directory} cannot be prepared ({exc}). "
                "runner writes every window there as soon as it is measured; choose a "
                "writable folder with results.dir=PATH or fix its permissions."
            ) from exc

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
        """Append one window to all three files, the file of record first, synced."""
        row = result.row.as_dict()
        try:
            record = {"schema": SCHEMA, "row": row, "detail": result.detail.as_dict()}
            _append_synced(self.detail_path, json.dumps(record, default=str) + "\n")
            _append_synced(self.jsonl_path, json.dumps(row) + "\n")
            _append_synced(self.csv_path, _csv_text([row], header=_is_empty(self.csv_path)))
        except OSError as exc:
            raise ResultsError(
                f"The window at users={result.row.users} could not be written to "
                f"{self.directory} ({exc}). Windows written before it are intact; free "
                "disk space or fix permissions and resume the run with its run_id."
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

    def _rebuild_rows(self) -> None:
        """Make results.jsonl and results.csv hold exactly the windows of record."""
        rows = [result.row.as_dict() for result in read_results(self.directory)]
        if len(read_jsonl(self.jsonl_path)) == len(rows) and _csv_rows(self.csv_path) == len(rows):
            return
        log.warning(
            "%s: rebuilding %s and %s from %s (a run stopped between the appends of a window)",
            self.directory, JSONL_NAME, CSV_NAME, DETAIL_NAME,
        )  # fmt: skip
        _replace_synced(self.jsonl_path, "".join(json.dumps(row) + "\n" for row in rows))
        _replace_synced(self.csv_path, _csv_text(rows, header=True) if rows else "")


def read_results(directory: Path) -> list[WindowResult]:
    """Every window of record in ``directory`` (rows with their details), for resuming
    a run and for its report; [] if none. A record this runner cannot read is refused."""
    path = Path(directory) / DETAIL_NAME
    results = []
    for number, record in enumerate(read_jsonl(path), start=1):
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            schema = record.get("schema") if isinstance(record, dict) else None
            raise ResultsError(
                f"Window {number} of {path} has layout {schema!r}, but this runner reads "
                f"layout {SCHEMA}: it was written by another version of runner. Resume "
                "that run with the version that started it, or start a new run_id."
            )
        try:
            row = WindowRow(**record["row"])
            detail = WindowDetail.from_dict(record["detail"])
        except (KeyError, TypeError, ValidationError) as exc:
            raise ResultsError(
                f"Window {number} of {path} does not hold a valid window ({exc}). The file "
                "was edited or damaged; restore it or start a new run_id."
            ) from exc
        results.append(WindowResult(row, detail))
    return results


def _csv_text(rows: list[dict[str, Any]], *, header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=WindowRow.field_names(), lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        # Same spelling as the JSONL file: empty for unavailable, lower-case booleans.
        writer.writerow({key: _csv_value(value) for key, value in row.items()})
    return buffer.getvalue()


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _csv_rows(path: Path) -> int:
    if _is_empty(path):
        return 0
    with path.open(encoding="utf-8", newline="") as handle:
        return max(0, sum(1 for _ in csv.reader(handle)) - 1)


def _append_synced(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8", newline="") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _replace_synced(path: Path, text: str) -> None:
    """Write ``path`` whole through a temporary file, never leaving the temporary behind."""
    partial = path.with_name(path.name + ".tmp")
    try:
        with partial.open("w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


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


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSONL file runner appends to; [] if absent.

    Only lines that end in a newline are complete: a last line without one is a torn
    write, ignored here as the next writer cuts it off (:func:`_cut_torn_tail`).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ResultsError(f"{path} cannot be read ({exc}).") from exc
    lines = text.split("\n")
    if lines[-1]:
        log.warning("ignoring a partial last line in %s", path)
    records = []
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ResultsError(
                f"Line {number} of {path} is not valid JSON ({exc.msg}). Only the last "
                "line can be torn by an interrupted run; a damaged line before it "
                "means the file was edited or corrupted. Restore it or start a new run."
            ) from exc
    return records
