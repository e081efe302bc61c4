"""The folding process (`python -m runner.execute.folding FOLDER`, started by
runner.execute.journal.Folder): fold each journal named on a line of its input into the cache
folder's SQLite, and answer "ok" or "error: <why>" on a line; at an empty line or the end of
its input (a parent that was killed), fold every journal no live process holds and leave."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from runner.errors import CacheError
from runner.execute.cache import Cache
from runner.execute.journal import fold_file, recover


def main(argv: list[str]) -> NoReturn:
    # Ctrl-C reaches the whole process group: the parent decides, and ends this child with an
    # empty line; a parent that was killed closes its input.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    directory = Path(argv[0])
    code = 0
    try:
        with Cache(directory) as cache:
            for line in sys.stdin.buffer:
                if line == b"\n":  # the parent's last word
                    break
                try:
                    fold_file(Path(os.fsdecode(line.rstrip(b"\n"))), cache.put_raw, wait=True)
                    reply = "ok"
                except CacheError as exc:
                    reply = f"error: {exc}".replace("\n", " ")
                sys.stdout.write(reply + "\n")
                sys.stdout.flush()
            recover(directory, cache.put_raw)
    except (CacheError, OSError) as exc:
        sys.stderr.write(f"{exc}\n")
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
