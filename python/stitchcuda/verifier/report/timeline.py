"""The kernel timeline: one row per kernel name, a bar per execution, coloured by what bounds it.

matplotlib draws it when it is importable; otherwise a small built-in rasteriser (a 5x7 bitmap
font and a zlib PNG writer) draws the same picture, so a report never lacks its plot.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

from ...fsutil import atomic_write_bytes
from .profile import KernelRecord, ProfileSummary, format_ns

COLOURS = {  # bound -> RGB
    "memory": (66, 133, 244),
    "compute": (244, 160, 0),
    "latency": (219, 68, 55),
    "unknown": (140, 140, 140),
}
MAX_ROWS = 16


def _rows(records: list[KernelRecord] | tuple[KernelRecord, ...], profile: ProfileSummary | None):
    """Row names (heaviest kernels first, the rest folded into "(other)") and each record's row."""
    if profile is not None and profile.kernels:
        order = [k.name for k in profile.kernels]
    else:
        totals: dict[str, int] = {}
        for r in records:
            totals[r.name] = totals.get(r.name, 0) + r.duration_ns
        order = sorted(totals, key=lambda n: -totals[n])
    names = order[:MAX_ROWS - 1] if len(order) > MAX_ROWS else order
    other = len(order) > MAX_ROWS
    index = {n: i for i, n in enumerate(names)}
    labels = list(names) + (["(other)"] if other else [])
    placed = [(index.get(r.name, len(names)), r) for r in records]
    return labels, placed


def _bounds(profile: ProfileSummary | None) -> dict[str, str]:
    return {k.name: k.bound for k in profile.kernels} if profile else {}


def render_timeline_png(records: list[KernelRecord] | tuple[KernelRecord, ...], path: str | Path,
                        profile: ProfileSummary | None = None, title: str = "",
                        prefer_matplotlib: bool = True) -> tuple[Path, str]:
    """Draw the timeline to ``path`` (atomically). Returns (path, renderer) where renderer is
    "matplotlib" or "builtin"."""
    data = None
    renderer = "builtin"
    if prefer_matplotlib:
        try:
            data = _matplotlib_png(records, profile, title)
            renderer = "matplotlib"
        except ImportError:
            data = None
    if data is None:
        data = _builtin_png(records, profile, title)
    return atomic_write_bytes(path, data), renderer


# ------------------------------------------------------------------ matplotlib


