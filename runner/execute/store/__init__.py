"""The response cache: where every answer is kept, and how the rest of judge-runner reads it.

`backend` (the one interface, and `open_cache`) over `reader` (the reader child process), over
`answers` (what judging reads of a stored answer, and the reader's pipe format), `cache` (a
diskcache folder), `pgcache` (PostgreSQL) and `keyindex` (a job's keys kept in its cache
folder), over `journal` (the answers' append-only journal), `table` (batches of keys read and
written in a folder's SQLite table), `faults` (a folder that cannot be written, a database
SQLite cannot use, a damaged record), `lease` (a run's lease on its job and shard) and
`deadline` (the watchdog over a database call). It hands out keys and bytes and knows nothing
of tasks (runner.expand_ahead makes tasks of them); its child processes are runner.children's.
"""
