"""The benchmark: each contestant of each row alone in a fresh process, in rotating rounds.

``python -m benchmarks`` (``make bench``). Every row (:data:`benchmarks.cases.CASES`,
then the model step of :mod:`benchmarks.model_step`) has up to three contestants:
``ours`` (nnx-pool under ``jax.jit``), ``flax`` (the ``flax.nnx`` function or the
plain ``jnp`` a Flax user writes) and ``torch`` (PyTorch on a ``channels_last``
tensor). For each pass of a row, each round starts one process per contestant
(:mod:`benchmarks.contestant`) in an order that rotates from round to round; a
process warms up, then times its calls alone, as a user's program would run them.

The report gives, per row, pass and contestant, the median over rounds of the
per-process medians and their spread (min to max over rounds), compile time, XLA's
temporaries (``memory_analysis``) and PyTorch's saved-for-backward bytes, the memory
floor and each row's ratios: ours over the faster peer (<= 1.00 meets the target)
and ours over the floor. ``stable`` is the number of rounds after which the running
median of that ratio stays within 5% of its final value.

``--in-process`` runs the old harness (:mod:`benchmarks.run`: every contestant in
one process, interleaved), kept to show what interleaving does to the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import model_step
from benchmarks.cases import CASES

PASSES = ("forward", "backward")
STABLE_WITHIN = 0.05


def _has_torch() -> bool:
  import importlib.util

  return importlib.util.find_spec("torch") is not None


def _environment() -> dict:
  import benchmarks.run as run

  return run.environment()


def contestant_process(module: str, args: Sequence[str]) -> dict:
  """Runs ``python -m <module> ARGS`` in a fresh process and returns its JSON line."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
  done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                        env=env, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"{module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def stable_after(ratios: Sequence[float], within: float = STABLE_WITHIN) -> int:
  """Rounds after which the running median of ``ratios`` stays within ``within`` of its last.

  Example: ratios 1.0, 2.0, 1.1, 1.05, 1.08 have running medians 1.0, 1.5, 1.1, 1.075,
  1.08; within 5% of 1.08 from the third round on, so 3.
  """
  final = statistics.median(ratios)
  stable = len(ratios)
  for k in range(len(ratios), 0, -1):
    if abs(statistics.median(ratios[:k]) - final) > within * final:
      break
    stable = k
  return stable


def summarise(per_round: dict[str, list[dict]]) -> dict:
  """One pass of one row from its rounds: ``{contestant: [process result per round]}``."""
  out: dict = {"contestants": {}}
  for name, results in per_round.items():
    calls = [r["call_ms"] for r in results]
    summary = {"median_ms": statistics.median(calls), "min_ms": min(calls),
               "max_ms": max(calls), "rounds_ms": calls,
               "dispatch_ms": statistics.median(r["null_ms"] for r in results)}
    for key in ("compile_s",):
      if key in results[0]:
        summary[key] = statistics.median(r[key] for r in results)
    for key in ("temp_bytes", "saved_bytes"):
      if key in results[0]:
        summary[key] = results[0][key]  # deterministic: the same in every round
    out["contestants"][name] = summary
  ours = out["contestants"]["ours"]
  peers = {k: v for k, v in out["contestants"].items() if k != "ours"}
  if peers:
    best = min(peers, key=lambda k: peers[k]["median_ms"])
    out["best_peer"] = best
    out["ratio"] = ours["median_ms"] / peers[best]["median_ms"]
    ratios = [o / min(per_round[k][i]["call_ms"] for k in peers)
              for i, o in enumerate(ours["rounds_ms"])]
    out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    out["stable_after"] = stable_after(ratios)
  floors = [r["floor_ms"] for r in per_round["ours"]]
  out["floor_ms"] = statistics.median(floors)
  out["floor_ratio"] = ours["median_ms"] / out["floor_ms"]
  return out


def run_row(name: str, passes: Sequence[str], contestants: Sequence[str], *, rounds: int,
            module: str, extra: Sequence[str], progress) -> dict:
  """Every pass of one row, ``rounds`` times, each contestant in its own process."""
  row = {"case": name}
  for pass_name in passes:
    per_round: dict[str, list[dict]] = {c: [] for c in contestants}
    for round_ in range(rounds):
      shift = round_ % len(contestants)
      for contestant in [*contestants[shift:], *contestants[:shift]]:
        per_round[contestant].append(
            contestant_process(module, [name, contestant, pass_name, *extra]))
        progress(f"{name} {pass_name} round {round_ + 1}/{rounds} {contestant}")
    check_same_loss(name, per_round)
    row[pass_name] = summarise(per_round)
  return row


LOSS_RTOL = 1e-4  # float32 training steps in three frameworks: summation orders differ


