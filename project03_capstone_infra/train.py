"""Fault-tolerant FSDP2 training of the shared transformer: checkpoint, resume, survive.

    torchrun --nproc-per-node 2 --max-restarts 3 -m project03_capstone_infra.train \\
        --preset tiny --resume auto --run-dir runs/demo

What it does, and why:
- FSDP2 (`shared.parallelize.apply_fsdp`: one unit per block plus the root) over NCCL on GPUs or
  gloo on CPU; bfloat16 compute on GPU, float32 on CPU (`--dtype`).
- Deterministic: the data stream is indexed by step (`shared.data.SyntheticTokens`), the
  initial weights come from a seeded CPU generator, and a checkpoint holds model, optimizer,
  LR schedule, data position, step and every RNG; on CPU/gloo a resumed run ends bit-for-bit
  where an uninterrupted one does (the tests check this after kill -9). On GPUs the kernels
  must be made deterministic as well: `--deterministic` (`shared.determinism`: deterministic
  algorithms, flash/math attention, cuBLAS workspace, NCCL ring/simple, seeds per rank; the
  launcher passes its environment variables, `runner.child_env`). The trainer runs eager (no
  torch.compile), so the mode has no compiler setting to fix.
- `--stop-after N` ends a launch after step N with a checkpoint, the schedule still spanning
  `--steps`: the next launch (on as many ranks as wanted: DCP reshards) continues the run.
- `--resume auto`: newest checkpoint that verifies (checksums), else a fresh start. A launcher
  restart (torchrun --max-restarts, Slurm requeue) therefore just runs the same command again.
- SIGTERM / SIGUSR1 (spot preemption, Slurm's pre-timeout signal): every rank agrees on the
  step through the per-step all-reduce, saves synchronously within `--sigterm-deadline-s`, and
  exits with EXIT_PREEMPTED (75, "try again"). A watchdog ends the process at the deadline.
- Non-finite loss: all ranks see the same reduced loss; `rollback` reloads the last checkpoint
  in-process and replays (a transient fault leaves no trace), at most `--max-nan-retries`
  times for one step, after which that batch is skipped; `skip` drops the step; `abort` stops.
- A collective that hangs or loses a peer raises after `--pg-timeout-s`; the trainer logs what
  happened and exits with EXIT_COLLECTIVE (76) so the launcher restarts the job.
- `train(cfg, report_fn)` is the function a Ray Tune trial calls; `report_fn` receives the
  metrics after every step on rank 0.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shared.results import git_commit

from .checkpoint.layout import CheckpointError
from .checkpoint.manager import CheckpointManager, SaveStats
from .config import (
    EXIT_COLLECTIVE,
    EXIT_NAN_ABORT,
    EXIT_OK,
    EXIT_PREEMPTED,
    EXIT_PREFLIGHT,
    TRAJECTORY_FIELDS,
    TrainConfig,
    config_hash,
)
from .faults import FAULTS_ENV, EventLog, FaultInjector, current_attempt, parse_faults

LAUNCH_TIME_ENV = "P03_LAUNCH_T"  # unix time the launcher started this attempt (optional)
ReportFn = Callable[[dict], None]


class NonFiniteLossError(RuntimeError):
    """The loss stayed non-finite beyond the retry budget."""


class CollectiveFailure(RuntimeError):
    """A collective timed out or a peer vanished."""


def process_start_time() -> float:
    """Unix time this process started (Linux /proc), else now: the origin of 'time to the
    first step' when the launcher does not pass P03_LAUNCH_T."""
    from shared.cli import env_float

    launched = env_float(LAUNCH_TIME_ENV)  # a bad value is named
    if launched is not None:
        return launched
    try:
        with open("/proc/self/stat") as f:
            after_comm = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(after_comm[19])  # field 22 of proc(5): starttime, in clock ticks
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def _is_collective_failure(e: BaseException) -> bool:
    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    msg = str(e)
    needles = (
        "Timed out",
        "timed out",
        "Connection closed by peer",
        "Connection reset",
        "NCCL communicator was aborted",
        "ProcessGroup",
    )
    return isinstance(e, RuntimeError) and any(n in msg for n in needles)


