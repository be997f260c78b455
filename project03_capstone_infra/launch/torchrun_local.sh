#!/usr/bin/env bash
# One node, N processes, automatic restarts: torchrun's elastic agent restarts the whole worker
# group when any rank dies (kill -9, OOM, a collective timeout), up to --max-restarts times, and
# the trainer resumes from the newest checkpoint that verifies (--resume auto).
#
#   project03_capstone_infra/launch/torchrun_local.sh [NPROC] [extra trainer flags...]
#   e.g.  .../torchrun_local.sh 2 --preset tiny --steps 200 --run-dir runs/demo
#
# Exit codes (see config.py): 0 done, 75 preempted (SIGTERM/SIGUSR1 to this script: the workers
# saved a checkpoint; run the same command again), 76 collective timeout / lost peer, 69
# pre-flight failed (bad GPU or disk: do not restart on this node), 65 loss stayed non-finite, 1
# checkpoint error (none usable, run directory locked by another trainer or not writable).
# torchrun itself exits 1 when it is signalled, whatever the workers did: this script forwards
# the signal to it and turns that exit into 75.
set -euo pipefail
cd "$(dirname "$0")/../.."
NPROC="${1:-2}"
shift || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for arg in "$@"; do  # --deterministic: its variables must be in the workers' environment at start
    if [[ $arg == --deterministic ]]; then
        eval "$("${PYTHON:-python3}" -c 'import shlex; from shared.determinism import deterministic_env as e
print("\n".join(f"export {k}={shlex.quote(v)}" for k, v in e().items()))')"
    fi
done
"${PYTHON:-python3}" -m torch.distributed.run \
    --standalone --nproc-per-node "$NPROC" \
    --max-restarts "${MAX_RESTARTS:-3}" --monitor-interval 1 \
    -m project03_capstone_infra.train --resume auto "$@" &
TRAIN_PID=$!
signalled=0
on_signal() {  # torchrun forwards SIGTERM to the workers, which save and exit
    signalled=1
    kill -TERM "$TRAIN_PID" 2>/dev/null || true
}
trap on_signal TERM USR1
rc=0
wait "$TRAIN_PID" || rc=$?
while kill -0 "$TRAIN_PID" 2>/dev/null; do  # a trap interrupted wait: wait again
    rc=0
    wait "$TRAIN_PID" || rc=$?
done
if [[ $signalled -eq 1 && $rc -ne 0 ]]; then
    echo "preempted: the workers saved a checkpoint; run the same command again (exit 75)" >&2
    exit 75
fi
exit "$rc"
