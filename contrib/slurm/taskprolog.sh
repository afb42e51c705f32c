#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/cudatrace-taskprolog.sh): gives each job on
# a shared GPU its share of the GPU's memory as a cudatrace budget (docs/slurm.md). Slurm runs it
# as the job's user before each task and applies the `export NAME=value` lines it prints.
# Edit --shards-per-gpu to what gres.conf gives each GPU; add --gpu-memory SIZE where NVML cannot
# be read on the node. The ledger directory is made once at boot:
#   install -d -m 1777 -o root -g root /run/cudatrace
exec cudatrace slurm-taskprolog --shards-per-gpu 8 --ledger-dir /run/cudatrace