def lr_multiplier(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to min_lr_ratio at cfg.steps."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Trainer:
    """One training run on this rank. `train()` below drives it; the GPU checkpoint benchmark
    drives the same methods step by step."""

    def __init__(self, cfg: TrainConfig, report_fn: ReportFn | None = None) -> None:
        self.cfg = cfg.validate()
        self.report_fn = report_fn
        self.t_launch = process_start_time()
        self.attempt = current_attempt()
        self.run_dir = Path(cfg.run_dir)
        self._stop_signal: int | None = None
        self._old_handlers: dict = {}
        self._deadline_timer: threading.Timer | None = None
        self._owns_world = False
        self.metrics = self.server = None
        self.losses: dict[int, float] = {}
        self.step_times: list[float] = []
        self.saves: list[SaveStats] = []
        self.resume_info: dict | None = None
        self.rollbacks = self.skipped = 0
        self._nan_retries: dict[int, int] = {}
        self._consecutive_skips = 0
        self._first_step_logged = False
        self._state_on_disk: int | None = None  # the step whose state the newest checkpoint holds
        self.determinism = None  # shared.determinism.DeterminismState under --deterministic

    # -- set-up --

    def _determinism_record(self) -> dict | None:
        return self.determinism.record() if self.determinism is not None else None

    def setup(self) -> None:
        from shared.distributed import get_logger, init_distributed

        cfg = self.cfg
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("TrainConfig.device='cuda' but torch sees no CUDA GPU")
        if cfg.metrics_port >= 0 and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            from .health import check_bind_address

            check_bind_address("TrainConfig.metrics_addr", cfg.metrics_addr)
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        self.dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if use_cuda else "float32")
        self.log = get_logger("project03.train")
        if cfg.deterministic:
            # Before the pre-flight matmul and the process group: cuBLAS and NCCL read their
            # settings when first used.
            from shared.cli import env_int
            from shared.determinism import enable_determinism

            self.determinism = enable_determinism(
                cfg.seed, env_int("RANK", 0, minimum=0), device_type="cuda" if use_cuda else "cpu"
            )
            for note in self.determinism.notes:
                self.log.warning("deterministic mode: %s", note)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cfg.preflight:
            self._preflight(use_cuda, local_rank)
        self._owns_world = "RANK" not in os.environ
        info = init_distributed(
            timeout_s=cfg.pg_timeout_s,
            device="cuda" if use_cuda else "cpu",
            restart_scoped_store=True,  # torchrun --max-restarts relaunches this job
        )
        self.info, self.device = info, info.device
        self.rank, self.world = info.rank, info.world_size
        # The checkpoint manager first: it takes the run directory's lock, so that a second
        # trainer started on the same directory is refused before it writes anything.
        self.resolved_cfg = resolved = replace(cfg, dtype=self.dtype)
        self.ckpt = CheckpointManager(
            self.run_dir / "checkpoints",
            keep_last=cfg.keep_last,
            milestone_every=cfg.milestone_every,
            config_hash=config_hash(resolved),
            config=resolved.to_dict(),
            git_commit=git_commit() if self.rank == 0 else None,
            write_threads=cfg.ckpt_write_threads,
            log=self.log.info,
            warn=self.log.warning,
            on_commit=self._on_commit,
        )
        self.events = EventLog(self.run_dir / "events.jsonl", rank=self.rank, attempt=self.attempt)
        self.events.write(
            "start",
            world_size=self.world,
            device=str(self.device),
            dtype=self.dtype,
            t_launch=self.t_launch,
            deterministic=cfg.deterministic,
            determinism=self._determinism_record(),
        )
        self._install_signal_handlers()
        if cfg.metrics_port >= 0 and info.local_rank == 0:
            from .health import MetricsServer, TrainingMetrics

            self.metrics = TrainingMetrics(gpu=True)
            self.server = MetricsServer(self.metrics, cfg.metrics_port, cfg.metrics_addr)
            self.metrics.restarts.set(self.attempt)
            self.events.write(
                "metrics", port=self.server.port, url=self.server.url, bound=self.server.bound
            )
            self.log.info(
                "Prometheus metrics at %s (listening on %s%s)",
                self.server.url,
                self.server.bound,
                self.server.exposure,
            )
        if cfg.resume == "never":
            if self.ckpt.has_checkpoint():
                raise ValueError(
                    f"{self.ckpt.root} already holds checkpoints and --resume is 'never': "
                    "use --resume auto to continue that run, or another --run-dir"
                )
            if self.ckpt.has_history():
                self.log.warning(
                    "--resume never: starting from step 0 in %s, whose earlier "
                    "checkpoints are quarantined or gone",
                    self.ckpt.root,
                )
            resume = False
        else:
            # auto: a run that has ever checkpointed here resumes, and fails loudly when
            # nothing usable is left (CheckpointManager.load), instead of starting over.
            resume = cfg.resume != "auto" or self.ckpt.has_history()
        self._build(resume)
        self.step = 0
        if resume:
            self._resume(None if cfg.resume == "auto" else cfg.resume)
        self.faults = self._fault_injector()

    def _fault_injector(self) -> FaultInjector:
        """P03_FAULTS acts only with --fault-injection on the command line as well: a variable
        left in an environment must never kill or corrupt a real run."""
        faults = parse_faults(os.environ.get(FAULTS_ENV))
        if faults and not self.cfg.fault_injection:
            self.log.warning(
                "%s is set (%d faults) but --fault-injection is off: ignoring it",
                FAULTS_ENV,
                len(faults),
            )
            faults = []
        elif self.cfg.fault_injection:
            plan = (
                ", ".join(
                    f"{f.kind}@{f.step if f.step is not None else f'+{f.after}'}(rank {f.rank})"
                    for f in faults
                )
                or "none listed"
            )
            msg = (
                f"FAULT INJECTION IS ON ({FAULTS_ENV}): this run kills, hangs, poisons or "
                f"corrupts itself on purpose: {plan}"
            )
            print(f"[rank {self.rank}] WARNING {msg}", file=sys.stderr, flush=True)
            self.events.write("fault_injection", faults=len(faults), plan=plan)
        return FaultInjector(
            faults,
            rank=self.rank,
            attempt=self.attempt,
            events=self.events,
            ckpt_root=self.ckpt.root,
            flush=self.ckpt.wait,
        )

    def _preflight(self, use_cuda: bool, local_rank: int) -> None:
        from shared.model import ModelArgs

        from .health import preflight

        n = ModelArgs.from_preset(self.cfg.preset).num_params()
        ckpt_bytes = n * 12  # fp32 parameters + two AdamW moments
        result = preflight(
            require_gpus=1 if use_cuda else 0,
            gpu_indices=[local_rank] if use_cuda else None,
            ckpt_dir=str(self.run_dir),
            min_free_disk_bytes=2 * ckpt_bytes,  # one committed checkpoint + one being written
        )
        for note in result.notes:
            print(f"[preflight] {note}", file=sys.stderr)

    def _build(self, for_resume: bool) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from shared.model import ModelArgs, Transformer, build_model, rope_tables
        from shared.parallelize import apply_activation_checkpointing, apply_fsdp

        cfg = self.cfg
        args = ModelArgs.from_preset(cfg.preset)
        self.seq_len = cfg.seq_len or args.max_seq_len
        if self.seq_len > args.max_seq_len:
            raise ValueError(
                f"seq_len {self.seq_len} exceeds the {cfg.preset} preset's max_seq_len {args.max_seq_len}"
            )
        if for_resume:
            # Every parameter comes from the checkpoint: skip the (for 1B, seconds-long) init.
            with torch.device("meta"):
                model = Transformer(args)
        else:
            model = build_model(args, seed=cfg.seed)
        if cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        mesh = init_device_mesh(self.device.type, (self.world,))
        bf16 = self.dtype == "bfloat16"
        apply_fsdp(
            model,
            mesh=mesh,
            param_dtype="bfloat16" if bf16 else None,
            reduce_dtype="float32" if bf16 else None,
        )
        if for_resume:
            model.to_empty(device=self.device)
            cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
            with torch.no_grad():
                model.rope_cos.copy_(cos)
                model.rope_sin.copy_(sin)
        self.model = model
        self.model_args = args
        self.opt = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            weight_decay=cfg.weight_decay,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_multiplier(s, cfg))
        from shared.data import SyntheticTokens

        self.data = SyntheticTokens(
            args.vocab_size,
            self.seq_len,
            cfg.global_batch,
            cfg.seed,
            rank=self.rank,
            world_size=self.world,
        )
        self.tokens_per_step = cfg.global_batch * self.seq_len

    # -- checkpoint plumbing --

    def _model_optim_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def _extra(self) -> dict:
        return {
            "step": self.step,
            "lr_schedule": self.sched.state_dict(),
            "data": self.data.state_dict(),
            "rollbacks": self.rollbacks,
            "skipped_steps": self.skipped,
            "world_size": self.world,
        }

    def save(self, mode: str) -> SaveStats:
        stats = self.ckpt.save(self.step, self._model_optim_state(), self._extra(), mode=mode)
        self.saves.append(stats)
        if self.rank == 0:
            self.events.write(
                "save_started", step=self.step, mode=mode, blocking_s=stats.blocking_s
            )
        return stats

    def _on_commit(self, stats: SaveStats) -> None:
        self._state_on_disk = stats.step
        if self.rank == 0:
            self.events.write(
                "save_committed",
                step=stats.step,
                mode=stats.mode,
                blocking_s=stats.blocking_s,
                total_s=stats.total_s,
                bytes=stats.bytes,
            )
        if self.metrics is not None:
            self.metrics.save_seconds.set(stats.total_s or 0.0)
            self.metrics.save_blocking_seconds.set(stats.blocking_s)
            self.metrics.save_bytes.set(stats.bytes or 0)
            self.metrics.saves.inc()

    def _resume(self, path: str | None, *, reason: str = "resume") -> bool:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._model_optim_state()
        result = self.ckpt.load(state, path)
        if result is None:
            return False
        set_state_dict(
            self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        extra = result.extra
        try:
            self.sched.load_state_dict(extra["lr_schedule"])
            self.data.load_state_dict(extra["data"])
            self.step = int(extra["step"])
        except (KeyError, TypeError) as e:
            raise CheckpointError(
                f"{result.path.name}: its trainer state lacks or mangles {e}"
            ) from e
        self._state_on_disk = self.step
        if reason == "resume":
            self._apply_changed_config(result)
            self.rollbacks = int(extra.get("rollbacks", 0))
            self.skipped = int(extra.get("skipped_steps", 0))
        saved_world = int(extra.get("world_size", self.world))
        if saved_world != self.world:
            self.log.warning(
                "resharded: checkpoint saved on %d ranks, resumed on %d", saved_world, self.world
            )
        self.resume_info = {
            "reason": reason,
            "from_step": self.step,
            "path": str(result.path),
            "load_s": result.seconds,
            "verify_s": result.verify_s,
            "skipped": result.skipped,
            "saved_world_size": saved_world,
            "rng_restored": result.rng_restored,
            "t_launch": self.t_launch,
            "t_loaded": time.time(),
        }
        if self.rank == 0:
            self.events.write(
                reason,
                **{k: v for k, v in self.resume_info.items() if k != "path"},
                path=result.path.name,
            )
        self.log.info(
            "%s: loaded %s (step %d) in %.2f s", reason, result.path.name, self.step, result.seconds
        )
        for name, why in result.skipped:
            self.log.warning("skipped checkpoint %s: %s", name, why)
        if self.metrics is not None:
            self.metrics.load_seconds.set(result.seconds)
        return True

    def _apply_changed_config(self, result) -> None:
        """A run resumed with other trajectory settings than its checkpoint's: say which, and
        make them true. The optimizer's learning rate and weight decay and the schedule's base
        rate come from the checkpoint, so they are set here from this run's flags; the rest
        (schedule shape, clipping, dtype) is read from the config at every step anyway. Data
        settings that cannot change (seed, batch, sequence length) are refused by the data
        stream, a different model by the load."""
        saved = result.manifest.get("config")
        if not isinstance(saved, dict):
            return
        now = self.resolved_cfg.to_dict()
        changed = {
            k: (saved[k], now[k]) for k in TRAJECTORY_FIELDS if k in saved and saved[k] != now[k]
        }
        if not changed:
            return
        cfg = self.cfg
        lr = cfg.lr * lr_multiplier(self.sched.last_epoch, cfg)
        self.sched.base_lrs = [cfg.lr for _ in self.opt.param_groups]
        for group in self.opt.param_groups:
            group["initial_lr"] = cfg.lr
            group["lr"] = lr
            group["weight_decay"] = cfg.weight_decay
        self.sched._last_lr = [lr for _ in self.opt.param_groups]
        what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
        self.log.warning(
            "%s was saved with other settings (%s): this run's values apply from step %d on "
            "(learning rate %.3g, weight decay %g, schedule over %d steps); the trajectory "
            "differs from the saved run's",
            result.path.name,
            what,
            self.step + 1,
            lr,
            cfg.weight_decay,
            cfg.steps,
        )
        if self.rank == 0:
            self.events.write(
                "config_changed", step=self.step, changed={k: list(v) for k, v in changed.items()}
            )

    # -- signals --

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # e.g. a Ray Tune function trial: the runner owns the signals
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None:
            return
        self._stop_signal = signum
        self._t_signal = time.time()
        self._deadline_timer = threading.Timer(self.cfg.sigterm_deadline_s, self._deadline_passed)
        self._deadline_timer.daemon = True
        self._deadline_timer.start()

    def _deadline_passed(self) -> None:
        msg = (
            f"preemption save did not finish within {self.cfg.sigterm_deadline_s:.0f} s: exiting "
            "without it; the run resumes from the previous checkpoint"
        )
        print(f"[rank {self.rank}] {msg}", file=sys.stderr, flush=True)
        self.events.write("deadline_exceeded", step=self.step)
        os._exit(EXIT_PREEMPTED)

    # -- one step --

    def train_step(self) -> dict:
        """Run step self.step + 1: forward, backward, agree on loss and stop flag, update."""
        cfg = self.cfg
        t0 = time.perf_counter()
        target_step = self.step + 1
        poison = self.faults.at_step(target_step)
        inputs, targets = self.data.next_batch()
        inputs = inputs.to(self.device, non_blocking=True)
        targets = targets.to(self.device, non_blocking=True)
        logits = self.model(inputs)  # (B, S, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        if poison:
            loss = loss * float("nan")
        loss.backward()
        # One all-reduce carries the loss and the stop flag: every rank takes the same decision.
        flags = torch.stack(
            [
                loss.detach().float(),
                torch.tensor(float(self._stop_signal is not None), device=self.device),
            ]
        )
        dist.all_reduce(flags)
        global_loss = flags[0].item() / self.world
        stop = flags[1].item() > 0
        outcome = "ok"
        if not math.isfinite(global_loss):
            outcome = self._non_finite(target_step, global_loss)
        else:
            self._consecutive_skips = 0
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip, foreach=True)
            self.ckpt.wait_staging()  # an async save's copy must finish before params change
            self.opt.step()
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if outcome in ("ok", "skipped"):
            self.step = target_step
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if outcome == "ok":
            self.losses[self.step] = global_loss
            self.step_times.append(dt)
        return {
            "step": self.step,
            "loss": global_loss,
            "step_s": dt,
            "outcome": outcome,
            "stop": stop,
            "tokens_per_s": self.tokens_per_step / dt,
        }

    def _non_finite(self, step: int, value: float) -> str:
        cfg = self.cfg
        if self.rank == 0:
            self.events.write("nonfinite", step=step, loss=repr(value), policy=cfg.nan_policy)
        self.log.warning("step %d: non-finite loss %r (policy %s)", step, value, cfg.nan_policy)
        if cfg.nan_policy == "abort":
            raise NonFiniteLossError(f"non-finite loss {value!r} at step {step} (nan_policy=abort)")
        if cfg.nan_policy == "rollback":
            n = self._nan_retries[step] = self._nan_retries.get(step, 0) + 1
            if n <= cfg.max_nan_retries:
                self.opt.zero_grad(set_to_none=True)
                if self._resume(None, reason="rollback"):
                    self.rollbacks += 1
                    if self.metrics is not None:
                        self.metrics.rollbacks.inc()
                    return "rolled_back"
                self.log.warning("no checkpoint to roll back to: skipping step %d instead", step)
            else:
                self.log.warning(
                    "step %d: still non-finite after %d rollbacks: skipping its batch",
                    step,
                    cfg.max_nan_retries,
                )
        self._consecutive_skips += 1
        # Bounded under every policy: under rollback a step is skipped after its own retries
        # (or with no checkpoint to roll back to), and many in a row mean a broken run.
        limit = cfg.max_nan_retries if cfg.nan_policy == "skip" else max(1, cfg.max_nan_retries)
        if self._consecutive_skips > limit:
            raise NonFiniteLossError(
                f"{self._consecutive_skips} consecutive non-finite steps skipped "
                f"(policy {cfg.nan_policy}, max_nan_retries={cfg.max_nan_retries})"
            )
        self.skipped += 1
        if self.metrics is not None:
            self.metrics.skipped_steps.inc()
        if self.rank == 0:
            self.events.write("skipped", step=step)
        return "skipped"

    # -- the loop --

    def _after_step(self, out: dict) -> None:
        if out["outcome"] != "ok":
            return
        step = out["step"]
        if self.rank == 0:
            self.events.write(
                "step",
                step=step,
                loss=out["loss"],
                step_s=out["step_s"],
                lr=self.sched.get_last_lr()[0],
            )
            if not self._first_step_logged:
                self._first_step_logged = True
                since_launch = time.time() - self.t_launch
                self.events.write("first_step", step=step, since_launch_s=since_launch)
                if self.resume_info is not None:
                    self.resume_info.setdefault("first_step_since_launch_s", since_launch)
        if self.metrics is not None:
            self.metrics.step.set(step)
            self.metrics.loss.set(out["loss"])
            self.metrics.step_seconds.observe(out["step_s"])
            self.metrics.tokens_per_second.set(out["tokens_per_s"])
        if self.report_fn is not None and self.rank == 0:
            self.report_fn(self._summary(status="running"))

    def _summary(self, status: str) -> dict:
        med = statistics.median(self.step_times) if self.step_times else None
        last = self.losses[max(self.losses)] if self.losses else None
        return {
            "status": status,
            "step": self.step,
            "loss": last,
            "losses": dict(self.losses),
            "median_step_s": med,
            "tokens_per_s": self.tokens_per_step / med if med else None,
            "rollbacks": self.rollbacks,
            "skipped_steps": self.skipped,
            "attempt": self.attempt,
            "world_size": self.world,
            "deterministic": self.cfg.deterministic,
            "determinism": self._determinism_record(),
            "resume": self.resume_info,
            "checkpoints": [s.__dict__ for s in self.saves],
            "metrics_url": self.server.url if self.server is not None else None,
        }

    def run(self) -> dict:
        from shared.progress import progress

        with progress(
            self.cfg.steps,
            "train",
            unit="step",
            every=self.cfg.log_every,
            enabled=self.rank == 0,
            start=self.step,
        ) as bar:
            return self._run(bar)

    def _run(self, bar) -> dict:
        cfg = self.cfg
        prestage = cfg.ckpt_mode == "async" and self.device.type == "cuda"
        end = min(cfg.steps, cfg.stop_after) if cfg.stop_after else cfg.steps
        while self.step < end:
            out = self.train_step()
            self._after_step(out)
            status = {
                "ok": "",
                "rolled_back": "non-finite loss: rolled back, ",
                "skipped": "non-finite loss: step skipped, ",
            }[out["outcome"]]
            bar.set(
                self.step,
                status=f"{status}loss {out['loss']:.4f}, {out['step_s']:.3f} s/step, "
                f"{out['tokens_per_s']:,.0f} tok/s",
            )
            if prestage:
                # Allocate and pin the async staging buffers on a thread while training goes
                # on, so that the first save does not (seconds for a 1B model's 12 GiB of
                # state). After the first step, so that the time to it (resume) is unchanged.
                prestage = False
                self.ckpt.prestage(self._model_optim_state(), background=True)
            if out["stop"]:
                return self._preempt()
            if out["outcome"] != "ok":
                continue
            if self.step == end:
                self.save("sync")
            elif self.step % cfg.ckpt_every == 0:
                self.save(cfg.ckpt_mode)
        self.ckpt.wait()
        if self._state_on_disk != self.step:
            # The last step was skipped (non-finite loss): its batch is consumed, the weights
            # are those of the last good step. The run ends with that state on disk.
            self.log.warning(
                "step %d was skipped: saving the last good state as step %d", self.step, self.step
            )
            self.save("sync")
        if self.step < cfg.steps:  # --stop-after: this launch ends here, the run goes on
            self.log.info(
                "--stop-after %d: stopping at step %d of %d (saved); the next launch continues",
                cfg.stop_after,
                self.step,
                cfg.steps,
            )
            if self.rank == 0:
                self.events.write("stopped", step=self.step, loss=self.losses.get(self.step))
            return self._summary(status="stopped")
        if self.rank == 0:
            self.events.write("done", step=self.step, loss=self.losses.get(self.step))
        return self._summary(status="completed")

    def _preempt(self) -> dict:
        sig = signal.Signals(self._stop_signal).name if self._stop_signal else "?"
        t0 = time.perf_counter()
        self.ckpt.wait()  # an async save in flight lands first
        if self._state_on_disk != self.step:
            self.save("sync")
        dt = time.perf_counter() - t0
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self.log.warning(
            "%s: saved step %d in %.2f s (deadline %.0f s); exiting with %d for a requeue",
            sig,
            self.step,
            dt,
            self.cfg.sigterm_deadline_s,
            EXIT_PREEMPTED,
        )
        if self.rank == 0:
            self.events.write("preempted", step=self.step, signal=sig, save_s=dt)
        return self._summary(status="preempted")

    def close(self, *, clean: bool = True) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        if self.server is not None:
            self.server.close()
        if self.determinism is not None:  # process-wide flags: an in-process caller gets them back
            self.determinism.restore()
        ckpt = getattr(self, "ckpt", None)
        if clean:
            if ckpt is not None:
                ckpt.close()
            from shared.distributed import cleanup

            cleanup()
        if self._owns_world:  # a world of one we made: leave the environment as we found it,
            # clean or not (a later run in this process, or a child it starts, must not take
            # this world's rank and port as a launcher's)
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                os.environ.pop(k, None)


