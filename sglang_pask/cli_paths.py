"""Command-line output paths checked when the arguments are parsed, not when a long run ends.

Calibration and the benchmarks run for minutes to hours and write their files last; a path whose
directory is missing would otherwise lose the whole run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def output_file(text: str) -> str:
    """argparse ``type=`` for a file the program will write: returns ``text`` unchanged.

    Raises
    ------
    argparse.ArgumentTypeError
        If the path is a directory, its directory does not exist or is not writable, or the file
        exists and is not writable.
    """
    path = Path(text).expanduser()
    directory = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path")
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return text
