"""The response cache: where every answer is kept, and how the rest of judge-runner reads it.

`backend` (the one interface, and `open_cache`) over `reader` (the reader process and the
forked expanders), over `cache` (a diskcache folder), `pgcache` (PostgreSQL) and `keyindex`
(a job's keys kept in its cache folder), over `table` (batches of keys read and written in a
folder's SQLite table), over `journal` (the answers' append-only journal), `faults` (a folder that
cannot be written, a database SQLite cannot use, a damaged record), `lease` (a run's lease on its
job and shard) and `deadline` (the watchdog over a database call), over `child` (child
processes, spawned or forked).
"""
