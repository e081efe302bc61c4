"""One command's working set, and the run itself, one module a phase of `judge run`:

select (the job, its models and items, the cache and the report folder; the checks before any
call) -> serve (local servers) -> pool (generation stage first, then the judges) -> report (the
manifest); and plan, what a run would do. Nothing here prints or exits.
"""
