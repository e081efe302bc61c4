"""The `judge` command on top of the pipeline: click commands, the session, progress."""