def train(cfg: TrainConfig, report_fn: ReportFn | None = None) -> dict:
    """Run (or resume) training; returns the run's metrics. status is 'completed' or
    'preempted'. Raises CollectiveFailure, NonFiniteLossError, CheckpointError, PreflightError."""
    trainer = Trainer(cfg, report_fn)
    clean = True
    try:
        trainer.setup()
        return trainer.run()
    except Exception as e:
        if _is_collective_failure(e):
            clean = False  # a barrier now would hang on the dead or stuck peer
            msg = (
                f"collective failed on rank {getattr(trainer, 'rank', '?')} after step "
                f"{getattr(trainer, 'step', '?')}: {str(e).splitlines()[0][:300]}. A peer is hung "
                f"(no answer within pg_timeout_s={cfg.pg_timeout_s:g} s) or died; ending this "
                "process so the launcher restarts the job from the last checkpoint."
            )
            if hasattr(trainer, "events"):
                trainer.events.write(
                    "collective_failure", step=getattr(trainer, "step", None), error=str(e)[:300]
                )
            raise CollectiveFailure(msg) from e
        raise
    finally:
        trainer.close(clean=clean)


def command(cfg: TrainConfig) -> int:
    """`train`: run (or resume) training on this rank; the exit status says what a launcher
    should do (EXIT_OK, EXIT_PREEMPTED, EXIT_NAN_ABORT, EXIT_PREFLIGHT, EXIT_COLLECTIVE)."""
    from shared.cli import writable_dir

    from .health import PreflightError

    cfg.validate()
    # Before any process group, model or checkpoint: what the command line and environment say.
    writable_dir("--run-dir", cfg.run_dir)
    writable_dir("--run-dir", Path(cfg.run_dir) / "checkpoints")
    parse_faults(os.environ.get(FAULTS_ENV))
    current_attempt()
    process_start_time()
    try:
        result = train(cfg)
    except CollectiveFailure as e:
        print(f"ERROR {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_COLLECTIVE)  # skip teardown: it would wait on the lost peer
    except PreflightError as e:
        print(f"ERROR {e}. Not starting: fix or replace this node.", file=sys.stderr, flush=True)
        return EXIT_PREFLIGHT
    except NonFiniteLossError as e:
        print(f"ERROR {e}", file=sys.stderr, flush=True)
        return EXIT_NAN_ABORT
    except CheckpointError as e:
        print(f"ERROR {e}", file=sys.stderr, flush=True)
        return 1
    return EXIT_PREEMPTED if result["status"] == "preempted" else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """`python -m project03_capstone_infra.train` (torchrun's target): the package's `train`
    command."""
    from .__main__ import main as package_main

    return package_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    from shared.distributed import exit_under_launcher

    code = main()
    # The process group is destroyed and every file closed by now; a gloo worker thread can still
    # abort the interpreter's teardown, which torchrun would report as a failed job.
    exit_under_launcher(code)
    raise SystemExit(code)
