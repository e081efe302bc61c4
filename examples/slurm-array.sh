#!/usr/bin/env bash
# One shard of a judge-runner job per SLURM array task, all against one shared PostgreSQL cache.
#
#   export JUDGE_CACHE_URL=postgresql://judge@db.lab:5432/judge   # password: ~/.pgpass or PGPASSWORD
#   sbatch --array=0-7 --export=ALL,SHARDS=8 examples/slurm-array.sh jobs/openmeva.toml
#   # when every array task is done (any machine, no network calls):
#   judge rescore jobs/openmeva.toml --cache "$JUDGE_CACHE_URL"
#   # rerun only shard 3 (after a kill, a node failure, or exit 1):
#   sbatch --array=3 --export=ALL,SHARDS=8 examples/slurm-array.sh jobs/openmeva.toml
#
# SHARDS must equal the number of array tasks of the first submission (the split is by cache
# key, I/N): it is passed explicitly, not read from SLURM_ARRAY_TASK_COUNT, so that a rerun of
# one index still means "shard 3 of 8". The job's rpm/tpm are divided by SHARDS in each task.
#SBATCH --job-name=judge
#SBATCH --cpus-per-task=2
#SBATCH --mem=4G
#SBATCH --time=12:00:00
#SBATCH --output=judge-%A_%a.log
set -euo pipefail
JOB="${1:?usage: sbatch --array=0-7 --export=ALL,SHARDS=8 examples/slurm-array.sh JOB}"
: "${SHARDS:?set SHARDS to the number of array tasks, e.g. --export=ALL,SHARDS=8}"
: "${JUDGE_CACHE_URL:?set JUDGE_CACHE_URL=postgresql://USER@HOST:PORT/DB}"
export JUDGE_CACHE_URL
# Exit codes as `judge run`: 0 done, 1 some tasks failed (rerun this index), 130 interrupted.
exec judge run "$JOB" --shard "${SLURM_ARRAY_TASK_ID}/${SHARDS}" --yes
