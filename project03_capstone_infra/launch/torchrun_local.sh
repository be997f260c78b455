#!/usr/bin/env bash
# One node, N processes, automatic restarts: torchrun's elastic agent restarts the whole worker
# group when any rank dies (kill -9, OOM, a collective timeout), up to --max-restarts times, and
# the trainer resumes from the newest checkpoint that verifies (--resume auto).
#
#   project03_capstone_infra/launch/torchrun_local.sh [NPROC] [extra trainer flags...]
#   e.g.  .../torchrun_local.sh 2 --preset tiny --steps 200 --run-dir runs/demo
#
# Exit codes of the trainer (see config.py): 0 done, 75 preempted (SIGTERM/SIGUSR1: checkpoint
# saved, run the same command again), 76 collective timeout / lost peer, 69 pre-flight failed
# (bad GPU or disk: do not restart on this node), 65 loss stayed non-finite.
set -euo pipefail
cd "$(dirname "$0")/../.."
NPROC="${1:-2}"
shift || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m torch.distributed.run \
    --standalone --nproc-per-node "$NPROC" \
    --max-restarts "${MAX_RESTARTS:-3}" --monitor-interval 1 \
    -m project03_capstone_infra.train --resume auto "$@"
