"""`judge serve`: the study desk, a local web app over a folder of runs.

Every job and its kept runs (what `judge runs` lists), each run's report, two runs side by side
with `judge diff`'s figures (one computation: runner.report.diff), the item browser across runs
(the raw request and answer of any judgment), a run in progress with its counts and ETA, and
a rating page that appends human ratings to the job's ratings files. It reads the runs'
files and the cache (read-only); the only file it writes is a ratings file.

The app's layers: `app` (routes) over `forms` and `pages` (HTML) over `items`, `rate` and
`live` (what the pages show) over `desk` (the folder's jobs and runs).
"""

from runner.serve.app import make_app, new_token, serve
from runner.serve.desk import Desk

__all__ = ["Desk", "make_app", "new_token", "serve"]
