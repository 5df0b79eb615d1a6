"""The HTML report of the demo with one failing rule: the failing bucket and the threshold line
are in the page (DOM checks, always) and visible in headless Chromium (a screenshot, where
Chromium is installed; `.ci/run` installs it best-effort).

The demo spec (`specs/demo.soak`) with its TTFT rule judged per bucket, and one bucket of
`sim-slow` (concurrency 8, bucket 1) slowed to 1.25 s TTFT: `p95(ttft) < 1s per bucket` fails
there, and only there (the warn rule `drift(p50(ttft))` does not pass either: it is drawn as an
amber outline, not as a failure).

`python tests/test_report_screenshot.py` writes the screenshot to docs/report-demo.png.
"""

from __future__ import annotations

import html.parser
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from soakspec.judge.testing import EvidenceBuilder, spec_from_text
from soakspec.report import prepare

REPO = Path(__file__).resolve().parents[1]

FAILING_RULE = "p95(ttft) < 1s per bucket"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")) if p), None)


def demo_failing_report() -> str:
    text = (REPO / "specs" / "demo.soak").read_text()
    old = "require p95(ttft) < 1s per level"
    assert text.count(old) == 1, "specs/demo.soak changed: its TTFT rule is no longer the one this test edits"
    spec = spec_from_text(text.replace(old, "require " + FAILING_RULE), "specs/demo.soak")
    b = EvidenceBuilder(spec, per_bucket=48)  # enough for p95 at the demo's 90% confidence in every bucket
    for r in b.measured("sim-slow", level=1, bucket=1):
        r.update(ttft=1.25, first_token=r["start"] + 1.25)
    inp = prepare(spec, b.build())
    failing = [r.rule for r in inp.verdict.rules if r.status == "fail"]
    assert inp.verdict.outcome == "FAIL" and failing == [FAILING_RULE], failing
    return inp.render("html")


