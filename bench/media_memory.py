"""Peak memory one hostile attachment adds to the bot, each measured in a fresh process.

    python bench/media_memory.py [--source PATH] [--limit-mb 100]

For each file below, a child process imports ``mnemo.gateway.media`` and Pillow, warms
them up on a tiny image, reads its own peak resident set (``VmHWM`` in /proc: unlike
``getrusage``'s ``ru_maxrss`` it starts afresh at ``exec``, where ``ru_maxrss`` keeps the
parent's peak), then does what
the bot does with an attachment — ``MediaStore.prepare`` and, for what was stored, the
content blocks a request would carry — and prints how much the peak grew, what the
model would be told, and the time taken:

* a 12000×12000 PNG of one colour (about 420 KB), decoded whole when scaled on main;
* a PNG declaring 50000×50000 in a few hundred bytes (Pillow's DecompressionBombError);
* a JPEG bomb: a progressive JPEG of a few hundred bytes declaring 12000×12000, whose
  coefficients libjpeg holds for the whole image however small it is decoded;
* a PDF of 20,000 blank pages;
* and, for scale, the largest images still read: a 4096×3072 PNG of noise and a
  4032×3024 (12 MP) progressive JPEG photo of noise.

``--source`` runs the children on another checkout (e.g. ``--source /work/main`` for
the code before the fix): the same files, the same measure. The exit status is 1 when
any file adds more than ``--limit-mb``.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hostile_media import jpeg_declaring, pdf, png_declaring, png_solid

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, re, sys, tempfile, time, warnings
from pathlib import Path
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
from mnemo.gateway.media import MediaStore
from PIL import Image, JpegImagePlugin, PngImagePlugin  # imported before the baseline
kind, media_type, path = sys.argv[2], sys.argv[3], sys.argv[4]
data = Path(path).read_bytes()
store = MediaStore(Path(tempfile.mkdtemp()))
store.prepare("photo", "warm-up.png", "image/png", Path(sys.argv[5]).read_bytes())
def peak_kb():
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())[1])
before = peak_kb()
started = time.perf_counter()
try:
    prepared = store.prepare(kind, Path(path).name, media_type, data)
    blocks = store.blocks(prepared.refs, show=True)
    outcome = prepared.text or f"stored: {', '.join(b['type'] for b in blocks)}"
except BaseException as e:
    outcome = f"raised {type(e).__name__}: {str(e)[:80]}"
seconds = time.perf_counter() - started
added = peak_kb() - before
print(json.dumps({"added_mb": added / 1024, "outcome": outcome, "seconds": seconds}))
"""


def noise(fmt: str, width: int, height: int, **options: object) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.effect_noise((width, height), 64).convert("RGB").save(out, fmt, **options)
    return out.getvalue()


def cases() -> list[tuple[str, str, str, bytes]]:
    """(label, attachment kind, media type, bytes)."""
    return [
        ("PNG 12000×12000, one colour", "photo", "image/png", png_solid(12000, 12000)),
        ("PNG declaring 50000×50000", "photo", "image/png", png_declaring(50000, 50000)),
        ("JPEG bomb: progressive, declares 12000×12000", "photo", "image/jpeg",
         jpeg_declaring(12000, 12000, progressive=True)),
        ("PDF of 20,000 pages", "document", "application/pdf", pdf(20000)),
        ("largest PNG read: 4096×3072 noise", "document", "image/png", noise("PNG", 4096, 3072, compress_level=1)),
        ("12 MP progressive JPEG, noise", "photo", "image/jpeg", noise("JPEG", 4032, 3024, progressive=True)),
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--source", type=Path, default=ROOT, help="the checkout the children import mnemo from"
    )
    parser.add_argument("--limit-mb", type=float, default=100.0)
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="mnemo-media-bench-") as tmp:
        warm = Path(tmp) / "warm.png"
        warm.write_bytes(png_solid(64, 64))
        print(f"source: {args.source}")
        print(f"{'file':<46} {'bytes':>10} {'added MB':>9} {'s':>6}  outcome")
        for n, (label, kind, media_type, data) in enumerate(cases()):
            path = Path(tmp) / f"case{n}{'.pdf' if kind == 'document' and 'pdf' in media_type else '.bin'}"
            path.write_bytes(data)
            run = subprocess.run(
                [sys.executable, "-c", CHILD, str(args.source), kind, media_type, str(path), str(warm)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if run.returncode != 0:
                print(f"{label:<46} {len(data):>10} {'-':>9} {'-':>6}  the process died: {run.stderr[-300:]}")
                worst = float("inf")
                continue
            result = json.loads(run.stdout.strip().splitlines()[-1])
            worst = max(worst, result["added_mb"])
            added, seconds = result["added_mb"], result["seconds"]
            print(f"{label:<46} {len(data):>10,} {added:>9.0f} {seconds:>6.2f}  {result['outcome']}")
    print(f"largest: {worst:.0f} MB added (limit {args.limit_mb:.0f} MB)")
    return 0 if worst <= args.limit_mb else 1


if __name__ == "__main__":
    raise SystemExit(main())
