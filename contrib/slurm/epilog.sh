#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/cudatrace-epilog.sh): removes the job's fence
# record that cudatrace's Prolog wrote (docs/slurm.md). Always exits 0 (a failing Epilog drains
# the node); when cudatrace cannot run, the record goes all the same.
CUDATRACE=/opt/cudatrace/bin/cudatrace

"$CUDATRACE" slurm-epilog && exit 0
case "$SLURM_JOB_ID" in '' | *[!0-9]*) exit 0 ;; esac
rm -f "/run/cudatrace/jobs/$SLURM_JOB_ID"
exit 0
