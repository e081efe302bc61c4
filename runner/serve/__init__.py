"""`judge serve`: the study desk, a local web app over a folder of runs (what it shows:
docs/how-to/desk.md). It reads the runs' files and the cache (read-only); the only file it
writes is a ratings file.

The app's layers: `app` (routes) over `forms` and `pages` (HTML) over `items`, `rate` and
`live` (what the pages show) over `desk` (the folder's jobs and runs).
"""

from runner.serve.app import make_app, new_token, serve
from runner.serve.desk import Desk

__all__ = ["Desk", "make_app", "new_token", "serve"]
