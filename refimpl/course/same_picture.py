"""Whether two PNGs of a figure show the same picture, up to how another machine draws it.

The same code, the same pinned matplotlib and the same data give PNG bytes that differ from one
machine to the next: anti-aliased edges shade differently (measured: at most 17/255 on a
channel) and a line can snap to the neighbouring pixel column (216/255 along a 2-pixel edge).
A reader's Run All + save (and `make notebooks` elsewhere) must not turn that into a change of
a tracked file, while a figure that really changed must still be saved.

Two PNGs show the same picture when they decode to the same size and:
- every channel of every pixel of each lies within the range that channel spans in the other
  picture's 3 x 3 neighbourhood of the same place, widened by `CHANNEL_TOLERANCE` (so an edge
  may move by one pixel and its anti-aliased shade may change); and
- at most `MOVED_FRACTION` of the pixels differ in place by more than `CHANNEL_TOLERANCE`
  (a figure whose whole layout shifted is a change).
A changed number, label, bar or colour puts pixels where the other picture has no such colour
nearby, which breaks the first rule.
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

#: Largest difference of one RGBA channel (of 255) that counts as the same colour.
CHANNEL_TOLERANCE = 32
#: Largest fraction of pixels that may differ in place by more than CHANNEL_TOLERANCE, as long
# as each matches a pixel next to it.
MOVED_FRACTION = 0.01


def decode(png: str | bytes) -> np.ndarray:
    """A PNG (raw bytes, or base64 text as a notebook stores it) as an int16 RGBA array."""
    from PIL import Image

    raw = base64.b64decode(png) if isinstance(png, str) else png
    with Image.open(io.BytesIO(raw)) as image:
        return np.asarray(image.convert("RGBA"), dtype=np.int16)


def _unmatched(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> bool:
    """Whether a pixel of `a` at one of the (row, column) places `where` has a channel outside
    the range that channel spans in `b`'s 3 x 3 neighbourhood of that place, widened by the
    tolerance. (A pixel within tolerance in place always lies in that range.)"""
    padded = np.pad(b, ((1, 1), (1, 1), (0, 0)), mode="edge")
    rows, columns = where[:, 0], where[:, 1]
    around = np.stack([padded[rows + dy, columns + dx] for dy in range(3) for dx in range(3)])
    value = a[rows, columns]
    outside = (value < around.min(axis=0) - CHANNEL_TOLERANCE) | (
        value > around.max(axis=0) + CHANNEL_TOLERANCE
    )
    return bool(outside.any())


def same_picture(first: str | bytes, second: str | bytes) -> bool:
    """Whether two PNGs show the same picture within the tolerances above (identical bytes
    always do; an undecodable PNG matches only its own bytes)."""
    if first == second:
        return True
    try:
        a, b = decode(first), decode(second)
    except (OSError, ValueError, binascii.Error):
        return False
    if a.shape != b.shape:
        return False
    differ = np.abs(a - b).max(axis=2) > CHANNEL_TOLERANCE
    if differ.mean() > MOVED_FRACTION:
        return False
    where = np.argwhere(differ)
    return not (_unmatched(a, b, where) or _unmatched(b, a, where))
