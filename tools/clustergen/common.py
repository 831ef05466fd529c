"""What every part of the generator shares: seeded identifiers, timestamps, units, the `List` writer.

Owns `Ids` (every random stream, uid, digest and name suffix of a generated cluster derives from a scope,
an optional seed and the parts naming what it is for, never from the run or from PYTHONHASHSEED), `ts`,
the units, and `write_list`, which streams a `List` as `kubectl get -o json` prints it.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

Json = dict[str, Any]

GIB = 1024**3
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's rand.String


@dataclass(frozen=True)
class Ids:
    """Deterministic randomness and identifiers for one generated cluster.

    `scope` separates clusters (it is part of every uid); `seed`, when given, is the first of the parts of
    every stream, uid and digest, so that two seeds give two clusters. Without a seed the values depend on
    the parts alone.
    """

    scope: str
    seed: int | None = None

    def _key(self, parts: tuple[object, ...]) -> str:
        everything = parts if self.seed is None else (self.seed, *parts)
        return "/".join(map(str, everything))

    def rng(self, *parts: object) -> random.Random:
        """A random stream that depends only on the seed and `parts`."""
        return random.Random(zlib.crc32(self._key(parts).encode()))

    def uid(self, *parts: object) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.scope}/{self._key(parts)}"))

    def digest(self, *parts: object) -> str:
        """64 hex digits (a container id, an image digest...)."""
        return hashlib.sha256(self._key(parts).encode()).hexdigest()

    def suffix(self, length: int, *parts: object) -> str:
        """A Kubernetes-style name suffix (the alphabet of apimachinery's rand.String)."""
        r = self.rng("suffix", *parts)
        return "".join(r.choice(SUFFIX_ALPHABET) for _ in range(length))


def ts(moment: datetime) -> str:
    """RFC 3339 in UTC, to the second, as the API server prints it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


_LIST_HEAD = '{\n    "apiVersion": "v1",\n    "items": ['
_LIST_TAIL = '\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n'
_ITEM_INDENT = "\n        "  # an item sits two levels deep


def write_list(path: Path, items: Iterable[Json]) -> int:
    """Write a `List` of `items` as `kubectl get -o json` prints it, one item at a time; return the count.

    The bytes are those of `json.dumps(document, indent=4, sort_keys=True) + "\\n"` for the whole document
    (an empty list included), without ever holding more than one item's text.
    """
    count = 0
    with path.open("w", encoding="utf-8") as out:
        out.write(_LIST_HEAD)
        for item in items:
            text = json.dumps(item, indent=4, sort_keys=True).replace("\n", _ITEM_INDENT)
            out.write(("," if count else "") + _ITEM_INDENT + text)
            count += 1
        out.write("\n    ]," if count else "],")
        out.write(_LIST_TAIL)
    return count
