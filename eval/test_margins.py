"""Margins of the learned-quality tests over seeds, kernel settings and thread counts.

Every test that trains a tiny model and asserts a quality bar does it through a
``tests/quality.py`` ``Bar``, listed in its module's ``BARS``. This script measures each bar's
value for seeds 0..N-1 under each setting (torch's ``ATEN_CPU_CAPABILITY`` kernels and the
number of torch threads; each setting in a fresh process) and writes the range per bar, the
worst value against the bar, and every value::

    python eval/test_margins.py --seeds 10 --settings native:1,avx2:1,default:1 --jobs 3 \\
        --output eval/results/test_margins.md

A bar is well chosen when the worst seed under the worst setting passes with room to spare.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
#: the test modules that declare BARS
MODULES = ["test_alignment_layer", "test_direct_hmm", "test_agreement", "test_train",
           "test_translate", "test_guide", "test_system"]


def bars(modules=None):
    """[(module, Bar)] of every module in `modules` (default MODULES)."""
    sys.path.insert(0, str(ROOT / "tests"))
    found = []
    for name in modules or MODULES:
        module = importlib.import_module(name)
        found += [(name, bar) for bar in module.BARS]
    return found


def measure(seeds: int, threads: int, modules: List[str]) -> Dict[str, List[float]]:
    """{bar name: [value per seed]} in this process."""
    import torch

    found = bars(modules)
    torch.set_num_threads(threads)   # after the imports (tests/conftest.py sets 1)
    values: Dict[str, List[float]] = {}
    for module, bar in found:
        values[f"{module}: {bar.name}"] = [float(bar.measure(seed)) for seed in range(seeds)]
        print(f"{module}: {bar.name}: {values[f'{module}: {bar.name}']}", file=sys.stderr,
              flush=True)
    return values


def run_setting(setting: str, seeds: int, modules: List[str]) -> Dict[str, List[float]]:
    """Measure in a fresh process under `setting` ('KERNELS:THREADS'; KERNELS 'native' = the
    CPU's best)."""
    kernels, threads = setting.split(":")
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernels != "native":
        env["ATEN_CPU_CAPABILITY"] = kernels
    output = subprocess.run([sys.executable, __file__, "--worker", "--seeds", str(seeds),
                             "--threads", threads, "--modules", ",".join(modules)], env=env,
                            check=True, text=True, stdout=subprocess.PIPE).stdout
    return json.loads(output)


def report(results: Dict[str, Dict[str, List[float]]], seeds: int, seconds: float,
           modules: List[str]) -> str:
    import torch

    limits = {f"{module}: {bar.name}": bar for module, bar in bars(modules)}
    settings = list(results)
    command = (f"python eval/test_margins.py --seeds {seeds} --settings {','.join(settings)}"
               + ("" if modules == MODULES else f" --modules {','.join(modules)}"))
    lines = [f"# Margins of the learned-quality tests ({time.strftime('%Y-%m-%d')})", "",
             f"`{command}`"
             f" on {platform.processor() or platform.machine()} "
             f"({torch.backends.cpu.get_cpu_capability()} native), torch {torch.__version__}, "
             f"{seconds / 60:.0f} min. A setting is KERNELS:THREADS (ATEN_CPU_CAPABILITY; "
             f"native = the CPU's best). Each test runs seed 0; the bar must hold for every "
             f"seed under every setting with room to spare.", "",
             "| bar | test asserts | range over seeds and settings | worst setting |",
             "|---|---|---|---|"]
    for name, bar in limits.items():
        every = [(value, setting) for setting in settings for value in results[setting][name]]
        low, high = min(v for v, _ in every), max(v for v, _ in every)
        worst = (min(every) if bar.above is not None else max(every))
        failing = sum(not bar.passes(v) for v, _ in every)
        lines.append(f"| {name} | {bar.describe()} | {low:.3f} - {high:.3f}"
                     f"{f' ({failing} FAIL)' if failing else ''} | {worst[1]}: {worst[0]:.3f} |")
    lines += ["", "## Every value (seeds 0.. in order)", ""]
    for setting in settings:
        lines += [f"### {setting}", ""]
        for name, values in results[setting].items():
            lines.append(f"- {name}: " + ", ".join(f"{v:.3f}" for v in values))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--settings", default="native:1,native:2,avx2:1,default:1")
    parser.add_argument("--output", default=None, help="markdown report (default: stdout)")
    parser.add_argument("--jobs", type=int, default=1, help="settings measured at once")
    parser.add_argument("--modules", default=",".join(MODULES),
                        help="the test modules whose BARS are measured")
    parser.add_argument("--from-json", default=None,
                        help="write the report of the values a run saved (--output's .json) "
                             "against the bars of the tests as they are now; measure nothing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    modules = args.modules.split(",")
    if args.worker:
        print(json.dumps(measure(args.seeds, args.threads, modules)))
        return
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results, seconds = saved["results"], saved["seconds"]
    else:
        start = time.time()
        settings = args.settings.split(",")
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:   # a process per setting
            measured = list(pool.map(lambda setting: run_setting(setting, args.seeds, modules),
                                     settings))
        results, seconds = dict(zip(settings, measured)), time.time() - start
        if args.output:   # the raw values first: a report that fails loses nothing
            Path(args.output).with_suffix(".json").write_text(
                json.dumps({"seconds": seconds, "results": results}, indent=1) + "\n")
    text = report(results, args.seeds, seconds, modules)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
