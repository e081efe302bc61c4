"""The execute stage: cache, client, limiter, local servers and the worker pool."""