def check_same_loss(name: str, per_round: dict[str, list[dict]]) -> None:
  """Refuses to report a step whose contestants computed different losses."""
  losses = {k: v[0]["loss"] for k, v in per_round.items() if "loss" in v[0]}
  if losses and max(losses.values()) - min(losses.values()) > LOSS_RTOL * max(
      abs(v) for v in losses.values()):
    raise RuntimeError(f"{name}: the contestants' losses differ, {losses}: they do not run "
                       "the same network, so their times cannot be compared.")


def _mb(nbytes: float | None) -> str:
  return "-" if nbytes is None else f"{nbytes / 2**20:.1f}"


def format_table(rows: Sequence[dict], env: dict, rounds: int) -> str:
  lines = [
      f"jax {env['jax']}, flax {env['flax']}, torch {env['torch']} "
      f"({env['torch_threads']} threads), {env['processor']}, {env['cpu_count']} CPUs",
      f"each contestant alone in a fresh process, {rounds} rounds (order rotating); ms: "
      "median of per-process medians [min-max over rounds]; ratio: ours / faster peer "
      "[min-max]; stable: rounds until the ratio's running median stays within 5%; "
      "floor: ours / the row's memory traffic; MB: XLA temporaries (ours/flax), "
      "PyTorch saved for backward",
      "",
      f"{'case':31} {'pass':7} {'ours ms':>19} {'flax ms':>19} {'torch ms':>19} "
      f"{'ratio':>17} {'stable':>6} {'floor':>6} {'compile s':>11} {'MB ours/flax/torch':>20}",
  ]
  for row in rows:
    for pass_name in PASSES + ("step",):
      if pass_name not in row:
        continue
      r = row[pass_name]
      cells = []
      for name in ("ours", "flax", "torch"):
        c = r["contestants"].get(name)
        cells.append(f"{'-':>19}" if c is None else
                     f"{c['median_ms']:7.2f} [{c['min_ms']:.2f}-{c['max_ms']:.2f}]".rjust(19))
      ratio = (f"{r['ratio']:5.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]"
               if "ratio" in r else "-")
      ours, flax = r["contestants"]["ours"], r["contestants"].get("flax", {})
      compile_s = f"{ours.get('compile_s', 0):.2f}/{flax.get('compile_s', 0):.2f}"
      memory = (f"{_mb(ours.get('temp_bytes'))}/{_mb(flax.get('temp_bytes'))}/"
                f"{_mb(r['contestants'].get('torch', {}).get('saved_bytes'))}")
      label = {"forward": "fwd", "backward": "fwd+bwd", "step": "step"}[pass_name]
      lines.append(f"{row['case']:31} {label:7} {' '.join(cells)} {ratio:>17} "
                   f"{r.get('stable_after', '-'):>6} {r['floor_ratio']:6.1f} "
                   f"{compile_s:>11} {memory:>20}")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
  parser.add_argument("--json", default=None, help="write the report here as JSON")
  parser.add_argument("-k", default="", help="only rows whose name contains this")
  parser.add_argument("--rounds", type=int, default=5, help="rounds per pass (default 5)")
  parser.add_argument("--calls", type=int, default=40, help="timed calls per process")
  parser.add_argument("--warmup", type=int, default=3, help="untimed calls first")
  parser.add_argument("--quick", action="store_true", help="tiny shapes, for the smoke test")
  parser.add_argument("--no-model", action="store_true", help="leave out the model step")
  parser.add_argument("--in-process", action="store_true",
                      help="the old harness: every contestant interleaved in one process")
  args, rest = parser.parse_known_args(argv)
  if args.in_process:
    from benchmarks import run

    return run.main([*rest, *(["--json", args.json] if args.json else []),
                     *(["-k", args.k] if args.k else []), *(["--quick"] if args.quick else [])])
  if rest:
    parser.error(f"unrecognised arguments: {' '.join(rest)}")
  contestants = ["ours", "flax", *(["torch"] if _has_torch() else [])]
  extra = ["--calls", str(args.calls), "--warmup", str(args.warmup),
           *(["--quick"] if args.quick else [])]
  names = [c.name for c in CASES if args.k in c.name]
  with_model = not args.no_model and args.k in model_step.NAME
  if not names and not with_model:
    parser.error(f"no row name contains {args.k!r}")

  def progress(what: str) -> None:
    print(f"  {what}", file=sys.stderr, flush=True)

  rows = [run_row(name, PASSES, contestants, rounds=args.rounds, module="benchmarks.contestant",
                  extra=extra, progress=progress) for name in names]
  if with_model:
    rows.append(run_row(model_step.NAME, ("step",), contestants, rounds=args.rounds,
                        module="benchmarks.model_step", extra=extra, progress=progress))
  env = _environment()
  print(format_table(rows, env, args.rounds))
  if args.json:
    report = {"environment": env, "rounds": args.rounds, "calls": args.calls, "rows": rows}
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
  return 0
