"""`pflash-gateway sessions ls|rm|gc`: works on the store directly. `rm` and `gc` refuse while a
server holds the store (its advisory lock): they would delete files it is serving from."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from gateway.config import Settings
from sessions.files import StoreLock
from sessions.layout import CURRENT, FORMAT_VERSION, KV, META, head_bytes, read_kv_header


def _scan(root: Path) -> list[dict[str, Any]]:
    """Every stored session of every fingerprint, read without loading its KV."""
    rows: list[dict[str, Any]] = []
    base = root / "sessions"
    for fp_dir in sorted(base.iterdir()) if base.exists() else []:
        for path in sorted(fp_dir.iterdir()) if fp_dir.is_dir() else []:
            row: dict[str, Any] = {"id": path.name, "fingerprint": fp_dir.name, "path": str(path), "valid": False}
            try:
                meta = msgpack.unpackb((path / META).read_bytes(), raw=False, strict_map_key=False)
                tokens = 0
                if (path / KV).exists():
                    with (path / KV).open("rb") as fh:
                        tokens = len(read_kv_header(head_bytes(fh))[0].get("tokens", []))
                row.update(
                    valid=meta.get("format") == FORMAT_VERSION,
                    tokens=tokens,
                    bytes=sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
                    last_used=meta["session"]["last_used"],
                    compressed_messages=len(meta["session"].get("kept_maps", {})),
                    kind=meta["session"].get("kind", "main"),  # a branch's session is its parent
                    parent=meta["session"].get("parent", ""),
                )
            except Exception as exc:  # listing must survive anything on disk
                row["error"] = str(exc)
            rows.append(row)
    return rows


def _stale_fingerprints(root: Path) -> list[Path]:
    """Fingerprint directories other than the one the last server used (another model, context
    size or KV type): nothing will load them again. Unknown without a server's mark: none."""
    base = root / "sessions"
    try:
        current = (base / CURRENT).read_text().strip()
    except OSError:
        return []
    return [p for p in sorted(base.iterdir()) if p.is_dir() and p.name != current]


def run_sessions(settings: Settings, action: str, ids: list[str], as_json: bool) -> int:
    root = settings.store_dir
    if action == "ls":
        return _ls(_scan(root), as_json)
    if not root.exists():
        print(f"pflash-gateway: no session store at {root}")
        return 0 if action == "gc" else 1
    lock = StoreLock(root)
    try:
        if not lock.try_exclusive():
            print(f"pflash-gateway: a running server holds the store {root}; stop it first "
                  f"(or use DELETE /v1/sessions/<id>)", file=sys.stderr)
            return 1
        return _rm(_scan(root), ids) if action == "rm" else _gc(root)
    finally:
        lock.release()


def _ls(rows: list[dict[str, Any]], as_json: bool) -> int:
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'session':16}  {'conversation':24}  {'tokens':>7}  {'MiB':>7}  {'last used':19}  state")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.get("last_used", 0)))
        state = "ok" if r["valid"] else f"invalid ({r.get('error', 'format')})"
        conversation = r.get("kind", "?") + (f" of {r['parent'][:12]}" if r.get("parent") else "")
        print(f"{r['id'][:16]:16}  {conversation:24}  {r.get('tokens', 0):>7}  {r.get('bytes', 0) / 2**20:>7.1f}  "
              f"{when:19}  {state}")
    return 0


def _rm(rows: list[dict[str, Any]], ids: list[str]) -> int:
    if not ids:
        print("pflash-gateway: sessions rm needs at least one session id")
        return 2
    status = 0
    for prefix in ids:
        matches = [r for r in rows if r["id"].startswith(prefix)]
        if len(matches) != 1:
            print(f"pflash-gateway: {prefix!r} matches {len(matches)} sessions")
            status = 1
            continue
        shutil.rmtree(matches[0]["path"], ignore_errors=True)
        print(f"removed {matches[0]['id']}")
    return status


def _gc(root: Path) -> int:
    stale = _stale_fingerprints(root)
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    removed = 0
    for r in _scan(root):
        if not r["valid"]:
            shutil.rmtree(r["path"], ignore_errors=True)
            removed += 1
    for tmp in (root / "sessions").glob("*/*/.*.tmp") if (root / "sessions").exists() else []:
        tmp.unlink(missing_ok=True)
    print(f"removed {removed} invalid sessions" + (f" and {len(stale)} stale model directories" if stale else ""))
    return 0
