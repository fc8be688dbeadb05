"""`pflash-gateway sessions ls|rm|gc`: works on the store directly, with the server down."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import msgpack

from gateway.config import Settings
from sessions.store import META, FORMAT_VERSION


def _scan(root: Path) -> list[dict[str, Any]]:
    """Every stored session of every fingerprint, read without loading its KV."""
    rows: list[dict[str, Any]] = []
    base = root / "sessions"
    for fp_dir in sorted(base.iterdir()) if base.exists() else []:
        for path in sorted(fp_dir.iterdir()) if fp_dir.is_dir() else []:
            row: dict[str, Any] = {"id": path.name, "fingerprint": fp_dir.name, "path": str(path), "valid": False}
            try:
                meta = msgpack.unpackb((path / META).read_bytes(), raw=False, strict_map_key=False)
                kv = meta.get("kv") or {}
                row.update(
                    valid=meta.get("format") == FORMAT_VERSION,
                    tokens=len(kv.get("tokens", [])),
                    bytes=sum(f.stat().st_size for f in path.iterdir() if f.is_file()),
                    last_used=meta["session"]["last_used"],
                    compressed_messages=len(meta["session"].get("kept_maps", {})),
                )
            except Exception as exc:  # listing must survive anything on disk
                row["error"] = str(exc)
            rows.append(row)
    return rows


def run_sessions(settings: Settings, action: str, ids: list[str], as_json: bool) -> int:
    root = settings.store_dir
    rows = _scan(root)
    if action == "ls":
        if as_json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{'session':16}  {'tokens':>7}  {'MiB':>7}  {'last used':19}  state")
            for r in rows:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.get("last_used", 0)))
                state = "ok" if r["valid"] else f"invalid ({r.get('error', 'format')})"
                print(f"{r['id'][:16]:16}  {r.get('tokens', 0):>7}  {r.get('bytes', 0) / 2**20:>7.1f}  {when:19}  {state}")
        return 0
    if action == "rm":
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
    removed = 0
    for r in rows:
        if not r["valid"]:
            shutil.rmtree(r["path"], ignore_errors=True)
            removed += 1
    for tmp in (root / "sessions").glob("*/*/.*.tmp") if (root / "sessions").exists() else []:
        tmp.unlink(missing_ok=True)
    print(f"removed {removed} invalid sessions")
    return 0
