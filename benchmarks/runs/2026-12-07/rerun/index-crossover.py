"""One-off, kept as the record of docs/benchmarks.md row 37's sizes past the bench's:
check_index, every pair against LSH, two rounds in turned order, at the sizes given.

    python benchmarks/runs/2026-12-07/rerun/index-crossover.py 10000 20000 30000
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from benchmarks.bench_check import measure_index_scaling  # noqa: E402

for n in [int(a) for a in sys.argv[1:]]:
    for turn in range(2):
        methods = ("exact", "lsh") if turn == 0 else ("lsh", "exact")
        for row in measure_index_scaling(sizes=(n,), methods=methods):
            print(turn, row["entries"], row["method"], row["seconds"],
                  row["near_duplicate_seconds"], row["planted_found"], row["false_reports"],
                  row["pairs_compared"], flush=True)
