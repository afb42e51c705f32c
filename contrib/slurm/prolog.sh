#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/cudatrace-prolog.sh): seals each job's share of
# its GPU's memory as a cudatrace budget where the job cannot write it (docs/slurm.md). slurmd
# runs it as root on the node before the job's first task; `cudatrace slurm-prolog` writes the
# job's fence record, /run/cudatrace/jobs/<job id>, which the preload library in every process
# of the job reads for itself (the job's environment can only lower it).
#
# Edit the settings below to your install (docs/slurm.md, "Setting it up on a node"): cudatrace
# by absolute path, the shards gres.conf gives each GPU, the node's shared ledger directory. Add
# --gpu-memory SIZE where NVML cannot be read on the node.
#
# It always exits 0 (a failing Prolog drains the node). When cudatrace itself cannot run, it
# writes the job a record that says why, so the job's CUDA is refused, never run unfenced.
CUDATRACE=/opt/cudatrace/bin/cudatrace
SHARDS_PER_GPU=8
LEDGER_DIR=/run/cudatrace/slurm

out=$("$CUDATRACE" slurm-prolog --shards-per-gpu "$SHARDS_PER_GPU" --ledger-dir "$LEDGER_DIR" 2>&1)
rc=$?
[ -n "$out" ] && printf '%s\n' "$out" >&2
[ $rc = 0 ] && exit 0
case "$SLURM_JOB_ID" in '' | *[!0-9]*) exit 0 ;; esac
# cudatrace could not run (removed, a half-done upgrade): a record saying so (the format of
# native/include/fence.def, version 1), written whole by root
why=$(printf '%s' "$out" | tr -c '[:print:]' ' ' | cut -c1-300)
dir=/run/cudatrace/jobs
mkdir -p -m 755 /run/cudatrace "$dir"
tmp="$dir/.$SLURM_JOB_ID.$$"
{
    echo "cudatrace-fence 1"
    echo "group=slurm"
    echo "budget=1048576"
    echo "ledger-dir=$LEDGER_DIR"
    case "$SLURM_JOB_UID" in '' | *[!0-9]*) ;; *) echo "uid=$SLURM_JOB_UID" ;; esac
    echo "owner=slurm job $SLURM_JOB_ID"
    echo "fence-error=the Slurm Prolog could not run cudatrace: $why"
} >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$dir/$SLURM_JOB_ID"
exit 0
