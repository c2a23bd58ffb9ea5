"""Where a plot goes: a file (not a directory) whose suffix names a format matplotlib writes.

Checked before drawing, so a large fleet is not drawn for nothing; the path returned is the one
written, since matplotlib would otherwise add ``.png`` to a name without a suffix.
"""

from __future__ import annotations

from pathlib import Path

from hulk.errors import InputError

# What matplotlib's Agg canvas writes (FigureCanvasAgg.get_supported_filetypes()).
PLOT_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".webp", ".tif", ".tiff",
                 ".eps", ".ps", ".gif")


def plot_path(out: str | Path) -> Path:
    """``out`` as the path to write; a one-line InputError for a directory or a suffix that
    names no supported format."""
    path = Path(out)
    expected = f"expected a file name ending in {', '.join(PLOT_SUFFIXES)}"
    if path.is_dir():
        raise InputError(f"is a directory; {expected}", path=str(path))
    if path.suffix.lower() not in PLOT_SUFFIXES:
        got = f"'{path.suffix}'" if path.suffix else "no suffix"
        raise InputError(f"{expected}, got {got}", path=str(path))
    return path


def save_figure(fig, out: Path) -> None:
    """Write ``fig`` to ``out`` (folders made as needed) and close it; a one-line InputError
    when it cannot be written."""
    import matplotlib.pyplot as plt

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    except OSError as exc:
        raise InputError(f"cannot write plot: {exc.strerror or exc}", path=str(out)) from None
    finally:
        plt.close(fig)
