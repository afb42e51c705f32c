#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/cudatrace-taskprolog.sh): gives each job on
# a shared GPU its share of the GPU's memory as a cudatrace budget (docs/slurm.md). Slurm runs it
# as the job's user, with the job's environment, before each task, and applies the
# `export NAME=value` and `print TEXT` lines it prints.
#
# Edit the four settings below to your install (docs/slurm.md, "Setting it up on a node"):
# cudatrace and its preload library by absolute path (the job user's PATH does not matter; both
# must be readable by every job user), the shards gres.conf gives each GPU, and the node's shared
# ledger directory (made at boot). Add --gpu-memory SIZE where NVML cannot be read on the node.
#
# It never fails a task, and never lets one that shares a GPU run unfenced in silence: when
# cudatrace itself cannot run, the task's output says so and its CUDA is refused (the preload
# library, told why through CUDATRACE_FENCE_ERROR, refuses cuInit; without the library no GPU
# is visible to the task).
CUDATRACE=/opt/cudatrace/bin/cudatrace
SHIM=/opt/cudatrace/libcudatrace.so
SHARDS_PER_GPU=8
LEDGER_DIR=/run/cudatrace

if out=$("$CUDATRACE" slurm-taskprolog --shards-per-gpu "$SHARDS_PER_GPU" \
        --ledger-dir "$LEDGER_DIR" 2>&1); then
    printf '%s\n' "$out" | grep -E '^(export|print|unset) '
    exit 0
fi
why=$(printf '%s' "$out" | tr -c '[:print:]' ' ' | cut -c1-300)
echo "print cudatrace: the TaskProlog could not run $CUDATRACE ($why): CUDA is refused in this task"
case " $LD_PRELOAD " in
*" $SHIM "*) ;;
*) [ -r "$SHIM" ] && echo "export LD_PRELOAD=$SHIM${LD_PRELOAD:+ $LD_PRELOAD}" ;;
esac
echo "export CUDATRACE_FENCE_ERROR=the Slurm TaskProlog could not run cudatrace: $why"
echo "export CUDATRACE_ON_FENCE_ERROR=refuse"
[ -r "$SHIM" ] || echo "export CUDA_VISIBLE_DEVICES=-1"
exit 0
