"""The frozen train / validation / test split of the evaluation data (`../shared/data/`).

Made once, before any tuning, and committed as `benchmarks/training/splits.json` (beside the training
code, never in the runtime package). Coding sessions are split by repository and session: within
each repository its sessions are ordered by a hash of their id and dealt into test, validation and
train; a repository with at most two sessions goes whole to test (a repository no tuning saw).
MTRAG is split by conversation within each collection the same way. Training, early stopping and
every choice of setting use train and validation only; published numbers use test only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Literal

Split = Literal["train", "validation", "test"]
SPLITS_FILE = Path(__file__).resolve().parent / "splits.json"
TEST_SHARE = 0.30
VALIDATION_SHARE = 0.20
_SALT = "pflash-split-v1"


def _order(key: str) -> str:
    return hashlib.sha256(f"{_SALT}\x00{key}".encode()).hexdigest()


def deal(groups: Mapping[str, Iterable[str]], whole_test_below: int = 3) -> dict[str, Split]:
    """Assign every member of every group (repository → session ids) to a split."""
    out: dict[str, Split] = {}
    for group in sorted(groups):
        members = sorted(set(groups[group]), key=_order)
        if len(members) < whole_test_below:
            out.update((m, "test") for m in members)
            continue
        n_test = max(1, round(len(members) * TEST_SHARE))
        n_val = max(1, round(len(members) * VALIDATION_SHARE))
        for k, member in enumerate(members):
            out[member] = "test" if k < n_test else "validation" if k < n_test + n_val else "train"
    return out


def make_splits(swe_records: Iterable[Mapping[str, object]], mtrag_records: Iterable[Mapping[str, object]]) -> dict[str, dict[str, Split]]:
    by_repo: dict[str, list[str]] = {}
    for r in swe_records:
        sid = str(r["id"])
        by_repo.setdefault(sid.split("__")[0], []).append(sid)
    by_collection: dict[str, list[str]] = {}
    for r in mtrag_records:
        by_collection.setdefault(str(r["Collection"]), []).append(str(r["conversation_id"]))
    return {"swe": deal(by_repo), "mtrag": deal(by_collection)}


@cache
def _frozen() -> dict[str, dict[str, Split]]:
    return json.loads(SPLITS_FILE.read_text())["splits"]  # type: ignore[no-any-return]


def split_of(kind: Literal["swe", "mtrag"], key: str) -> Split | None:
    """The frozen split of a session id (swe) or conversation id (mtrag); None if unknown."""
    return _frozen()[kind].get(key)


def write_splits(path: Path, splits: Mapping[str, Mapping[str, Split]]) -> None:
    counts = {kind: {s: sum(1 for v in members.values() if v == s) for s in ("train", "validation", "test")}
              for kind, members in splits.items()}
    doc = {"about": __doc__.strip().splitlines()[0], "salt": _SALT, "counts": counts,
           "splits": {kind: dict(sorted(members.items())) for kind, members in splits.items()}}
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