class _Svg(html.parser.HTMLParser):
    """Every `<svg class="chart">`: its data attributes and (tag, attrs, title text) children."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[tuple[str, str], list[tuple[str, dict[str, str], str]]] = {}
        self._cur: list | None = None
        self._title: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "svg" and a.get("class") == "chart":
            self._cur = self.charts.setdefault((a["data-backend"], a["data-metric"]), [])
        elif self._cur is not None:
            if tag == "title":
                self._title = []
            else:
                self._cur.append((tag, a, ""))

    def handle_data(self, data):
        if self._title is not None:
            self._title.append(data)

    def handle_endtag(self, tag):
        if tag == "svg":
            self._cur = None
        elif tag == "title" and self._title is not None and self._cur:
            t, a, _ = self._cur[-1]
            self._cur[-1] = (t, a, "".join(self._title))
            self._title = None


def charts(page: str) -> dict[tuple[str, str], list[tuple[str, dict[str, str], str]]]:
    p = _Svg()
    p.feed(page)
    return p.charts


def test_the_failing_bucket_and_the_threshold_line_are_in_the_page():
    c = charts(demo_failing_report())
    slow = c[("sim-slow", "ttft")]
    fails = [(a, t) for tag, a, t in slow if tag == "rect" and a.get("class") == "failing-bucket"]
    assert len(fails) == 1
    rect, title = fails[0]
    assert f"{FAILING_RULE}: FAIL" in title and "concurrency 8, bucket 1" in title
    bands = [a for tag, a, _ in slow if tag == "rect" and a.get("class", "").startswith("band")]
    lo, hi = float(bands[1]["x"]), float(bands[1]["x"]) + float(bands[1]["width"])
    x0, x1 = float(rect["x"]), float(rect["x"]) + float(rect["width"])
    assert lo - 0.1 <= x0 and x1 <= hi + 0.1 and x0 > (lo + hi) / 2 - 1  # the second bucket of the second level
    lines = [(a, t) for tag, a, t in slow if tag == "line" and a.get("class") == "threshold"]
    assert len(lines) == 1 and FAILING_RULE in lines[0][1]
    y = float(lines[0][0]["y1"])
    assert float(rect["y"]) < y < float(rect["y"]) + float(rect["height"])
    dots = [(float(a["cy"]), t) for tag, a, t in slow if tag == "circle" and t.startswith("p95 ")]
    above = [t for cy, t in dots if cy < y]  # svg y grows downwards: above the line is over the threshold
    assert len(above) == 1 and above[0].endswith("1.25 s"), dots
    assert any(tag == "rect" and a.get("class") == "warn-bucket" for tag, a, _ in slow)  # the drift warning, apart
    fast = c[("sim-fast", "ttft")]
    assert not any(a.get("class") == "failing-bucket" for _, a, _ in fast)
    assert sum(a.get("class") == "threshold" for _, a, _ in fast) == 1  # the rule applies to both backends


# ------------------------------------------------------------------------------ the screenshot


def screenshot(page: Path, png: Path, profile: Path, *, width: int = 1360, height: int = 2700, scale: float = 0.75) -> None:
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
         f"--force-device-scale-factor={scale}", f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]


def png_rows(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, bytes per pixel, the filtered scanlines) of an 8-bit non-interlaced RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color, _, _, interlace = head
    assert depth == 8 and color in (2, 6) and interlace == 0, head
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp + 1
    return w, bpp, [raw[y * stride:(y + 1) * stride] for y in range(h)]


def unfilter(rows: list[bytes], bpp: int, base: tuple[list[bytes], list[bytes]] | None = None) -> list[bytes]:
    """The pixel rows. With `base` (another image's filtered and unfiltered rows), a row whose
    filtered bytes and previous row equal the base's is the base's (only changed rows cost)."""
    out: list[bytes] = []
    prev = bytes(len(rows[0]) - 1)
    in_step = base is not None  # the previous rows equal the base's
    for y, r in enumerate(rows):
        if in_step and y < len(base[0]) and base[0][y] == r:
            prev = base[1][y]
            out.append(prev)
            continue
        f, line = r[0], bytearray(r[1:])
        for i in range(len(line)):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = bytes(line)
        out.append(prev)
        in_step = base is not None and y < len(base[1]) and prev == base[1][y]
    return out


def changed_pixels(a: Path, b: Path) -> list[tuple[int, int, int]]:
    """The RGB values in screenshot `a` of every pixel that differs in screenshot `b`."""
    w, bpp, ra = png_rows(a.read_bytes())
    w2, bpp2, rb = png_rows(b.read_bytes())
    assert (w, bpp, len(ra)) == (w2, bpp2, len(rb)), "the two screenshots differ in size"
    pa = unfilter(ra, bpp)
    assert len(set(pa[len(pa) // 2])) > 8  # a real page, not a blank one
    pb = unfilter(rb, bpp, (ra, pa))
    out = []
    for x, y in zip(pa, pb):
        if x != y:
            out += [tuple(x[i:i + 3]) for i in range(0, len(x), bpp) if x[i:i + bpp] != y[i:i + bpp]]
    return out


def reddish(px: tuple[int, int, int]) -> bool:
    return px[0] > px[1] + 20 and px[0] > px[2] + 20


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium): no screenshot to look at")
def test_the_failing_bucket_and_the_threshold_line_are_visible_in_chromium(tmp_path):
    """Screenshots with and without each overlay: the pixels that differ are the failing
    bucket's shade and the threshold lines, and they are red -- drawn, not hidden or clipped."""
    page = demo_failing_report()
    shots = {}
    for name, hide in (("shown", ""), ("no-bucket", "svg .failing-bucket{display:none}"),
                       ("no-threshold", "svg .threshold{display:none}")):
        html_file = tmp_path / f"{name}.html"
        html_file.write_text(page.replace("</style>", hide + "</style>", 1), encoding="utf-8")
        shots[name] = tmp_path / f"{name}.png"
        screenshot(html_file, shots[name], tmp_path / "profile", scale=0.5)  # half size: a faster decode
    bucket = changed_pixels(shots["shown"], shots["no-bucket"])
    assert len(bucket) > 1000 and sum(map(reddish, bucket)) > 0.9 * len(bucket), (len(bucket), sum(map(reddish, bucket)))
    line = changed_pixels(shots["shown"], shots["no-threshold"])  # thin dashed lines: anti-aliased edges are pale
    red = sum(map(reddish, line))
    assert red > 300 and red > 0.5 * len(line), (len(line), red)


if __name__ == "__main__":  # write docs/report-demo.png (what a reviewer sees)
    import tempfile

    assert CHROMIUM, "Chromium is not installed"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "report.html").write_text(demo_failing_report(), encoding="utf-8")
        screenshot(tmp / "report.html", REPO / "docs" / "report-demo.png", tmp / "profile", scale=0.55)
    size = (REPO / "docs" / "report-demo.png").stat().st_size
    print(f"docs/report-demo.png: {size} bytes")
    assert size < 200_000, "over 200 KB: do not commit it"