def _matplotlib_png(records, profile, title) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    labels, placed = _rows(records, profile)
    bound = _bounds(profile)
    t0 = min((r.start_ns for r in records), default=0)
    fig = Figure(figsize=(10, 0.4 * max(len(labels), 1) + 1.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    for row, r in placed:
        c = COLOURS.get(bound.get(r.name, "unknown"), COLOURS["unknown"])
        ax.broken_barh([((r.start_ns - t0) / 1e3, max(r.duration_ns, 1) / 1e3)], (row - 0.4, 0.8),
                       facecolors=[tuple(v / 255 for v in c)])
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels([lb if len(lb) <= 48 else lb[:45] + "..." for lb in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (us)")
    ax.set_title(title or "kernel timeline", fontsize=10)
    ax.legend(handles=[Patch(color=tuple(v / 255 for v in c), label=b) for b, c in COLOURS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(COLOURS), fontsize=7, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


# ------------------------------------------------------------------ built-in rasteriser

# Columns of a 5x7 font, least significant bit at the top.
_FONT = {
    "0": (0x3E, 0x51, 0x49, 0x45, 0x3E), "1": (0x00, 0x42, 0x7F, 0x40, 0x00), "2": (0x42, 0x61, 0x51, 0x49, 0x46),
    "3": (0x21, 0x41, 0x45, 0x4B, 0x31), "4": (0x18, 0x14, 0x12, 0x7F, 0x10), "5": (0x27, 0x45, 0x45, 0x45, 0x39),
    "6": (0x3C, 0x4A, 0x49, 0x49, 0x30), "7": (0x01, 0x71, 0x09, 0x05, 0x03), "8": (0x36, 0x49, 0x49, 0x49, 0x36),
    "9": (0x06, 0x49, 0x49, 0x29, 0x1E), "A": (0x7E, 0x11, 0x11, 0x11, 0x7E), "B": (0x7F, 0x49, 0x49, 0x49, 0x36),
    "C": (0x3E, 0x41, 0x41, 0x41, 0x22), "D": (0x7F, 0x41, 0x41, 0x22, 0x1C), "E": (0x7F, 0x49, 0x49, 0x49, 0x41),
    "F": (0x7F, 0x09, 0x09, 0x09, 0x01), "G": (0x3E, 0x41, 0x49, 0x49, 0x7A), "H": (0x7F, 0x08, 0x08, 0x08, 0x7F),
    "I": (0x00, 0x41, 0x7F, 0x41, 0x00), "J": (0x20, 0x40, 0x41, 0x3F, 0x01), "K": (0x7F, 0x08, 0x14, 0x22, 0x41),
    "L": (0x7F, 0x40, 0x40, 0x40, 0x40), "M": (0x7F, 0x02, 0x0C, 0x02, 0x7F), "N": (0x7F, 0x04, 0x08, 0x10, 0x7F),
    "O": (0x3E, 0x41, 0x41, 0x41, 0x3E), "P": (0x7F, 0x09, 0x09, 0x09, 0x06), "Q": (0x3E, 0x41, 0x51, 0x21, 0x5E),
    "R": (0x7F, 0x09, 0x19, 0x29, 0x46), "S": (0x46, 0x49, 0x49, 0x49, 0x31), "T": (0x01, 0x01, 0x7F, 0x01, 0x01),
    "U": (0x3F, 0x40, 0x40, 0x40, 0x3F), "V": (0x1F, 0x20, 0x40, 0x20, 0x1F), "W": (0x3F, 0x40, 0x38, 0x40, 0x3F),
    "X": (0x63, 0x14, 0x08, 0x14, 0x63), "Y": (0x07, 0x08, 0x70, 0x08, 0x07), "Z": (0x61, 0x51, 0x49, 0x45, 0x43),
    ".": (0x00, 0x60, 0x60, 0x00, 0x00), "_": (0x40, 0x40, 0x40, 0x40, 0x40), "-": (0x08, 0x08, 0x08, 0x08, 0x08),
    ":": (0x00, 0x36, 0x36, 0x00, 0x00), "%": (0x23, 0x13, 0x08, 0x64, 0x62), "(": (0x00, 0x1C, 0x22, 0x41, 0x00),
    ")": (0x00, 0x41, 0x22, 0x1C, 0x00), "/": (0x20, 0x10, 0x08, 0x04, 0x02), "<": (0x08, 0x14, 0x22, 0x41, 0x00),
    ">": (0x00, 0x41, 0x22, 0x14, 0x08), ",": (0x00, 0x50, 0x30, 0x00, 0x00), " ": (0, 0, 0, 0, 0),
    "=": (0x14, 0x14, 0x14, 0x14, 0x14), "+": (0x08, 0x08, 0x3E, 0x08, 0x08), "*": (0x14, 0x08, 0x3E, 0x08, 0x14),
    "[": (0x00, 0x7F, 0x41, 0x41, 0x00), "]": (0x00, 0x41, 0x41, 0x7F, 0x00), "?": (0x02, 0x01, 0x51, 0x09, 0x06),
}
_W, _ROW, _LEFT, _TOP = 1000, 16, 250, 40


class _Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def rect(self, x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        x0, x1 = max(0, x0), min(self.w, x1)
        y0, y1 = max(0, y0), min(self.h, y1)
        if x1 <= x0 or y1 <= y0:
            return
        row = bytes(rgb) * (x1 - x0)
        for y in range(y0, y1):
            o = (y * self.w + x0) * 3
            self.px[o:o + len(row)] = row

    def text(self, x: int, y: int, s: str, rgb=(0, 0, 0)) -> None:
        for ch in s.upper():
            cols = _FONT.get(ch, _FONT["?"])
            for cx, bits in enumerate(cols):
                for cy in range(7):
                    if bits >> cy & 1:
                        self.rect(x + cx, y + cy, x + cx + 1, y + cy + 1, rgb)
            x += 6

    def png(self) -> bytes:
        stride = self.w * 3
        raw = b"".join(b"\x00" + bytes(self.px[y * stride:(y + 1) * stride]) for y in range(self.h))

        def chunk(tag: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _builtin_png(records, profile, title) -> bytes:
    labels, placed = _rows(records, profile)
    bound = _bounds(profile)
    h = _TOP + _ROW * max(len(labels), 1) + 40
    c = _Canvas(_W, h)
    c.text(10, 8, (title or "kernel timeline")[:160])
    t0 = min((r.start_ns for r in records), default=0)
    t1 = max((r.end_ns for r in records), default=1)
    span = max(t1 - t0, 1)
    plot_w = _W - _LEFT - 20
    # axis and ticks
    c.rect(_LEFT, _TOP - 4, _LEFT + plot_w, _TOP - 3, (0, 0, 0))
    for k in range(5):
        x = _LEFT + plot_w * k // 4
        c.rect(x, _TOP - 8, x + 1, _TOP - 3, (0, 0, 0))
        c.text(min(x, _W - 60), _TOP - 18, format_ns(span * k / 4).replace(" ", ""))
    for i, lb in enumerate(labels):
        y = _TOP + i * _ROW
        if i % 2:
            c.rect(_LEFT, y, _LEFT + plot_w, y + _ROW, (245, 245, 245))
        c.text(6, y + 4, lb if len(lb) <= 39 else lb[:37] + "..")
    for row, r in placed:
        y = _TOP + row * _ROW
        x0 = _LEFT + int((r.start_ns - t0) / span * plot_w)
        x1 = max(x0 + 1, _LEFT + int((r.end_ns - t0) / span * plot_w))
        c.rect(x0, y + 2, x1, y + _ROW - 2, COLOURS.get(bound.get(r.name, "unknown"), COLOURS["unknown"]))
    # legend
    x, y = _LEFT, h - 24
    for b, rgb in COLOURS.items():
        c.rect(x, y, x + 10, y + 8, rgb)
        c.text(x + 14, y + 1, b)
        x += 14 + 6 * len(b) + 20
    return c.png()


__all__ = ["render_timeline_png", "COLOURS"]
