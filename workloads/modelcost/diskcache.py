"""Optional on-disk cache of measured costs (one JSON file per model+layout+shape)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


class DiskCache:
    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"

    def get(self, key: str) -> Any | None:
        if self.root is None:
            return None
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            return data["value"] if data.get("key") == key else None
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            return None  # a corrupt or foreign cache entry is a miss; it is rewritten after measuring

    def put(self, key: str, value: Any) -> None:
        if self.root is None:
            return
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "value": value}))
        tmp.replace(self._path(key))
