#!/bin/sh
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/cudatrace-taskprolog.sh): loads
# cudatrace's preload library into each task of a job (docs/slurm.md). Slurm runs it as the
# job's user, with the job's environment, before each task, and applies the `export
# NAME=value` and `print TEXT` lines it prints. The budget itself is the record the Prolog
# (contrib/slurm/prolog.sh) wrote for the job: the library reads it, and nothing the job sets
# can raise it.
#
# Edit the two settings below to your install (docs/slurm.md, "Setting it up on a node"):
# cudatrace and its preload library by absolute path (the job user's PATH does not matter;
# both must be readable by every job user).
#
# It never fails a task. When cudatrace itself cannot run, it still loads the library, which
# fences the task with its job's record; without the library no GPU is visible to the task.
CUDATRACE=/opt/cudatrace/bin/cudatrace
SHIM=/opt/cudatrace/libcudatrace.so

if out=$("$CUDATRACE" slurm-taskprolog 2>&1); then
    printf '%s\n' "$out" | grep -E '^(export|print|unset) '
    exit 0
fi
why=$(printf '%s' "$out" | tr -c '[:print:]' ' ' | cut -c1-300)
echo "print cudatrace: the TaskProlog could not run $CUDATRACE ($why): the job's fence record still holds"
case " $LD_PRELOAD " in
*" $SHIM "*) ;;
*) [ -r "$SHIM" ] && echo "export LD_PRELOAD=$SHIM${LD_PRELOAD:+ $LD_PRELOAD}" ;;
esac
[ -r "$SHIM" ] || echo "export CUDA_VISIBLE_DEVICES=-1"
exit 0
