"""A tiny pure-Python raster canvas and PNG writer (zlib + struct), enough for benchmark plots.

No plotting library: lines, rectangles, a 5x7 bitmap font (upper case, digits, a few signs),
and log/linear axes. ``Canvas.png()`` returns the encoded file.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Canvas", "Panel", "Series", "encode_png", "COLORS"]

RGB = tuple[int, int, int]

COLORS: dict[str, RGB] = {
    "black": (0, 0, 0),
    "grid": (225, 225, 225),
    "axis": (90, 90, 90),
    "blue": (31, 119, 180),
    "orange": (255, 127, 14),
    "gray": (127, 127, 127),
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "purple": (148, 103, 189),
    "white": (255, 255, 255),
}

# 5x7 font, column-major, bit 0 = top row (the classic HD44780-style glyphs).
_FONT: dict[str, tuple[int, int, int, int, int]] = {
    " ": (0x00, 0x00, 0x00, 0x00, 0x00), "!": (0x00, 0x00, 0x5F, 0x00, 0x00),
    "%": (0x23, 0x13, 0x08, 0x64, 0x62), "(": (0x00, 0x1C, 0x22, 0x41, 0x00),
    ")": (0x00, 0x41, 0x22, 0x1C, 0x00), "*": (0x14, 0x08, 0x3E, 0x08, 0x14),
    "+": (0x08, 0x08, 0x3E, 0x08, 0x08), ",": (0x00, 0x50, 0x30, 0x00, 0x00),
    "-": (0x08, 0x08, 0x08, 0x08, 0x08), ".": (0x00, 0x60, 0x60, 0x00, 0x00),
    "/": (0x20, 0x10, 0x08, 0x04, 0x02), ":": (0x00, 0x36, 0x36, 0x00, 0x00),
    "<": (0x08, 0x14, 0x22, 0x41, 0x00), "=": (0x14, 0x14, 0x14, 0x14, 0x14),
    ">": (0x00, 0x41, 0x22, 0x14, 0x08), "_": (0x40, 0x40, 0x40, 0x40, 0x40),
    "0": (0x3E, 0x51, 0x49, 0x45, 0x3E), "1": (0x00, 0x42, 0x7F, 0x40, 0x00),
    "2": (0x42, 0x61, 0x51, 0x49, 0x46), "3": (0x21, 0x41, 0x45, 0x4B, 0x31),
    "4": (0x18, 0x14, 0x12, 0x7F, 0x10), "5": (0x27, 0x45, 0x45, 0x45, 0x39),
    "6": (0x3C, 0x4A, 0x49, 0x49, 0x30), "7": (0x01, 0x71, 0x09, 0x05, 0x03),
    "8": (0x36, 0x49, 0x49, 0x49, 0x36), "9": (0x06, 0x49, 0x49, 0x29, 0x1E),
    "A": (0x7E, 0x11, 0x11, 0x11, 0x7E), "B": (0x7F, 0x49, 0x49, 0x49, 0x36),
    "C": (0x3E, 0x41, 0x41, 0x41, 0x22), "D": (0x7F, 0x41, 0x41, 0x22, 0x1C),
    "E": (0x7F, 0x49, 0x49, 0x49, 0x41), "F": (0x7F, 0x09, 0x09, 0x01, 0x01),
    "G": (0x3E, 0x41, 0x41, 0x51, 0x32), "H": (0x7F, 0x08, 0x08, 0x08, 0x7F),
    "I": (0x00, 0x41, 0x7F, 0x41, 0x00), "J": (0x20, 0x40, 0x41, 0x3F, 0x01),
    "K": (0x7F, 0x08, 0x14, 0x22, 0x41), "L": (0x7F, 0x40, 0x40, 0x40, 0x40),
    "M": (0x7F, 0x02, 0x04, 0x02, 0x7F), "N": (0x7F, 0x04, 0x08, 0x10, 0x7F),
    "O": (0x3E, 0x41, 0x41, 0x41, 0x3E), "P": (0x7F, 0x09, 0x09, 0x09, 0x06),
    "Q": (0x3E, 0x41, 0x51, 0x21, 0x5E), "R": (0x7F, 0x09, 0x19, 0x29, 0x46),
    "S": (0x46, 0x49, 0x49, 0x49, 0x31), "T": (0x01, 0x01, 0x7F, 0x01, 0x01),
    "U": (0x3F, 0x40, 0x40, 0x40, 0x3F), "V": (0x1F, 0x20, 0x40, 0x20, 0x1F),
    "W": (0x7F, 0x20, 0x18, 0x20, 0x7F), "X": (0x63, 0x14, 0x08, 0x14, 0x63),
    "Y": (0x03, 0x04, 0x78, 0x04, 0x03), "Z": (0x61, 0x51, 0x49, 0x45, 0x43),
}


def encode_png(width: int, height: int, rgb: bytes | bytearray) -> bytes:
    """An 8-bit RGB PNG of ``width`` x ``height`` from row-major pixel bytes."""
    if len(rgb) != width * height * 3:
        raise ValueError("pixel buffer does not match the size")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I",
                                                                        zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride:(y + 1) * stride]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT",
                                                                 zlib.compress(raw, 9)) + chunk(b"IEND", b"")


class Canvas:
    def __init__(self, width: int, height: int, background: RGB = COLORS["white"]) -> None:
        self.width, self.height = width, height
        self.px = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.px[i:i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: RGB, *, fill: bool = False) -> None:
        if fill:
            for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
                for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                    self.set(x, y, color)
            return
        self.line(x0, y0, x1, y0, color)
        self.line(x1, y0, x1, y1, color)
        self.line(x1, y1, x0, y1, color)
        self.line(x0, y1, x0, y0, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: RGB, *, width: int = 1, dash: int = 0) -> None:
        """Bresenham; ``width`` > 1 thickens it; ``dash`` > 0 draws dash-long runs with gaps."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, n = dx + dy, 0
        half = width // 2
        while True:
            if not dash or (n // dash) % 2 == 0:
                for ox in range(-half, width - half):
                    for oy in range(-half, width - half):
                        self.set(x0 + ox, y0 + oy, color)
            n += 1
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def polyline(self, points: Sequence[tuple[int, int]], color: RGB, *, width: int = 2) -> None:
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            self.line(x0, y0, x1, y1, color, width=width)

    def text(self, x: int, y: int, s: str, color: RGB = COLORS["black"], *, scale: int = 1,
             anchor: str = "left") -> int:
        """Draw ``s`` (upper-cased) with its top at ``y``; returns the width in pixels."""
        s = s.upper()
        w = self.text_width(s, scale)
        if anchor == "center":
            x -= w // 2
        elif anchor == "right":
            x -= w
        for ch in s:
            cols = _FONT.get(ch, _FONT["*"])
            for cx, bits in enumerate(cols):
                for cy in range(7):
                    if bits >> cy & 1:
                        for ox in range(scale):
                            for oy in range(scale):
                                self.set(x + cx * scale + ox, y + cy * scale + oy, color)
            x += 6 * scale
        return w

    @staticmethod
    def text_width(s: str, scale: int = 1) -> int:
        return max(0, len(s) * 6 * scale - scale)

    def png(self) -> bytes:
        return encode_png(self.width, self.height, self.px)


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    color: RGB
    step: bool = False  # draw as a staircase (CDF-like)


@dataclass
class Panel:
    """One chart: axes (linear or log10), grid, series, a legend, optional vertical markers."""

    title: str
    x_label: str
    y_label: str
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    x_log: bool = False
    y_log: bool = False
    x_ticks: Sequence[tuple[float, str]] = ()
    y_ticks: Sequence[tuple[float, str]] = ()
    series: list[Series] | None = None
    markers: Sequence[tuple[float, str, RGB]] = ()  # vertical lines at x

    def draw(self, c: Canvas, x0: int, y0: int, w: int, h: int) -> None:
        left, right, top, bottom = x0 + 62, x0 + w - 12, y0 + 28, y0 + h - 40
        c.text((left + right) // 2, y0 + 8, self.title, scale=2, anchor="center")

        def fx(v: float) -> int:
            lo, hi = self.x_range
            if self.x_log:
                v, lo, hi = math.log10(max(v, 1e-12)), math.log10(lo), math.log10(hi)
            t = (v - lo) / (hi - lo) if hi != lo else 0.0
            return int(round(left + min(max(t, 0.0), 1.0) * (right - left)))

        def fy(v: float) -> int:
            lo, hi = self.y_range
            if self.y_log:
                v, lo, hi = math.log10(max(v, 1e-12)), math.log10(lo), math.log10(hi)
            t = (v - lo) / (hi - lo) if hi != lo else 0.0
            return int(round(bottom - min(max(t, 0.0), 1.0) * (bottom - top)))

        for v, label in self.x_ticks:
            c.line(fx(v), top, fx(v), bottom, COLORS["grid"])
            c.text(fx(v), bottom + 6, label, COLORS["axis"], anchor="center")
        for v, label in self.y_ticks:
            c.line(left, fy(v), right, fy(v), COLORS["grid"])
            c.text(left - 5, fy(v) - 3, label, COLORS["axis"], anchor="right")
        c.rect(left, top, right, bottom, COLORS["axis"])
        c.text((left + right) // 2, bottom + 20, self.x_label, COLORS["axis"], anchor="center")
        c.text(x0 + 4, top - 12, self.y_label, COLORS["axis"])
        for xv, label, color in self.markers:
            c.line(fx(xv), top, fx(xv), bottom, color, dash=4)
            c.text(fx(xv) + 3, bottom - 11, label, color)
        ly = top + 6
        for s in self.series or []:
            pts: list[tuple[int, int]] = []
            for i, (xv, yv) in enumerate(s.points):
                if s.step and i:
                    pts.append((fx(xv), pts[-1][1]))
                pts.append((fx(xv), fy(yv)))
            if len(pts) == 1:
                c.rect(pts[0][0] - 2, pts[0][1] - 2, pts[0][0] + 2, pts[0][1] + 2, s.color, fill=True)
            c.polyline(pts, s.color)
            lx = right - 8 - Canvas.text_width(s.label) - 16
            c.rect(lx, ly, lx + 10, ly + 6, s.color, fill=True)
            c.text(lx + 14, ly, s.label, s.color)
            ly += 12
