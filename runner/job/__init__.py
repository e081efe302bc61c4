"""The job stage: job files read into frozen value objects (`spec`, `load`)."""
